"""How a step that the watch says is done (or failed) ends, from what its end found. Pure: no IO.

The watch decides ADVANCE or PARTIAL from the ledger; before the step is recorded as ended its outputs are checked
(``orchestration.step.end.finish``). Any of these fails it, in this order, with its own reason: the output prefix
is another run's now, an output the ledger does not vouch for, more rejected rows than ``tolerance.rows`` allows,
a blocking output check (``checks``, or ``drift.action: fail``).
"""

from __future__ import annotations

import dataclasses

from shardline.ledger.states import StepStatus

ENDED_WITH_OUTPUTS = (StepStatus.SUCCEEDED, StepStatus.PARTIAL)


@dataclasses.dataclass(frozen=True)
class EndChecks:
    """What a step's end found, each a reason to fail the step, or None."""

    lost: str | None = None  # another run holds the output prefix now: this run vouches for nothing there
    unvouched: str | None = None  # outputs whose object is not the one the ledger recorded
    over_limit: str | None = None  # rows rejected past tolerance.rows
    checks: str | None = None  # a blocking output check failed (checks:, or drift.action: fail), or could not run

    @property
    def first(self) -> str | None:
        """The reason that fails the step: the first check, in the module's order, that found one."""
        return self.lost or self.unvouched or self.over_limit or self.checks


def end_status(status: StepStatus, reason: str, checks: EndChecks) -> tuple[StepStatus, str]:
    """The status and reason a step ends with: the watch's, unless it ended with outputs and a check fails it."""
    if status in ENDED_WITH_OUTPUTS and checks.first is not None:
        return StepStatus.FAILED, checks.first
    return status, reason
