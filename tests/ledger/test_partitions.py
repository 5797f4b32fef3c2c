"""The output prefix's lock: one run writes a prefix at a time, a run that ended or stopped renewing gives way, and
of two takers exactly one wins (conditional writes on moto_server's DynamoDB)."""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor

import pytest

from shardline.ledger.keys import StepRef
from shardline.ledger.partitions import (
    PartitionHeld,
    PartitionHolder,
    PartitionLost,
    PartitionMovedOn,
    free_reason,
    read_holder,
    release,
    renew,
    standing,
    take,
)
from shardline.ledger.states import StepStatus
from shardline.ledger.step_writes import ensure_run, set_run_status
from shardline.ledger.table import bind_ledger

PREFIX = "s3://bucket/scored/2026-11-22T10/"
NOW = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)
A = StepRef("hourly", "scheduled__2026-11-22T10", "score")
B = StepRef("hourly", "manual__2026-11-22T10", "score")


def later(hours: float = 1) -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(hours=hours)


def holder(lease_hours: float) -> PartitionHolder:
    return PartitionHolder("hourly", "r1", "score", 1, NOW + dt.timedelta(hours=lease_hours))


def test_a_hold_stands_while_its_run_runs_and_its_lease_lasts():
    assert free_reason(holder(1), StepStatus.RUNNING, NOW) is None
    assert free_reason(holder(1), None, NOW) is None  # a run planning now has no RUN item yet


@pytest.mark.parametrize("status", [StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED])
def test_a_hold_whose_run_ended_is_free(status):
    assert f"ended ({status})" in free_reason(holder(1), status, NOW)


def test_a_hold_whose_lease_ran_out_is_free_and_says_when():
    assert "ran out at 2026-11-22 11:00:00 UTC" in free_reason(holder(-1), StepStatus.RUNNING, NOW)
    assert free_reason(None, None, NOW) == "nobody holds it"


@pytest.fixture
def model(ledger_table, aws_env):
    m = bind_ledger(ledger_table)
    for ref in (A, B):
        ensure_run(m, ref.pipeline, ref.run_id)
    return m


def test_a_second_run_is_refused_naming_the_holder_and_the_holder_renews(model):
    first = take(model, PREFIX, A, later())
    with pytest.raises(PartitionHeld, match=r"being written by run hourly/scheduled__2026-11-22T10 \(step score\)"):
        take(model, PREFIX, B, later())
    again = take(model, PREFIX, A, later(2))  # the holder's own take renews: the fence stays
    assert (first.fence, again.fence) == (1, 1) and again.lease_until > first.lease_until
    assert standing(model, PREFIX, B)[1] is None


def test_a_run_that_ended_gives_way_and_its_late_renewal_is_refused(model):
    take(model, PREFIX, A, later())
    set_run_status(model, A.pipeline, A.run_id, StepStatus.FAILED, "its watch failed")
    taken = take(model, PREFIX, B, later())
    assert (taken.run_id, taken.fence) == (B.run_id, 2)
    with pytest.raises(PartitionLost, match=r"run hourly/manual__2026-11-22T10 .* holds it now"):
        renew(model, PREFIX, A, later())
    assert not release(model, PREFIX, A)  # not its to release
    assert read_holder(model, PREFIX).run_id == B.run_id
    with pytest.raises(PartitionMovedOn):  # A resubmitted now: refused at once, not left waiting for B
        take(model, PREFIX, A, later(), known_fence=1)


def test_a_hold_nobody_renewed_is_taken_over_with_a_higher_fence(model):
    take(model, PREFIX, A, dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
    assert "ran out" in standing(model, PREFIX, B)[1]
    assert take(model, PREFIX, B, later()).fence == 2


def test_a_released_prefix_is_taken_by_the_next_run_and_never_again_by_the_one_before(model):
    first = take(model, PREFIX, A, later())
    assert release(model, PREFIX, A)
    assert read_holder(model, PREFIX).released  # who wrote it last is kept
    assert take(model, PREFIX, B, later(), known_fence=None).fence == 2
    assert release(model, PREFIX, B)
    # A held it with fence 1; B took it since: A never takes it again (its outputs there may be B's now).
    with pytest.raises(PartitionMovedOn, match=r"written by run hourly/manual__2026-11-22T10 \(step score\) after"):
        take(model, PREFIX, A, later(), known_fence=first.fence)
    assert take(model, PREFIX, B, later(), known_fence=2).fence == 3  # B again: nobody came between


def test_a_renewal_never_shortens_a_lease(model):
    take(model, PREFIX, A, later(3))
    assert renew(model, PREFIX, A, later(1))
    assert read_holder(model, PREFIX).lease_until > later(2)


def test_of_many_runs_taking_a_free_prefix_at_once_exactly_one_wins(model):
    refs = [StepRef("hourly", f"manual__{i}", "score") for i in range(8)]
    for ref in refs:
        ensure_run(model, ref.pipeline, ref.run_id)

    def attempt(ref):
        try:
            return take(model, PREFIX, ref, later())
        except PartitionHeld as err:
            return err

    with ThreadPoolExecutor(len(refs)) as pool:
        results = list(pool.map(attempt, refs))
    winners = [r for r in results if isinstance(r, PartitionHolder)]
    assert len(winners) == 1 and winners[0].fence == 1
    assert {r.holder.run_id for r in results if isinstance(r, PartitionHeld)} == {winners[0].run_id}
    assert read_holder(model, PREFIX).run_id == winners[0].run_id


def test_a_run_that_ended_holds_its_prefix_until_its_job_has_ended_too(model):
    """Whatever ended run A (its failure callback, a task marked failed, a lease run out), its job may still write: the
    prefix is free for run B only once the backend says that job ended (``running`` asks it)."""
    take(model, PREFIX, A, later())
    set_run_status(model, A.pipeline, A.run_id, StepStatus.FAILED, "step score failed")
    still_running = {"sl-a-1"}

    def running(last: PartitionHolder) -> str | None:
        assert last.is_(A)
        return next(iter(still_running), None)

    with pytest.raises(PartitionHeld, match="still being written by job sl-a-1 of run hourly/") as held:
        take(model, PREFIX, B, later(), running=running)
    assert held.value.running_job == "sl-a-1"
    assert standing(model, PREFIX, B, running) == (read_holder(model, PREFIX), None)
    assert read_holder(model, PREFIX).is_(A)  # nothing taken
    still_running.clear()  # the backend says it ended
    assert "ended (FAILED)" in standing(model, PREFIX, B, running)[1]
    assert take(model, PREFIX, B, later(), running=running).is_(B)


def test_a_failure_callback_releases_only_a_run_nobody_took_up_again(model):
    """The release a failure callback makes is checked against the RUN item in one transaction: an on-call engineer
    who took the run up again keeps its hold."""
    from shardline.ledger.partitions import release_after_life
    from shardline.ledger.step_writes import end_life

    take(model, PREFIX, A, later())
    set_run_status(model, A.pipeline, A.run_id, StepStatus.RUNNING, life=0)
    set_run_status(model, A.pipeline, A.run_id, StepStatus.RUNNING, taken_up=True)  # the page's Resubmit, first
    assert not end_life(model, A.pipeline, A.run_id, 0, "DAG run failed")
    assert not release_after_life(model, PREFIX, A, 0)
    assert read_holder(model, PREFIX).holds(A)

    assert end_life(model, A.pipeline, A.run_id, 0 + 1, "DAG run failed")  # its next life fails: that one ends
    set_run_status(model, A.pipeline, A.run_id, StepStatus.RUNNING, taken_up=True)  # ...and is taken up at once
    assert not release_after_life(model, PREFIX, A, 1)
    assert read_holder(model, PREFIX).holds(A)
    assert end_life(model, A.pipeline, A.run_id, 2, "DAG run failed")
    assert release_after_life(model, PREFIX, A, 2)
    assert not read_holder(model, PREFIX).holds(A)
