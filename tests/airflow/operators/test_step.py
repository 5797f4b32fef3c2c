"""The watch task (WatchStepOperator), called as Airflow's task runner calls it, over a pipeline staged on moto_server
and run by the local backend: it submits the planned attempt and defers to StepTrigger carrying it; AWS's "not now" to
a submit is waited out in a BackoffTrigger deferral, and ``submit_planned`` then submits; ``execute_complete`` turns
a finished job's decision into the step's summary, and a timed-out or unreachable one into a failure that says what
to do. And the DAG's failure callback, ``mark_run_failed``.

The jobs that must not finish here start up for an hour (the emulator's ``startup_seconds``, SageMaker's
provisioning): they are in progress for as long as the test looks, and use no CPU, until the test stops them."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from shardline.airflow.operators.step import WatchStepOperator, mark_run_failed
from shardline.airflow.triggers.step import BackoffTrigger, StepTrigger
from shardline.backends.local_fleet import FLEET_ENV
from shardline.decision.policy import Action, JobStatus
from shardline.decision.summary import StepSummary
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.watch import StepEvent, StepWatch, decide_now
from shardline.planning.attempt import Attempt
from tests.airflow.operators.conftest import FILES, PIPELINE, ROWS, FakeDagRun
from tests.support.pipelines import wait_for_job

SLOW_START = {"startup_seconds": 3600}  # a job in progress until stopped, none of its instances running


def plan(staged, run_id: str, life: int | None = None) -> Attempt:
    """Attempt 1 of the run's step, as its plan task leaves it (each run its own output prefix)."""
    return step_plan.plan(
        staged.spec,
        "score",
        step_plan.PlanRequest(
            run_id,
            input_prefix=staged.uri("in"),
            output_prefix=staged.uri(f"out-{run_id}"),
            model_uri=staged.model_uri,
            instance_count=1,
            life=life,
        ),
    )


def watch_operator(staged) -> WatchStepOperator:
    """The step's watch task as ``dag_from_spec`` builds it."""
    return WatchStepOperator(
        task_id="watch_score", spec_path=staged.spec_path, plan_task_id="plan_score", poll_interval=2.5
    )


def as_stored(data: dict) -> dict:
    """A value as Airflow hands it back from its database (XCom, a trigger's kwargs or event): through JSON."""
    return json.loads(json.dumps(data))


@pytest.fixture
def started(staged):
    """The attempts a test starts a slow job for: stopped at its end, whatever happened (a failed test leaves none)."""
    attempts: list[Attempt] = []
    yield attempts
    for attempt in attempts:
        if step_jobs.job_status(staged.spec, attempt) is JobStatus.IN_PROGRESS:
            step_jobs.stop(staged.spec, attempt)
            wait_for_job(staged.spec, attempt)


def stop_and_wait(op: WatchStepOperator, staged, attempt: Attempt) -> None:
    """What Airflow does to a task it kills (``on_kill``): the job it watches is stopped."""
    op.on_kill()
    wait_for_job(staged.spec, attempt)
    assert step_jobs.job_status(staged.spec, attempt) is JobStatus.STOPPED


def test_execute_submits_the_planned_attempt_and_defers_to_the_step_trigger_carrying_it(
    staged, context, monkeypatch, started
):
    monkeypatch.setenv(FLEET_ENV, json.dumps(SLOW_START))
    run_id = "run-submit"
    planned = plan(staged, run_id)
    started.append(planned)
    op = watch_operator(staged)
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context(run_id, xcoms={"plan_score": as_stored(planned.to_xcom())}))
    trigger = deferred.value.trigger
    assert isinstance(trigger, StepTrigger) and deferred.value.method_name == "execute_complete"
    path, kwargs = trigger.serialize()
    assert path == "shardline.airflow.triggers.step.StepTrigger"
    kwargs = as_stored(kwargs)  # as the triggerer builds it
    submitted = Attempt.from_xcom(kwargs["attempt"])
    assert (submitted.run_id, submitted.number, submitted.job_name, submitted.file_count) == (
        run_id,
        1,
        planned.job_name,
        FILES,
    )
    assert submitted.submitted_at is not None and submitted.submitted_at >= before
    assert StepWatch.from_json(kwargs["watch"]) == StepWatch.of(staged.spec, "score")
    assert kwargs["poll_interval"] == 2.5 and kwargs["deadline"] > before
    assert staged.jobs_of(run_id) == [planned.job_name]
    assert step_jobs.job_status(staged.spec, submitted) is JobStatus.IN_PROGRESS
    stop_and_wait(op, staged, submitted)


def test_a_refused_submit_is_waited_out_in_a_backoff_deferral_and_submit_planned_then_submits_it(
    staged, context, monkeypatch, started
):
    monkeypatch.setenv(FLEET_ENV, json.dumps({"refuse_first": {"ThrottlingException": 1}, **SLOW_START}))
    monkeypatch.setenv(step_jobs.SUBMIT_WAIT_ENV, "1")  # the first wait: 1 s, drawn in its upper half
    run_id = "run-refused"
    planned = plan(staged, run_id)
    started.append(planned)
    op = watch_operator(staged)
    ctx = context(run_id, xcoms={"plan_score": as_stored(planned.to_xcom())})
    with pytest.raises(TaskDeferred) as waiting:
        op.execute(ctx)
    trigger = waiting.value.trigger
    assert isinstance(trigger, BackoffTrigger) and waiting.value.method_name == "submit_planned"
    assert 0.5 <= trigger.delay_seconds < 1.0
    carried = as_stored(trigger.serialize()[1]["payload"])
    assert carried["attempt"] == as_stored(planned.to_xcom()) and carried["refusals"] == 1
    assert staged.jobs_of(run_id) == []  # refused: no job, and no attempt spent
    step = staged.step_item(run_id)
    assert (step.attempt, step.message) == (1, None) and "ThrottlingException" in step.waiting

    with pytest.raises(TaskDeferred) as watching:
        op.submit_planned(ctx, carried)  # the trigger's event, after the wait
    trigger = watching.value.trigger
    assert isinstance(trigger, StepTrigger) and watching.value.method_name == "execute_complete"
    submitted = Attempt.from_xcom(trigger.attempt)
    assert (submitted.number, submitted.job_name) == (1, planned.job_name)  # the same attempt, not a next one
    assert staged.jobs_of(run_id) == [planned.job_name]
    assert staged.step_item(run_id).waiting is None
    stop_and_wait(op, staged, submitted)


def test_execute_complete_on_a_finished_job_returns_the_steps_summary(staged, context, monkeypatch):
    monkeypatch.delenv(FLEET_ENV, raising=False)
    run_id = "run-done"
    attempt = step_jobs.submit(staged.spec, plan(staged, run_id)).attempt
    wait_for_job(staged.spec, attempt)
    watch = StepWatch.of(staged.spec, "score")
    decision = decide_now(watch, attempt)  # the trigger's poll
    assert decision.action is Action.ADVANCE, decision
    event = as_stored(StepEvent.of(decision, attempt, watch.policy).to_event())

    returned = watch_operator(staged).execute_complete(context(run_id), event)
    assert as_stored(returned) == returned
    summary = StepSummary.from_xcom(returned)
    assert summary.to_xcom() == returned
    assert (summary.step, summary.files, summary.succeeded, summary.failed, summary.attempts) == (
        "score",
        FILES,
        FILES,
        0,
        1,
    )
    assert (summary.rows_in, summary.rows_out, summary.rows_rejected) == (FILES * ROWS, FILES * ROWS, 0)
    assert (summary.outcome, summary.rows_mismatched_files, summary.failed_files) == (Action.ADVANCE, (), ())
    assert staged.step_item(run_id).status == "SUCCEEDED"
    marker = boto3.client("s3").get_object(Bucket=staged.bucket, Key=f"out-{run_id}/_SUCCESS")["Body"].read()
    assert json.loads(marker)["run_id"] == run_id


def test_a_timed_out_attempt_fails_the_task_saying_what_to_raise_and_how_to_resubmit(
    staged, context, monkeypatch, started
):
    monkeypatch.setenv(FLEET_ENV, json.dumps(SLOW_START))
    run_id = "run-late"
    attempt = step_jobs.submit(staged.spec, plan(staged, run_id)).attempt
    started.append(attempt)
    event = StepEvent(Action.TIMEOUT, "ran past its deadline", attempt, stop_job=True).to_event()
    with pytest.raises(AirflowFailException) as failed:
        watch_operator(staged).execute_complete(context(run_id), as_stored(event))
    text = str(failed.value)
    assert text.startswith(f"step score of {PIPELINE} run {run_id} failed: ran past its deadline."), text
    assert "raise max_runtime_seconds in the spec" in text
    assert text.endswith(f"shardline resubmit {PIPELINE}/{run_id} --step score --all-failed"), text
    step = staged.step_item(run_id)
    assert step.status == "FAILED" and "ran past its deadline" in step.message
    wait_for_job(staged.spec, attempt)  # stopped by the step's end (stop_job), not left to run
    assert step_jobs.job_status(staged.spec, attempt) is JobStatus.STOPPED


def test_an_unreachable_ledger_fails_the_task_with_its_reason_and_records_nothing(staged, context):
    run_id = "run-unreachable"
    attempt = plan(staged, run_id)
    event = StepEvent(Action.UNREACHABLE, "the endpoint was unreachable for 61s", attempt).to_event()
    with pytest.raises(AirflowFailException) as failed:
        watch_operator(staged).execute_complete(context(run_id), as_stored(event))
    assert str(failed.value) == f"step score of {PIPELINE} run {run_id}: the endpoint was unreachable for 61s"
    assert staged.step_item(run_id).status == "PLANNED"  # as it was: the ledger could not be reached


def test_the_dag_failure_callback_fails_the_run_and_frees_its_prefix_unless_a_later_life_took_it_up(staged):
    run_id = "run-callback"
    plan(staged, run_id, life=0)
    mark_run_failed(staged.spec_path, {"run_id": run_id, "dag_run": FakeDagRun(run_id), "reason": "task_failure"})
    run = staged.run_item(run_id)
    assert (run.status, run.message) == (
        "FAILED",
        "DAG run failed (task_failure); check the failed task's log in Airflow for why",
    )
    step_plan.plan(  # the next run of the partition takes the prefix at once
        staged.spec,
        "score",
        step_plan.PlanRequest(
            "run-callback-next",
            input_prefix=staged.uri("in"),
            output_prefix=staged.uri(f"out-{run_id}"),
            model_uri=staged.model_uri,
            instance_count=1,
        ),
    )

    cleared = "run-cleared"
    plan(staged, cleared, life=1)  # cleared once: its tasks run in life 1
    late = {"run_id": cleared, "dag_run": FakeDagRun(cleared, clear_number=0), "reason": "task_failure"}
    mark_run_failed(staged.spec_path, late)  # the callback of life 0, late
    assert staged.run_item(cleared).status == "RUNNING"
