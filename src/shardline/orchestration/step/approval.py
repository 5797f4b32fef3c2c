"""Accepting outputs a step's blocking checks held back (``shardline approve``): who, when and why, recorded on the
STEP item, fenced on the facts accepted; the step's end then writes ``_SUCCESS`` and says who approved it.

The approval covers one attempt's held-back outputs: a later attempt (a resubmission, a rerun) is checked again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

from shardline.errors import InvalidArgument
from shardline.ledger.keys import StepRef
from shardline.ledger.records import StepRecord
from shardline.ledger.states import HELD_BACK, StepStatus
from shardline.ledger.step_reads import read_step_item
from shardline.ledger.step_writes import record_approval
from shardline.orchestration import partitions, services
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec

MIN_REASON = 10  # characters: "ok" is no reason anyone can read back later


@dataclasses.dataclass(frozen=True)
class Approval:
    """An on-call engineer's acceptance of one attempt's held-back outputs."""

    by: str
    at: str  # ISO 8601, UTC
    reason: str
    attempt: int
    held_back: str  # the step's message when it was approved: which check, its value and bound

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Approval:
        return cls(**json.loads(text))

    def words(self) -> str:
        return f"approved by {self.by} at {self.at}: {self.reason!r}"


class NotApprovable(InvalidArgument):
    """The step is not one whose held-back outputs can be approved (it says why, and what to do instead)."""


def approval_of(step: StepRecord | None, attempt: int) -> Approval | None:
    """The approval recorded for ``attempt`` of the step, or None (none, or another attempt's)."""
    if step is None or not step.approval:
        return None
    approval = Approval.from_json(step.approval)
    return approval if approval.attempt == attempt else None


def approve(spec: PipelineSpec, ref: StepRef, by: str, reason: str) -> Approval:
    """Record the approval of the step's held-back outputs, and take the run up again: its RUNNING status and its hold
    on the output prefix (another run that took the prefix since refuses it: that run's outputs are there now).
    The caller then lets the DAG run's watch task end the step again. Raises :class:`NotApprovable` naming why not."""
    reason = (reason or "").strip()
    if len(reason) < MIN_REASON:
        raise NotApprovable(
            f"--reason must say why the outputs are right as they are (at least {MIN_REASON} characters)"
        )
    model = services.ledger_model(spec)
    step = read_step_item(model, ref)
    if step is None or not step.plan_json:
        raise NotApprovable(f"step {ref.step} of run {ref.run_id} has no ledger record of a plan")
    if step.status != StepStatus.FAILED.value or not (step.message or "").startswith(HELD_BACK):
        raise NotApprovable(
            f"step {ref.step} is {step.status}"
            + ("" if step.status != StepStatus.FAILED.value else f" for another reason: {step.message}")
            + ": only outputs its blocking checks held back can be approved"
        )
    attempt = Attempt.from_plan(step.plan_json, step.attempt, 0, **ref._asdict())
    approval = Approval(
        by=by,
        at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        reason=reason,
        attempt=attempt.number,
        held_back=step.message,
    )
    # The prefix first: if another run holds it now, nothing is recorded and the run stays as it ended.
    fence = partitions.hold_for_attempt(
        spec, ref, attempt.output_prefix, number=attempt.number, may_take=True, taken_up=True
    )
    partitions.record_fence(spec, ref, fence)
    if not record_approval(model, ref, attempt.number, approval.to_json()):
        raise NotApprovable(f"step {ref.step} moved on (resubmitted or cancelled) while it was being approved")
    return approval
