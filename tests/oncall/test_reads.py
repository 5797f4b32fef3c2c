"""What on-call reads of a run (``shardline.oncall.reads``): the runs listed with how each ended, a step's status
with why it waits, and the failed files, or why there are none, of a red run."""

from __future__ import annotations

import pytest

from shardline.ledger.step_writes import ensure_run
from shardline.ledger.table import bind_ledger
from shardline.oncall.errors import Conflict, NotFound
from shardline.oncall.service import OnCall
from shardline.oncall.values import RunRef
from shardline.orchestration import run as run_records
from shardline.orchestration.step import plan as step_plan
from shardline.spec import load_spec
from tests.support.oncall_runs import CALLBACK, LOST_HOLD, red_run
from tests.support.pipelines import parquet_bytes, plan_request, stage_step


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
    step_plan.plan(spec, "score", plan_request("run-pool", bucket))
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


def test_failed_after_a_plan_failure_says_what_the_run_recorded_and_what_to_run(ledger_table):
    oncall = red_run(ledger_table, "run-p", scored=False)
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
    oncall = red_run(ledger_table, "run-s", scored=True)
    view = oncall.failed_view(RunRef("p", "run-s"))
    assert view.files == []
    assert view.note.startswith("every file of p/run-s was scored, so there is nothing to resubmit; yet the run ended")
    assert f"step score ended FAILED: {LOST_HOLD}, so its outputs are not committed" in view.note
    assert view.note.endswith(
        "`shardline rerun p/run-s` runs its failed tasks again, which check the outputs and commit them"
    )
    assert oncall.failed_view(RunRef("p", "run-s"), "score").note == view.note
