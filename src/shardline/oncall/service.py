"""What an on-call engineer does to a run: the IO. The CLI and the UI page call :class:`OnCall`.

It holds the on-call services by role, each a plain object over one :class:`~shardline.oncall.reads.OnCallReads`
(the pipelines of a DAGs folder, their Airflow, and the reads: runs, status, failed):
:class:`~shardline.oncall.run_reports.RunReports` (a step's run report),
:class:`~shardline.oncall.resubmission.Resubmission` (resubmit) and :class:`~shardline.oncall.run_actions.RunActions`
(trigger, rerun, cancel). Each request below is one of their methods, named here so that "go to definition" finds it.
What is shown is built in :mod:`shardline.oncall.views`, what is said in :mod:`shardline.oncall.messages`, and what a
resubmission does is decided in :mod:`shardline.decision.resubmit`.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Self

from shardline.oncall.airflow_client import AirflowClient
from shardline.oncall.reads import OnCallReads, load_specs
from shardline.oncall.resubmission import Resubmission
from shardline.oncall.run_actions import RunActions
from shardline.oncall.run_reports import RunReports
from shardline.oncall.values import (
    FailedView,
    FileChoice,
    FileView,
    ResubmitPlan,
    ResubmitResult,
    RunRef,
    RunRow,
    RunView,
    SavedReport,
    StepReportRef,
)
from shardline.spec import PipelineSpec
from shardline.spec.fleet import FleetSpec, load_fleet


class OnCall:
    """On-call reads and actions over the pipelines in one DAGs folder (``OnCall.from_folder``)."""

    def __init__(
        self,
        specs: dict[str, PipelineSpec],
        *,
        airflow: AirflowClient | None = None,
        fleet: FleetSpec | None = None,
        now=lambda: dt.datetime.now(dt.UTC),
        sleep=time.sleep,
    ):
        self.reads = OnCallReads(specs, airflow=airflow, fleet=fleet, now=now, sleep=sleep)
        self.reports = RunReports(self.reads)
        self.resubmissions = Resubmission(self.reads)
        self.actions = RunActions(self.reads)

    @classmethod
    def from_folder(cls, dags_folder: Path, airflow: AirflowClient | None = None) -> Self:
        return cls(load_specs(dags_folder), airflow=airflow, fleet=load_fleet(dags_folder))

    @property
    def specs(self) -> dict[str, PipelineSpec]:
        return self.reads.specs

    @property
    def airflow_warning(self) -> str | None:
        """Why Airflow's side is missing from the views, if it is."""
        return self.reads.airflow_warning

    def spec(self, pipeline: str) -> PipelineSpec:
        return self.reads.spec(pipeline)

    def runs(self, pipeline: str | None = None, limit: int = 20) -> list[RunRow]:
        return self.reads.runs(pipeline, limit)

    def status(self, ref: RunRef, *, with_files: bool = False) -> RunView:
        return self.reads.status(ref, with_files=with_files)

    def failed(self, ref: RunRef, step: str | None = None) -> list[FileView]:
        return self.reads.failed(ref, step)

    def failed_view(self, ref: RunRef, step: str | None = None) -> FailedView:
        return self.reads.failed_view(ref, step)

    def report_refs(self, ref: RunRef, step: str | None = None) -> list[StepReportRef]:
        return self.reports.report_refs(ref, step)

    def open_report(self, ref: RunRef, report: StepReportRef, suffix: str = "html"):
        return self.reports.open_report(ref, report, suffix)

    def save_reports(
        self, ref: RunRef, step: str | None = None, *, root: Path, out: Path | None = None, with_json: bool = False
    ) -> list[SavedReport]:
        return self.reports.save_reports(ref, step, root=root, out=out, with_json=with_json)

    def plan_resubmission(self, ref: RunRef, step: str, choice: FileChoice) -> ResubmitPlan:
        return self.resubmissions.plan_resubmission(ref, step, choice)

    def resubmit(
        self,
        ref: RunRef,
        step: str,
        choice: FileChoice,
        *,
        dry_run: bool = False,
        force: bool = False,
        ledger_only: bool = False,
    ) -> ResubmitResult:
        return self.resubmissions.resubmit(ref, step, choice, dry_run=dry_run, force=force, ledger_only=ledger_only)

    def trigger(self, pipeline: str, start: dt.datetime, conf: dict, *, dry_run: bool = False) -> list[str]:
        return self.actions.trigger(pipeline, start, conf, dry_run=dry_run)

    def rerun(self, ref: RunRef, conf: dict | None = None, *, dry_run: bool = False) -> list[str]:
        return self.actions.rerun(ref, conf, dry_run=dry_run)

    def cancel(self, ref: RunRef, reason: str = "cancelled by on-call") -> list[str]:
        return self.actions.cancel(ref, reason)
