"""A run's spend and its budget, by hand: each instance from its start to its last heartbeat (or now, while the
watched attempt runs it), and what ``decide()`` does with a step past its budget."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from shardline.decision.budget import RunBudget, over_budget, spend_of
from shardline.decision.policy import Action, JobStatus, decide, needs_files
from shardline.ledger.records import ShardRecord
from shardline.ledger.states import ShardStatus
from tests.decision.test_policy import POLICY, R, S, files, snap

T0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)


def shard(host: str, attempt: int, started: float | None, beat: float, status=ShardStatus.RUNNING) -> ShardRecord:
    return ShardRecord(
        host,
        attempt,
        status=status.value,
        heartbeat_at=T0 + dt.timedelta(seconds=beat),
        started_at=T0 + dt.timedelta(seconds=started) if started is not None else None,
    )


def test_spend_by_hand_ended_instances_to_their_last_heartbeat_running_ones_to_now():
    now = (T0 + dt.timedelta(seconds=100)).timestamp()
    ended = shard("algo-1", 1, 0, 40, ShardStatus.STOPPED)  # 40 s
    earlier = shard("algo-2", 1, 10, 30)  # an earlier attempt's, silent since: to its last heartbeat, 20 s
    running = shard("algo-1", 2, 50, 60)  # the watched attempt's, still running: to now, 50 s
    # $36/h = a cent a second: (40 + 20 + 50) s = $1.10
    assert spend_of([ended, earlier, running], 36.0, now, None, running_attempt=2) == pytest.approx(1.10)
    # read after the fact (no attempt watched): each to its last heartbeat, (40 + 20 + 10) s
    assert spend_of([ended, earlier, running], 36.0) == pytest.approx(0.70)
    # an older worker that recorded no start is counted from its job's submission: more, never less
    old = shard("algo-1", 2, None, 60)
    assert spend_of([old], 36.0, now, (T0 - dt.timedelta(seconds=20)).timestamp(), 2) == pytest.approx(1.20)


def test_over_budget_counts_what_the_other_steps_spent_and_suggests_a_budget_for_every_file():
    now = (T0 + dt.timedelta(seconds=100)).timestamp()
    budget = RunBudget(run_usd=1.0, spent_before_usd=0.25, price_per_hour=36.0)
    assert over_budget(budget, [shard("algo-1", 1, 30, 60)], 1, now, None) is None  # 0.25 + 0.70 <= 1
    over = over_budget(budget, [shard("algo-1", 1, 20, 60)], 1, now, None)  # 0.25 + 0.80
    assert over.spent_usd == pytest.approx(1.05) and over.budget_usd == 1.0 and over.setting == "budget.run_usd"
    # 3 of 10 files done for $1.05: $3.50 for all, and a quarter more
    assert over.suggested_budget(3, 10) == pytest.approx(4.38)
    assert over.suggested_budget(0, 10) == pytest.approx(2.63)  # nothing done yet: twice the spend, and a quarter
    reason = over.reason(3, 10, 600, "shardline resubmit p/r --step s --budget-usd 4.38")
    assert reason == (
        "over budget: the run spent $1.0500 of its $1.0000 (budget.run_usd), so this step was stopped between files "
        "with 3/10 file(s) and 600 rows done (kept); `shardline resubmit p/r --step s --budget-usd 4.38` finishes "
        "the unfinished files only"
    )
    assert RunBudget.from_json(budget.to_json()) == budget and RunBudget.from_json(None) is None


def test_a_running_step_over_budget_is_stopped_and_fails_a_finished_one_ends_as_it_would():
    why = "over budget: ..."
    running = dataclasses.replace(snap(JobStatus.IN_PROGRESS, files(S, R, R)), over_budget=why)
    assert needs_files(dataclasses.replace(running, files=None), POLICY)
    decision = decide(running, POLICY)
    assert (decision.action, decision.reason, decision.stop_job) == (Action.FAIL, why, True)
    # the job ended with files left: no retry spends past the budget
    stopped = dataclasses.replace(snap(JobStatus.STOPPED, files(S, R, R)), over_budget=why)
    assert decide(stopped, POLICY).action is Action.FAIL and not decide(stopped, POLICY).stop_job
    # every file done: the money is spent, and the outputs stand
    done = dataclasses.replace(snap(JobStatus.COMPLETED, files(S, S, S)), over_budget=why)
    assert decide(done, POLICY).action is Action.ADVANCE
