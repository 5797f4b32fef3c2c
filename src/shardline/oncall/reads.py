"""What an on-call engineer reads about a run: runs, status, failed. The CLI and the page call these.

Everything is read from the ledger (Queries on a run's partition, never Scans), the backend's job state and,
when the CLI can ask, Airflow's DAG run states; the pipeline specs under the DAGs folder say which table and
backend a pipeline uses. :class:`OnCallReads` holds the pipelines and their Airflow; the run reports, the
resubmission and the run actions each extend it (:class:`shardline.oncall.service.OnCall` is all four in one).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Self

from shardline.backends import JobNotFound
from shardline.decision.fleet import pool_name
from shardline.ledger.keys import StepRef
from shardline.ledger.records import StepRecord
from shardline.ledger.states import FileStatus, StepStatus
from shardline.ledger.step_reads import (
    FILE_DETAIL_ATTRIBUTES,
    RunRecords,
    list_runs,
    read_run,
    read_run_item,
    read_run_items,
    read_step_items,
    runs_started_since,
)
from shardline.oncall.airflow_client import AirflowApiError, AirflowClient
from shardline.oncall.errors import Conflict, NotFound
from shardline.oncall.messages import airflow_left_out, missing_pool_text, not_planned_text, unknown_step
from shardline.oncall.values import FailedView, FileView, RunRef, RunRow, RunView, StepView
from shardline.oncall.views import (
    MISSING_GRACE_SECONDS,
    failed_note,
    file_view,
    missing_job_status,
    missing_rows,
    run_message,
    run_row,
    run_view,
    step_view,
    with_airflow,
    with_setup_error,
)
from shardline.orchestration import services
from shardline.orchestration.step.files import PlanFileError, read_step_files
from shardline.planning import naming
from shardline.spec import PipelineSpec, SpecError, load_spec
from shardline.spec.fleet import FleetSpec, load_fleet, quota_of

# How long past its settle time an interval of a schedule may have no run before `shardline runs` and the page
# list it MISSING (seconds; default views.MISSING_GRACE_SECONDS): the scheduler and its queue take a while.
MISSING_GRACE_ENV = "SHARDLINE_MISSING_GRACE_SECONDS"


def load_specs(dags_folder: Path) -> dict[str, PipelineSpec]:
    """Every valid pipeline spec under ``dags_folder/pipelines``, by pipeline name."""
    folder = dags_folder / "pipelines"
    specs = {}
    for path in sorted(folder.glob("*.y*ml")):
        try:
            spec = load_spec(path)
        except SpecError:
            continue  # Airflow shows it as an import error; it has no runs to act on
        specs[spec.pipeline] = spec
    return specs


def read_step_records(spec: PipelineSpec, ref: StepRef, **kwargs):
    """A step's files (``orchestration.step.files``); a plan file gone or damaged is a :class:`Conflict` that
    says which, instead of a traceback."""
    pipeline, run_id, step = ref
    try:
        return read_step_files(spec, ref, **kwargs)
    except PlanFileError as err:
        raise Conflict(f"step {step} of {pipeline}/{run_id}: {err}") from err


class OnCallReads:
    """The pipelines of one DAGs folder, and what is read about their runs."""

    def __init__(
        self,
        specs: dict[str, PipelineSpec],
        *,
        airflow: AirflowClient | None = None,
        fleet: FleetSpec | None = None,
        now=lambda: dt.datetime.now(dt.UTC),
        sleep=time.sleep,
    ):
        if not specs:
            raise NotFound(
                "no pipeline specs found; pass --dags-folder (or set SHARDLINE_DAGS_FOLDER) to the "
                "folder that holds pipelines/*.yaml"
            )
        self.specs = specs
        self.airflow = airflow
        self.fleet = fleet  # dags/fleet.yaml: the quotas whose pools admit the steps
        self.airflow_warning: str | None = None  # why Airflow's side is missing from the views, if it is
        self.now = now
        self.sleep = sleep  # the one seam a test may replace: waiting for a watch task to end

    @classmethod
    def from_folder(cls, dags_folder: Path, airflow: AirflowClient | None = None) -> Self:
        return cls(load_specs(dags_folder), airflow=airflow, fleet=load_fleet(dags_folder))

    def spec(self, pipeline: str) -> PipelineSpec:
        if pipeline not in self.specs:
            raise NotFound(
                f"no pipeline {pipeline!r} among the specs found ({', '.join(sorted(self.specs))}); "
                "check the name, or pass --dags-folder with the folder that holds its spec"
            )
        return self.specs[pipeline]

    def runs(self, pipeline: str | None = None, limit: int = 20) -> list[RunRow]:
        """Recent runs, newest first, from every ledger table the pipelines use; first, the intervals each listed
        pipeline's schedule owes over its own recent runs' span that no run scores (MISSING rows, with the
        command). Each pipeline's from its own runs: a quiet pipeline's never hide behind a busy one's."""
        specs = [self.spec(pipeline)] if pipeline else list(self.specs.values())
        rows = []
        for table in sorted({s.ledger_table for s in specs}):
            model = services.ledger_model(next(s for s in specs if s.ledger_table == table))
            rows += _run_rows(model, pipeline, limit)
        rows.sort(key=lambda r: r.started_at or "", reverse=True)
        listed = [with_airflow(r, self._airflow_run_state(r.pipeline, r.run_id)) for r in rows[:limit]]
        now = self.now()
        grace = float(os.environ.get(MISSING_GRACE_ENV) or MISSING_GRACE_SECONDS)
        missing = []
        for spec in specs:
            if spec.schedule in (None, "@once"):
                continue  # owes no interval: no read
            own = rows if pipeline else _run_rows(services.ledger_model(spec), spec.pipeline, limit)
            missing += missing_rows(spec, own, now, limit, grace)
        return sorted(missing, key=lambda r: (r.partition or "", r.pipeline), reverse=True) + listed

    def steps_started_since(self, since: dt.datetime, pipelines: Collection[str] | None = None) -> list[StepRecord]:
        """The STEP items of every run of these pipelines (or of those of ``pipelines``) started at or after
        ``since``: one Query of each ledger table's run index, and batched reads of the steps."""
        specs = {name: s for name, s in self.specs.items() if pipelines is None or name in pipelines}
        records = []
        for table in sorted({s.ledger_table for s in specs.values()}):
            model = services.ledger_model(next(s for s in specs.values() if s.ledger_table == table))
            # Each STEP item's key, and its step's instance type in the spec: the type of a step an older Shardline
            # planned, whose plan names none unless a capacity failure moved it.
            types = {
                StepRef(entry.pipeline, entry.run_id, step.name): step.resources.instance_type
                for entry in runs_started_since(model, since.astimezone(dt.UTC).isoformat())
                if (spec := specs.get(entry.pipeline)) is not None and spec.ledger_table == table
                for step in spec.steps
            }
            for ref, record in read_step_items(model, types).items():
                records.append(
                    record if record.instance_type else dataclasses.replace(record, instance_type=types[ref])
                )
        return records

    def _airflow_run_state(self, pipeline: str, run_id: str) -> str | None:
        """The DAG run's state, or None when Airflow is not configured, has no such run, or cannot be
        asked (then :attr:`airflow_warning` says why, once)."""
        if self.airflow is None or self.airflow_warning is not None:
            return None
        try:
            return self.airflow.dag_run(pipeline, run_id).get("state")
        except AirflowApiError as err:
            if err.status == 404:
                return None
            self.airflow_warning = airflow_left_out(err)
            return None

    def _run_records(self, ref: RunRef, *, without_it: str = "") -> tuple[PipelineSpec, RunRecords]:
        """The run's records, read once. A run its table does not hold is a :class:`NotFound` naming the table and
        the command that lists the runs (``without_it``: what the caller cannot do, said after the table)."""
        spec = self.spec(ref.pipeline)
        records = read_run(services.ledger_model(spec), ref.pipeline, ref.run_id)
        if records.run is None:
            raise NotFound(
                f"no run {ref} in table {spec.ledger_table}{without_it}; check the run name: `shardline runs "
                f"--pipeline {ref.pipeline}` lists the recent ones"
            )
        return spec, records

    def status(self, ref: RunRef, *, with_files: bool = False) -> RunView:
        spec, records = self._run_records(ref)
        steps = [self._step_view(spec, ref, s.name, with_files) for s in spec.steps]
        steps = [self._with_missing_pool(spec, s) for s in steps if s is not None]
        return run_view(ref, records.run, steps, self._airflow_run_state(ref.pipeline, ref.run_id))

    def _step_view(self, spec: PipelineSpec, ref: RunRef, step: str, with_files: bool) -> StepView | None:
        records = read_step_records(
            spec, StepRef(ref.pipeline, ref.run_id, step), file_attributes=FILE_DETAIL_ATTRIBUTES
        )
        if records.step is None:
            return None
        record = records.step
        shards = records.shards
        job_name = naming.job_name(ref.pipeline, ref.run_id, step, record.attempt) if record.attempt else None
        job_status = None
        if job_name:
            try:
                job_status = services.backend_for(spec).describe(job_name).status.value
            except JobNotFound:
                job_status = missing_job_status(shards, record.attempt)
        return step_view(
            step,
            record,
            [file_view(step, f) for f in records.settled],
            shards,
            job_name=job_name,
            job_status=job_status,
            now=self.now(),
            with_files=with_files,
        )

    def _with_missing_pool(self, spec: PipelineSpec, view: StepView) -> StepView:
        """A planned step whose instance type has a quota in fleet.yaml waits for its pool; one that Airflow lacks
        holds it back forever, so its line says so, with the fix. Asked only when Airflow is configured."""
        step = spec.step(view.name)
        quota = quota_of(step, self.fleet)
        if view.status != StepStatus.PLANNED or quota is None or self.airflow is None:
            return view
        pool = pool_name(step.resources.instance_type)
        try:
            if self.airflow.pool(pool) is not None:
                return view
        except AirflowApiError:
            return view  # Airflow's side is left out of the views; the run's line says why
        missing = missing_pool_text(pool)
        return dataclasses.replace(view, message=f"{view.message}; {missing}" if view.message else missing)

    def failed(self, ref: RunRef, step: str | None = None) -> list[FileView]:
        """Every file that did not succeed, with its error class, message and attempt; and every file that
        succeeded with rows rejected (tolerance.rows), with the first of them (line or row, and reason)."""
        return self.failed_view(ref, step).files

    def failed_view(self, ref: RunRef, step: str | None = None) -> FailedView:
        """:meth:`failed`'s files, and what is missing when none is left to resubmit and yet the run ended badly. A
        run that planned no step (its plan task failed) is a Conflict saying what its RUN item says, and what to
        run; only a run the ledger does not know is a NotFound."""
        spec = self.spec(ref.pipeline)
        names = [step] if step else [s.name for s in spec.steps]
        if step:
            known_step(spec, step)
        found: list[FileView] = []
        steps: dict[str, StepRecord | None] = {}
        for name in names:
            records = read_step_records(
                spec, StepRef(ref.pipeline, ref.run_id, name), file_attributes=FILE_DETAIL_ATTRIBUTES
            )
            steps[name] = records.step
            # An instance that could not start recorded why on its SHARD item: its files show that reason.
            setup = {s.attempt: s.setup_error for s in records.shards if s.setup_error}
            files = records.settled  # a file's rejects parts count as the file's rows
            found += [
                with_setup_error(v, setup.get(v.attempt))
                for v in (file_view(name, f) for f in files)
                if v.status != FileStatus.SUCCEEDED
            ]
            found += [
                with_rejects(file_view(name, f), spec)
                for f in files
                if f.status == FileStatus.SUCCEEDED and f.rows_rejected
            ]
        run = read_run_item(services.ledger_model(spec), ref.pipeline, ref.run_id)
        if not any(steps.values()):
            if run is None:
                raise NotFound(
                    f"no run {ref} with {'step ' + step if step else 'any step'} planned in table "
                    f"{spec.ledger_table}; check the run name: `shardline runs --pipeline {ref.pipeline}` "
                    "lists the recent ones"
                )
            raise Conflict(not_planned_text(ref, step, run.status, run_message(run)))
        return FailedView(found, failed_note(ref, run, steps, found))


def _run_rows(model, pipeline: str | None, limit: int) -> list[RunRow]:
    """The newest ``limit`` runs of a ledger table (of one pipeline, or of all), each with its RUN item: one Query
    of the run index and one batched read."""
    entries = list_runs(model, pipeline, limit)
    runs = read_run_items(model, [(e.pipeline, e.run_id) for e in entries])
    return [run_row(e.pipeline, e.run_id, e.started_at, runs.get((e.pipeline, e.run_id))) for e in entries]


def known_step(spec: PipelineSpec, step: str) -> None:
    """A :class:`NotFound` naming the pipeline's steps, unless ``step`` is one of them."""
    if step not in {s.name for s in spec.steps}:
        raise NotFound(unknown_step(spec.pipeline, step, [s.name for s in spec.steps]))


REJECTS_SHOWN = 100  # rows of a file's rejects list that `failed` shows; the list itself has them all


def with_rejects(view: FileView, spec: PipelineSpec) -> FileView:
    """A file that succeeded with rows rejected, with the first of them (line or row number, and reason) read
    from its rejects list."""
    if not view.rejects_key:
        return view
    from shardline.orchestration.step.run_report import read_rejects

    try:
        rows = read_rejects(spec, view.rejects_key, REJECTS_SHOWN)
    except Exception as err:  # noqa: BLE001 - the count stands; say why the rows are not shown
        return dataclasses.replace(
            view, error_message=f"its rejects list {view.rejects_key} could not be read: {type(err).__name__}: {err}"
        )
    return dataclasses.replace(view, rejects=rows)
