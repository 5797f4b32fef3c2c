"""A step's summary, as one typed value between rooms: what its watch task returns (to XCom) and the report task, the
lineage and the Asset event read; and the one mapping from a watch's outcome to the status a step records. Pure."""

from __future__ import annotations

import dataclasses
from typing import Any

from shardline.decision.policy import Action
from shardline.ledger.states import StepStatus

# How the watch's outcome is recorded on the STEP item: the one mapping every room uses.
OUTCOME_STATUS = {
    Action.ADVANCE: StepStatus.SUCCEEDED,
    Action.PARTIAL: StepStatus.PARTIAL,
    Action.FAIL: StepStatus.FAILED,
    Action.TIMEOUT: StepStatus.FAILED,
}


def status_of(action: Action) -> StepStatus:
    """The status a step records for the watch's outcome ``action`` (ADVANCE, PARTIAL, FAIL or TIMEOUT)."""
    return OUTCOME_STATUS[action]


@dataclasses.dataclass(frozen=True)
class FailedFile:
    """A file of the step that failed: its input's s3:// URI, and its error in one line."""

    input: str
    error: str


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """Rows in against rows out for every file of a step, as the ledger had them at its end. ``outcome`` is the
    watch's (ADVANCE or PARTIAL) once its task returns the summary; None while only the ledger was read."""

    step: str
    files: int
    succeeded: int
    failed: int
    rows_in: int
    rows_out: int
    rows_rejected: int
    attempts: int
    rows_mismatched_files: tuple[str, ...] = ()  # succeeded files whose rows in != rows out + rows rejected
    failed_files: tuple[FailedFile, ...] = ()
    report: str | None = None  # where the step's run report is (s3://), None before its plan exists
    reported_at: str = ""  # ISO 8601, UTC
    outcome: Action | None = None
    # on-call accepted outputs the step's blocking checks held back (`shardline approve`): by, at, reason, attempt
    approval: dict[str, Any] | None = None
    # what its end committed to its output table (`output.table`): table, partition, snapshot_id, files and rows
    table: dict[str, Any] | None = None

    @property
    def status(self) -> StepStatus:
        """The status the step recorded: the outcome's (a summary with no outcome yet was read for a done step)."""
        return status_of(self.outcome or Action.ADVANCE)

    def ended(self, outcome: Action) -> StepSummary:
        """This summary as the watch task returns it, with the outcome it acted on."""
        return dataclasses.replace(self, outcome=outcome)

    def to_xcom(self) -> dict[str, Any]:
        """Plain JSON (XCom, the report task's return value, the Asset event's extra)."""
        data = dataclasses.asdict(self)
        data["rows_mismatched_files"] = list(self.rows_mismatched_files)
        data["failed_files"] = [dataclasses.asdict(f) for f in self.failed_files]
        data["outcome"] = self.outcome.value if self.outcome is not None else None
        return data

    @classmethod
    def from_xcom(cls, data: dict[str, Any]) -> StepSummary:
        """Back from :meth:`to_xcom`. A summary an earlier release returned (a run in flight across an upgrade) may lack
        ``rows_rejected`` (0 then) and ``outcome``; any other field missing is an error, never a zero."""
        outcome = data.get("outcome")
        return cls(
            step=data["step"],
            files=int(data["files"]),
            succeeded=int(data["succeeded"]),
            failed=int(data["failed"]),
            rows_in=int(data["rows_in"]),
            rows_out=int(data["rows_out"]),
            rows_rejected=int(data.get("rows_rejected") or 0),
            attempts=int(data["attempts"]),
            rows_mismatched_files=tuple(data["rows_mismatched_files"]),
            failed_files=tuple(FailedFile(f["input"], f["error"]) for f in data.get("failed_files") or ()),
            report=data.get("report"),
            reported_at=data.get("reported_at") or "",
            outcome=Action(outcome) if outcome else None,
            approval=data.get("approval"),
            table=data.get("table"),
        )
