"""What an on-call engineer does to a run, as plain functions: the CLI and the UI page call these.

Everything is read from the ledger (Queries on a run's partition, never Scans) and the
backend's job state; the pipeline specs under the DAGs folder say which table and
backend a pipeline uses. Resubmitting starts a new fenced attempt with exactly the
chosen files and, when the DAG run had already finished, clears the step's watch task
through Airflow's REST API so the run's state follows the resubmission.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

from shardline import contract
from shardline.backends import JobNotFound
from shardline.decision.policy import UNSAFE_KEY_ERROR, JobStatus
from shardline.ledger.keys import RUN_SK, run_pk
from shardline.ledger.orchestrator import (
    FILE_DETAIL_ATTRIBUTES,
    StaleOrchestratorError,
    cancel_step,
    list_runs,
    read_run,
    read_step,
    set_run_status,
)
from shardline.ledger.states import STEP_TERMINAL, FileStatus, StepStatus
from shardline.oncall.airflow_client import (
    FINISHED_RUN_STATES,
    FINISHED_TASK_STATES,
    HOW_TO_CONFIGURE,
    AirflowApiError,
    AirflowClient,
)
from shardline.orchestration import services
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec, SpecError, load_spec

ENV_DAGS_FOLDER = "SHARDLINE_DAGS_FOLDER"


class OnCallError(RuntimeError):
    """Something the operator can fix; the message says what to do next.

    Its kind says how the page answers (``http_status``) and how the CLI exits (``exit_code``), so
    neither reads the message to decide.
    """

    http_status = 409
    exit_code = 1


class NotFound(OnCallError):
    """No such pipeline, run, step or file."""

    http_status = 404


class Conflict(OnCallError):
    """The request does not fit where the run is now (a sensor in charge, an attempt moved on, ended)."""

    http_status = 409


class BadRequest(OnCallError):
    """The request itself is malformed: a run name, a choice of files."""

    http_status = 400
    exit_code = 2


class Refused(OnCallError):
    """Airflow would not let this caller do it."""

    http_status = 403


class Unavailable(OnCallError):
    """Airflow cannot be asked (not configured, or not answering), so nothing was changed."""

    http_status = 503


@dataclasses.dataclass(frozen=True)
class RunRef:
    pipeline: str
    run_id: str

    @classmethod
    def parse(cls, text: str) -> RunRef:
        pipeline, sep, run_id = text.partition("/")
        if not sep or not pipeline or not run_id:
            raise BadRequest(f"{text!r} is not a run name: a run is named PIPELINE/RUN_ID; copy it from the RUN "
                             "column of `shardline runs`")
        return cls(pipeline, run_id)

    def __str__(self) -> str:
        return naming.run_ref(self.pipeline, self.run_id)


def default_dags_folder() -> Path:
    for candidate in (os.environ.get(ENV_DAGS_FOLDER), os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")):
        if candidate:
            return Path(candidate)
    return Path.cwd() / "dags"


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


# --- views (plain data: the CLI prints them, the UI serves them as JSON) ---------------------


@dataclasses.dataclass(frozen=True)
class RunRow:
    pipeline: str
    run_id: str
    status: str
    started_at: str | None
    finished_at: str | None
    message: str | None = None
    airflow_state: str | None = None  # the DAG run's state in Airflow, when the CLI can ask
    disagreement: str | None = None  # set when Airflow and the ledger tell different stories


@dataclasses.dataclass(frozen=True)
class ShardView:
    host: str
    attempt: int
    status: str
    files_assigned: int
    files_done: int
    files_failed: int
    rows_done: int
    heartbeat_age_seconds: float | None


@dataclasses.dataclass(frozen=True)
class FileView:
    step: str
    input_key: str
    status: str
    attempt: int
    host: str | None
    rows_in: int | None
    rows_out: int | None
    error_class: str | None
    error_message: str | None


@dataclasses.dataclass(frozen=True)
class StepView:
    name: str
    status: str
    attempt: int
    job_name: str | None
    job_status: str | None
    files: int
    succeeded: int
    failed: int
    running: int
    pending: int
    rows_in: int
    rows_out: int
    rows_per_second: float | None
    eta_seconds: float | None
    started_at: str | None
    message: str | None
    shards: list[ShardView]
    file_rows: list[FileView]


@dataclasses.dataclass(frozen=True)
class RunView:
    ref: str
    pipeline: str
    run_id: str
    status: str
    started_at: str | None
    finished_at: str | None
    message: str | None
    steps: list[StepView]
    airflow_state: str | None = None
    disagreement: str | None = None


@dataclasses.dataclass(frozen=True)
class ResubmitPlan:
    ref: str
    step: str
    files: list[str]
    reason: str  # why these files (or why none)


class Next(enum.StrEnum):
    """What a resubmit command does, chosen by :func:`choose_next` before anything changes."""

    SUBMIT = "submit"  # start attempt N+1 with the chosen files
    TAKE_UP = "take_up"  # submit nothing; clear the watch task so the DAG run takes the step up again
    NOTHING = "nothing"  # submit nothing, clear nothing: all is in hand or done
    REFUSE = "refuse"  # the step's sensor is in charge; wait for it, or pass --force


@dataclasses.dataclass(frozen=True)
class NextStep:
    next: Next
    clear_watch: bool  # clear the DAG run's watch task (after submitting, or instead of it)
    reason: str


# The ledger's run status, and the DAG run states that tell the same story.
_AGREEING_RUN_STATES = {
    StepStatus.PLANNED: {"queued", "running"}, StepStatus.SUBMITTED: {"queued", "running"},
    StepStatus.RUNNING: {"queued", "running"}, StepStatus.SUCCEEDED: {"success"}, StepStatus.PARTIAL: {"success"},
    StepStatus.SKIPPED: {"success"}, StepStatus.FAILED: {"failed"}, StepStatus.CANCELLED: {"failed"},
}


def disagreement(ledger_status: str | None, airflow_state: str | None, ref: str, step: str | None = None) -> str | None:
    """Why the ledger and Airflow disagree about run ``ref``, with what to do; ``None`` when they agree."""
    if airflow_state is None or ledger_status not in _AGREEING_RUN_STATES:
        return None
    if airflow_state in _AGREEING_RUN_STATES[StepStatus(ledger_status)]:
        return None
    fix = (f"`{shlex.join(['shardline', 'resubmit', ref, '--step', step, '--all-failed'])}`" if step
           else f"`shardline resubmit {ref} --step STEP --all-failed` (for the step `shardline status {ref}` "
                "shows unfinished)")
    if airflow_state in FINISHED_RUN_STATES and ledger_status not in STEP_TERMINAL:
        return (f"the DAG run's state is {airflow_state} but the ledger says {ledger_status}: no task drives this "
                f"run now; {fix} takes it up again")
    if airflow_state == "failed" and ledger_status in (StepStatus.SUCCEEDED, StepStatus.PARTIAL):
        return (f"the DAG run failed but the ledger says {ledger_status}: its watch task ended before the last "
                f"attempt did; {fix} clears it, so the run turns green")
    return (f"the DAG run's state is {airflow_state}, the ledger says {ledger_status}; this can last a moment "
            f"while the DAG run's last tasks end: wait a minute and check again with `shardline status {ref}`, and "
            "if they still differ, check the DAG run's task logs in Airflow")


def _state(state: str | None) -> str:
    """An Airflow task state in words (a task instance Airflow has not scheduled yet has none)."""
    return "not started yet (no state)" if state in (None, "none") else state


def _ended_without_files(step_status: str | None) -> str:
    """Why a step that ended leaves no chosen file to resubmit, in words that hold for its status."""
    if step_status == StepStatus.SUCCEEDED:
        return "every file of the step has succeeded"
    if step_status == StepStatus.SKIPPED:
        return "the step was SKIPPED, so it has no files"
    return f"the step ended {step_status} and no chosen file is left to run"


# Where a key the planner refused (an unsafe path) is dealt with: it is never resubmitted.
_UNSAFE_HINT = ("`shardline failed` lists the files that did not succeed, and why (a key refused as an unsafe path "
                "never runs: rename the object or exclude it with input.exclude)")


def choose_next(*, attempt: int, job: str, job_running: bool, step_status: str | None, watch_state: str | None,
                files: int, force: bool, watch: str) -> NextStep:
    """What a resubmission does, from the latest attempt's job, the ledger's step status and the
    Airflow watch task's state (``None``: Airflow is not asked). Pure, so every case is tested.

    A watch task that has not finished is in charge of the step: it follows newer attempts and
    retries on its own. One that has finished while the ledger shows the step unfinished, or
    finished in a way the ledger has since overtaken, left the DAG run behind: clearing it lets the
    run take the step up again (this also completes a resubmission whose clear failed).
    """
    sensor_in_charge = watch_state is not None and watch_state not in FINISHED_TASK_STATES
    step_ended = step_status in STEP_TERMINAL
    if job_running:
        if sensor_in_charge or watch_state is None:
            follows = f" and its sensor ({watch}, {_state(watch_state)}) follows it" if sensor_in_charge else ""
            return NextStep(Next.NOTHING, False, f"attempt {attempt} ({job}) is still running{follows}: nothing to "
                                                 "resubmit while it runs; wait for it to end (`shardline status` "
                                                 "shows its progress)")
        return NextStep(Next.TAKE_UP, True, f"attempt {attempt} ({job}) is running, but the DAG run's {watch} has "
                                            f"ended ({watch_state}), so nothing in Airflow follows it: clearing "
                                            f"{watch} lets the DAG run follow it again")
    if not step_ended:
        if sensor_in_charge:
            if force and files:
                return NextStep(Next.SUBMIT, False, f"--force: {watch} is {_state(watch_state)} and follows the new "
                                                    "attempt")
            waiting = (f"attempt {attempt} has ended, but its sensor ({watch}, now {_state(watch_state)}) has not "
                       "recorded the outcome yet; it resubmits on its own while retry.max_attempts allows")
            if force:
                return NextStep(Next.REFUSE, False, f"{waiting}, and no chosen file is left to resubmit: wait for "
                                                    "it (`shardline status` shows when it has)")
            return NextStep(Next.REFUSE, False, f"{waiting}. Wait for it (`shardline status` shows when it has), "
                                                "or pass --force to resubmit now")
        if files:
            return NextStep(Next.SUBMIT, watch_state is not None,
                            f"attempt {attempt} has ended and no watch task recorded its outcome")
        if watch_state is None:
            return NextStep(Next.NOTHING, False, "nothing to resubmit: every chosen file has succeeded")
        return NextStep(Next.TAKE_UP, True, f"every chosen file has succeeded, but no watch task recorded attempt "
                                            f"{attempt}'s outcome: clearing {watch} lets the DAG run record it "
                                            "and go on")
    if files:
        return NextStep(Next.SUBMIT, watch_state is not None, f"the step ended {step_status}")
    if step_status in (StepStatus.SUCCEEDED, StepStatus.PARTIAL) and watch_state in FINISHED_TASK_STATES \
            and watch_state != "success":
        return NextStep(Next.TAKE_UP, True, f"{_ended_without_files(step_status)}, but the DAG run's {watch} ended "
                                            f"{watch_state} before the last attempt did: clearing it lets the run "
                                            "turn green")
    if step_status in (StepStatus.SUCCEEDED, StepStatus.SKIPPED):
        return NextStep(Next.NOTHING, False, f"nothing to resubmit: {_ended_without_files(step_status)}")
    return NextStep(Next.NOTHING, False, f"nothing to resubmit: {_ended_without_files(step_status)}; {_UNSAFE_HINT}")


# --- what a resubmission or a cancel says, as text (pure: tests/oncall/test_messages.py renders each) ---------


def dry_run_text(choice: NextStep, watch: str, run_id: str, attempt: int | None, watch_state: str | None) -> str:
    """What a dry run says it would do: ``attempt`` is the one it would submit (``None``: it submits none)."""
    if attempt is None:
        return f"dry run, nothing was changed: {choice.reason}"
    if choice.clear_watch:
        return (f"dry run, nothing was changed: for real, it would submit attempt {attempt}, then clear {watch} of "
                f"DAG run {run_id} so the run follows it")
    return (f"dry run, nothing was changed: for real, it would submit attempt {attempt} and clear nothing in "
            f"Airflow ({followed_text(watch, watch_state)})")


def followed_text(watch: str, watch_state: str | None) -> str:
    """Who follows a new attempt when no watch task needs clearing."""
    if watch_state:
        return f"{watch} is {_state(watch_state)} and follows the new attempt"
    return "Airflow was left out (--ledger-only): no DAG run follows this attempt"


def half_done_text(attempt: int | None, job_name: str | None, watch: str, err: Exception, again: str) -> str:
    """A resubmission whose clear failed: what was done, and the command that finishes it."""
    if attempt:
        done = f"attempt {attempt} is submitted as job {job_name}, but the DAG run does not follow it yet"
    else:
        done = "nothing was submitted, and the DAG run does not follow the step yet"
    return (f"{done}: clearing {watch} failed: {err}. To finish, run the same command again once Airflow lets "
            f"you; it clears {watch} and submits nothing twice: {again}")


def cleared_text(watch: str, state: str, cleared: int) -> str:
    """What clearing a finished watch task did."""
    return (f"{watch} had ended ({state}): cleared it and what follows it ({cleared} task instance(s)), so the DAG "
            "run follows the step again and turns green when it succeeds")


def airflow_left_out(err: Exception) -> str:
    """Why `shardline runs` and `status` show no Airflow column."""
    return f"Airflow's DAG run states are left out (the ledger's are shown): {err}"


def unknown_step(pipeline: str, step: str, steps: Sequence[str]) -> str:
    return f"pipeline {pipeline} has no step {step!r}; its steps are {', '.join(steps)}: pass one of them as --step"


# What `shardline cancel` prints, a line per thing it did (or left alone).
CANCEL_LINES = {
    "already": "step {step}: already {status}, left as it is",
    "moved_on": "step {step}: moved on while being cancelled (resubmitted, or ended), so it was left as it is; "
                "`shardline status {ref}` shows where it is now",
    "stopped": "step {step}: stopped {job}",
    "cancelled": "step {step}: CANCELLED",
    "dag_run_failed": "Airflow: DAG run {run_id} marked failed",
    "airflow_error": "Airflow: DAG run {run_id} was not marked failed ({err}); the ledger says CANCELLED, so no "
                     "sensor resubmits; mark the DAG run failed in Airflow's UI",
}


@dataclasses.dataclass(frozen=True)
class ResubmitResult:
    plan: ResubmitPlan
    attempt: int | None
    job_name: str | None
    airflow: str  # what happened on the Airflow side, in words
    complete: bool = True  # False: something is left half done; ``airflow`` says what, and how to finish it
    action: str = Next.SUBMIT.value  # what was (or, in a dry run, would be) done: a Next value


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


class OnCall:
    """On-call actions over the pipelines in one DAGs folder."""

    def __init__(self, specs: dict[str, PipelineSpec], *, airflow: AirflowClient | None = None,
                 now=lambda: dt.datetime.now(dt.UTC)):
        if not specs:
            raise NotFound("no pipeline specs found; pass --dags-folder (or set SHARDLINE_DAGS_FOLDER) to the "
                           "folder that holds pipelines/*.yaml")
        self.specs = specs
        self.airflow = airflow
        self.airflow_warning: str | None = None  # why Airflow's side is missing from the views, if it is
        self._now = now

    @classmethod
    def from_folder(cls, dags_folder: Path, airflow: AirflowClient | None = None) -> OnCall:
        return cls(load_specs(dags_folder), airflow=airflow)

    def spec(self, pipeline: str) -> PipelineSpec:
        if pipeline not in self.specs:
            raise NotFound(f"no pipeline {pipeline!r} among the specs found ({', '.join(sorted(self.specs))}); "
                           "check the name, or pass --dags-folder with the folder that holds its spec")
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
            runs = {(r.pipeline, r.run_id): r for r in model.Control.batch_get(keys)} if keys else {}
            for entry in entries:
                run = runs.get((entry.pipeline, entry.run_id))
                rows.append(RunRow(entry.pipeline, entry.run_id, run.status if run else "UNKNOWN",
                                   _iso(entry.started_at), _iso(run.finished_at) if run else None,
                                   run.message if run else None))
        rows.sort(key=lambda r: r.started_at or "", reverse=True)
        return [self._with_airflow(r) for r in rows[:limit]]

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

    def _with_airflow(self, row: RunRow) -> RunRow:
        state = self._airflow_run_state(row.pipeline, row.run_id)
        return dataclasses.replace(row, airflow_state=state,
                                   disagreement=disagreement(row.status, state, naming.run_ref(row.pipeline,
                                                                                               row.run_id)))

    def status(self, ref: RunRef, *, with_files: bool = False) -> RunView:
        spec = self.spec(ref.pipeline)
        model = services.ledger_model(spec)
        records = read_run(model, ref.pipeline, ref.run_id)
        if records.run is None:
            raise NotFound(f"no run {ref} in table {spec.ledger_table}; `shardline runs --pipeline "
                           f"{ref.pipeline}` lists the recent ones")
        steps = [self._step_view(spec, ref, s.name, with_files) for s in spec.steps]
        status = records.run.status or "UNKNOWN"
        steps = [s for s in steps if s is not None]
        state = self._airflow_run_state(ref.pipeline, ref.run_id)
        # The step to take up: the first one not ended, or else the last one.
        behind = next((s.name for s in steps if s.status not in STEP_TERMINAL), steps[-1].name if steps else None)
        return RunView(str(ref), ref.pipeline, ref.run_id, status, _iso(records.run.started_at),
                       _iso(records.run.finished_at), records.run.message, steps, state,
                       disagreement(status, state, str(ref), behind))

    def _step_view(self, spec: PipelineSpec, ref: RunRef, step: str, with_files: bool) -> StepView | None:
        records = read_step(services.ledger_model(spec), ref.pipeline, ref.run_id, step,
                            file_attributes=FILE_DETAIL_ATTRIBUTES)
        if records.step is None:
            return None
        attempt = int(records.step.attempt or 0)
        job_name = naming.job_name(ref.pipeline, ref.run_id, step, attempt) if attempt else None
        job_status = None
        if job_name:
            try:
                job_status = services.backend_for(spec).describe(job_name).status.value
            except JobNotFound:
                # Instances that reported for this attempt prove the job ran: elsewhere, not "not submitted".
                ran = any(int(s.attempt or 0) == attempt for s in records.shards)
                job_status = "NotFoundHere" if ran else "NotSubmitted"
        by_status = {s: [f for f in records.files if f.status == s] for s in FileStatus}
        succeeded = by_status[FileStatus.SUCCEEDED]
        status = records.step.status or StepStatus.PLANNED.value
        if status == StepStatus.PLANNED and job_status == JobStatus.IN_PROGRESS:
            status = StepStatus.RUNNING.value
        now = self._now()
        started = records.step.started_at
        # Over the current attempt: until it ended, or until now while it runs.
        until = records.step.finished_at if status in STEP_TERMINAL and records.step.finished_at else now
        elapsed = (until - started).total_seconds() if started else None
        rows_out = int(sum(f.rows_out or 0 for f in succeeded))
        # Throughput and ETA over the current attempt: files done per second so far.
        done_now = [f for f in records.files if int(f.attempt or 0) == attempt and FileStatus(f.status).is_terminal]
        remaining = len(by_status[FileStatus.PENDING]) + len(by_status[FileStatus.RUNNING])
        rows_done_now = sum(f.rows_out or 0 for f in done_now)
        rate = rows_done_now / elapsed if elapsed and rows_done_now else None
        eta = remaining / (len(done_now) / elapsed) if elapsed and done_now and remaining else None
        shards = [
            ShardView(s.host or "?", int(s.attempt or 0), s.status or "?", int(s.files_assigned or 0),
                      int(s.files_done or 0), int(s.files_failed or 0), int(s.rows_done or 0),
                      (now - s.heartbeat_at).total_seconds() if s.heartbeat_at else None)
            for s in records.shards
        ]
        files = [_file_view(step, f) for f in records.files] if with_files else []
        return StepView(step, status, attempt, job_name, job_status, len(records.files), len(succeeded),
                        len(by_status[FileStatus.FAILED]), len(by_status[FileStatus.RUNNING]),
                        len(by_status[FileStatus.PENDING]), int(sum(f.rows_in or 0 for f in succeeded)), rows_out,
                        rate, eta, _iso(started), records.step.message, shards, files)

    def failed(self, ref: RunRef, step: str | None = None) -> list[FileView]:
        """Every file that did not succeed, with its error class, message and attempt."""
        spec = self.spec(ref.pipeline)
        names = [step] if step else [s.name for s in spec.steps]
        if step and step not in {s.name for s in spec.steps}:
            self._unknown_step(spec, step)
        found, planned = [], 0
        for name in names:
            records = read_step(services.ledger_model(spec), ref.pipeline, ref.run_id, name,
                                file_attributes=FILE_DETAIL_ATTRIBUTES)
            planned += records.step is not None
            found += [_file_view(name, f) for f in records.files if f.status != FileStatus.SUCCEEDED]
        if not planned:
            raise NotFound(f"no run {ref} with {'step ' + step if step else 'any step'} planned in table "
                           f"{spec.ledger_table}; check the run name: `shardline runs --pipeline {ref.pipeline}` "
                           "lists the recent ones")
        return found

    @staticmethod
    def _unknown_step(spec: PipelineSpec, step: str):
        raise NotFound(unknown_step(spec.pipeline, step, [s.name for s in spec.steps]))

    # --- actions -------------------------------------------------------------------------

    def plan_resubmission(self, ref: RunRef, step: str, *, shard: str | None = None, files: Sequence[str] = (),
                          all_failed: bool = False) -> ResubmitPlan:
        """Which files a resubmission would take. Succeeded files are never taken again."""
        spec = self.spec(ref.pipeline)
        if step not in {s.name for s in spec.steps}:
            self._unknown_step(spec, step)
        if sum(bool(x) for x in (shard, files, all_failed)) != 1:
            raise BadRequest("choose what to resubmit with exactly one of --all-failed, --shard HOST or --file KEY")
        records = read_step(services.ledger_model(spec), ref.pipeline, ref.run_id, step,
                            file_attributes=FILE_DETAIL_ATTRIBUTES)
        if records.step is None:
            raise Conflict(f"step {step} of {ref} was never planned, so there is nothing to resubmit: it starts "
                           f"when the DAG run reaches its plan_{step} task; `shardline status {ref}` shows where "
                           "the run is")
        # A key the planner refused as an unsafe path can never run: it is listed as failed, never resubmitted.
        not_done = {f.input_key: f for f in records.files
                    if f.status != FileStatus.SUCCEEDED and f.error_class != UNSAFE_KEY_ERROR}
        if all_failed:
            chosen, why = sorted(not_done), "every file that has not succeeded"
        elif shard:
            # Hosts are per attempt (algo-1 of attempt 2 is another machine than algo-1 of attempt 1),
            # so only the newest attempt's files count; those never claimed went where the manifest dealt them.
            latest = int(records.step.attempt or 0)
            newest = {k: f for k, f in not_done.items() if int(f.attempt or 0) == latest}
            dealt = self._dealt_hosts(spec, ref, step, latest) if any(f.host is None for f in newest.values()) else {}
            chosen = sorted(k for k, f in newest.items() if (f.host or dealt.get(k)) == shard)
            why = f"the unfinished or failed files of shard {shard} (attempt {latest})"
        else:
            known = {f.input_key for f in records.files}
            wanted = [self._full_key(records, key) for key in files]
            unknown = [k for k, w in zip(files, wanted, strict=True) if w not in known]
            if unknown:
                raise NotFound(f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not an "
                               f"input of step {step}; `shardline failed {ref} --step {step}` lists the files "
                               "that can be resubmitted (pass one as --file, or use --all-failed)")
            chosen = sorted(w for w in wanted if w in not_done)
            why = "the chosen files that have not succeeded"
        return ResubmitPlan(str(ref), step, chosen, why)

    @staticmethod
    def _full_key(records, key: str) -> str:
        """Accept a full s3:// URI, or a key relative to the step's input prefix."""
        if key.startswith("s3://"):
            return key
        matches = [f.input_key for f in records.files if f.input_key.endswith("/" + key.lstrip("/"))]
        return matches[0] if len(matches) == 1 else key

    def _dealt_hosts(self, spec: PipelineSpec, ref: RunRef, step: str, attempt: int) -> dict[str, str]:
        """Which instance each entry of an attempt's manifest went to (the deal is round robin)."""
        import json

        from shardline.planning.inputs import parse_s3_uri

        then = self._plan(spec, ref, step).model_copy(update={"number": attempt})
        bucket, key = parse_s3_uri(then.manifest_uri)
        body = json.loads(services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"].read())
        prefix, entries = body[0]["prefix"], body[1:]
        instances = then.model_copy(update={"file_count": len(entries)}).instance_count
        return {prefix + entry: contract.host_name(i)
                for i, share in enumerate(contract.deal(entries, instances)) for entry in share}

    def _plan(self, spec: PipelineSpec, ref: RunRef, step: str) -> Attempt:
        from shardline.orchestration import steps

        try:
            attempt = steps.latest_attempt(spec, ref.pipeline, ref.run_id, step)
        except ValueError as err:
            raise Conflict(f"{err}, so it cannot be resubmitted from here; clear its plan_{step} task in Airflow "
                           "instead") from err
        if attempt is None:
            raise Conflict(f"step {step} of {ref} has no recorded plan (was it planned by an older Shardline?), "
                           f"so it cannot be resubmitted from here; clear its plan_{step} task in Airflow instead")
        return attempt

    def resubmit(self, ref: RunRef, step: str, *, shard: str | None = None, files: Sequence[str] = (),
                 all_failed: bool = False, dry_run: bool = False, force: bool = False,
                 ledger_only: bool = False) -> ResubmitResult:
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
        again = _command(ref, step, shard=shard, files=files, all_failed=all_failed, force=force)
        latest = self._plan(spec, ref, step)
        records = read_step(services.ledger_model(spec), ref.pipeline, ref.run_id, step)
        try:
            job = services.backend_for(spec).describe(latest.job_name).status
        except JobNotFound:
            job = None
            if spec.backend == "local" and any(int(s.attempt or 0) == latest.number for s in records.shards):
                raise Conflict(local_root_mismatch(latest.job_name, latest.number)) from None
        watch = f"watch_{step}"
        watch_state = None if ledger_only else self._watch_state(ref, watch)
        choice = choose_next(attempt=latest.number, job=latest.job_name,
                             job_running=job is not None and not job.is_terminal,
                             step_status=records.step.status if records.step else None, watch_state=watch_state,
                             files=len(plan.files), force=force, watch=watch)
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
                return ResubmitResult(plan, None, None, dry_run_text(choice, watch, ref.run_id, None, watch_state),
                                      action=choice.next.value)
            nxt = latest.number + 1
            return ResubmitResult(plan, nxt, naming.job_name(ref.pipeline, ref.run_id, step, nxt),
                                  dry_run_text(choice, watch, ref.run_id, nxt, watch_state))
        attempt = job_name = None
        if choice.next is Next.SUBMIT:
            try:
                nxt = steps.resubmit(spec, latest, plan.files, by_operator=True)
            except StaleOrchestratorError as err:
                raise Conflict(f"someone else (the sensor, or another operator) moved step {step} of {ref} past "
                               f"attempt {latest.number} meanwhile, so nothing was submitted; `shardline "
                               f"status {ref}` shows where it is now") from err
            attempt, job_name = nxt.number, nxt.job_name
        if not choice.clear_watch:
            return ResubmitResult(plan, attempt, job_name, followed_text(watch, watch_state),
                                  action=choice.next.value)
        try:
            said = self._rerun_watch(ref, watch)
        except (AirflowApiError, OnCallError) as err:
            return ResubmitResult(plan, attempt, job_name, half_done_text(attempt, job_name, watch, err, again),
                                  complete=False, action=choice.next.value)
        return ResubmitResult(plan, attempt, job_name, said, action=choice.next.value)

    def _watch_state(self, ref: RunRef, watch: str) -> str:
        """The watch task's state in Airflow; raises OnCallError, before anything changed, if Airflow
        cannot be asked (a resubmission must be able to let the DAG run follow it)."""
        nothing = "nothing was submitted"
        if self.airflow is None:
            raise Unavailable(f"Airflow is not configured, so {nothing}: after a resubmission the DAG run's "
                              f"{watch} task must be cleared so the run follows it. To give the CLI access, "
                              f"{HOW_TO_CONFIGURE}; then run the same command again. (For a step not run by "
                              "Airflow, pass --ledger-only.)")
        try:
            answer = self.airflow.task_instance(ref.pipeline, ref.run_id, watch)
        except AirflowApiError as err:
            if err.status == 404:
                raise NotFound(f"Airflow at {self.airflow.base_url} has no task {watch} in DAG run {ref.run_id} "
                               f"of {ref.pipeline}, so {nothing}. Check that it is the Airflow that runs this "
                               f"pipeline (the URL came from {self.airflow.source}; --airflow-url picks another); "
                               "for a step not run by Airflow, pass --ledger-only.") from err
            raise Unavailable(f"cannot ask Airflow about DAG run {ref.run_id}, so {nothing}: {err}. Run the same "
                              "command again once Airflow answers.") from err
        return answer.get("state") or "none"

    def _may_clear(self, ref: RunRef, watch: str) -> None:
        """Ask Airflow to clear the watch task as a dry run: the same permission check, no change."""
        assert self.airflow is not None
        try:
            self.airflow.clear_tasks(ref.pipeline, ref.run_id, [watch], include_downstream=True, dry_run=True)
        except AirflowApiError as err:
            hint = (f" (clearing task instances of DAG {ref.pipeline} takes Airflow's Op role, or an admin)"
                    if err.status == 403 else ". Run the same command again once Airflow answers")
            raise Refused(f"Airflow would not let this caller clear {watch} of DAG run {ref.run_id}, so nothing "
                          f"was submitted: {err}{hint}") from err

    def _rerun_watch(self, ref: RunRef, watch: str, wait_seconds: float = 60.0) -> str:
        """Let the DAG run follow the step again: clear its watch task once it has finished.

        The sensor records the step's outcome a moment before its task ends, so a watch task
        still running here is about to end: wait for it, then clear it (and what follows it).
        Raises AirflowApiError or OnCallError if it cannot.
        """
        assert self.airflow is not None
        deadline = time.monotonic() + wait_seconds
        state = self.airflow.task_instance(ref.pipeline, ref.run_id, watch).get("state")
        while state not in FINISHED_TASK_STATES and time.monotonic() < deadline:
            time.sleep(1)
            state = self.airflow.task_instance(ref.pipeline, ref.run_id, watch).get("state")
        if state not in FINISHED_TASK_STATES:
            raise Conflict(f"{watch} has not finished after {wait_seconds:.0f}s (it is {_state(state)})")
        cleared = self.airflow.clear_tasks(ref.pipeline, ref.run_id, [watch], include_downstream=True)
        return cleared_text(watch, state, len(cleared))

    def cancel(self, ref: RunRef, reason: str = "cancelled by an operator") -> list[str]:
        """Mark every step CANCELLED (so no sensor resubmits), stop their jobs, fail the DAG run."""
        spec = self.spec(ref.pipeline)
        model = services.ledger_model(spec)
        records = read_run(model, ref.pipeline, ref.run_id)
        if records.run is None:
            raise NotFound(f"no run {ref} in table {spec.ledger_table}, so there is nothing to cancel; check the "
                           f"run name: `shardline runs --pipeline {ref.pipeline}` lists the recent ones")
        if records.run.status in STEP_TERMINAL:
            raise Conflict(f"run {ref} already ended {records.run.status}, so there is nothing to cancel; "
                           f"`shardline status {ref}` shows how it ended")
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


def local_root_mismatch(job: str, attempt: int) -> str:
    """The local backend's jobs live in a directory; a CLI that looks in another one must not submit."""
    return (f"job {job} of attempt {attempt} ran, but not under {services.local_root()}, where this shell's local "
            "backend looks, so nothing was submitted (a job started here would run beside Airflow's). Run the "
            "command with the same AIRFLOW_HOME (or SHARDLINE_LOCAL_ROOT) as the Airflow that runs the pipeline")


def _command(ref: RunRef, step: str, *, shard: str | None, files: Sequence[str], all_failed: bool,
             force: bool) -> str:
    """The resubmit command that repeats this call, to print when something is left half done."""
    words = ["shardline", "resubmit", str(ref), "--step", step]
    if all_failed:
        words.append("--all-failed")
    elif shard:
        words += ["--shard", shard]
    for key in files:
        words += ["--file", key]
    if force:
        words.append("--force")
    return shlex.join(words)


def _file_view(step: str, item) -> FileView:
    return FileView(step, item.input_key, item.status, int(item.attempt or 0), item.host,
                    int(item.rows_in) if item.rows_in is not None else None,
                    int(item.rows_out) if item.rows_out is not None else None, item.error_class, item.error_message)
