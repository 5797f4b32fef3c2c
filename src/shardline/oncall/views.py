"""What `shardline runs`, `status` and `failed` show, as pure functions over values already read: the ledger's
records (:mod:`shardline.oncall.values`), the backend's job status, Airflow's states and the clock.

No AWS client, no Airflow, no HTTP here: :mod:`shardline.oncall.service` reads and calls these, the CLI
prints what they return and the page serves it, so every view is tested without a server
(``tests/oncall/test_views.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shlex
from collections.abc import Mapping, Sequence

from shardline.backends import JobStatus
from shardline.decision.fleet import Waiting
from shardline.ledger.records import FileRecord, RunRecord, ShardRecord, StepRecord
from shardline.ledger.states import SETUP_ERROR, STEP_TERMINAL, FileStatus, StepStatus
from shardline.oncall.messages import all_scored_text
from shardline.oncall.values import FileView, InstanceView, RunRef, RunRow, RunView, StepView
from shardline.planning import naming
from shardline.planning.arrivals import ARRIVAL_RUN_PREFIX
from shardline.spec import PARTITION_FORMAT, PipelineSpec, interval_starts

# DAG run states in which no task will run again unless something is cleared.
FINISHED_RUN_STATES = frozenset({"success", "failed"})
# A task instance that ended: what `cancel` leaves as it is (it fails every other one of the run).
FINISHED_TASK_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def file_view(step: str, record: FileRecord) -> FileView:
    """A file of ``step`` as the views show it."""
    return FileView(
        step,
        record.input_key,
        record.status,
        record.attempt,
        record.host,
        record.rows_in,
        record.rows_out,
        record.error_class,
        record.error_message,
        rows_rejected=record.rows_rejected or 0,
        rejects_key=record.rejects_key,
    )


def failed_note(
    ref: RunRef, run: RunRecord | None, steps: Mapping[str, StepRecord | None], files: Sequence[FileView]
) -> str | None:
    """What `shardline failed` says besides its files when no file is left to resubmit and yet the run, or one of
    ``steps`` (the steps asked about, each None if never planned), ended FAILED or CANCELLED: what is missing, and
    the command that mends it. None when a file is left to resubmit, or nothing ended badly."""
    bad = (StepStatus.FAILED, StepStatus.CANCELLED)
    run_status = run.status if run is not None and run.status in bad else None
    if any(f.status != FileStatus.SUCCEEDED for f in files):
        return None
    if run_status is None and not any(s is not None and s.status in bad for s in steps.values()):
        return None
    missing = []
    for name, step in steps.items():
        if step is None:
            missing.append(f"step {name} was never planned")
        elif step.status in bad:
            said = f": {step.message}" if step.message else ""
            missing.append(
                f"step {name} ended {step.status}{said}, so its outputs are not committed (no outputs manifest, "
                "no _SUCCESS)"
            )
        elif step.status not in (StepStatus.SUCCEEDED, StepStatus.PARTIAL, StepStatus.SKIPPED):
            missing.append(f"step {name} never ended ({step.status or 'no status'}), so its outputs are not committed")
    if not missing:
        missing.append("every step ended well, but the run's end (its report task) was not recorded")
    return all_scored_text(ref, missing, run_status, run.message if run_status else None)


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
        pipeline, run_id, run.status, iso(started_at), iso(run.finished_at), run_message(run), partition=run.partition
    )


def run_message(run: RunRecord) -> str | None:
    """What a run says: while it runs, which step's job is not running yet and why, if one waits; else its message.
    A run that missed its deadline says that first."""
    waiting = Waiting.from_json(run.waiting) if run.status == StepStatus.RUNNING else None
    said = waiting.text() if waiting is not None else ""
    message = f"step {run.waiting_step}: {said}" if said else run.message
    if run.missed_deadline:
        return f"{run.missed_deadline}: {message}" if message else run.missed_deadline
    return message


def _step_wait(record: StepRecord) -> Waiting | None:
    """Why a step still going has no job running yet, if it waits (an ended step waits for nothing)."""
    return Waiting.from_json(record.waiting) if record.status not in STEP_TERMINAL else None


def step_message(record: StepRecord, waiting: Waiting | None = None) -> str | None:
    """What a step says: an ended one, why it ended; one still going, why its job is not running yet, if it waits
    (``waiting``: its wait, when the caller has read it already)."""
    said = (waiting or _step_wait(record) or Waiting()).text()
    return said or record.message


SCHEDULED_RUN_PREFIX = "scheduled__"  # Airflow's run ids of scheduled runs
MISSING = "MISSING"  # the status of a row for an interval its schedule owes and no run scores
# A scheduled run records itself (its RUN item) when its plan task starts, at its interval's end: past the
# partition's settle time and this grace, an interval with no run is missing, not merely queued.
MISSING_GRACE_SECONDS = 300


def missing_rows(
    spec: PipelineSpec,
    rows: Sequence[RunRow],
    now: dt.datetime,
    limit: int = 20,
    grace_seconds: float = MISSING_GRACE_SECONDS,
) -> list[RunRow]:
    """The intervals of a scheduled pipeline, from its oldest listed run's partition to the last one past its
    settle time, that no listed run scores: each a MISSING row with the command that scores it. Whatever the
    cause (a paused DAG, a manual run that took an interval's logical date, a scheduler outage), an owed
    partition is never silently skipped. The newest ``limit`` are listed; the last one says how many more."""
    if spec.schedule in (None, "@once"):
        return []
    mine = [r for r in rows if r.pipeline == spec.pipeline and r.partition]
    seen = {r.partition for r in mine}
    # The span is the scheduled runs' own: a manual run of an old partition (a rerun, a backfill) listed among the
    # newest says nothing of the intervals between it and them.
    # A run an arrival started (trigger:) is the one its schedule would have created.
    scheduled = [r.partition for r in mine if r.run_id.startswith((SCHEDULED_RUN_PREFIX, ARRIVAL_RUN_PREFIX))]
    if not scheduled:
        return []
    oldest = min(dt.datetime.fromisoformat(p).replace(tzinfo=dt.UTC) for p in scheduled)
    settle = max((s.input.settle_seconds for s in spec.steps if not s.input.from_step), default=0)
    until = now - dt.timedelta(seconds=settle + grace_seconds)
    missing = []
    owed = [s for s in interval_starts(spec.schedule, oldest, until) if s.strftime(PARTITION_FORMAT) not in seen]
    for start in sorted(owed, reverse=True)[:limit]:
        key = start.strftime(PARTITION_FORMAT)
        command = f"shardline trigger {spec.pipeline} --partition {start:%Y-%m-%dT%H:%M}"
        missing.append(
            RunRow(
                spec.pipeline,
                "-",
                MISSING,
                None,
                None,
                f"no run scores the interval starting {key}Z, past its settle time: score it with `{command}`",
                partition=key,
            )
        )
    if len(owed) > limit:
        last = missing[-1]
        more = f" ({len(owed) - limit} more interval(s) before it are missing too)"
        missing[-1] = dataclasses.replace(last, message=(last.message or "") + more)
    return missing


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
    waiting = _step_wait(record)  # read once: the message says it, `waiting` gives it as data
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
    instance_views = [
        InstanceView(
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
        step_message(record, waiting),
        instance_views,
        list(files) if with_files else [],
        rows_rejected=int(sum(f.rows_rejected or 0 for f in succeeded)),
        waiting=waiting.to_data() if waiting is not None else None,  # for `status --json` and the page
        table=record.table,
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
        run_message(run),
        list(steps),
        airflow_state,
        disagreement(status, airflow_state, str(ref), behind),
    )


# --- the ledger-vs-Airflow comparison ------------------------------------------------------------


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
