"""What a run has spent, and whether it may spend more (pure).

Spend is measured, not quoted: each instance from its start (its SHARD item's ``started_at``; from an older worker
that does not record it, its job's submission, which counts more, never less) to its last heartbeat, or to now
while the attempt being watched runs it, times its instance type's price per hour. A running step whose run has
spent past its budget is stopped (``policy.decide``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from shardline.ledger.records import ShardRecord

RUN_SETTING = "budget.run_usd"
DAILY_SETTING = "budget.daily_usd"
RAISE_FACTOR = 1.25  # the budget a stopped step's resubmit command suggests: its projected spend, and a quarter more


@dataclasses.dataclass(frozen=True)
class RunBudget:
    """What a step's watch holds a run to: its budget, what the run's other steps spent before this one began, and
    the price of this step's instances. Carried in the watch (JSON): the triggerer reads no spec."""

    run_usd: float
    spent_before_usd: float
    price_per_hour: float
    setting: str = RUN_SETTING  # where the budget came from: the spec's setting, or an on-call's --budget-usd

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RunBudget | None:
        return cls(**data) if data else None


def instance_seconds(shard: ShardRecord, now: float | None, submitted_at: float | None) -> float:
    """How long one instance has run: from its start to ``now`` while it runs (``now`` given: an instance of the
    attempt being watched that has not ended), else to its last heartbeat."""
    if shard.started_at is not None:
        start = shard.started_at.timestamp()
    elif submitted_at is not None:
        start = submitted_at
    elif shard.heartbeat_at is not None:
        start = shard.heartbeat_at.timestamp()
    else:
        return 0.0
    if now is not None and not shard.finished:
        end = now
    else:
        end = shard.heartbeat_at.timestamp() if shard.heartbeat_at else start
    return max(0.0, end - start)


def spend_of(
    shards: Iterable[ShardRecord],
    price_per_hour: float,
    now: float | None = None,
    submitted_at: float | None = None,
    running_attempt: int | None = None,
) -> float:
    """USD the instances have cost so far at ``price_per_hour``: each to its last heartbeat, but those of
    ``running_attempt`` that have not ended, which cost until ``now``."""
    total = 0.0
    for s in shards:
        running = running_attempt is not None and s.attempt == running_attempt
        total += instance_seconds(s, now if running else None, submitted_at if running else None)
    return total * price_per_hour / 3600


@dataclasses.dataclass(frozen=True)
class OverBudget:
    """A run that has spent past its budget: what the stopped step's message says."""

    spent_usd: float
    budget_usd: float
    setting: str

    def suggested_budget(self, files_done: int, files_total: int) -> float:
        """What to resubmit with: the spend projected over every file, and a quarter more, rounded up to a cent."""
        projected = self.spent_usd * files_total / files_done if files_done else 2 * self.spent_usd
        return math.ceil(max(projected, self.budget_usd) * RAISE_FACTOR * 100) / 100

    def reason(self, files_done: int, files_total: int, rows_done: int, resubmit_command: str) -> str:
        return (
            f"over budget: the run spent ${self.spent_usd:,.4f} of its ${self.budget_usd:,.4f} ({self.setting}), so "
            f"this step was stopped between files with {files_done}/{files_total} file(s) and {rows_done:,} rows "
            f"done (kept); `{resubmit_command}` finishes the unfinished files only"
        )


def over_budget(
    budget: RunBudget, shards: list[ShardRecord], attempt: int, now: float, submitted_at: float | None
) -> OverBudget | None:
    """The run's overspend, when this step's instances (``shards``: every attempt's, ``attempt`` the one running)
    have taken it past its budget."""
    spent = budget.spent_before_usd + spend_of(shards, budget.price_per_hour, now, submitted_at, attempt)
    return OverBudget(spent, budget.run_usd, budget.setting) if spent > budget.run_usd else None
