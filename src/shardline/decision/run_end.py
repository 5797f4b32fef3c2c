"""How a DAG run ends, from what its steps' watch tasks returned. Pure: no IO.

The report task hands the steps' summaries here and records what comes back; it decides nothing itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from shardline.decision.policy import Action
from shardline.decision.summary import StepSummary
from shardline.ledger.states import RunStatus


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """The run's status, or None when every step was skipped (there is nothing to report), and why."""

    status: RunStatus | None
    message: str
    steps_reported: int
    steps_skipped: int


def run_end(summaries: Sequence[StepSummary | None]) -> RunEnd:
    """A run whose steps wrote other numbers of rows than they read FAILED; one with a PARTIAL step is PARTIAL;
    else SUCCEEDED. A step skipped for empty input returned nothing (None) and counts for neither."""
    reported = [s for s in summaries if s]
    skipped = len(summaries) - len(reported)
    mismatched = [list(s.rows_mismatched_files) for s in reported if s.rows_mismatched_files]
    if mismatched:
        return RunEnd(RunStatus.FAILED, rows_mismatch_text(mismatched), len(reported), skipped)
    if not reported:
        return RunEnd(None, "every step was skipped: none had input", 0, skipped)
    partial = any(s.outcome is Action.PARTIAL for s in reported)
    return RunEnd(RunStatus.PARTIAL if partial else RunStatus.SUCCEEDED, "", len(reported), skipped)


def rows_mismatch_text(mismatched: list[list[str]]) -> str:
    files = [key for keys in mismatched for key in keys]
    return (
        f"rows in != rows out + rows rejected for {len(files)} succeeded file(s): {files[:10]}"
        + (f" and {len(files) - 10} more" if len(files) > 10 else "")
        + "; the model must return one prediction per input row: check its script, and the job's log for "
        "these files"
    )
