"""A step's end: what the watch's decision becomes (:func:`conclude`), recorded on the STEP and RUN items with its
message (:func:`finish`), and the step's summary of rows in and out (:func:`summarize`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from shardline.decision.policy import Action
from shardline.decision.step_end import ENDED_WITH_OUTPUTS, EndChecks, end_status
from shardline.decision.summary import FailedFile, StepSummary, status_of
from shardline.errors import LedgerRecordMissing, TableCommitFailed, TableError, error_line
from shardline.ledger.keys import StepRef
from shardline.ledger.record_gaps import record_gap
from shardline.ledger.records import StepRecord
from shardline.ledger.states import FileStatus, RunStatus, StepStatus
from shardline.ledger.step_reads import StepRecords, read_step, read_step_item
from shardline.ledger.step_writes import finish_step, record_refused, set_run_status
from shardline.orchestration import partitions, services, tables
from shardline.orchestration.step import jobs, outputs, run_report
from shardline.orchestration.step.approval import Approval, approval_of
from shardline.orchestration.step.files import attempt_of, read_step_files
from shardline.orchestration.step.watch import StepEvent
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Retry:
    """The next attempt a step's end asks for: these files (full s3:// URIs), after ``delay_seconds``."""

    files: tuple[str, ...]
    sizes: dict[str, int]  # sizes a listing already knows (inputs that landed late): no object is read for them
    capacity: bool  # SageMaker could not provision the job: the next may move to a fallback type
    delay_seconds: float
    beside: bool = False  # a lost instance's files: the running job goes on beside the next attempt

    def to_json(self, attempt: Attempt) -> dict:
        """What the watch task carries through its backoff to :func:`jobs.resubmit`."""
        files, sizes = list(self.files), self.sizes
        return {
            "attempt": attempt.to_xcom(),
            "retry_files": files,
            "retry_sizes": sizes,
            "capacity": self.capacity,
            "beside": self.beside,
        }


@dataclasses.dataclass(frozen=True)
class StepEnd:
    """What the watch's decision became once acted on: the step is done (``summary``), a next attempt is due
    (``retry``), or the step failed (``failed_files``; ``message`` is the step's own when its end check failed it).
    An UNREACHABLE end recorded nothing: the ledger could not be reached."""

    action: Action
    reason: str
    summary: StepSummary | None = None
    retry: Retry | None = None
    failed_files: tuple[dict, ...] = ()
    message: str | None = None
    moved_on: bool = False  # a newer attempt owns the step (an on-call resubmission): the watch follows it


def conclude(spec: PipelineSpec, event: StepEvent) -> StepEnd:
    """Act on the watch's decision about ``event.attempt``: stop its job if asked, send inputs that landed after
    planning to a next attempt (``_SUCCESS`` never covers a partial set), record the step's end, and say what the
    watch task does next. Fenced like :func:`finish`: an on-call engineer's newer attempt stands."""
    attempt, action = event.attempt, event.action
    if action is Action.UNREACHABLE:
        return StepEnd(action, event.reason)
    if event.stop_job:
        jobs.stop(spec, attempt)
    late_sizes: dict[str, int] = {}
    if action.is_done and (late := outputs.late_inputs_decision(spec, attempt, event.policy)) is not None:
        event, late_sizes = StepEvent.of(late[0], attempt, event.policy), late[1]
    if event.action is not Action.RESUBMIT:
        try:
            status = finish(spec, attempt, event.action, event.reason)
        except outputs.LateInputsFound as found:
            # The last look before _SUCCESS found inputs that landed (or changed) after planning: a next attempt
            # scores them, or the step fails naming them; it is not green without them.
            log.warning("step %s: its last look before _SUCCESS found that %s", attempt.step, found)
            late = outputs.late_inputs_decision(spec, attempt, event.policy, found.late)
            event, late_sizes = StepEvent.of(late[0], attempt, event.policy), late[1]
            status = None if event.action is Action.RESUBMIT else finish(spec, attempt, event.action, event.reason)
        if status is None and event.action is not Action.RESUBMIT:
            # A newer attempt owns the step (its STEP item says so: finish() checked it is there): follow it.
            return StepEnd(event.action, f"step {attempt.step} moved on past attempt {attempt.number}", moved_on=True)
        if status is StepStatus.CANCELLED:
            return StepEnd(Action.FAIL, step_message(spec, attempt), failed_files=event.failed_files)
        if event.action.is_done and status is StepStatus.FAILED:
            # The outputs are there, but a blocking output check held its _SUCCESS back and failed the step.
            return StepEnd(Action.FAIL, event.reason, message=step_message(spec, attempt))
    if event.action.is_done:
        return StepEnd(event.action, event.reason, summarize(spec, attempt.ref), failed_files=event.failed_files)
    if event.action is Action.RESUBMIT:
        retry = Retry(event.retry_files, late_sizes, event.capacity, event.delay_seconds, event.beside)
        return StepEnd(event.action, event.reason, retry=retry)
    return StepEnd(event.action, event.reason, failed_files=event.failed_files)


def finish(spec: PipelineSpec, attempt: Attempt, action: Action, reason: str) -> StepStatus | None:
    """Record the watch's outcome on the STEP item (and on the RUN item when the step failed), and return the status
    recorded.

    Fenced on the attempt: if an on-call engineer resubmitted meanwhile, the newer attempt's state stands (None); if
    they cancelled it, CANCELLED. A STEP item that is gone raises :class:`~shardline.errors.LedgerRecordMissing`:
    absence is never read as a newer attempt.
    """
    status = status_of(action)
    model = services.ledger_model(spec)
    took = _Laps()
    step_record = read_step(model, attempt.ref, files=False).step
    if gap := record_gap(step_record, attempt.ref, attempt.number):  # first: no check, report or marker without it
        raise LedgerRecordMissing(gap)
    unvouched: list[outputs.UnvouchedFile] = []
    seen, checks, written = None, EndChecks(), None
    # The checks, each only where the one before it found nothing (decision.step_end orders them).
    if status in ENDED_WITH_OUTPUTS:
        checks = EndChecks(lost=partitions.lost(spec, attempt))
    took.lap("records and hold")
    if status in ENDED_WITH_OUTPUTS and checks.first is None:
        seen, unvouched, written = _vouched_and_reported(spec, attempt)
        took.lap("outputs vouched and run report")
        if unvouched:
            checks = EndChecks(unvouched=outputs.unvouched_text(unvouched))
            log.error("step %s: %s", attempt.step, checks.unvouched)
        else:
            checks = EndChecks(over_limit=outputs.rejects_over_limit(spec, attempt, seen.records))
    outputs_stand = status in ENDED_WITH_OUTPUTS and checks.first is None
    table_failure = False  # the table refused the outputs: the step's message is the commit's own
    committed: dict | None = None  # what the end committed to the step's output table
    if written is None:
        written = run_report.write_report(spec, attempt)
        took.lap("run report")
    approved = approval_of(step_record, attempt.number)  # on-call accepted what the checks held back
    held = run_report.checks_failure(spec, attempt, outputs_stand, written, approved)
    checks = dataclasses.replace(checks, checks=held)
    status, reason = end_status(status, reason, checks)
    if status is StepStatus.SUCCEEDED:
        status, reason, committed = _commit(spec, attempt, seen, reason, took)
        table_failure = status is StepStatus.FAILED
        if committed:
            run_report.note_table(spec, attempt, written, committed)
    try:
        message = reason if table_failure else _message(attempt, status, reason, checks, approved)
        recorded = finish_step(
            model, attempt.ref, attempt.number, status, message, json.dumps(committed) if committed else None
        )
    except BaseException:
        if status is StepStatus.SUCCEEDED:  # the marker stands only beside a step recorded SUCCEEDED
            outputs.withdraw_own_marker(spec, attempt)
        raise
    took.lap("STEP item")
    log.info("step %s: its end took %s", attempt.step, took)
    if not recorded:
        log.info("step %s moved on (resubmitted or cancelled); its newer state stands", attempt.step)
        if status is StepStatus.SUCCEEDED:
            outputs.withdraw_own_marker(spec, attempt)  # the newer attempt writes the prefix again
        now = read_step(model, attempt.ref, files=False).step
        if now is not None and now.status == StepStatus.CANCELLED.value and int(now.attempt or 0) == attempt.number:
            return StepStatus.CANCELLED
        return None
    if unvouched:  # FAILED now, so `failed` shows them and `resubmit --all-failed` takes them
        for number in sorted({u.attempt for u in unvouched}):
            record_refused(
                model,
                attempt.ref,
                number,
                [(u.input_key, 0, u.reason) for u in unvouched if u.attempt == number],
                error_class=outputs.UNVOUCHED_OUTPUT_ERROR,
            )
    if status is StepStatus.FAILED:
        set_run_status(model, attempt.pipeline, attempt.run_id, RunStatus.FAILED, run_outcome_message(attempt, reason))
    if status in ENDED_WITH_OUTPUTS and status is not StepStatus.SUCCEEDED:
        # No file changed since the reading: a step with an unvouched file ended FAILED, and commits nothing.
        outputs.commit_outputs(spec, attempt, status, seen)
    return status


def _commit(
    spec: PipelineSpec, attempt: Attempt, seen, reason: str, took: _Laps
) -> tuple[StepStatus, str, dict | None]:
    """Commit a step that succeeded: its last look at the inputs, its outputs manifest, its table's commit and its
    ``_SUCCESS``. The status and reason to record, and what the table commit was (None without a table). FAILED when
    the table refused the outputs: they are whole, but there is no ``_SUCCESS``; the message says why and how to
    commit again, a rerun adopts them."""
    # The last look at the input prefix, after the run report and just before the step is recorded as
    # ended: a file that landed (or was replaced) since the watch's look goes to a next attempt, never under
    # a _SUCCESS that does not cover it. The marker is written before the step's end is recorded, and the
    # prefix listed once more after it (commit_outputs): no window is left between this look and _SUCCESS.
    look = outputs.look_at_inputs(spec, attempt)
    took.lap("last look")
    if look is not None and look.late:
        raise outputs.LateInputsFound(look.late)
    try:
        committed = outputs.commit_outputs(spec, attempt, StepStatus.SUCCEEDED, seen, look).get("table")
    except (TableError, TableCommitFailed) as err:
        log.error("step %s: %s", attempt.step, err)
        return StepStatus.FAILED, f"table: {err}", None
    finally:
        took.lap("manifest, table and _SUCCESS")
    if committed:
        reason = f"{reason}; {tables.TableCommit(**committed).words()}"
    return StepStatus.SUCCEEDED, reason, committed


def _message(attempt: Attempt, status: StepStatus, reason: str, checks: EndChecks, approved: Approval | None) -> str:
    """The STEP item's message for how the step ends: a lost prefix's reason as it is (the run that holds it writes it
    now), held-back checks' with their ways forward, an approval's who and why, else :func:`outcome_message`."""
    if approved is not None and status is StepStatus.SUCCEEDED:
        return f"{reason}; outputs held back by its checks were {approved.words()}"
    held_back = checks.checks is not None and checks.first == checks.checks
    return reason if checks.lost or held_back else outcome_message(attempt, status, reason)


def _vouched_and_reported(spec: PipelineSpec, attempt: Attempt):
    """The step's outputs as read, those not vouched for, and its run report as written (or why not). The report is
    written on a thread beside the vouching: both mostly wait on S3, and both are done before anything is decided."""
    seen = outputs.read_outputs(spec, attempt)
    with ThreadPoolExecutor(max_workers=1) as beside:
        report = beside.submit(run_report.write_report, spec, attempt, seen.records)
        unvouched = outputs.unvouched_outputs(spec, attempt, seen)
        return seen, unvouched, report.result()


class _Laps:
    """Where a step's end spends its seconds, said in one log line (docs/benchmarks.md quotes it)."""

    def __init__(self):
        self.started = self.last = time.monotonic()
        self.laps: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps.append((name, now - self.last))
        self.last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in self.laps)
        return f"{self.last - self.started:.2f}s ({parts})"


def file_error(error_class: str | None, error_message: str | None) -> str:
    """A file's error in one line: class and message, either of which may be missing."""
    return error_line(error_class, error_message) or "no error recorded"


def summarize(spec: PipelineSpec, ref: StepRef) -> StepSummary:
    """Reconcile rows in against rows out for every file of a step."""
    step = ref.step
    records = read_step_files(spec, ref)
    if records.step is None:  # the files it can still see are not the step's: never a summary of nothing
        raise LedgerRecordMissing(record_gap(None, ref, 1))
    files = records.settled  # a file's rejects parts count as the file's rows
    succeeded = [f for f in files if f.status == FileStatus.SUCCEEDED]
    failed = [f for f in files if f.status == FileStatus.FAILED]
    mismatched = [f.input_key for f in succeeded if (f.rows_in or 0) != (f.rows_out or 0) + (f.rows_rejected or 0)]
    approved = approval_of(records.step, records.step.attempt)
    return StepSummary(
        step=step,
        files=len(files),
        succeeded=len(succeeded),
        failed=len(failed),
        rows_in=int(sum(f.rows_in or 0 for f in succeeded)),
        rows_out=int(sum(f.rows_out or 0 for f in succeeded)),
        rows_rejected=int(sum(f.rows_rejected or 0 for f in succeeded)),
        attempts=records.step.attempt,
        rows_mismatched_files=tuple(mismatched),
        failed_files=tuple(FailedFile(f.input_key, file_error(f.error_class, f.error_message)) for f in failed),
        report=report_uri(records.step, ref),
        reported_at=dt.datetime.now(dt.UTC).isoformat(),
        approval=dataclasses.asdict(approved) if approved else None,
        table=records.step.table,
    )


def confirm_ended(spec: PipelineSpec, ref: StepRef, summary: StepSummary) -> str | None:
    """Why a step's summary (what its watch task returned) cannot be taken as the run's end, or None when its facts
    still stand: its STEP item is there, at the attempt the summary counted, with the status its outcome recorded;
    and a SUCCEEDED step's ``_SUCCESS`` is this run's. The report task asks before it marks a run green: a summary
    in XCom outlives a ledger or an S3 prefix that was lost, or taken over, since. One Query of the STEP item: no
    FILE item or plan file is read (a step of a million files is checked as quickly as one of ten)."""
    step = read_step(services.ledger_model(spec), ref, files=False).step
    attempts = summary.attempts
    gap = record_gap(step, ref, attempts)
    if gap:
        return gap
    expected = summary.status
    if step.attempt != attempts or step.status != expected.value:
        return (
            f"step {ref.step} returned {expected.value} at attempt {attempts}, but its ledger record now says "
            f"{step.status} at attempt {step.attempt} (resubmitted or cancelled since): `shardline status "
            f"{naming.run_ref(ref.pipeline, ref.run_id)}` shows where it is"
        )
    if expected is not StepStatus.SUCCEEDED:
        return None
    attempt = attempt_of(StepRecords(step=step, files=[], shards=[], requests=0), ref)
    if attempt is None:  # a STEP item at its attempt always records its plan: this one was not written by a plan
        return f"step {ref.step}'s ledger record names no plan: " + naming.rerun_command(ref.pipeline, ref.run_id)
    marker = outputs.success_marker_of(spec, attempt.output_prefix)
    if marker and (marker.get("run_id"), marker.get("step")) == (ref.run_id, ref.step):
        return None
    found = f"run {marker.get('run_id')}'s" if marker else "gone"
    return (
        f"step {ref.step} succeeded, but {naming.success_marker_key(attempt.output_prefix)} is {found}: its outputs "
        "were removed or taken over since. Score the partition again: " + naming.rerun_command(ref.pipeline, ref.run_id)
    )


def report_uri(step: StepRecord | None, ref: StepRef) -> str | None:
    """Where a step's run report is (None before its plan exists)."""
    if step is None or not step.plan_json:
        return None
    return Attempt.from_plan(step.plan_json, step.attempt or 1, 0, **ref._asdict()).report_uri()


def step_message(spec: PipelineSpec, attempt: Attempt) -> str:
    """The STEP item's message: what its outcome was, and why."""
    item = read_step_item(services.ledger_model(spec), attempt.ref)
    return (item.message if item else None) or f"step {attempt.step} has no recorded outcome"


def outcome_message(attempt: Attempt, status: StepStatus, reason: str) -> str:
    """The STEP item's message for the watch's outcome: a step that did not succeed says how to retry it."""
    if status is StepStatus.SUCCEEDED:
        return reason
    return (
        reason + "; after fixing the cause: " + naming.resubmit_command(attempt.pipeline, attempt.run_id, attempt.step)
    )


def run_outcome_message(attempt: Attempt, step_message: str) -> str:
    """The RUN item's message when one of its steps failed."""
    return f"step {attempt.step} failed: {step_message}"
