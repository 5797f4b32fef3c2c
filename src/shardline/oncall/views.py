"""What the on-call CLI and page show, and what a resubmission does, as pure functions over values
already read: the ledger's records (as :class:`RunRecord`, :class:`StepRecord`, :class:`ShardRecord`
and :class:`FileView`), the backend's job status, Airflow's states and the clock.

No AWS client, no Airflow, no HTTP here: :mod:`shardline.oncall.service` reads, calls these, and
acts on what they say, so every view and every message is tested without a server
(``tests/oncall/test_views.py``, ``tests/oncall/test_messages.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardline.backends import JobStatus
from shardline.ledger.states import SETUP_ERROR, STEP_TERMINAL, FileStatus, StepStatus
from shardline.oncall.errors import BadRequest
from shardline.planning import naming

# DAG run states in which no task will run again unless something is cleared.
FINISHED_RUN_STATES = frozenset({"success", "failed"})
# Task instance states in which the task will not run again unless it is cleared.
FINISHED_TASK_STATES = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})


@dataclasses.dataclass(frozen=True)
class RunRef:
    pipeline: str
    run_id: str

    @classmethod
    def parse(cls, text: str) -> RunRef:
        pipeline, sep, run_id = text.partition("/")
        if not sep or not pipeline or not run_id:
            raise BadRequest(
                f"{text!r} is not a run name: a run is named PIPELINE/RUN_ID; copy it from the RUN "
                "column of `shardline runs`"
            )
        return cls(pipeline, run_id)

    def __str__(self) -> str:
        return naming.run_ref(self.pipeline, self.run_id)


# --- the ledger's records, as plain values (the service copies them from the items it read) ----------


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """A run's RUN item."""

    status: str | None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    message: str | None = None
    partition: str | None = None

    @classmethod
    def of(cls, item: Any) -> RunRecord:
        return cls(item.status, item.started_at, item.finished_at, item.message, getattr(item, "partition", None))


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """A step's STEP item: its latest attempt, and how that ended."""

    status: str | None
    attempt: int
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    message: str | None = None

    @classmethod
    def of(cls, item: Any) -> StepRecord:
        return cls(item.status, int(item.attempt or 0), item.started_at, item.finished_at, item.message)


@dataclasses.dataclass(frozen=True)
class ShardRecord:
    """One instance of one attempt, as it reported itself (its SHARD item)."""

    host: str | None
    attempt: int
    status: str | None = None
    files_assigned: int = 0
    files_done: int = 0
    files_failed: int = 0
    rows_done: int = 0
    heartbeat_at: dt.datetime | None = None

    @classmethod
    def of(cls, item: Any) -> ShardRecord:
        return cls(
            item.host,
            int(item.attempt or 0),
            item.status,
            int(item.files_assigned or 0),
            int(item.files_done or 0),
            int(item.files_failed or 0),
            int(item.rows_done or 0),
            item.heartbeat_at,
        )


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
    partition: str | None = None  # what the run scores: its data interval's start (UTC)


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


@dataclasses.dataclass(frozen=True)
class ResubmitResult:
    plan: ResubmitPlan
    attempt: int | None
    job_name: str | None
    airflow: str  # what happened on the Airflow side, in words
    complete: bool = True  # False: something is left half done; ``airflow`` says what, and how to finish it
    action: str = Next.SUBMIT.value  # what was (or, in a dry run, would be) done: a Next value


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def file_view(step: str, item: Any) -> FileView:
    """A FILE item of ``step`` as the views show it."""
    return FileView(
        step,
        item.input_key,
        item.status,
        int(item.attempt or 0),
        item.host,
        int(item.rows_in) if item.rows_in is not None else None,
        int(item.rows_out) if item.rows_out is not None else None,
        item.error_class,
        item.error_message,
    )


def with_setup_error(view: FileView, setup_error: str | None) -> FileView:
    """An unfinished file of an attempt whose instance could not start: the instance's reason is the file's."""
    if setup_error is None or view.error_class or FileStatus(view.status).is_terminal:
        return view
    return dataclasses.replace(view, error_class=SETUP_ERROR, error_message=setup_error)


def run_row(pipeline: str, run_id: str, started_at: dt.datetime | None, run: RunRecord | None) -> RunRow:
    """A line of `shardline runs`: the run index's entry, with its RUN item when there is one."""
    if run is None:
        return RunRow(pipeline, run_id, "UNKNOWN", iso(started_at), None)
    return RunRow(
        pipeline, run_id, run.status, iso(started_at), iso(run.finished_at), run.message, partition=run.partition
    )


def with_airflow(row: RunRow, airflow_state: str | None) -> RunRow:
    """``row`` with the DAG run's state beside the ledger's, and what to do when they disagree."""
    return dataclasses.replace(
        row,
        airflow_state=airflow_state,
        disagreement=disagreement(row.status, airflow_state, naming.run_ref(row.pipeline, row.run_id)),
    )


def missing_job_status(shards: Sequence[ShardRecord], attempt: int) -> str:
    """The job column for an attempt whose job the backend does not know: instances that reported for the
    attempt prove it ran (elsewhere, as another local root); else it was never submitted."""
    return "NotFoundHere" if any(s.attempt == attempt for s in shards) else "NotSubmitted"


def step_view(
    step: str,
    record: StepRecord,
    files: Sequence[FileView],
    shards: Sequence[ShardRecord],
    *,
    job_name: str | None,
    job_status: str | None,
    now: dt.datetime,
    with_files: bool = False,
) -> StepView:
    """A step of `shardline status`: file counts, rows, and the current attempt's throughput and ETA."""
    attempt = record.attempt
    by_status = {s: [f for f in files if f.status == s] for s in FileStatus}
    succeeded = by_status[FileStatus.SUCCEEDED]
    status = record.status or StepStatus.PLANNED.value
    if status == StepStatus.PLANNED and job_status == JobStatus.IN_PROGRESS:
        status = StepStatus.RUNNING.value
    started = record.started_at
    # Over the current attempt: until it ended, or until now while it runs.
    until = record.finished_at if status in STEP_TERMINAL and record.finished_at else now
    elapsed = (until - started).total_seconds() if started else None
    rows_out = int(sum(f.rows_out or 0 for f in succeeded))
    # Throughput and ETA over the current attempt: files done per second so far.
    done_now = [f for f in files if f.attempt == attempt and FileStatus(f.status).is_terminal]
    remaining = len(by_status[FileStatus.PENDING]) + len(by_status[FileStatus.RUNNING])
    rows_done_now = sum(f.rows_out or 0 for f in done_now)
    rate = rows_done_now / elapsed if elapsed and rows_done_now else None
    eta = remaining / (len(done_now) / elapsed) if elapsed and done_now and remaining else None
    shard_views = [
        ShardView(
            s.host or "?",
            s.attempt,
            s.status or "?",
            s.files_assigned,
            s.files_done,
            s.files_failed,
            s.rows_done,
            (now - s.heartbeat_at).total_seconds() if s.heartbeat_at else None,
        )
        for s in shards
    ]
    return StepView(
        step,
        status,
        attempt,
        job_name,
        job_status,
        len(files),
        len(succeeded),
        len(by_status[FileStatus.FAILED]),
        len(by_status[FileStatus.RUNNING]),
        len(by_status[FileStatus.PENDING]),
        int(sum(f.rows_in or 0 for f in succeeded)),
        rows_out,
        rate,
        eta,
        iso(started),
        record.message,
        shard_views,
        list(files) if with_files else [],
    )


def run_view(ref: RunRef, run: RunRecord, steps: Sequence[StepView], airflow_state: str | None) -> RunView:
    """`shardline status`: the run, its planned steps, and Airflow's side when it was asked."""
    status = run.status or "UNKNOWN"
    # The step to take up: the first one not ended, or else the last one.
    behind = next((s.name for s in steps if s.status not in STEP_TERMINAL), steps[-1].name if steps else None)
    return RunView(
        str(ref),
        ref.pipeline,
        ref.run_id,
        status,
        iso(run.started_at),
        iso(run.finished_at),
        run.message,
        list(steps),
        airflow_state,
        disagreement(status, airflow_state, str(ref), behind),
    )


# --- the resubmit policy and the ledger-vs-Airflow comparison ------------------------------------


# The ledger's run status, and the DAG run states that tell the same story.
_AGREEING_RUN_STATES = {
    StepStatus.PLANNED: {"queued", "running"},
    StepStatus.SUBMITTED: {"queued", "running"},
    StepStatus.RUNNING: {"queued", "running"},
    StepStatus.SUCCEEDED: {"success"},
    StepStatus.PARTIAL: {"success"},
    StepStatus.SKIPPED: {"success"},
    StepStatus.FAILED: {"failed"},
    StepStatus.CANCELLED: {"failed"},
}


def disagreement(ledger_status: str | None, airflow_state: str | None, ref: str, step: str | None = None) -> str | None:
    """Why the ledger and Airflow disagree about run ``ref``, with what to do; ``None`` when they agree."""
    if airflow_state is None or ledger_status not in _AGREEING_RUN_STATES:
        return None
    if airflow_state in _AGREEING_RUN_STATES[StepStatus(ledger_status)]:
        return None
    fix = (
        f"`{shlex.join(['shardline', 'resubmit', ref, '--step', step, '--all-failed'])}`"
        if step
        else f"`shardline resubmit {ref} --step STEP --all-failed` (for the step `shardline status {ref}` "
        "shows unfinished)"
    )
    if airflow_state in FINISHED_RUN_STATES and ledger_status not in STEP_TERMINAL:
        return (
            f"the DAG run's state is {airflow_state} but the ledger says {ledger_status}: no task drives this "
            f"run now; {fix} takes it up again"
        )
    if airflow_state == "failed" and ledger_status in (StepStatus.SUCCEEDED, StepStatus.PARTIAL):
        return (
            f"the DAG run failed but the ledger says {ledger_status}: its watch task ended before the last "
            f"attempt did; {fix} clears it, so the run turns green"
        )
    return (
        f"the DAG run's state is {airflow_state}, the ledger says {ledger_status}; this can last a moment "
        f"while the DAG run's last tasks end: wait a minute and check again with `shardline status {ref}`, and "
        "if they still differ, check the DAG run's task logs in Airflow"
    )


def task_state(state: str | None) -> str:
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
_UNSAFE_HINT = (
    "`shardline failed` lists the files that did not succeed, and why (a key refused as an unsafe path "
    "never runs: rename the object or exclude it with input.exclude)"
)


def choose_next(
    *,
    attempt: int,
    job: str,
    job_running: bool,
    step_status: str | None,
    watch_state: str | None,
    files: int,
    force: bool,
    watch: str,
) -> NextStep:
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
            follows = f" and its sensor ({watch}, {task_state(watch_state)}) follows it" if sensor_in_charge else ""
            return NextStep(
                Next.NOTHING,
                False,
                f"attempt {attempt} ({job}) is still running{follows}: nothing to "
                "resubmit while it runs; wait for it to end (`shardline status` "
                "shows its progress)",
            )
        return NextStep(
            Next.TAKE_UP,
            True,
            f"attempt {attempt} ({job}) is running, but the DAG run's {watch} has "
            f"ended ({watch_state}), so nothing in Airflow follows it: clearing "
            f"{watch} lets the DAG run follow it again",
        )
    if not step_ended:
        if sensor_in_charge:
            if force and files:
                return NextStep(
                    Next.SUBMIT, False, f"--force: {watch} is {task_state(watch_state)} and follows the new attempt"
                )
            waiting = (
                f"attempt {attempt} has ended, but its sensor ({watch}, now {task_state(watch_state)}) has "
                "not recorded the outcome yet; it resubmits on its own while retry.max_attempts allows"
            )
            if force:
                return NextStep(
                    Next.REFUSE,
                    False,
                    f"{waiting}, and no chosen file is left to resubmit: wait for "
                    "it (`shardline status` shows when it has)",
                )
            return NextStep(
                Next.REFUSE,
                False,
                f"{waiting}. Wait for it (`shardline status` shows when it has), or pass --force to resubmit now",
            )
        if files:
            return NextStep(
                Next.SUBMIT,
                watch_state is not None,
                f"attempt {attempt} has ended and no watch task recorded its outcome",
            )
        if watch_state is None:
            return NextStep(Next.NOTHING, False, "nothing to resubmit: every chosen file has succeeded")
        return NextStep(
            Next.TAKE_UP,
            True,
            f"every chosen file has succeeded, but no watch task recorded attempt "
            f"{attempt}'s outcome: clearing {watch} lets the DAG run record it "
            "and go on",
        )
    if files:
        return NextStep(Next.SUBMIT, watch_state is not None, f"the step ended {step_status}")
    if (
        step_status in (StepStatus.SUCCEEDED, StepStatus.PARTIAL)
        and watch_state in FINISHED_TASK_STATES
        and watch_state != "success"
    ):
        return NextStep(
            Next.TAKE_UP,
            True,
            f"{_ended_without_files(step_status)}, but the DAG run's {watch} ended "
            f"{watch_state} before the last attempt did: clearing it lets the run "
            "turn green",
        )
    if step_status in (StepStatus.SUCCEEDED, StepStatus.SKIPPED):
        return NextStep(Next.NOTHING, False, f"nothing to resubmit: {_ended_without_files(step_status)}")
    return NextStep(Next.NOTHING, False, f"nothing to resubmit: {_ended_without_files(step_status)}; {_UNSAFE_HINT}")


# --- what a resubmission or a cancel says, as text (tests/oncall/test_messages.py renders each) ----------


def dry_run_text(choice: NextStep, watch: str, run_id: str, attempt: int | None, watch_state: str | None) -> str:
    """What a dry run says it would do: ``attempt`` is the one it would submit (``None``: it submits none)."""
    if attempt is None:
        return f"dry run, nothing was changed: {choice.reason}"
    if choice.clear_watch:
        return (
            f"dry run, nothing was changed: for real, it would submit attempt {attempt}, then clear {watch} of "
            f"DAG run {run_id} so the run follows it"
        )
    return (
        f"dry run, nothing was changed: for real, it would submit attempt {attempt} and clear nothing in "
        f"Airflow ({followed_text(watch, watch_state)})"
    )


def followed_text(watch: str, watch_state: str | None) -> str:
    """Who follows a new attempt when no watch task needs clearing."""
    if watch_state:
        return f"{watch} is {task_state(watch_state)} and follows the new attempt"
    return "Airflow was left out (--ledger-only): no DAG run follows this attempt"


def half_done_text(attempt: int | None, job_name: str | None, watch: str, err: Exception, again: str) -> str:
    """A resubmission whose clear failed: what was done, and the command that finishes it."""
    if attempt:
        done = f"attempt {attempt} is submitted as job {job_name}, but the DAG run does not follow it yet"
    else:
        done = "nothing was submitted, and the DAG run does not follow the step yet"
    return (
        f"{done}: clearing {watch} failed: {err}. To finish, run the same command again once Airflow lets "
        f"you; it clears {watch} and submits nothing twice: {again}"
    )


def cleared_text(watch: str, state: str, cleared: int) -> str:
    """What clearing a finished watch task did."""
    return (
        f"{watch} had ended ({state}): cleared it and what follows it ({cleared} task instance(s)), so the DAG "
        "run follows the step again and turns green when it succeeds"
    )


def not_finished_text(watch: str, wait_seconds: float, state: str | None) -> str:
    """A watch task that was still running when the resubmission came to clear it."""
    return f"{watch} has not finished after {wait_seconds:.0f}s (it is {task_state(state)})"


def airflow_left_out(err: Exception) -> str:
    """Why `shardline runs` and `status` show no Airflow column."""
    return f"Airflow's DAG run states are left out (the ledger's are shown): {err}"


def unknown_step(pipeline: str, step: str, steps: Sequence[str]) -> str:
    return f"pipeline {pipeline} has no step {step!r}; its steps are {', '.join(steps)}: pass one of them as --step"


def local_root_mismatch(job: str, attempt: int, local_root: object) -> str:
    """The local backend's jobs live in a directory; a CLI that looks in another one must not submit."""
    return (
        f"job {job} of attempt {attempt} ran, but not under {local_root}, where this shell's local "
        "backend looks, so nothing was submitted (a job started here would run beside Airflow's). Run the "
        "command with the same AIRFLOW_HOME (or SHARDLINE_LOCAL_ROOT) as the Airflow that runs the pipeline"
    )


def resubmit_command(
    ref: RunRef, step: str, *, shard: str | None, files: Sequence[str], all_failed: bool, force: bool
) -> str:
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


# --- run reports -----------------------------------------------------------------------------------------------

# Where `shardline report` puts the pages it fetches, under the current directory.
LOCAL_REPORTS = (".shardline", "reports")


@dataclasses.dataclass(frozen=True)
class StepReportRef:
    """Where one step's run report is on S3: derived from the STEP item's plan, never given by a caller."""

    step: str
    status: str | None
    html_uri: str
    json_uri: str


@dataclasses.dataclass(frozen=True)
class SavedReport:
    """A step's report fetched to a local file (``report`` holds report.json's content when it was asked for)."""

    step: str
    status: str | None
    uri: str
    path: str
    report: dict | None = None


def report_command(pipeline: str, run_id: str, step: str) -> str:
    """The command that fetches a step's run report and opens it."""
    return shlex.join(["shardline", "report", naming.run_ref(pipeline, run_id), "--step", step, "--open"])


def path_part(text: str) -> str:
    """``text`` as one folder name: a separator or any unusual character becomes ``_``, and never ``.``/``..``."""
    part = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_.:+=@-") else "_" for ch in text)
    return part if part.strip(".") else "_" + part


def local_report_path(root: Path, pipeline: str, run_id: str, step: str) -> Path:
    """``<root>/.shardline/reports/<pipeline>/<run>/<step>/report.html`` (``root``: the current directory)."""
    return root.joinpath(*LOCAL_REPORTS, path_part(pipeline), path_part(run_id), path_part(step), "report.html")


REPORTS_WHEN = "a step's run report is written when the step ends"


def report_not_planned_text(ref: RunRef, step: str) -> str:
    return (
        f"step {step} of {ref} was never planned, so it has no run report ({REPORTS_WHEN}); `shardline status "
        f"{ref}` shows where the run is"
    )


def report_missing_text(ref: RunRef, step: str, status: str | None, uri: str) -> str:
    """A planned step whose report is not (yet) on S3: still running, or ended without one."""
    if status not in STEP_TERMINAL:
        return (
            f"step {step} of {ref} has not ended ({status or 'no status'}), so it has no run report yet: "
            f"{REPORTS_WHEN}; `shardline status {ref}` shows its progress"
        )
    return (
        f"step {step} of {ref} ended {status}, but its run report is not at {uri}: {REPORTS_WHEN}, so a run "
        f"from before Shardline wrote reports has none, and if writing it failed the step's watch_{step} task "
        "log says why"
    )


def no_reports_text(ref: RunRef, missing: Sequence[str]) -> str:
    """No step of the run has a report: each one's reason."""
    return f"run {ref} has no run report yet: " + "; ".join(missing)


def out_needs_step_text(ref: RunRef, steps: Sequence[str]) -> str:
    return f"--out names one file, and run {ref} has reports for steps {', '.join(steps)}: pass --step with --out"
