"""A run's own records (orchestration/run.py), against moto_server with nothing but the ledger and S3: how it ended
(finish_run), a run listed before anything was planned (record_run_status), and the failure callback of one of its
Airflow lives (end_failed_life). No job runs: the cases with real jobs stopped and waited for are
tests/scenarios/test_fail_closed.py's."""

from __future__ import annotations

import boto3

from shardline.ledger.keys import RUN_SK, StepRef, run_pk
from shardline.ledger.partitions import read_holder
from shardline.ledger.records import RunRecord
from shardline.ledger.states import RunStatus, StepStatus
from shardline.ledger.step_reads import list_runs
from shardline.ledger.step_writes import finish_step, set_run_status
from shardline.orchestration import run as run_records
from shardline.orchestration import services
from shardline.orchestration.step import outputs
from shardline.orchestration.step import plan as step_plan
from tests.support.pipelines import plan_request


def plan(spec, bucket: str, run_id: str, step: str = "score", **more):
    output = "out" if step == "score" else "calibrated"
    return step_plan.plan(spec, step, plan_request(run_id, bucket, output, **more))


def run_record(spec, run_id: str) -> RunRecord:
    control = services.ledger_model(spec).Control
    return RunRecord.of(control.get(run_pk(spec.pipeline, run_id), RUN_SK, consistent_read=True))


def holder_of(spec, bucket: str, folder: str):
    return read_holder(services.ledger_model(spec), f"s3://{bucket}/{folder}/")


def markers(bucket: str) -> set[str]:
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"] for o in listed if o["Key"].endswith("/_SUCCESS")}


# -- finish_run -----------------------------------------------------------------------------------------------------


def test_finish_run_records_how_the_run_ended_and_releases_every_prefix_it_held(two_steps):
    spec, bucket = two_steps
    plan(spec, bucket, "run-1", "score")
    plan(spec, bucket, "run-1", "calibrate")
    assert not holder_of(spec, bucket, "out").released  # the control: held while the run runs

    run_records.finish_run(spec, spec.pipeline, "run-1", RunStatus.FAILED, "step calibrate failed")
    record = run_record(spec, "run-1")
    assert (record.status, record.message) == ("FAILED", "step calibrate failed") and record.finished_at is not None
    for folder in ("out", "calibrated"):
        held = holder_of(spec, bucket, folder)
        assert held.released and held.run_id == "run-1", folder
    plan(spec, bucket, "run-2", "score")  # the next run of the partition takes the prefix at once
    assert holder_of(spec, bucket, "out").holds(StepRef(spec.pipeline, "run-2", "score"))


def test_finish_run_of_an_older_run_leaves_the_prefix_a_newer_run_holds(two_steps, monkeypatch):
    from shardline.orchestration import partitions

    spec, bucket = two_steps
    monkeypatch.setenv(partitions.LEASE_ENV, "-1")
    plan(spec, bucket, "run-1")  # its hold runs out at once: run-2 takes the prefix over
    monkeypatch.delenv(partitions.LEASE_ENV)
    plan(spec, bucket, "run-2")
    run_records.finish_run(spec, spec.pipeline, "run-1", RunStatus.SUCCEEDED)
    assert run_record(spec, "run-1").status == "SUCCEEDED"
    assert holder_of(spec, bucket, "out").holds(StepRef(spec.pipeline, "run-2", "score"))


# -- record_run_status ------------------------------------------------------------------------------------------


def test_a_run_not_yet_planned_is_listed_with_its_status_and_why(two_steps):
    spec, _bucket = two_steps
    model = services.ledger_model(spec)
    assert list_runs(model, spec.pipeline) == []  # the control: nothing listed before

    run_records.record_run_status(
        spec, "run-wait", StepStatus.RUNNING, "waiting for input under s3://x/in/", partition="2026-11-22T10:00:00"
    )
    record = run_record(spec, "run-wait")
    assert (record.status, record.message, record.partition) == (
        "RUNNING",
        "waiting for input under s3://x/in/",
        "2026-11-22T10:00:00",
    )
    run_records.record_run_status(spec, "run-wait", RunStatus.FAILED, "no input after 6h")
    record = run_record(spec, "run-wait")
    assert (record.status, record.message, record.partition) == ("FAILED", "no input after 6h", "2026-11-22T10:00:00")
    assert record.finished_at is not None
    # Listed once, however often its status was recorded.
    assert [item.run_id for item in list_runs(model, spec.pipeline)] == ["run-wait"]


def test_a_run_skipped_before_it_planned_is_listed_as_skipped(two_steps):
    spec, _bucket = two_steps
    run_records.record_run_status(spec, "run-skip", RunStatus.SKIPPED, "no input, and input.when_missing is skip")
    record = run_record(spec, "run-skip")
    assert (record.status, record.message) == ("SKIPPED", "no input, and input.when_missing is skip")
    assert [item.run_id for item in list_runs(services.ledger_model(spec), spec.pipeline)] == ["run-skip"]


# -- end_failed_life ------------------------------------------------------------------------------------------------


def test_a_failed_life_with_no_job_running_ends_the_run_and_releases_its_prefixes(two_steps):
    spec, bucket = two_steps
    plan(spec, bucket, "run-1", "score", life=0)
    plan(spec, bucket, "run-1", "calibrate", life=0)
    said = run_records.end_failed_life(spec, "run-1", 0, "DAG run failed")
    assert said == "run run-1 failed; its output prefixes are released", said
    record = run_record(spec, "run-1")
    assert (record.status, record.message) == ("FAILED", "DAG run failed")
    assert holder_of(spec, bucket, "out").released and holder_of(spec, bucket, "calibrated").released


def test_a_failed_life_keeps_the_message_a_failed_step_recorded(two_steps):
    spec, bucket = two_steps
    plan(spec, bucket, "run-1", life=0)
    set_run_status(services.ledger_model(spec), spec.pipeline, "run-1", RunStatus.FAILED, "step score: 3 files failed")
    run_records.end_failed_life(spec, "run-1", 0, "DAG run failed")
    assert run_record(spec, "run-1").message == "step score: 3 files failed"
    assert holder_of(spec, bucket, "out").released


def test_a_failed_life_does_nothing_to_a_run_taken_up_again_since(two_steps):
    """An on-call resubmission took the run up after its life 0 failed and before that life's callback ran: the
    callback leaves the run RUNNING, its prefixes held and its steps' markers where they are."""
    spec, bucket = two_steps
    first = plan(spec, bucket, "run-1", life=0)
    outputs.commit_outputs(spec, first, StepStatus.SUCCEEDED)  # a marker of a step not recorded SUCCEEDED
    set_run_status(services.ledger_model(spec), spec.pipeline, "run-1", RunStatus.RUNNING, taken_up=True)

    said = run_records.end_failed_life(spec, "run-1", 0, "DAG run failed")
    assert "taken up again since its life 0 failed" in said, said
    record = run_record(spec, "run-1")
    assert (record.status, record.message) == ("RUNNING", None)
    assert holder_of(spec, bucket, "out").holds(StepRef(spec.pipeline, "run-1", "score"))
    assert markers(bucket) == {"out/_SUCCESS"}


def test_a_failed_life_withdraws_the_marker_of_a_step_never_recorded_succeeded_and_only_that_one(two_steps):
    """An end that wrote _SUCCESS and died before recording its step leaves no marker behind a failed run; a step
    recorded SUCCEEDED keeps its own."""
    spec, bucket = two_steps
    score = plan(spec, bucket, "run-1", "score", life=0)
    calibrate = plan(spec, bucket, "run-1", "calibrate", life=0)
    outputs.commit_outputs(spec, score, StepStatus.SUCCEEDED)
    assert finish_step(services.ledger_model(spec), score.ref, 1, StepStatus.SUCCEEDED)
    outputs.commit_outputs(spec, calibrate, StepStatus.SUCCEEDED)  # its end died here
    assert markers(bucket) == {"out/_SUCCESS", "calibrated/_SUCCESS"}

    run_records.end_failed_life(spec, "run-1", 0, "the watch task's retries ran out")
    assert markers(bucket) == {"out/_SUCCESS"}


def test_a_run_gone_from_airflow_with_no_job_running_is_ended_and_stops_nothing(two_steps):
    spec, bucket = two_steps
    plan(spec, bucket, "run-1")
    said = run_records.end_run_gone_from_airflow(spec, holder_of(spec, bucket, "out"))
    assert said.startswith("its DAG run no longer exists in Airflow") and "stopping" not in said, said
    assert run_record(spec, "run-1").status == "FAILED"
