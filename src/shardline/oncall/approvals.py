"""A run's output checks, and accepting what they held back: ``checks`` (every check of each step, with its value in
this run and in the last successful partitions) and ``approve`` (the held-back outputs accepted, who, when and why
recorded, and the DAG run's watch task cleared so the step ends again, green, with its ``_SUCCESS``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from shardline.ledger.keys import StepRef
from shardline.oncall.airflow_client import AirflowApiError
from shardline.oncall.errors import BadRequest, Conflict, NotFound, OnCallError
from shardline.oncall.messages import half_done_text
from shardline.oncall.reads import known_step
from shardline.oncall.resubmission import Resubmission
from shardline.oncall.run_reports import RunReports
from shardline.oncall.values import RunRef
from shardline.planning import naming
from shardline.report.model import CheckResult, RunReport

if TYPE_CHECKING:
    from shardline.orchestration.step.approval import Approval


@dataclasses.dataclass(frozen=True)
class CheckRow:
    """One check of a step in a run, and the same check's value in the last successful partitions (newest first)."""

    step: str
    result: CheckResult
    earlier: list[tuple[str, str]]  # (run id, the value as shown), for runs whose report has this check


@dataclasses.dataclass(frozen=True)
class ChecksView:
    ref: str
    rows: list[CheckRow]
    approvals: dict[str, dict]  # step -> its approval, where on-call accepted held-back outputs
    missing: list[str]  # steps with no report yet (not ended, or ended before writing one)

    @property
    def blocked(self) -> list[CheckRow]:
        return [r for r in self.rows if r.result.level == "blocking" and r.result.verdict == "fail"]


@dataclasses.dataclass(frozen=True)
class ApproveResult:
    approval: Approval
    said: str  # what happened to the DAG run
    complete: bool = True


class Approvals(RunReports, Resubmission):
    """``checks`` and ``approve``."""

    def checks_view(self, ref: RunRef, step: str | None = None) -> ChecksView:
        """Each step's checks from its run report, against the last ``checks.last`` successful partitions'."""
        from shardline.orchestration.step.run_report import TREND_RUNS, previous_reports  # numpy: when it runs

        spec = self.spec(ref.pipeline)
        rows, approvals, missing = [], {}, []
        for report_ref in self.report_refs(ref, step):
            try:
                report = RunReport.from_json(self._read_report(ref, report_ref, "json"))
            except NotFound:
                missing.append(report_ref.step)
                continue
            last = spec.step(report_ref.step).checks.last
            found = previous_reports(spec, StepRef(ref.pipeline, ref.run_id, report_ref.step), max(TREND_RUNS, last))
            earlier = [(run_id, past) for run_id, past in found if not past.approval][:last]  # as the bands read them
            for result in report.checks:
                values = [
                    (run_id, found.shown)
                    for run_id, past in earlier
                    if (found := next((c for c in past.checks if c.check == result.check), None))
                ]
                rows.append(CheckRow(report_ref.step, result, values))
            if report.approval:
                approvals[report_ref.step] = report.approval
        return ChecksView(str(ref), rows, approvals, missing)

    def make_baseline(self, pipeline: str, step: str, source: str, by: str) -> dict:
        """Profile ``source`` and keep it as ``step``'s reference for its PSI checks (checks.reference: baseline)."""
        from shardline.errors import InvalidArgument
        from shardline.orchestration.step.baseline import make_baseline

        spec = self.spec(pipeline)
        known_step(spec, step)
        try:
            return make_baseline(spec, step, source, by)
        except (InvalidArgument, OSError) as err:
            raise BadRequest(str(err)) from err

    def approve(self, ref: RunRef, step: str, reason: str, by: str) -> ApproveResult:
        """Accept the outputs ``step``'s blocking checks held back, and let the DAG run end the step again.

        All or nothing on Airflow's side first, as a resubmission: its watch task must have ended and this caller
        must be allowed to clear it, or nothing is recorded."""
        from shardline.orchestration.partitions import PartitionHeld, PartitionLost, PartitionMovedOn
        from shardline.orchestration.step.approval import NotApprovable, approve

        spec = self.spec(ref.pipeline)
        known_step(spec, step)
        watch = f"watch_{step}"
        state = self._watch_state(ref, watch)
        if state not in ("failed", "upstream_failed"):
            raise Conflict(
                f"the {watch} task of DAG run {ref.run_id} is {state}: only a step that ended held back by its checks "
                "can be approved"
            )
        self._may_clear(ref, watch)
        try:
            approval = approve(spec, StepRef(ref.pipeline, ref.run_id, step), by, reason)
        except NotApprovable as err:
            raise Conflict(str(err)) from err
        except (PartitionHeld, PartitionMovedOn, PartitionLost) as err:
            raise Conflict(
                f"{err}: the held-back outputs are no longer this run's to approve; score the partition again: "
                + naming.rerun_command(ref.pipeline, ref.run_id)
            ) from err
        try:
            said = self._rerun_watch(ref, watch)
        except (AirflowApiError, OnCallError) as err:
            again = naming.approve_command(ref.pipeline, ref.run_id, step)
            return ApproveResult(approval, half_done_text(None, None, watch, err, again), complete=False)
        return ApproveResult(approval, said)
