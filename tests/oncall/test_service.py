"""On-call actions on moto_server and the local backend, without Airflow: which runs exist, what
failed, which files a resubmission takes, and that it is safe to repeat. (The same actions
through a real Airflow, DAG run state included, are in test_oncall_airflow.py.)
"""

from __future__ import annotations

import time
import uuid

import boto3
import pytest

from shardline.decision.policy import Action, JobStatus, Policy, StepSnapshot, decide
from shardline.ledger.context import StaleAttemptError
from shardline.ledger.keys import StepRef
from shardline.ledger.states import StepStatus
from shardline.ledger.step_reads import list_runs, read_step
from shardline.ledger.step_writes import ensure_run, finish_step, start_attempt
from shardline.ledger.table import bind_ledger
from shardline.oncall.errors import Conflict, NotFound, OnCallError
from shardline.oncall.service import OnCall
from shardline.oncall.values import RunRef
from shardline.orchestration import run as run_records
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.files import latest_attempt
from shardline.s3uri import parse_s3_uri
from shardline.spec import load_spec, parse_spec
from tests.support.pipelines import parquet_bytes, plan_args, stage_step, wait_for_job


@pytest.fixture
def failed_run(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    """A finished step of 4 good files and one corrupt one, run for real by the local backend."""
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    inputs = {f"part-{i}.parquet": parquet_bytes(250, i * 250) for i in range(4)}
    inputs["part-9.parquet"] = b"PAR1 not parquet at all"
    spec, bucket = stage_step("oncall_test", ledger_table, xgboost_model.parent, tmp_path, inputs)
    s3 = boto3.client("s3")
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", "run-1", **plan_args(bucket))).attempt
    wait_for_job(spec, attempt)
    step_end.finish(spec, attempt, Action.FAIL, "1 of 5 file(s) failed")
    return spec, bucket, s3, RunRef("oncall_test", "run-1")


def test_run_refs_are_pipeline_slash_run_id():
    assert RunRef.parse("p/scheduled__2026-11-22T10:00:00+00:00") == RunRef("p", "scheduled__2026-11-22T10:00:00+00:00")
    with pytest.raises(OnCallError, match="PIPELINE/RUN_ID"):
        RunRef.parse("just-a-run-id")


def test_runs_are_listed_newest_first_and_indexed_once(ledger_table):
    model = bind_ledger(ledger_table)
    for run in ("r1", "r2", "r3"):
        ensure_run(model, "alpha" if run != "r2" else "beta", run)
        time.sleep(0.01)
    ensure_run(model, "alpha", "r1")  # a retried plan task: no second index entry
    assert [r.run_id for r in list_runs(model)] == ["r3", "r2", "r1"]
    assert [r.run_id for r in list_runs(model, "alpha")] == ["r3", "r1"]
    assert [r.run_id for r in list_runs(model, limit=1)] == ["r3"]
    assert [r.run_id for r in list_runs(model, "alpha", limit=1)] == ["r3"]
    assert [r.run_id for r in list_runs(model, "beta")] == ["r2"]


def test_a_step_outcome_is_fenced_on_its_attempt(ledger_table):
    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-9", "score"), 1, [("s3://b/in/a", 1)])
    start_attempt(model, StepRef("p", "run-9", "score"), 2, [("s3://b/in/a", 1)])  # someone resubmitted
    assert not finish_step(model, StepRef("p", "run-9", "score"), 1, StepStatus.FAILED, "old news")
    assert read_step(model, StepRef("p", "run-9", "score")).step.status == StepStatus.PLANNED
    assert finish_step(model, StepRef("p", "run-9", "score"), 2, StepStatus.SUCCEEDED)
    assert read_step(model, StepRef("p", "run-9", "score")).step.status == StepStatus.SUCCEEDED


def test_a_cancelled_step_is_failed_by_the_watch_task_not_resubmitted():
    policy = Policy(3, 1, 2, 0, 0, 60)
    snap = StepSnapshot(
        attempt=1, job_status=JobStatus.STOPPED, job_age_seconds=10, files=[], cancelled=True, now=time.time()
    )
    decision = decide(snap, policy)
    assert decision.action is Action.FAIL and "cancelled" in decision.reason


@pytest.mark.slow
def test_status_failed_and_a_resubmission_that_is_safe_twice(failed_run):
    spec, bucket, s3, ref = failed_run
    oncall = OnCall({spec.pipeline: spec})
    assert [r.run_id for r in oncall.runs()] == ["run-1"]

    view = oncall.status(ref)
    step = view.steps[0]
    assert (step.status, step.files, step.succeeded, step.failed) == ("FAILED", 5, 4, 1)
    assert "shardline resubmit oncall_test/run-1 --step score --all-failed" in step.message

    failed = oncall.failed(ref)
    assert [(f.input_key, f.error_class) for f in failed] == [(f"s3://{bucket}/in/part-9.parquet", "CorruptInputError")]
    # Selections: never a file that succeeded; a relative key is accepted; unknown keys are refused.
    assert oncall.plan_resubmission(ref, "score", all_failed=True).files == [f"s3://{bucket}/in/part-9.parquet"]
    assert oncall.plan_resubmission(ref, "score", files=["part-0.parquet"]).files == []
    assert oncall.plan_resubmission(ref, "score", instance=failed[0].host).files == [f"s3://{bucket}/in/part-9.parquet"]
    with pytest.raises(OnCallError, match="not an input of step score"):
        oncall.plan_resubmission(ref, "score", files=["nope.parquet"])
    with pytest.raises(OnCallError, match="has no step 'postprocess'"):
        oncall.plan_resubmission(ref, "postprocess", all_failed=True)

    s3.put_object(Bucket=bucket, Key="in/part-9.parquet", Body=parquet_bytes(250, 9 * 250))  # the fix
    # Without a way to let the DAG run follow the new attempt, nothing is submitted at all.
    with pytest.raises(OnCallError, match=r"Airflow is not configured, so nothing was submitted.*shardline login"):
        oncall.resubmit(ref, "score", all_failed=True)
    assert latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score")).number == 1
    # A step not run by Airflow says so explicitly.
    result = oncall.resubmit(ref, "score", all_failed=True, ledger_only=True)
    assert (result.attempt, result.plan.files, result.complete) == (2, [f"s3://{bucket}/in/part-9.parquet"], True)
    assert "Airflow was left out (--ledger-only)" in result.airflow
    second = oncall.resubmit(ref, "score", all_failed=True, force=True, ledger_only=True)  # while 2 runs, or after
    assert second.attempt is None
    wait_for_job(spec, latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score")))
    last = oncall.resubmit(ref, "score", all_failed=True, force=True, ledger_only=True)
    assert (last.attempt, last.action, last.airflow) == (
        None,
        "nothing",
        "nothing to resubmit: every chosen file has succeeded",
    )

    step = oncall.status(ref).steps[0]
    assert (step.attempt, step.succeeded, step.failed, step.rows_in, step.rows_out) == (2, 5, 0, 1250, 1250)
    outputs = [
        o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"] if o["Key"].endswith(".parquet")
    ]
    assert sorted(outputs) == [f"out/part-{i}.parquet" for i in (0, 1, 2, 3, 9)]


def test_a_resubmission_of_an_older_run_is_refused_while_a_newer_run_writes_its_prefix(failed_run):
    """Run 1 failed; run 2 of the same partition took the output prefix. Resubmitting run 1's failed file now would
    mix its output with run 2's: refused, naming run 2 and what to do, with nothing submitted, and run 1 stays
    FAILED. Once run 2 has ended it is still refused: the prefix holds run 2's outputs now."""
    spec, bucket, _, ref = failed_run
    oncall = OnCall({spec.pipeline: spec})
    second = step_plan.plan(spec, "score", "run-2", **plan_args(bucket))
    with pytest.raises(OnCallError, match=r"not resubmitted: s3://.*/out/ was written by run oncall_test/run-2"):
        oncall.resubmit(ref, "score", all_failed=True, ledger_only=True)
    assert latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score")).number == 1
    assert oncall.status(ref).status == "FAILED"  # not left reopened by the refused attempt
    wait_for_job(spec, step_jobs.submit(spec, second).attempt)
    step_end.finish(spec, second, Action.FAIL, "1 of 5 file(s) failed")
    run_records.finish_run(spec, spec.pipeline, "run-2", StepStatus.FAILED)
    with pytest.raises(OnCallError, match=r"was written by run oncall_test/run-2 \(step score\) after"):
        oncall.resubmit(ref, "score", all_failed=True, ledger_only=True)


@pytest.mark.slow
def test_a_resubmission_waits_for_the_watch_task_and_cancel_stops_everything(failed_run):
    spec, _, _, ref = failed_run
    oncall = OnCall({spec.pipeline: spec})
    model = bind_ledger(spec.ledger_table)
    # The watch task is retrying on its own: attempt 2 runs every file again.
    latest = latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score"))
    keys = [f.input_key for f in read_step(model, StepRef(ref.pipeline, ref.run_id, "score")).files]
    running = step_jobs.resubmit(spec, latest, keys).attempt
    result = oncall.resubmit(ref, "score", all_failed=True, ledger_only=True)  # on-call, while attempt 2 runs
    assert result.attempt is None and "is still running" in result.airflow
    lines = oncall.cancel(ref, "bad model version")
    assert f"step score: stopped {running.job_name}" in lines and "step score: CANCELLED" in lines
    assert step_jobs.job_status(spec, running) in (JobStatus.STOPPED, JobStatus.STOPPING)
    assert oncall.status(ref).status == "CANCELLED"
    assert read_step(model, StepRef(ref.pipeline, ref.run_id, "score")).step.status == StepStatus.CANCELLED
    # The watch's late verdict, and its own retries, never undo on-call's cancel.
    assert step_end.finish(spec, running, Action.FAIL, "job Stopped") is StepStatus.CANCELLED  # it stands
    with pytest.raises(StaleAttemptError):
        start_attempt(model, StepRef(ref.pipeline, ref.run_id, "score"), 3, [(keys[0], 1)])
    with pytest.raises(OnCallError, match="already ended CANCELLED"):
        oncall.cancel(ref)


def test_a_shard_selection_takes_the_files_its_instance_never_claimed(aws_env, ledger_table, tmp_path, monkeypatch):
    """An instance that died before claiming anything: its files are found from the manifest's deal."""
    from shardline.contract import deal as dealt

    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    s3 = boto3.client("s3")
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for i in range(7):
        s3.put_object(Bucket=bucket, Key=f"in/part-{i}.parquet", Body=b"x" * (100 + i))
    spec = parse_spec(
        {
            "pipeline": "shard_test",
            "ledger_table": ledger_table,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{bucket}/m.tar.gz", "sha256": "a" * 64},
                    "input": {"prefix": f"s3://{bucket}/in/"},
                    "output": {"prefix": f"s3://{bucket}/out/"},
                    "resources": {"instance_count": 3},
                    "sharding": "by_size",
                }
            ],
        },
        "shard_test.yaml",
    )
    attempt = step_plan.plan(
        spec,
        "score",
        "run-1",
        input_prefix=f"s3://{bucket}/in/",
        output_prefix=f"s3://{bucket}/out/",
        model_uri=f"s3://{bucket}/m.tar.gz",
        instance_count=3,
    )
    finish_step(bind_ledger(ledger_table), StepRef("shard_test", "run-1", "score"), 1, StepStatus.FAILED, "lost")
    body = __import__("json").loads(
        s3.get_object(Bucket=bucket, Key=parse_s3_uri(attempt.manifest_uri)[1])["Body"].read()
    )
    expected = [body[0]["prefix"] + e for e in dealt(body[1:], attempt.instance_count)[1]]  # algo-2's share
    oncall = OnCall({spec.pipeline: spec})
    chosen = oncall.plan_resubmission(RunRef("shard_test", "run-1"), "score", instance="algo-2").files
    assert chosen == sorted(expected) and 2 <= len(chosen) <= 3


def test_a_dag_run_that_fails_outside_the_watch_task_shows_as_failed(aws_env, ledger_table, tmp_path):
    """The DAG's on_failure_callback: planning crashed, say. A run that already ended keeps its status."""
    import types

    from shardline.airflow.operators.step import mark_run_failed

    spec_path = tmp_path / "p.yaml"
    spec_path.write_text(
        f"pipeline: p\nledger_table: {ledger_table}\nsteps:\n  - name: score\n"
        f"    model: {{uri: s3://b/m.tar.gz, sha256: {'a' * 64}}}\n    input: {{prefix: s3://b/in/}}\n"
        "    output: {prefix: s3://b/out/}\n"
    )
    oncall = OnCall({"p": load_spec(spec_path)})
    model = bind_ledger(ledger_table)
    ensure_run(model, "p", "crashed")
    ensure_run(model, "p", "cancelled")
    oncall.cancel(RunRef("p", "cancelled"))
    for run_id in ("crashed", "cancelled", "never-started"):
        mark_run_failed(str(spec_path), {"dag_run": types.SimpleNamespace(run_id=run_id), "reason": "task_failure"})
    runs = {r.run_id: r for r in oncall.runs()}
    assert runs["crashed"].status == "FAILED" and "task_failure" in runs["crashed"].message
    assert runs["cancelled"].status == "CANCELLED"
    assert "never-started" not in runs


@pytest.mark.slow
def test_a_cli_that_looks_in_another_local_root_submits_nothing_beside_airflows_job(failed_run, tmp_path, monkeypatch):
    """The local backend's jobs live under a directory (AIRFLOW_HOME/shardline-local). A shell with another one
    would start attempt 2 beside the one Airflow's watch task starts: it is refused, and status says where to look."""
    spec, _, _, ref = failed_run
    oncall = OnCall({spec.pipeline: spec})
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "another-shell"))
    assert oncall.status(ref).steps[0].job_status == "NotFoundHere"
    with pytest.raises(OnCallError, match=r"ran, but not under .*another-shell.*nothing was submitted.*AIRFLOW_HOME"):
        oncall.resubmit(ref, "score", all_failed=True, ledger_only=True)
    assert latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score")).number == 1
    assert not (tmp_path / "another-shell").exists()


def test_a_run_skipped_for_missing_input_is_listed_skipped_with_its_reason(
    aws_env, ledger_table, xgboost_model, tmp_path
):
    from shardline.ledger.states import StepStatus

    spec, bucket = stage_step("skips_test", ledger_table, xgboost_model.parent, tmp_path, {})
    reason = f"step score: skipped: no input file under s3://{bucket}/in/ (matching ['*']) (input.when_missing: skip)"
    run_records.record_run_status(spec, "scheduled__2026-11-22T10:00:00+00:00", StepStatus.SKIPPED, reason)
    rows = OnCall({spec.pipeline: spec}).runs(spec.pipeline)
    assert [(r.run_id, r.status, r.message) for r in rows] == [
        ("scheduled__2026-11-22T10:00:00+00:00", "SKIPPED", reason)
    ]


class _AirflowWithPools:
    """Airflow's REST API as `shardline status` asks it: a queued DAG run, and the pools by name."""

    def __init__(self, pools: dict[str, dict]):
        self.pools = pools

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return {"state": "queued"}

    def pool(self, name: str) -> dict | None:
        return self.pools.get(name)


def test_a_planned_step_whose_pool_airflow_lacks_says_so_with_the_fix(aws_env, ledger_table, xgboost_model, tmp_path):
    """fleet.yaml gives the step's instance type a quota; until `shardline fleet sync` creates its pool, Airflow never
    runs the step's watch task, so `shardline status` (and the page) names the pool and the command."""
    from shardline.spec.fleet import FleetSpec

    spec, bucket = stage_step(
        "pooled_test", ledger_table, xgboost_model.parent, tmp_path, {"part-0.parquet": parquet_bytes(10, 0)}
    )
    step_plan.plan(spec, "score", "run-pool", **plan_args(bucket))
    instance_type = spec.step("score").resources.instance_type
    fleet, ref = FleetSpec(quotas={instance_type: 4}), RunRef("pooled_test", "run-pool")

    (waiting,) = OnCall({spec.pipeline: spec}, airflow=_AirflowWithPools({}), fleet=fleet).status(ref).steps
    assert waiting.status == "PLANNED"
    assert waiting.message.endswith(
        f"pool sagemaker-{instance_type} does not exist in Airflow, so this step waits for it forever: "
        "`shardline fleet sync` creates the pools dags/fleet.yaml names"
    ), waiting.message
    synced = _AirflowWithPools({f"sagemaker-{instance_type}": {"slots": 4, "include_deferred": True}})
    (admitted,) = OnCall({spec.pipeline: spec}, airflow=synced, fleet=fleet).status(ref).steps
    assert "does not exist" not in (admitted.message or "")
    (unpooled,) = OnCall({spec.pipeline: spec}, airflow=_AirflowWithPools({})).status(ref).steps
    assert "does not exist" not in (unpooled.message or "")  # no quota for the type: no pool to wait for


# --- `failed` of a run that has nothing left to resubmit ------------------------------------------------------

LOST_HOLD = "the run no longer holds the lock on s3://b/out/"
CALLBACK = "DAG run failed (task_failure); check the failed task's log in Airflow for why"


def _red_run(ledger_table: str, run_id: str, *, scored: bool) -> OnCall:
    """A run the failure callback marked FAILED: its plan failed (no STEP item), or (``scored``) its watch failed
    after every file of its step succeeded."""
    from shardline.ledger.context import LedgerContext
    from shardline.ledger.job_writes import FileOutcome, WorkerLedger
    from shardline.ledger.states import FileStatus
    from shardline.ledger.step_writes import set_run_status

    spec = _spec(ledger_table)
    model = bind_ledger(ledger_table)
    ensure_run(model, "p", run_id)
    if scored:
        ref = StepRef("p", run_id, "score")
        start_attempt(model, ref, 1, [("s3://b/in/a.parquet", 1), ("s3://b/in/b.parquet", 1)])
        worker = WorkerLedger(LedgerContext(ledger_table, "p", run_id, "score", 1, input_uri="s3://b/in/"), "algo-1")
        for name in ("a.parquet", "b.parquet"):
            worker.claim_file(name)
            worker.finish_file(name, FileOutcome(FileStatus.SUCCEEDED, rows_in=5, rows_out=5))
        assert finish_step(model, ref, 1, StepStatus.FAILED, LOST_HOLD)
    set_run_status(model, "p", run_id, StepStatus.FAILED, CALLBACK)
    return OnCall({"p": spec})


def _spec(ledger_table: str):
    return parse_spec(
        {
            "pipeline": "p",
            "ledger_table": ledger_table,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": "s3://b/m.tar.gz", "sha256": "a" * 64},
                    "input": {"prefix": "s3://b/in/"},
                    "output": {"prefix": "s3://b/out/"},
                }
            ],
        },
        "p.yaml",
    )


def test_failed_after_a_plan_failure_says_what_the_run_recorded_and_what_to_run(ledger_table):
    oncall = _red_run(ledger_table, "run-p", scored=False)
    with pytest.raises(Conflict) as caught:
        oncall.failed(RunRef("p", "run-p"))
    text = str(caught.value)
    assert "check the run name" not in text
    assert f"no step of p/run-p was planned, so no file failed: the run ended FAILED: {CALLBACK}" in text
    assert "`shardline rerun p/run-p` plans it again" in text
    with pytest.raises(Conflict, match="step score of p/run-p was never planned"):
        oncall.failed(RunRef("p", "run-p"), "score")
    # A run the ledger does not know is still a wrong name.
    with pytest.raises(NotFound, match="check the run name"):
        oncall.failed(RunRef("p", "run-nope"))


def test_failed_of_a_red_run_whose_files_are_all_scored_says_what_is_missing(ledger_table):
    oncall = _red_run(ledger_table, "run-s", scored=True)
    view = oncall.failed_view(RunRef("p", "run-s"))
    assert view.files == []
    assert view.note.startswith("every file of p/run-s was scored, so there is nothing to resubmit; yet the run ended")
    assert f"step score ended FAILED: {LOST_HOLD}, so its outputs are not committed" in view.note
    assert view.note.endswith(
        "`shardline rerun p/run-s` runs its failed tasks again, which check the outputs and commit them"
    )
    assert oncall.failed_view(RunRef("p", "run-s"), "score").note == view.note
