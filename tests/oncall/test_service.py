"""The on-call service (``shardline.oncall.service``) end to end, on moto_server and the local backend, without
Airflow: which runs exist, what failed, which files a resubmission takes, that it is safe to repeat, and a cancel.
(Its reads, resubmissions and run actions alone are in test_reads.py, test_resubmission.py and test_run_actions.py;
the same actions through a real Airflow, DAG run state included, are in test_oncall_airflow.py.)
"""

from __future__ import annotations

import time

import pytest

from shardline.decision.policy import Action, JobStatus, Policy, StepSnapshot, decide
from shardline.ledger.context import StaleAttemptError
from shardline.ledger.keys import StepRef
from shardline.ledger.states import StepStatus
from shardline.ledger.step_reads import read_step
from shardline.ledger.step_writes import start_attempt
from shardline.ledger.table import bind_ledger
from shardline.oncall.errors import OnCallError
from shardline.oncall.service import OnCall
from shardline.oncall.values import FileChoice
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step.files import latest_attempt
from tests.support.pipelines import parquet_bytes, wait_for_job


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
    assert oncall.plan_resubmission(ref, "score", FileChoice(all_failed=True)).files == [
        f"s3://{bucket}/in/part-9.parquet"
    ]
    assert oncall.plan_resubmission(ref, "score", FileChoice(files=["part-0.parquet"])).files == []
    assert oncall.plan_resubmission(ref, "score", FileChoice(instance=failed[0].host)).files == [
        f"s3://{bucket}/in/part-9.parquet"
    ]
    with pytest.raises(OnCallError, match="not an input of step score"):
        oncall.plan_resubmission(ref, "score", FileChoice(files=["nope.parquet"]))
    with pytest.raises(OnCallError, match="has no step 'postprocess'"):
        oncall.plan_resubmission(ref, "postprocess", FileChoice(all_failed=True))

    s3.put_object(Bucket=bucket, Key="in/part-9.parquet", Body=parquet_bytes(250, 9 * 250))  # the fix
    # Without a way to let the DAG run follow the new attempt, nothing is submitted at all.
    with pytest.raises(OnCallError, match=r"Airflow is not configured, so nothing was submitted.*shardline login"):
        oncall.resubmit(ref, "score", FileChoice(all_failed=True))
    assert latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score")).number == 1
    # A step not run by Airflow says so explicitly.
    result = oncall.resubmit(ref, "score", FileChoice(all_failed=True), ledger_only=True)
    assert (result.attempt, result.plan.files, result.complete) == (2, [f"s3://{bucket}/in/part-9.parquet"], True)
    assert "Airflow was left out (--ledger-only)" in result.airflow
    second = oncall.resubmit(
        ref, "score", FileChoice(all_failed=True), force=True, ledger_only=True
    )  # while 2 runs, or after
    assert second.attempt is None
    wait_for_job(spec, latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score")))
    last = oncall.resubmit(ref, "score", FileChoice(all_failed=True), force=True, ledger_only=True)
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


@pytest.mark.slow
def test_a_resubmission_waits_for_the_watch_task_and_cancel_stops_everything(failed_run):
    spec, _, _, ref = failed_run
    oncall = OnCall({spec.pipeline: spec})
    model = bind_ledger(spec.ledger_table)
    # The watch task is retrying on its own: attempt 2 runs every file again.
    latest = latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score"))
    keys = [f.input_key for f in read_step(model, StepRef(ref.pipeline, ref.run_id, "score")).files]
    running = step_jobs.resubmit(spec, latest, keys).attempt
    result = oncall.resubmit(
        ref, "score", FileChoice(all_failed=True), ledger_only=True
    )  # on-call, while attempt 2 runs
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
