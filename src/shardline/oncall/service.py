"""What an on-call engineer does to a run: the IO. The CLI and the UI page call these.

Everything is read from the ledger (Queries on a run's partition, never Scans) and the
backend's job state; the pipeline specs under the DAGs folder say which table and
backend a pipeline uses. Resubmitting starts a new fenced attempt with exactly the
chosen files and, when the DAG run had already finished, clears the step's watch task
through Airflow's REST API so the run's state follows the resubmission.

What is shown and what is decided is not here: the views, the resubmit policy and every message
are pure functions in :mod:`shardline.oncall.views`, and which files a resubmission takes in
:mod:`shardline.oncall.selection`. This module reads, asks them, and acts on the answer.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Sequence
from pathlib import Path

from shardline.backends import JobNotFound
from shardline.ledger.keys import RUN_SK, run_pk
from shardline.ledger.states import SETUP_ERROR, STEP_TERMINAL, FileStatus, StepStatus
from shardline.ledger.step_reads import FILE_DETAIL_ATTRIBUTES, list_runs, read_run, read_step
from shardline.ledger.step_writes import StaleOrchestratorError, cancel_step, set_run_status
from shardline.oncall import selection
from shardline.oncall.airflow_client import HOW_TO_CONFIGURE, INVALID_TOKEN, AirflowApiError, AirflowClient
from shardline.oncall.errors import BadRequest, Conflict, NotFound, OnCallError, Refused, Unavailable
from shardline.oncall.views import (
    CANCEL_LINES,
    FINISHED_RUN_STATES,
    FINISHED_TASK_STATES,
    FileView,
    Next,
    ResubmitPlan,
    ResubmitResult,
    RunRecord,
    RunRef,
    RunRow,
    RunView,
    SavedReport,
    ShardRecord,
    StepRecord,
    StepReportRef,
    StepView,
    airflow_left_out,
    choose_next,
    cleared_text,
    dry_run_text,
    file_view,
    followed_text,
    half_done_text,
    local_report_path,
    local_root_mismatch,
    missing_job_status,
    no_reports_text,
    not_finished_text,
    out_needs_step_text,
    report_missing_text,
    report_not_planned_text,
    resubmit_command,
    run_row,
    run_view,
    step_view,
    unknown_step,
    with_airflow,
    with_setup_error,
)
from shardline.orchestration import services
from shardline.orchestration.step_files import PlanFileError, read_step_files
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import parse_s3_uri
from shardline.spec import PipelineSpec, SpecError, load_spec
from shardline.waiting import wait_for

# How long a resubmission waits for a watch task that is about to end before it clears it, and how often
# it asks Airflow meanwhile.
WATCH_WAIT_SECONDS = 60.0
WATCH_POLL_SECONDS = 1.0


def conf_problem(spec: PipelineSpec, conf: dict | None) -> str | None:
    """Why a run with this conf would be refused by the trigger form's Params or fail at its plan task (the
    checks ``PlanStepOperator`` makes), or None."""
    from shardline.spec.conf import (
        input_override_problem,
        model_version_problem,
        param_type_problem,
        unknown_conf_problem,
    )

    conf = conf or {}
    if spec.unknown_conf == "fail" and (unknown := unknown_conf_problem(conf)):
        return unknown
    if problem := param_type_problem(conf):
        return problem
    first = spec.steps[0]
    override = str(conf.get("input_prefix") or "").strip()
    if override and (problem := input_override_problem(first, override)):
        return problem
    version = str(conf.get("model_version") or "").strip() or first.model.version
    return model_version_problem(first, version)


def rerun_not_finished_text(ref: RunRef, state: str | None) -> str:
    return (
        f"DAG run {ref.run_id} is {state or 'in no known state'}, not finished, so nothing was rerun: wait for it "
        f"to end (`shardline status {ref}`), or stop it with `shardline cancel {ref}` first"
    )


def rerun_conf_text(ref: RunRef, problem: str, *, given: bool) -> str:
    whose = "the conf given" if given else f"the conf of DAG run {ref.run_id}"
    return (
        f"{whose} would fail the plan task again ({problem}), so nothing was rerun: pass a valid one with "
        f"`shardline rerun {ref} --conf '{{...}}'`"
    )


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


def _read_step_files(spec: PipelineSpec, pipeline: str, run_id: str, step: str, **kwargs):
    """A step's files (``orchestration.step_files``); a plan file gone or damaged is a :class:`Conflict` that
    says which, instead of a traceback."""
    try:
        return read_step_files(spec, pipeline, run_id, step, **kwargs)
    except PlanFileError as err:
        raise Conflict(f"step {step} of {pipeline}/{run_id}: {err}") from err


class OnCall:
    """On-call actions over the pipelines in one DAGs folder."""

    def __init__(
        self,
        specs: dict[str, PipelineSpec],
        *,
        airflow: AirflowClient | None = None,
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
        self.airflow_warning: str | None = None  # why Airflow's side is missing from the views, if it is
        self._now = now
        self._sleep = sleep  # the one seam a test may replace: waiting for a watch task to end

    @classmethod
    def from_folder(cls, dags_folder: Path, airflow: AirflowClient | None = None) -> OnCall:
        return cls(load_specs(dags_folder), airflow=airflow)

    def spec(self, pipeline: str) -> PipelineSpec:
        if pipeline not in self.specs:
            raise NotFound(
                f"no pipeline {pipeline!r} among the specs found ({', '.join(sorted(self.specs))}); "
                "check the name, or pass --dags-folder with the folder that holds its spec"
            )
        return self.specs[pipeline]

    # --- reads ---------------------------------------------------------------------------

    def runs(self, pipeline: str | None = None, limit: int = 20) -> list[RunRow]:
        """Recent runs, newest first, from every ledger table the pipelines use."""
        specs = [self.spec(pipeline)] if pipeline else list(self.specs.values())
        rows = []
        for table in sorted({s.ledger_table for s in specs}):
            model = services.ledger_model(next(s for s in specs if s.ledger_table == table))
            entries = list_runs(model, pipeline, limit)
            keys = [(run_pk(e.pipeline, e.run_id), RUN_SK) for e in entries]
            runs = {(r.pipeline, r.run_id): RunRecord.of(r) for r in model.Control.batch_get(keys)} if keys else {}
            rows += [run_row(e.pipeline, e.run_id, e.started_at, runs.get((e.pipeline, e.run_id))) for e in entries]
        rows.sort(key=lambda r: r.started_at or "", reverse=True)
        return [with_airflow(r, self._airflow_run_state(r.pipeline, r.run_id)) for r in rows[:limit]]

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

    def status(self, ref: RunRef, *, with_files: bool = False) -> RunView:
        spec = self.spec(ref.pipeline)
        model = services.ledger_model(spec)
        records = read_run(model, ref.pipeline, ref.run_id)
        if records.run is None:
            raise NotFound(
                f"no run {ref} in table {spec.ledger_table}; `shardline runs --pipeline "
                f"{ref.pipeline}` lists the recent ones"
            )
        steps = [self._step_view(spec, ref, s.name, with_files) for s in spec.steps]
        return run_view(
            ref,
            RunRecord.of(records.run),
            [s for s in steps if s is not None],
            self._airflow_run_state(ref.pipeline, ref.run_id),
        )

    def _step_view(self, spec: PipelineSpec, ref: RunRef, step: str, with_files: bool) -> StepView | None:
        records = _read_step_files(spec, ref.pipeline, ref.run_id, step, file_attributes=FILE_DETAIL_ATTRIBUTES)
        if records.step is None:
            return None
        record = StepRecord.of(records.step)
        shards = [ShardRecord.of(s) for s in records.shards]
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
            [file_view(step, f) for f in records.files],
            shards,
            job_name=job_name,
            job_status=job_status,
            now=self._now(),
            with_files=with_files,
        )

    def failed(self, ref: RunRef, step: str | None = None) -> list[FileView]:
        """Every file that did not succeed, with its error class, message and attempt."""
        spec = self.spec(ref.pipeline)
        names = [step] if step else [s.name for s in spec.steps]
        if step:
            self._known_step(spec, step)
        found, planned = [], 0
        for name in names:
            records = _read_step_files(spec, ref.pipeline, ref.run_id, name, file_attributes=FILE_DETAIL_ATTRIBUTES)
            planned += records.step is not None
            # An instance that could not start recorded why on its SHARD item: its files show that reason.
            setup = {int(s.attempt or 0): s.error_message for s in records.shards if s.error_class == SETUP_ERROR}
            found += [
                with_setup_error(v, setup.get(v.attempt))
                for v in (file_view(name, f) for f in records.files)
                if v.status != FileStatus.SUCCEEDED
            ]
        if not planned:
            raise NotFound(
                f"no run {ref} with {'step ' + step if step else 'any step'} planned in table "
                f"{spec.ledger_table}; check the run name: `shardline runs --pipeline {ref.pipeline}` "
                "lists the recent ones"
            )
        return found

    @staticmethod
    def _known_step(spec: PipelineSpec, step: str) -> None:
        if step not in {s.name for s in spec.steps}:
            raise NotFound(unknown_step(spec.pipeline, step, [s.name for s in spec.steps]))

    # --- run reports ---------------------------------------------------------------------

    def report_refs(self, ref: RunRef, step: str | None = None) -> list[StepReportRef]:
        """Where the run's step reports are, for each step planned (or ``step`` alone), in the spec's order.

        Each S3 key is derived from the STEP item's recorded plan (its output and metadata prefixes), never
        taken from the caller. Raises NotFound for an unknown pipeline, step or run, or a step never planned.
        """
        spec = self.spec(ref.pipeline)
        if step:
            self._known_step(spec, step)
        records = read_run(services.ledger_model(spec), ref.pipeline, ref.run_id)
        if records.run is None:
            raise NotFound(
                f"no run {ref} in table {spec.ledger_table}; `shardline runs --pipeline "
                f"{ref.pipeline}` lists the recent ones"
            )
        items = {item.step: item for item in records.steps}
        found = []
        for name in [step] if step else [s.name for s in spec.steps]:
            item = items.get(name)
            if item is None or not item.plan_json:
                if step:
                    raise NotFound(report_not_planned_text(ref, name))
                continue
            try:
                attempt = Attempt.from_plan(
                    item.plan_json, int(item.attempt or 1), 0, pipeline=ref.pipeline, run_id=ref.run_id, step=name
                )
            except ValueError as err:
                raise Conflict(f"{err}, so where its run report is cannot be told") from err
            found.append(StepReportRef(name, item.status, attempt.report_uri("html"), attempt.report_uri("json")))
        return found

    def open_report(self, ref: RunRef, report: StepReportRef, suffix: str = "html"):
        """The S3 object body (a stream) of a step's ``report.html`` or ``report.json``; the caller closes it.
        Raises NotFound, saying when reports are written, when it is not there."""
        spec = self.spec(ref.pipeline)
        s3 = services.s3_client(spec)
        uri = report.html_uri if suffix == "html" else report.json_uri
        bucket, key = parse_s3_uri(uri)
        try:
            return s3.get_object(Bucket=bucket, Key=key)["Body"]
        except s3.exceptions.NoSuchKey as err:
            raise NotFound(report_missing_text(ref, report.step, report.status, uri)) from err

    def _read_report(self, ref: RunRef, report: StepReportRef, suffix: str) -> bytes:
        body = self.open_report(ref, report, suffix)
        try:
            return body.read()
        finally:
            body.close()

    def save_reports(
        self, ref: RunRef, step: str | None = None, *, root: Path, out: Path | None = None, with_json: bool = False
    ) -> list[SavedReport]:
        """Fetch the run report of ``step`` (or of every step of the run that has one) to local files.

        Each goes to ``<root>/.shardline/reports/<pipeline>/<run>/<step>/report.html``, or to ``out`` (one
        step only). ``with_json`` also reads report.json, the same data, into each result.
        """
        refs = self.report_refs(ref, step)
        pages, missing = [], []
        for report in refs:
            try:
                pages.append((report, self._read_report(ref, report, "json")))
            except NotFound as err:
                if step:
                    raise
                missing.append(str(err))
        if not pages:
            planned = {r.step for r in refs}
            missing += [
                report_not_planned_text(ref, s.name) for s in self.spec(ref.pipeline).steps if s.name not in planned
            ]
            raise NotFound(no_reports_text(ref, missing))
        if out is not None and len(pages) > 1:
            raise BadRequest(out_needs_step_text(ref, [r.step for r, _ in pages]))
        saved = []
        for report, raw in pages:
            # The page is rendered here from report.json, never the stored report.html opened as it is: the HTML
            # in the bucket is bytes anyone with write access there chose, and the browser opens a local file
            # with no server's CSP in front of it. render_html escapes every value, and its page runs no script.
            try:
                data = json.loads(raw)
            except ValueError as err:
                raise Conflict(
                    f"{report.json_uri} is not a run report ({type(err).__name__}: {err}), so no page "
                    "was rendered from it"
                ) from err
            page = self._page(ref, report, raw)
            path = out if out is not None else local_report_path(root, ref.pipeline, ref.run_id, report.step)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(page)
            saved.append(
                SavedReport(report.step, report.status, report.html_uri, str(path), data if with_json else None)
            )
        return saved

    def _page(self, ref: RunRef, report: StepReportRef, raw: bytes) -> bytes:
        """The report's page, rendered from its report.json (every value escaped, a policy that allows no script).
        Without the run report's libraries (numpy, matplotlib: the ``airflow`` extra) it is the stored page, led
        by the same policy, which no later markup in the page can loosen."""
        try:
            from shardline.report.model import RunReport
            from shardline.report.render import render_html
        except ImportError:
            return no_script_page(self._read_report(ref, report, "html"))
        try:
            return render_html(RunReport.from_json(raw)).encode()
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise Conflict(
                f"{report.json_uri} is not a run report ({type(err).__name__}: {err}), so no page was rendered from it"
            ) from err

    # --- actions -------------------------------------------------------------------------

    def plan_resubmission(
        self, ref: RunRef, step: str, *, shard: str | None = None, files: Sequence[str] = (), all_failed: bool = False
    ) -> ResubmitPlan:
        """Which files a resubmission would take (:func:`selection.choose_files`). Succeeded files are never
        taken again."""
        spec = self.spec(ref.pipeline)
        self._known_step(spec, step)
        selection.check_one_choice(shard=shard, files=files, all_failed=all_failed)
        records = _read_step_files(spec, ref.pipeline, ref.run_id, step, file_attributes=FILE_DETAIL_ATTRIBUTES)
        if records.step is None:
            raise Conflict(
                f"step {step} of {ref} was never planned, so there is nothing to resubmit: it starts "
                f"when the DAG run reaches its plan_{step} task; `shardline status {ref}` shows where "
                "the run is"
            )
        latest = StepRecord.of(records.step).attempt
        views = [file_view(step, f) for f in records.files]
        dealt = self._dealt_hosts(spec, ref, step, latest) if shard and selection.needs_deal(views, latest) else None
        return selection.choose_files(
            str(ref), step, latest, views, shard=shard, keys=files, all_failed=all_failed, dealt=dealt
        )

    def _dealt_hosts(self, spec: PipelineSpec, ref: RunRef, step: str, attempt: int) -> dict[str, str]:
        """Which instance each entry of an attempt's manifest went to: the manifest, read from S3."""
        then = self._plan(spec, ref, step).model_copy(update={"number": attempt})
        bucket, key = parse_s3_uri(then.manifest_uri)
        return selection.dealt_hosts(
            json.loads(services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"].read()), then
        )

    def _plan(self, spec: PipelineSpec, ref: RunRef, step: str) -> Attempt:
        from shardline.orchestration import steps

        try:
            attempt = steps.latest_attempt(spec, ref.pipeline, ref.run_id, step)
        except ValueError as err:
            raise Conflict(
                f"{err}, so it cannot be resubmitted from here; clear its plan_{step} task in Airflow instead"
            ) from err
        if attempt is None:
            raise Conflict(
                f"step {step} of {ref} has no recorded plan (was it planned by an older Shardline?), "
                f"so it cannot be resubmitted from here; clear its plan_{step} task in Airflow instead"
            )
        return attempt

    def resubmit(
        self,
        ref: RunRef,
        step: str,
        *,
        shard: str | None = None,
        files: Sequence[str] = (),
        all_failed: bool = False,
        dry_run: bool = False,
        force: bool = False,
        ledger_only: bool = False,
    ) -> ResubmitResult:
        """Start a new attempt of ``step`` with only the chosen files, and let the DAG run follow it.

        All or nothing: Airflow is asked first (the watch task's state, and whether this caller may
        clear it), and if it cannot be asked or would refuse, nothing is submitted. Safe to repeat:
        the same call again finds the attempt running, or completes a resubmission whose clear
        failed, or finds nothing left. ``force`` resubmits while the step's sensor is still in
        charge (it follows the new attempt). ``ledger_only`` leaves Airflow out (a step not run by
        an Airflow DAG): the new attempt runs, and no DAG run follows it.
        """
        from shardline.orchestration import steps

        spec = self.spec(ref.pipeline)
        plan = self.plan_resubmission(ref, step, shard=shard, files=files, all_failed=all_failed)
        again = resubmit_command(ref, step, shard=shard, files=files, all_failed=all_failed, force=force)
        latest = self._plan(spec, ref, step)
        records = read_step(services.ledger_model(spec), ref.pipeline, ref.run_id, step)
        try:
            job = services.backend_for(spec).describe(latest.job_name).status
        except JobNotFound:
            job = None
            if spec.backend == "local" and any(int(s.attempt or 0) == latest.number for s in records.shards):
                raise Conflict(local_root_mismatch(latest.job_name, latest.number, services.local_root())) from None
        watch = f"watch_{step}"
        watch_state = None if ledger_only else self._watch_state(ref, watch)
        choice = choose_next(
            attempt=latest.number,
            job=latest.job_name,
            job_running=job is not None and not job.is_terminal,
            step_status=records.step.status if records.step else None,
            watch_state=watch_state,
            files=len(plan.files),
            force=force,
            watch=watch,
        )
        if choice.next is Next.SUBMIT:  # otherwise the reason is what the result says: printed once, not twice
            plan = dataclasses.replace(plan, reason=f"{plan.reason}; {choice.reason}")
        if choice.next is Next.REFUSE:
            raise Conflict(f"step {step} of {ref}: {choice.reason}")
        if choice.clear_watch:
            self._may_clear(ref, watch)
        if choice.next is Next.NOTHING:
            return ResubmitResult(plan, None, None, choice.reason, action=choice.next.value)
        if dry_run:
            if choice.next is Next.TAKE_UP:
                return ResubmitResult(
                    plan,
                    None,
                    None,
                    dry_run_text(choice, watch, ref.run_id, None, watch_state),
                    action=choice.next.value,
                )
            nxt = latest.number + 1
            return ResubmitResult(
                plan,
                nxt,
                naming.job_name(ref.pipeline, ref.run_id, step, nxt),
                dry_run_text(choice, watch, ref.run_id, nxt, watch_state),
            )
        attempt = job_name = None
        if choice.next is Next.SUBMIT:
            try:
                nxt = steps.resubmit(spec, latest, plan.files, by_operator=True)
            except StaleOrchestratorError as err:
                raise Conflict(
                    f"someone else (the sensor, or another operator) moved step {step} of {ref} past "
                    f"attempt {latest.number} meanwhile, so nothing was submitted; `shardline "
                    f"status {ref}` shows where it is now"
                ) from err
            attempt, job_name = nxt.number, nxt.job_name
        if not choice.clear_watch:
            return ResubmitResult(plan, attempt, job_name, followed_text(watch, watch_state), action=choice.next.value)
        try:
            said = self._rerun_watch(ref, watch)
        except (AirflowApiError, OnCallError) as err:
            return ResubmitResult(
                plan,
                attempt,
                job_name,
                half_done_text(attempt, job_name, watch, err, again),
                complete=False,
                action=choice.next.value,
            )
        return ResubmitResult(plan, attempt, job_name, said, action=choice.next.value)

    def _watch_state(self, ref: RunRef, watch: str) -> str:
        """The watch task's state in Airflow; raises OnCallError, before anything changed, if Airflow
        cannot be asked (a resubmission must be able to let the DAG run follow it)."""
        nothing = "nothing was submitted"
        if self.airflow is None:
            raise Unavailable(
                f"Airflow is not configured, so {nothing}: after a resubmission the DAG run's "
                f"{watch} task must be cleared so the run follows it. To give the CLI access, "
                f"{HOW_TO_CONFIGURE}; then run the same command again. (For a step not run by "
                "Airflow, pass --ledger-only.)"
            )
        try:
            answer = self.airflow.task_instance(ref.pipeline, ref.run_id, watch)
        except AirflowApiError as err:
            if err.status == 404:
                raise NotFound(
                    f"Airflow at {self.airflow.base_url} has no task {watch} in DAG run {ref.run_id} "
                    f"of {ref.pipeline}, so {nothing}. Check that it is the Airflow that runs this "
                    f"pipeline (the URL came from {self.airflow.source}; --airflow-url picks another); "
                    "for a step not run by Airflow, pass --ledger-only."
                ) from err
            if err.status in (401, 403):  # the token: the error says which fix (missing, expired, unreadable, role)
                raise Refused(f"Airflow would not answer about DAG run {ref.run_id}, so {nothing}: {err}") from err
            raise Unavailable(
                f"cannot ask Airflow about DAG run {ref.run_id}, so {nothing}: {err}. Run the same "
                "command again once Airflow answers."
            ) from err
        return answer.get("state") or "none"

    def _may_clear(self, ref: RunRef, watch: str) -> None:
        """Ask Airflow to clear the watch task as a dry run: the same permission check, no change."""
        assert self.airflow is not None
        try:
            self.airflow.clear_tasks(ref.pipeline, ref.run_id, [watch], include_downstream=True, dry_run=True)
        except AirflowApiError as err:
            hint = (
                ""
                if err.status == 401 or INVALID_TOKEN in str(err)  # the token itself: the error says
                else f" (clearing task instances of DAG {ref.pipeline} takes Airflow's Op role, or an admin)"
                if err.status == 403
                else ". Run the same command again once Airflow answers"
            )
            raise Refused(
                f"Airflow would not let this caller clear {watch} of DAG run {ref.run_id}, so nothing "
                f"was submitted: {err}{hint}"
            ) from err

    def _rerun_watch(self, ref: RunRef, watch: str, wait_seconds: float = WATCH_WAIT_SECONDS) -> str:
        """Let the DAG run follow the step again: clear its watch task once it has finished.

        The sensor records the step's outcome a moment before its task ends, so a watch task
        still running here is about to end: wait for it, then clear it (and what follows it).
        Raises AirflowApiError or OnCallError if it cannot.
        """
        assert self.airflow is not None
        airflow = self.airflow
        state = wait_for(
            lambda: airflow.task_instance(ref.pipeline, ref.run_id, watch).get("state"),
            lambda answer: answer in FINISHED_TASK_STATES,
            timeout=wait_seconds,
            interval=WATCH_POLL_SECONDS,
            sleep=self._sleep,
        )
        if state not in FINISHED_TASK_STATES:
            raise Conflict(not_finished_text(watch, wait_seconds, state))
        cleared = airflow.clear_tasks(ref.pipeline, ref.run_id, [watch], include_downstream=True)
        return cleared_text(watch, state, len(cleared))

    def rerun(self, ref: RunRef, conf: dict | None = None, *, dry_run: bool = False) -> list[str]:
        """Run a finished DAG run's partition again, as Airflow 3.3 allows it.

        Without ``conf``: the run plans again from its first failed step (that step's plan task and everything
        after it are cleared), with its own conf: after input that landed late, a model uploaded since, or a
        setup error fixed. With ``conf``: a run's conf cannot change, and Airflow refuses a second run at the
        same logical date (409), so the run is deleted and triggered again at the same logical date and data
        interval with the new conf, under a new run id; if that trigger fails, the old conf is put back.
        The conf is checked first as the trigger form and the plan task check it, and no job of the run may
        still be running (its outputs would mix with the new run's).
        """
        spec = self.spec(ref.pipeline)
        if self.airflow is None:
            raise Unavailable(
                f"Airflow is not configured, so nothing was rerun: {HOW_TO_CONFIGURE}; then run the same command again"
            )
        run = self.airflow.dag_run(ref.pipeline, ref.run_id)
        state = run.get("state")
        if state not in ("failed", "success"):
            raise Conflict(rerun_not_finished_text(ref, state))
        problem = conf_problem(spec, run.get("conf") if conf is None else conf)
        if problem:
            raise BadRequest(rerun_conf_text(ref, problem, given=conf is not None))
        running = self._running_jobs(spec, ref)
        if running:
            raise Conflict(
                f"job(s) {', '.join(running)} of {ref} still run, so nothing was rerun (a new run's outputs "
                f"would mix with theirs): stop them with `shardline cancel {ref}`, then run this again"
            )
        if conf is None:
            return self._rerun_in_place(spec, ref, state, dry_run=dry_run)
        interval = (run.get("data_interval_start"), run.get("data_interval_end"))
        old = (
            f"DAG run {ref.run_id} (logical date {run.get('logical_date')}, data interval {interval[0]} to "
            f"{interval[1]}, conf {json.dumps(run.get('conf') or {}, sort_keys=True)})"
        )
        if dry_run:
            return [
                f"dry run, nothing was changed: for real, it would delete {old} and trigger that partition "
                f"again with conf {json.dumps(conf, sort_keys=True)}"
            ]
        self.airflow.delete_run(ref.pipeline, ref.run_id)

        def trigger(with_conf: dict, note: str) -> dict:
            return self.airflow.trigger(
                ref.pipeline,
                with_conf,
                logical_date=run.get("logical_date"),
                data_interval=interval if all(interval) else None,
                note=note,
            )

        try:
            new = trigger(conf, f"rerun of {ref.run_id} with a new conf (shardline rerun)")
        except AirflowApiError as err:
            try:  # the partition must not be left without a run: put the old one's conf back
                back = trigger(run.get("conf") or {}, f"{ref.run_id} put back: a rerun's trigger failed")
            except AirflowApiError as again:
                raise Unavailable(
                    f"deleted {old}, but Airflow refused the new run ({err}) and the old conf too "
                    f"({again}): trigger that logical date and data interval by hand"
                ) from again
            raise BadRequest(
                f"Airflow refused the new run ({err}); {old} was put back as {back['dag_run_id']} with its own conf"
            ) from err
        new_ref = RunRef(ref.pipeline, new["dag_run_id"])
        return [
            f"deleted {old} and triggered it again as {new['dag_run_id']} with conf "
            f"{json.dumps(conf, sort_keys=True)}; follow it with `shardline status {new_ref}`"
        ]

    def _rerun_in_place(self, spec: PipelineSpec, ref: RunRef, state: str, *, dry_run: bool) -> list[str]:
        """Clear the plan task of the run's first failed step and everything after it."""
        assert self.airflow is not None
        failed = {
            t["task_id"]
            for t in self.airflow.task_instances(ref.pipeline, ref.run_id)
            if t.get("state") in ("failed", "upstream_failed")
        }
        step = next(
            (s.name for s in spec.steps if failed & {f"plan_{s.name}", f"submit_{s.name}", f"watch_{s.name}"}), None
        )
        start = f"plan_{step}" if step else ("report" if "report" in failed else None)
        if start is None:
            raise Conflict(
                f"DAG run {ref.run_id} has no failed task to run again (it is {state}); to score its "
                f"partition again with another conf: `shardline rerun {ref} --conf '{{...}}'`"
            )
        cleared = self.airflow.clear_tasks(ref.pipeline, ref.run_id, [start], include_downstream=True, dry_run=dry_run)
        names = ", ".join(sorted({t["task_id"] for t in cleared}))
        if dry_run:
            return [f"dry run, nothing was changed: for real, it would clear {names} of DAG run {ref.run_id}"]
        return [
            f"cleared {names} of DAG run {ref.run_id}: it plans again from {start} with its own conf (the files "
            f"that succeeded are kept); follow it with `shardline status {ref}`"
        ]

    def _running_jobs(self, spec: PipelineSpec, ref: RunRef) -> list[str]:
        """The jobs of the run's steps that have not ended."""
        records = read_run(services.ledger_model(spec), ref.pipeline, ref.run_id)
        backend, running = services.backend_for(spec), []
        for item in records.steps:
            if not item.attempt or not item.step:
                continue
            name = naming.job_name(ref.pipeline, ref.run_id, item.step, int(item.attempt))
            try:
                if not backend.describe(name).status.is_terminal:
                    running.append(name)
            except JobNotFound:
                continue
        return running

    def cancel(self, ref: RunRef, reason: str = "cancelled by an operator") -> list[str]:
        """Mark every step CANCELLED (so no sensor resubmits), stop their jobs, fail the DAG run."""
        spec = self.spec(ref.pipeline)
        model = services.ledger_model(spec)
        records = read_run(model, ref.pipeline, ref.run_id)
        if records.run is None:
            raise NotFound(
                f"no run {ref} in table {spec.ledger_table}, so there is nothing to cancel; check the "
                f"run name: `shardline runs --pipeline {ref.pipeline}` lists the recent ones"
            )
        if records.run.status in STEP_TERMINAL:
            raise Conflict(
                f"run {ref} already ended {records.run.status}, so there is nothing to cancel; "
                f"`shardline status {ref}` shows how it ended"
            )
        done = []
        backend = services.backend_for(spec)
        for item in records.steps:
            step = item.step
            if item.status in STEP_TERMINAL:
                done.append(CANCEL_LINES["already"].format(step=step, status=item.status))
                continue
            attempt = int(item.attempt or 1)
            if not cancel_step(model, ref.pipeline, ref.run_id, step, attempt, reason):
                done.append(CANCEL_LINES["moved_on"].format(step=step, ref=ref))
                continue
            name = naming.job_name(ref.pipeline, ref.run_id, step, attempt)
            try:
                if not backend.describe(name).status.is_terminal:
                    backend.stop(name)
                    done.append(CANCEL_LINES["stopped"].format(step=step, job=name))
            except JobNotFound:
                pass
            done.append(CANCEL_LINES["cancelled"].format(step=step))
        set_run_status(model, ref.pipeline, ref.run_id, StepStatus.CANCELLED, reason)
        if self.airflow is not None:
            try:
                state = self.airflow.dag_run(ref.pipeline, ref.run_id).get("state")
                if state not in FINISHED_RUN_STATES:
                    self.airflow.set_run_state(ref.pipeline, ref.run_id, "failed", note=reason)
                    done.append(CANCEL_LINES["dag_run_failed"].format(run_id=ref.run_id))
            except AirflowApiError as err:
                done.append(CANCEL_LINES["airflow_error"].format(run_id=ref.run_id, err=err))
        return done


# The policy a report page runs under when it is opened from a file: its inline styles and data: images only.
NO_SCRIPT_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def no_script_page(stored: bytes) -> bytes:
    """A stored page, led by a Content-Security-Policy that allows no script. The meta element comes first, so
    the browser puts it in the head before any of the page's own markup, and a policy, once set, can only be
    tightened by what follows."""
    return f'<meta http-equiv="Content-Security-Policy" content="{NO_SCRIPT_POLICY}">\n'.encode() + stored
