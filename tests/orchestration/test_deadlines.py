"""A run that missed its deadline (orchestration/deadlines.py), recorded on its RUN item in moto_server's ledger:
counted each time, and made visible even for a run no plan task has started yet."""

from __future__ import annotations

from shardline.ledger.keys import RUN_SK, run_pk
from shardline.ledger.records import RunRecord
from shardline.ledger.states import RunStatus
from shardline.ledger.step_reads import list_runs
from shardline.orchestration import run as run_records
from shardline.orchestration import services
from shardline.orchestration.deadlines import record_missed
from shardline.orchestration.step import plan as step_plan
from tests.support.pipelines import plan_request


def run_record(spec, run_id: str) -> RunRecord:
    control = services.ledger_model(spec).Control
    return RunRecord.of(control.get(run_pk(spec.pipeline, run_id), RUN_SK, consistent_read=True))


def test_a_planned_run_that_missed_its_deadline_is_marked_and_each_miss_counted(two_steps):
    spec, bucket = two_steps
    step_plan.plan(spec, "score", plan_request("run-1", bucket))
    assert (run_record(spec, "run-1").missed_deadline, run_record(spec, "run-1").deadline_misses) == (None, 0)

    record_missed(spec, "run-1", "2026-11-22 13:00 UTC, step score running")
    record = run_record(spec, "run-1")
    assert (record.missed_deadline, record.deadline_misses) == ("2026-11-22 13:00 UTC, step score running", 1)
    assert record.status == "RUNNING"  # a miss ends nothing

    record_missed(spec, "run-1", "2026-11-22 14:00 UTC, step score running")  # Airflow fired the alert again
    record = run_record(spec, "run-1")
    assert (record.missed_deadline, record.deadline_misses) == ("2026-11-22 14:00 UTC, step score running", 2)


def test_a_run_late_before_its_first_plan_task_is_made_and_listed_with_the_miss(two_steps):
    spec, _bucket = two_steps
    record_missed(spec, "run-queued", "2026-11-22 13:00 UTC, queued", partition="2026-11-22T10:00:00")
    record = run_record(spec, "run-queued")
    assert (record.status, record.partition, record.missed_deadline, record.deadline_misses) == (
        "RUNNING",
        "2026-11-22T10:00:00",
        "2026-11-22 13:00 UTC, queued",
        1,
    )
    assert [item.run_id for item in list_runs(services.ledger_model(spec), spec.pipeline)] == ["run-queued"]


def test_a_miss_of_a_run_that_ended_is_recorded_and_leaves_its_end_alone(two_steps):
    spec, _bucket = two_steps
    run_records.record_run_status(spec, "run-done", RunStatus.FAILED, "step score failed")
    record_missed(spec, "run-done", "2026-11-22 13:00 UTC, failed")
    record = run_record(spec, "run-done")
    assert (record.status, record.message, record.deadline_misses) == ("FAILED", "step score failed", 1)
