"""When a run's partition is complete enough to plan (pure: the clock is an argument)."""

from __future__ import annotations

import datetime as dt

import pytest

from shardline.decision import policy, readiness
from shardline.decision.policy import Action, Policy
from shardline.ledger.states import FileStatus

END = dt.datetime(2026, 11, 22, 11, tzinfo=dt.UTC)


def test_a_scheduled_run_plans_its_settle_time_after_its_interval_ends():
    at = readiness.ready_at(run_type="scheduled", interval_end=END, settle_seconds=300, ready_marker=None)
    assert at == END + dt.timedelta(minutes=5)


@pytest.mark.parametrize("run_type", ["manual", "backfill", "asset_triggered", ""])
def test_a_run_a_person_chose_waits_for_its_interval_to_settle_too(run_type):
    # A partition is as incomplete for a manual run as for the scheduled one until it has settled; a manual run
    # of a long-past interval finds that moment passed and plans at once.
    at = readiness.ready_at(run_type=run_type, interval_end=END, settle_seconds=300, ready_marker=None)
    assert at == END + dt.timedelta(minutes=5)


@pytest.mark.parametrize("run_type", ["manual", "asset_triggered"])
def test_a_run_of_an_unscheduled_pipeline_plans_at_once(run_type):
    assert (
        readiness.ready_at(
            run_type=run_type, interval_end=END, settle_seconds=300, ready_marker=None, scheduled_pipeline=False
        )
        is None
    )


def test_a_manual_run_at_an_interval_boundary_with_the_interval_before_blocks_the_next_scheduled_run():
    blocks = readiness.blocks_the_next_interval
    hour = dt.timedelta(hours=1)
    # Airflow's own inference: a manual run at 11:00 scores 10:00-11:00 and holds 11:00, the next run's date.
    assert blocks(run_type="manual", scheduled_pipeline=True, logical_date=END, interval_end=END)
    # `shardline trigger --partition 10:00`: logical date 10:00, interval 10:00-11:00, as the scheduled run's.
    assert not blocks(run_type="manual", scheduled_pipeline=True, logical_date=END - hour, interval_end=END)
    # The UI form's default, now: off any boundary.
    assert not blocks(
        run_type="manual", scheduled_pipeline=True, logical_date=END + dt.timedelta(minutes=34), interval_end=END
    )
    assert not blocks(run_type="scheduled", scheduled_pipeline=True, logical_date=END - hour, interval_end=END)
    assert not blocks(run_type="manual", scheduled_pipeline=False, logical_date=END, interval_end=END)
    text = readiness.blocks_text("hourly", "manual__x", END, END - hour)
    assert "shardline trigger hourly --partition 2026-11-22T10:00" in text and "MISSING" in text


def test_a_ready_marker_replaces_the_settle_time():
    assert (
        readiness.ready_at(run_type="scheduled", interval_end=END, settle_seconds=300, ready_marker="_SUCCESS") is None
    )


def test_no_settle_time_means_the_interval_end_itself():
    assert readiness.ready_at(run_type="scheduled", interval_end=END, settle_seconds=0, ready_marker=None) == END


POLICY = Policy(
    max_attempts=3,
    backoff_seconds=0,
    backoff_multiplier=1,
    max_failed_files=5,
    max_failed_percent=50,
    heartbeat_timeout_seconds=60,
)
LATE = ["s3://b/in/late-2.parquet", "s3://b/in/late-1.parquet"]


def test_inputs_that_landed_after_planning_go_to_the_next_attempt():
    decision = policy.for_late_inputs(LATE, 1, POLICY, "s3://b/in/")
    assert decision.action is Action.RESUBMIT
    assert decision.retry_files == tuple(sorted(LATE))
    assert decision.delay_seconds == 0
    assert "late-1.parquet" in decision.reason and "attempt 2 of 3" in decision.reason


def test_late_inputs_fail_the_step_naming_them_when_no_attempt_is_left_whatever_the_tolerance():
    decision = policy.for_late_inputs(LATE, 3, POLICY, "s3://b/in/")
    # The tolerance (5 files) would allow two failures: late inputs are never tolerated into a green step.
    assert decision.action is Action.FAIL
    assert [f.input_key for f in decision.failed_files] == sorted(LATE)
    assert {f.status for f in decision.failed_files} == {FileStatus.FAILED}
    assert {f.error_class for f in decision.failed_files} == {policy.LATE_INPUT_ERROR}
    assert "retry.max_attempts" in decision.reason


def test_a_scheduled_runs_partition_is_due_at_its_intervals_end_even_when_it_was_created_late():
    # A scheduler that was down does not move the deadline: the partition was owed at its interval's end.
    late = END + dt.timedelta(hours=2)
    assert readiness.due_at(run_type="scheduled", interval_end=END, triggered_at=late) == END


@pytest.mark.parametrize("run_type", ["manual", "operator_triggered", "asset_triggered"])
def test_any_other_runs_partition_is_due_when_it_was_triggered_if_that_is_later(run_type):
    # A manual run of last week's hour is not late the moment it starts; a manual run of an hour still going is
    # due at its end, as the scheduled run would be.
    later = END + dt.timedelta(days=7)
    assert readiness.due_at(run_type=run_type, interval_end=END, triggered_at=later) == later
    earlier = END - dt.timedelta(minutes=30)
    assert readiness.due_at(run_type=run_type, interval_end=END, triggered_at=earlier) == END


def test_a_backfill_has_no_deadline():
    # Airflow creates a backfill's runs at once and runs max_active_runs of them at a time: counted from their
    # creation, most would be "late" while they wait their turn.
    later = END + dt.timedelta(days=7)
    assert readiness.due_at(run_type="backfill", interval_end=END, triggered_at=later) is None


def test_a_run_with_no_interval_is_due_when_it_was_triggered_and_one_with_neither_never():
    assert readiness.due_at(run_type="manual", interval_end=None, triggered_at=END) == END
    assert readiness.due_at(run_type="scheduled", interval_end=None, triggered_at=None) is None
