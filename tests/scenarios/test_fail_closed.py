"""Fail closed, with the faults made for real on a moto_server of the test's own and real local jobs.

- The endpoint's state lost: stopped and started again empty on the same port (and provisioned again, as compose's
  `shardline-init` would), after a step's job ended and while it runs. Absence is never success: the watch fails the
  step naming what is gone, the end refuses to take a missing record for a newer attempt, nothing resubmits in a loop,
  and the report task does not take a summary for facts.
- One attempt at a time: a plan task run again while its attempt's job runs adopts that attempt.
"""

from __future__ import annotations

import boto3
import pytest

from shardline.backends.local import LocalBackend
from shardline.decision.policy import Action
from shardline.errors import LedgerRecordMissing
from shardline.ledger.partitions import PartitionHeld
from shardline.ledger.states import FileStatus, StepStatus
from shardline.ledger.step_writes import set_run_status
from shardline.ledger.table import create_ledger_table
from shardline.local.embedded_aws import start_moto
from shardline.orchestration import run as run_records
from shardline.orchestration import services
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import outputs, watch
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.files import read_step_files
from shardline.orchestration.step.watch import StepEvent
from shardline.waiting import wait_for
from tests.scenarios.test_faults import (
    gated_model,
    plan_and_submit,
    point_aws_at,
    stage,
    stalling_model,
    summing_model,
    wait_until_a_file_is_claimed,
)
from tests.support.faults import MotoServer, moto_server
from tests.support.pipelines import output_ids

pytestmark = pytest.mark.slow

ROWS_PER_FILE = 500
JOB_END_SECONDS = 600  # a safety net only


@pytest.fixture
def own_moto(tmp_path, request):
    """A moto_server of this test's own; ``own_moto.restarted()`` starts it again, empty, on the same port."""
    with moto_server(tmp_path / "moto") as server:
        servers = [server]

        def restarted() -> MotoServer:
            servers[-1].stop()
            log = tmp_path / "moto" / f"moto_server.{len(servers)}.log"
            proc, url = start_moto(log, port=server.port, tethered=True)
            servers.append(MotoServer(proc, url, log))
            return servers[-1]

        server.restarted = restarted
        yield server
        for later in servers[1:]:
            later.stop()


@pytest.fixture
def local_root(tmp_path, monkeypatch):
    root = tmp_path / "local"
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(root))
    yield root
    backend = LocalBackend(root)
    for job_dir in sorted((root / "jobs").glob("sl-*")):
        if not backend.describe(job_dir.name).status.is_terminal:
            backend.stop(job_dir.name)


def provision_again(spec, bucket: str, url: str) -> None:
    """What compose's `shardline-init` does on an empty endpoint: the ledger table and the bucket, no data."""
    create_ledger_table(spec.ledger_table, "us-east-1", url)
    boto3.client("s3").create_bucket(Bucket=bucket)


def job_ended(spec, attempt) -> bool:
    return services.backend_for(spec).describe(attempt.job_name).status.is_terminal


def test_a_step_whose_ledger_is_lost_after_its_job_ended_fails_naming_it_and_never_goes_green(
    own_moto, local_root, tmp_path, monkeypatch
):
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    _, spec, bucket, _ = stage(tmp_path, own_moto.url, summing_model(tmp_path / "model", "pass"), rows_per_file=500)
    attempt = plan_and_submit(spec, bucket, "run-lost")
    assert wait_for(lambda: job_ended(spec, attempt), timeout=JOB_END_SECONDS)
    assert watch.decide_now(spec, attempt).action is Action.ADVANCE  # the control: with its ledger, it is done

    own_moto.restarted()  # empty, and not provisioned yet: the table itself is gone
    decision = watch.decide_now(spec, attempt)
    assert decision.action is Action.FAIL, decision
    assert f"the ledger table {spec.ledger_table} does not exist" in decision.reason

    provision_again(spec, bucket, own_moto.url)  # the table is back, empty
    decision = watch.decide_now(spec, attempt)
    assert decision.action is Action.FAIL, decision
    assert "the ledger has no record of step score of run run-lost" in decision.reason
    assert "shardline rerun faults/run-lost" in decision.reason
    # Acting on it fails the task with that reason: never "a newer attempt moved on", never a summary of nothing.
    with pytest.raises(LedgerRecordMissing, match="has no record of step score"):
        step_end.conclude(spec, StepEvent.of(decision, attempt))
    # The decision made just before the loss, acted on after it: no _SUCCESS, no summary.
    with pytest.raises(LedgerRecordMissing, match="has no record of step score"):
        step_end.conclude(spec, StepEvent(Action.ADVANCE, "all 8 files succeeded", attempt))
    with pytest.raises(LedgerRecordMissing):
        step_end.summarize(spec, attempt.ref)
    # A retried watch task resumes at the step's newest attempt: a missing STEP item is no attempt to resume (it
    # used to be read as attempt 0, so the task resubmitted, was refused as stale, resumed, and so on).
    with pytest.raises(LedgerRecordMissing):
        step_jobs.resume(spec, attempt)
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == [], keys  # nothing claims to be complete


def test_a_step_whose_ledger_is_lost_mid_run_fails_and_its_job_is_stopped(own_moto, local_root, tmp_path, monkeypatch):
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    model = stalling_model(tmp_path / "model", files_before_stalling=1)  # the job cannot end by itself
    _, spec, bucket, _ = stage(tmp_path, own_moto.url, model, rows_per_file=ROWS_PER_FILE)
    attempt = plan_and_submit(spec, bucket, "run-mid")
    wait_until_a_file_is_claimed(spec, attempt, "run-mid")

    own_moto.restarted()
    provision_again(spec, bucket, own_moto.url)
    decision = watch.decide_now(spec, attempt)
    assert decision.action is Action.FAIL, decision
    assert "the ledger has no record of step score of run run-mid" in decision.reason
    assert decision.stop_job  # its job can no longer be fenced: it is stopped, not left writing
    with pytest.raises(LedgerRecordMissing):
        step_end.conclude(spec, StepEvent.of(decision, attempt))
    assert wait_for(lambda: job_ended(spec, attempt), timeout=JOB_END_SECONDS)


def test_a_run_whose_ledger_is_lost_after_its_step_ended_is_not_reported_green(
    own_moto, local_root, tmp_path, monkeypatch
):
    """The report task checks each step's summary against the ledger and the _SUCCESS marker before the run is green:
    a summary in XCom outlives the endpoint's state."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    _, spec, bucket, rows = stage(tmp_path, own_moto.url, summing_model(tmp_path / "model", "pass"), rows_per_file=500)
    attempt = plan_and_submit(spec, bucket, "run-ended")
    assert wait_for(lambda: job_ended(spec, attempt), timeout=JOB_END_SECONDS)
    done = step_end.conclude(spec, StepEvent.of(watch.decide_now(spec, attempt), attempt))
    summary = done.summary.ended(done.action)
    assert (done.action, summary.rows_out) == (Action.ADVANCE, rows)
    assert step_end.confirm_ended(spec, attempt.ref, summary) is None  # the control: its facts stand

    # Another run's marker over this prefix (the partition scored again since): this run's summary no longer stands.
    marker = "out/_SUCCESS"
    s3 = boto3.client("s3")
    mine = s3.get_object(Bucket=bucket, Key=marker)["Body"].read()
    s3.put_object(Bucket=bucket, Key=marker, Body=mine.replace(b'"run-ended"', b'"run-later"'))
    assert "is run run-later's" in step_end.confirm_ended(spec, attempt.ref, summary)
    s3.put_object(Bucket=bucket, Key=marker, Body=mine)

    own_moto.restarted()
    provision_again(spec, bucket, own_moto.url)
    gap = step_end.confirm_ended(spec, attempt.ref, summary)
    assert gap and "the ledger has no record of step score of run run-ended" in gap


def test_a_plan_run_again_while_its_attempt_runs_adopts_it_and_never_starts_a_twin(
    own_moto, local_root, tmp_path, monkeypatch
):
    """A plan task cleared or retried while attempt 1's job runs: it used to plan attempt 2 beside it, and both jobs
    wrote the same keys."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    gate = tmp_path / "gate"
    _, spec, bucket, rows = stage(tmp_path, own_moto.url, gated_model(tmp_path / "model", gate), rows_per_file=200)
    first = plan_and_submit(spec, bucket, "run-twice")
    wait_until_a_file_is_claimed(spec, first, "run-twice")
    again = step_plan.plan(
        spec,
        "score",
        step_plan.PlanRequest(
            "run-twice",
            input_prefix=f"s3://{bucket}/in/",
            output_prefix=f"s3://{bucket}/out/",
            model_uri=f"s3://{bucket}/model/model.tar.gz",
            instance_count=spec.step("score").resources.instance_count,
        ),
    )
    assert (again.number, again.job_name) == (first.number, first.job_name)
    adopted = step_jobs.submit(spec, again).attempt  # what the watch task does with it: the running job is adopted
    assert adopted.job_name == first.job_name
    jobs = sorted(p.name for p in (local_root / "jobs").glob("sl-*"))
    assert jobs == [first.job_name], jobs
    gate.touch()
    assert wait_for(lambda: job_ended(spec, first), timeout=JOB_END_SECONDS)
    assert watch.decide_now(spec, first).action is Action.ADVANCE
    assert sorted(output_ids(bucket)) == list(range(rows))  # every row once


def plan_run(spec, bucket: str, run_id: str):
    return step_plan.plan(
        spec,
        "score",
        step_plan.PlanRequest(
            run_id,
            input_prefix=f"s3://{bucket}/in/",
            output_prefix=f"s3://{bucket}/out/",
            model_uri=f"s3://{bucket}/model/model.tar.gz",
            instance_count=spec.step("score").resources.instance_count,
        ),
    )


def test_a_failed_runs_job_holds_its_prefix_until_it_has_ended_and_its_callback_stops_it(
    own_moto, local_root, tmp_path, monkeypatch
):
    """Run A fails while its job runs (its task marked failed, an outage past the watch): the next run of the partition
    waits for that job's end, never writing beside it; A's failure callback stops the job, waits, then releases."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    gate = tmp_path / "gate"
    _, spec, bucket, rows = stage(tmp_path, own_moto.url, gated_model(tmp_path / "model", gate), rows_per_file=200)
    a = plan_and_submit(spec, bucket, "run-a")
    wait_until_a_file_is_claimed(spec, a, "run-a")
    model = services.ledger_model(spec)
    set_run_status(model, spec.pipeline, "run-a", StepStatus.FAILED, "the watch task was marked failed")
    with pytest.raises(PartitionHeld, match=f"still being written by job {a.job_name}"):
        plan_run(spec, bucket, "run-b")  # the plan task would wait (PartitionTrigger) and say so

    done = run_records.end_failed_life(spec, "run-a", 0, "DAG run failed")
    assert done == f"run run-a failed; its output prefixes are released, after stopping {a.job_name}", done
    assert job_ended(spec, a)
    gate.touch()
    b = step_jobs.submit(spec, plan_run(spec, bucket, "run-b")).attempt
    assert wait_for(lambda: job_ended(spec, b), timeout=JOB_END_SECONDS)
    done = step_end.conclude(spec, StepEvent.of(watch.decide_now(spec, b), b))
    assert done.action is Action.ADVANCE and done.summary.rows_out == rows
    assert sorted(output_ids(bucket)) == list(range(rows))
    assert step_end.confirm_ended(spec, b.ref, done.summary.ended(done.action)) is None


def test_a_resubmission_that_lands_before_the_failure_callback_stands(own_moto, local_root, tmp_path, monkeypatch):
    """The page's Resubmit answers in a second or two, before Airflow runs the failure callback of the life that
    failed: the callback then ends nothing (it used to release the reopened run's hold, and the run ended red)."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    gate = tmp_path / "gate"
    _, spec, bucket, rows = stage(tmp_path, own_moto.url, gated_model(tmp_path / "model", gate), rows_per_file=200)
    first = plan_and_submit(spec, bucket, "run-r")
    wait_until_a_file_is_claimed(spec, first, "run-r")
    step_jobs.stop_and_wait(spec, first)
    step_end.finish(spec, first, Action.FAIL, "job Stopped")  # the watch task fails: the run is FAILED
    keys = [f.input_key for f in read_step_files(spec, first.ref).files if f.status != FileStatus.SUCCEEDED]
    # On-call, before the callback, after the watch task ended (its clear is next): a take-up.
    second = step_jobs.resubmit(spec, first, keys, by_oncall=True, taken_up=True).attempt

    assert "taken up again" in run_records.end_failed_life(spec, "run-r", 0, "DAG run failed")
    assert not job_ended(spec, second)  # its job was not stopped, nor its hold released
    gate.touch()
    assert wait_for(lambda: job_ended(spec, second), timeout=JOB_END_SECONDS)
    done = step_end.conclude(spec, StepEvent.of(watch.decide_now(spec, second), second))
    assert done.action is Action.ADVANCE, done
    assert sorted(output_ids(bucket)) == list(range(rows))


def test_a_resubmission_after_the_failure_callback_takes_the_run_up_again_and_ends_green(
    own_moto, local_root, tmp_path, monkeypatch
):
    """The CLI's resubmit, slower than the page: the callback has marked the run FAILED and released its prefix; the
    resubmission takes the run up again (RUNNING, its prefix held again) and the run ends green, every row once."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    gate = tmp_path / "gate"
    _, spec, bucket, rows = stage(tmp_path, own_moto.url, gated_model(tmp_path / "model", gate), rows_per_file=200)
    first = plan_and_submit(spec, bucket, "run-c")
    wait_until_a_file_is_claimed(spec, first, "run-c")
    step_jobs.stop_and_wait(spec, first)
    step_end.finish(spec, first, Action.FAIL, "job Stopped")
    assert (
        run_records.end_failed_life(spec, "run-c", 0, "DAG run failed")
        == "run run-c failed; its output prefixes are released"
    )
    keys = [f.input_key for f in read_step_files(spec, first.ref).files if f.status != FileStatus.SUCCEEDED]

    second = step_jobs.resubmit(spec, first, keys, by_oncall=True, taken_up=True).attempt
    with pytest.raises(PartitionHeld):  # held again: another run of the partition waits for it
        plan_run(spec, bucket, "run-d")
    gate.touch()
    assert wait_for(lambda: job_ended(spec, second), timeout=JOB_END_SECONDS)
    done = step_end.conclude(spec, StepEvent.of(watch.decide_now(spec, second), second))
    assert done.action is Action.ADVANCE, done
    assert sorted(output_ids(bucket)) == list(range(rows))
    assert step_end.confirm_ended(spec, second.ref, done.summary.ended(done.action)) is None


def test_a_deleted_dag_runs_job_is_stopped_and_its_hold_is_free_once_that_job_has_ended(
    own_moto, local_root, tmp_path, monkeypatch
):
    """A DAG run deleted while its job runs: nobody watches that job, so the next run of the partition ends the run
    in the ledger and stops the job, and plans once the backend says it ended (it used to wait for the job to run to
    its end, or for the hold's lease)."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    gate = tmp_path / "gate"
    _, spec, bucket, rows = stage(tmp_path, own_moto.url, gated_model(tmp_path / "model", gate), rows_per_file=200)
    gone = plan_and_submit(spec, bucket, "run-deleted")
    wait_until_a_file_is_claimed(spec, gone, "run-deleted")
    with pytest.raises(PartitionHeld) as held:
        plan_run(spec, bucket, "run-next")

    done = run_records.end_run_gone_from_airflow(spec, held.value.holder)
    assert done.endswith(f"is ended; stopping its job(s) {gone.job_name}"), done
    assert wait_for(lambda: job_ended(spec, gone), timeout=JOB_END_SECONDS)
    gate.touch()
    nxt = step_jobs.submit(spec, plan_run(spec, bucket, "run-next")).attempt
    assert wait_for(lambda: job_ended(spec, nxt), timeout=JOB_END_SECONDS)
    done = step_end.conclude(spec, StepEvent.of(watch.decide_now(spec, nxt), nxt))
    assert done.action is Action.ADVANCE, done
    assert sorted(output_ids(bucket)) == list(range(rows))


def test_a_success_marker_written_by_an_end_that_died_before_recording_the_step_goes_with_the_failed_run(
    own_moto, local_root, tmp_path, monkeypatch
):
    """The step's end writes _SUCCESS, then records the step SUCCEEDED. An end that died in between (its task
    killed, the ledger unreachable) and a run that then failed leave no marker behind: the failure callback withdraws
    the marker of a step that never recorded SUCCEEDED, and only that one."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    _, spec, bucket, _rows = stage(tmp_path, own_moto.url, summing_model(tmp_path / "model", "pass"), rows_per_file=200)
    attempt = plan_and_submit(spec, bucket, "run-died")
    assert wait_for(lambda: job_ended(spec, attempt), timeout=JOB_END_SECONDS)
    outputs.commit_outputs(spec, attempt, StepStatus.SUCCEEDED)  # what the end wrote before it died
    s3 = boto3.client("s3")
    assert s3.list_objects_v2(Bucket=bucket, Prefix="out/_SUCCESS")["KeyCount"] == 1

    run_records.end_failed_life(spec, "run-died", 0, "the watch task's retries ran out")
    assert s3.list_objects_v2(Bucket=bucket, Prefix="out/_SUCCESS")["KeyCount"] == 0


def test_a_resubmission_that_lands_while_the_failure_callback_stops_the_job_stands(
    own_moto, local_root, tmp_path, monkeypatch
):
    """The third moment: the callback has ended the life and is stopping the run's job when the resubmission lands
    (it waits for that job's end too, then takes the run up). Whichever sees the job's end first, the resubmission's
    attempt runs on, its prefix held, and the run ends green with every row once."""
    import threading

    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    gate = tmp_path / "gate"
    _, spec, bucket, rows = stage(tmp_path, own_moto.url, gated_model(tmp_path / "model", gate), rows_per_file=200)
    first = plan_and_submit(spec, bucket, "run-during")
    wait_until_a_file_is_claimed(spec, first, "run-during")
    step_end.finish(spec, first, Action.FAIL, "the watch task was marked failed")  # the run is FAILED; its job runs

    said: list[str] = []
    callback = threading.Thread(
        target=lambda: said.append(run_records.end_failed_life(spec, "run-during", 0, "failed"))
    )
    callback.start()
    backend = services.backend_for(spec)
    assert wait_for(lambda: backend.describe(first.job_name).status.value != "InProgress", timeout=JOB_END_SECONDS)
    keys = [f.input_key for f in read_step_files(spec, first.ref).files if f.status != FileStatus.SUCCEEDED]
    second = step_jobs.resubmit(spec, first, keys, by_oncall=True, taken_up=True).attempt  # lands mid-callback
    callback.join(timeout=120)
    assert said and "failed" in said[0], said

    assert not job_ended(spec, second)  # the callback stopped only the job of the life that failed
    with pytest.raises(PartitionHeld):  # and the run taken up holds its prefix
        plan_run(spec, bucket, "run-after")
    gate.touch()
    assert wait_for(lambda: job_ended(spec, second), timeout=JOB_END_SECONDS)
    done = step_end.conclude(spec, StepEvent.of(watch.decide_now(spec, second), second))
    assert done.action is Action.ADVANCE, done
    assert sorted(output_ids(bucket)) == list(range(rows))
