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
from shardline.ledger.step_writes import record_approval, withdraw_approval
from shardline.orchestration import partitions, services
from shardline.planning.attempt import Attempt
from shardline.report.model import CheckResult, RunReport
from shardline.s3uri import parse_s3_uri
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
    checks: tuple[str, ...] = ()  # the blocking checks that failed then: the approval covers these, and no other

    def covers(self, failed: list[str]) -> bool:
        """Whether the blocking checks failing now are all ones this approval accepted."""
        return set(failed) <= set(self.checks)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Approval:
        data = json.loads(text)
        return cls(**{**data, "checks": tuple(data.get("checks") or ())})

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
    """Record the approval of the step's held-back outputs (the blocking checks its run report says failed, none of
    them uncomputable), and take the run up again: its RUNNING status and its hold on the output prefix (another run
    that took the prefix since refuses it, and the approval is withdrawn: that run's outputs are there now). The
    caller then lets the DAG run's watch task end the step again. Raises :class:`NotApprovable` naming why not."""
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
    blocked = _blocked_checks(spec, attempt)
    approval = Approval(
        by=by,
        at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        reason=reason,
        attempt=attempt.number,
        held_back=step.message,
        checks=tuple(c.check for c in blocked),
    )
    # Fenced on the facts accepted first: nothing else changes unless the step is still held back at this attempt.
    if not record_approval(model, ref, attempt.number, approval.to_json()):
        raise NotApprovable(f"step {ref.step} moved on (resubmitted or cancelled) while it was being approved")
    try:  # then the run takes its prefix up again: another run that holds it now refuses it (and the approval goes)
        fence = partitions.hold_for_attempt(
            spec, ref, attempt.output_prefix, number=attempt.number, may_take=True, taken_up=True
        )
    except BaseException:
        withdraw_approval(model, ref, attempt.number)
        raise
    partitions.record_fence(spec, ref, fence)
    return approval


UNCOMPUTED = frozenset({"missing", "not computed", "not computable", "no value"})


def _blocked_checks(spec: PipelineSpec, attempt: Attempt) -> list[CheckResult]:
    """The blocking checks that held the attempt's outputs back, from its run report. One that could not be computed
    is refused: an approval accepts values as they are, never their absence."""
    bucket, key = parse_s3_uri(attempt.report_uri("json"))
    try:
        body = services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"].read()
        report = RunReport.from_json(body)
    except Exception as err:
        raise NotApprovable(
            f"the run report {attempt.report_uri('json')} cannot be read ({type(err).__name__}: {err}), so which "
            "checks held the outputs back cannot be told: nothing was approved"
        ) from err
    blocked = [c for c in report.checks if c.level == "blocking" and c.verdict == "fail"]
    if not blocked:
        raise NotApprovable(f"the run report of step {attempt.step} names no blocking check that failed")
    absent = [c for c in blocked if c.shown in UNCOMPUTED]
    if absent:
        raise NotApprovable(
            f"{absent[0].check} could not be computed ({absent[0].bound}): an approval accepts values, not their "
            "absence; fix that, or the check, and score the partition again"
        )
    return blocked
