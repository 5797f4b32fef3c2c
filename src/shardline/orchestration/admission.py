"""Before a job starts: does its quote fit what is left of its run's budget, and of its pipeline's day's?

Checked at every submit (a plan's first attempt, a retry, an on-call resubmit): the attempt's quote from the step's
history (:func:`~shardline.orchestration.quote.attempt_quote`, its expected figure) against the run's budget less
what its instances have spent, and the day's less what the pipeline's runs started today have spent. A step with no
history has no quote: it starts, and the watch's measured spend alone holds it to the budget (said in the log).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math

from shardline.decision.budget import DAILY_SETTING, RAISE_FACTOR
from shardline.orchestration.budget import run_budget, run_spent, spent_today
from shardline.orchestration.quote import attempt_quote
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BudgetRefusal:
    """Why a job does not start, and whether it waits for the next day's budget (``wait``) or fails."""

    text: str
    wait: bool = False


def next_day(now: dt.datetime) -> dt.datetime:
    """The next UTC midnight: when a daily budget starts again."""
    return (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)


def budget_refusal(spec: PipelineSpec, attempt: Attempt, now: dt.datetime | None = None) -> BudgetRefusal | None:
    """Why the attempt's job may not start for its budgets, or None when it may (or there are none)."""
    found = run_budget(spec, attempt.run_id)
    daily = spec.budget.daily_usd
    if found is None and daily is None:
        return None
    quote = attempt_quote(spec, attempt)
    if quote is None:
        log.info(
            "step %s: no quote (no successful run to quote from), so its budget is held while it runs, not before",
            attempt.step,
        )
        return None
    expected, step = quote.usd.expected, attempt.step
    quoted = f"step {step}'s job not started: its quote, ${expected:,.4f} (from {len(quote.rates.runs)} earlier run(s))"
    if found is not None:
        budget, setting = found
        spent = run_spent(spec, attempt.run_id)
        if expected > budget - spent:
            raised = math.ceil((spent + quote.usd.high) * RAISE_FACTOR * 100) / 100
            command = naming.budget_resubmit_command(attempt.pipeline, attempt.run_id, step, raised)
            return BudgetRefusal(
                f"{quoted}, would pass what is left of the run's budget: ${max(0.0, budget - spent):,.4f} of "
                f"${budget:,.4f} ({setting}); `{command}` raises it and starts the step"
            )
    if daily is not None:
        now = now or dt.datetime.now(dt.UTC)
        spent = spent_today(spec, now)
        if expected > daily - spent:
            then = "it waits for the next UTC day's budget" if spec.budget.on_exceed == "wait" else "it fails"
            return BudgetRefusal(
                f"{quoted}, would pass what is left of {spec.pipeline}'s budget for {now:%Y-%m-%d} (UTC): "
                f"${max(0.0, daily - spent):,.4f} of ${daily:,.4f} ({DAILY_SETTING}); {then} (budget.on_exceed)",
                wait=spec.budget.on_exceed == "wait",
            )
    return None
