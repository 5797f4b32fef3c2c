"""A step's jobs: submit (or adopt), stop, resubmit the next attempt, and resume at the newest. Two attempts of a
step never run at once: the next is planned only after the last one's job has ended."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import random
import time
from typing import Literal

import botocore.exceptions

from shardline.backends import JobNotFound
from shardline.decision import fleet
from shardline.decision.policy import JobStatus
from shardline.errors import GaveUpWaiting, LedgerRecordMissing, OverBudgetRefused, SubmitRefused
from shardline.ledger.context import StaleAttemptError
from shardline.ledger.keys import StepRef
from shardline.ledger.record_gaps import record_gap
from shardline.ledger.records import StepRecord
from shardline.ledger.states import STEP_TERMINAL, StepStatus, Succession
from shardline.ledger.step_reads import StepRecords, read_step_item
from shardline.ledger.step_writes import cancel_step
from shardline.orchestration import partitions, services
from shardline.orchestration.admission import budget_refusal, next_day
from shardline.orchestration.step.capacity import after_capacity_failure, note_waiting
from shardline.orchestration.step.files import read_step_files
from shardline.orchestration.step.plan import new_attempt, sized_objects
from shardline.planning import naming
from shardline.planning.attempt import CHANGED_BY_CAPACITY, Attempt
from shardline.planning.inputs import S3Object
from shardline.planning.request import build_processing_request
from shardline.spec import PipelineSpec
from shardline.waiting import wait_for

log = logging.getLogger(__name__)


# The first wait after AWS refuses a submit, in seconds (later ones double): the tests and the fleet benchmark
# shorten it; in production the default (decision.fleet.SUBMIT_WAIT_FIRST_SECONDS) suits a quota's pace.
SUBMIT_WAIT_ENV = "SHARDLINE_SUBMIT_WAIT_FIRST_SECONDS"
BUDGET_DAY_GRACE_SECONDS = 60.0  # a wait for the next day's budget ends this long after midnight (UTC)


@dataclasses.dataclass(frozen=True)
class Submitted:
    """The attempt's job runs (submitted now, or adopted: an earlier try of the task started it)."""

    attempt: Attempt


@dataclasses.dataclass(frozen=True)
class MustWait:
    """AWS said "not now" to the attempt's submit (a quota in use, a throttle): the attempt is planned and recorded,
    its wait noted on the STEP item for the views; the caller waits ``delay_seconds`` (a deferral holds no worker
    slot) and calls :func:`submit` again with :meth:`again`. The wait is no attempt and fails nothing."""

    attempt: Attempt
    delay_seconds: float
    note: str  # what the task logs: why, and when it goes again
    retry_at: float  # epoch seconds
    refusals: int  # refusals in a row so far, this one included
    waited: float  # seconds waited in all once this wait is over

    def again(self) -> dict:
        """What the wait carries (JSON) to :func:`submit_again`."""
        return {"attempt": self.attempt.to_xcom(), "refusals": self.refusals, "waited": self.waited}


def submit(spec: PipelineSpec, attempt: Attempt, *, refusals: int = 0, waited: float = 0.0) -> Submitted | MustWait:
    """Start the attempt's job, or adopt the one an earlier try of this task started: :class:`Submitted`; or, when AWS
    says "not now", :class:`MustWait`. Only while the step still holds its output prefix (a watch task that queued
    past its hold's lease finds another run there) and, after a wait (``refusals`` so far, ``waited`` seconds in all),
    only while the attempt still owns the step: an on-call engineer may have resubmitted or cancelled it meanwhile
    (:class:`~shardline.ledger.context.StaleAttemptError`). Past a day of refusals, :class:`SubmitRefused`."""
    if refusals and not note_waiting(spec, attempt, None):
        raise StaleAttemptError(moved_on_text(attempt))
    why = partitions.lost(spec, attempt)
    if why:
        raise partitions.PartitionLost(why)
    backend = services.backend_for(spec)
    refusal = budget_refusal(spec, attempt)
    if refusal is not None and not _job_exists(backend, attempt.job_name):  # a job started already is adopted
        if not refusal.wait:
            raise OverBudgetRefused(refusal.text)
        return _wait_for_budget(spec, attempt, refusal.text, refusals=refusals, waited=waited)
    image, role = services.image_and_role(spec)
    request = build_processing_request(spec, attempt, image_uri=image, role_arn=role, region=services.region(spec))
    try:
        backend.submit(request)
    except botocore.exceptions.ClientError as err:
        error = err.response.get("Error", {})
        if fleet.refusal_of(error.get("Code")) is None:
            raise
        # "Not now", not "not this": the caller waits and submits this same attempt again.
        refused = SubmitRefused(error["Code"], error.get("Message", ""), attempt.job_name, attempt.to_xcom())
        return _wait_after(spec, attempt, refused, refusals=refusals, waited=waited)
    state = backend.describe(attempt.job_name)
    log.info("job %s (attempt %d of step %s): %s", attempt.job_name, attempt.number, attempt.step, state.status.value)
    return Submitted(attempt.submitted(state.created_at or time.time()))


def submit_again(spec: PipelineSpec, carried: dict) -> Submitted | MustWait:
    """:func:`submit` after a :class:`MustWait`, from what its :meth:`~MustWait.again` carried."""
    attempt = Attempt.from_xcom(carried["attempt"])
    return submit(spec, attempt, refusals=int(carried.get("refusals", 0)), waited=float(carried.get("waited", 0.0)))


def _wait_after(spec: PipelineSpec, attempt: Attempt, refused: SubmitRefused, *, refusals: int, waited: float):
    """The wait after AWS refused the attempt's submit, noted on the STEP item (the page and the CLI show it)."""
    first = float(os.environ.get(SUBMIT_WAIT_ENV) or fleet.SUBMIT_WAIT_FIRST_SECONDS)
    wait = fleet.submit_wait(
        refused.code, refused.message, refusals + 1, random.random(), waited_seconds=waited, first_seconds=first
    )
    if wait is None:  # refused for a day: AWS's answer fails the task
        raise refused
    retry_at = time.time() + wait.delay_seconds
    if not note_waiting(spec, attempt, fleet.Waiting(submit=wait, job_name=attempt.job_name, retry_at=retry_at)):
        raise StaleAttemptError(moved_on_text(attempt)) from refused
    note = fleet.submit_wait_text(attempt.job_name, wait)
    return MustWait(attempt, wait.delay_seconds, note, retry_at, wait.refusals, waited + wait.delay_seconds)


def _job_exists(backend, job_name: str) -> bool:
    try:
        backend.describe(job_name)
    except JobNotFound:
        return False
    return True


def _wait_for_budget(spec: PipelineSpec, attempt: Attempt, why: str, *, refusals: int, waited: float) -> MustWait:
    """The wait for the next UTC day's budget (``budget.on_exceed: wait``), noted on the STEP item as a submit's
    wait is; past a day of waiting, the step fails naming the budget."""
    if waited >= fleet.SUBMIT_WAIT_GIVE_UP_SECONDS:
        raise OverBudgetRefused(f"{why}; it waited {waited / 3600:.0f} h for a day's budget that fits it, and fails")
    now = dt.datetime.now(dt.UTC)
    delay = (next_day(now) - now).total_seconds() + BUDGET_DAY_GRACE_SECONDS
    wait = fleet.SubmitWait(fleet.SubmitRefusal.DAILY_BUDGET, delay, refusals + 1, why)
    retry_at = time.time() + delay
    if not note_waiting(spec, attempt, fleet.Waiting(submit=wait, job_name=attempt.job_name, retry_at=retry_at)):
        raise StaleAttemptError(moved_on_text(attempt))
    return MustWait(
        attempt, delay, fleet.submit_wait_text(attempt.job_name, wait), retry_at, refusals + 1, waited + delay
    )


def moved_on_text(attempt: Attempt) -> str:
    return (
        f"step {attempt.step} moved on while attempt {attempt.number}'s submit waited for AWS (an on-call engineer "
        f"resubmitted or cancelled it), so that attempt was not submitted; `shardline status "
        f"{attempt.pipeline}/{attempt.run_id}` shows where the step is"
    )


def stop(spec: PipelineSpec, attempt: Attempt) -> None:
    """Stop the attempt's job if it still runs (one never submitted has nothing to stop), and every earlier
    attempt's job still running beside it. The attempt's own job first: it is stopped even when the ledger cannot
    say which earlier ones run (its record lost, its endpoint down)."""
    stop_job(spec, attempt.job_name)
    try:
        earlier = live_jobs(spec, attempt)[:-1]
    except Exception as err:  # noqa: BLE001 - see the docstring
        log.warning("step %s: could not read which earlier attempts' jobs still run: %s", attempt.step, err)
        return
    for each in earlier:
        stop_job(spec, each.job_name)


@dataclasses.dataclass(frozen=True)
class StepCancel:
    """What :func:`cancel` did to one step: ``already`` ended (``status``), ``moved_on`` (resubmitted or ended while
    being cancelled: left as it is), or ``cancelled``, with the jobs it stopped."""

    result: Literal["already", "moved_on", "cancelled"]
    status: str | None = None
    stopped: tuple[str, ...] = ()


def cancel(spec: PipelineSpec, ref: StepRef, step: StepRecord, reason: str) -> StepCancel:
    """Stop a step by hand, the one way: mark it CANCELLED, fenced on the attempt ``step`` records (so no watch task
    resubmits it and a resubmit meanwhile stands), then stop its attempt's job and every earlier one still running
    beside it."""
    if step.status in STEP_TERMINAL:
        return StepCancel("already", step.status)
    if not cancel_step(services.ledger_model(spec), ref, step.attempt or 1, reason):
        return StepCancel("moved_on")
    names = [naming.job_name(ref.pipeline, ref.run_id, ref.step, n) for n in step.live_attempts]
    return StepCancel("cancelled", StepStatus.CANCELLED.value, tuple(name for name in names if stop_job(spec, name)))


def is_running(spec: PipelineSpec, job_name: str) -> bool:
    """Whether the job was submitted and has not ended."""

    try:
        return not services.backend_for(spec).describe(job_name).status.is_terminal
    except JobNotFound:
        return False


def stop_job(spec: PipelineSpec, job_name: str) -> bool:
    """Stop the job if it still runs, without waiting for it to end: True when it was stopped now. The watch
    task and on-call's cancel both stop a job this way."""
    if not is_running(spec, job_name):
        return False
    log.warning("stopping job %s", job_name)
    services.backend_for(spec).stop(job_name)
    return True


def resubmit(
    spec: PipelineSpec,
    attempt: Attempt,
    retry_keys: list[str],
    *,
    by_oncall: bool = False,
    sizes: dict[str, int] | None = None,
    capacity: bool = False,
    records: StepRecords | None = None,
    taken_up: bool = False,
    beside: bool = False,
) -> Submitted | MustWait:
    """Plan and submit the next attempt with only ``retry_keys`` (full s3:// URIs); AWS's "not now" to its submit
    is a :class:`MustWait` (the attempt is planned and recorded).

    Fenced on ``attempt``: the step must still be at it, so a watch task and an on-call engineer cannot
    both plan the next one (the loser gets StaleAttemptError). ``attempt``'s job is stopped,
    and waited for, before the next one is planned: two attempts never run at once.
    ``by_oncall``: a cancelled step may be reopened. ``sizes``: sizes the caller already knows (the listing
    that found inputs landed after planning), so no object is read for them. ``capacity``: SageMaker could not
    provision ``attempt``'s job, so the next one may move to a fallback instance type (``after_capacity_failure``).
    ``records``: the step's files as the caller read them (``plan.SIZED_FILE_ATTRIBUTES``), so they are not read
    again. ``taken_up``: on-call takes the run up after its watch task ended (``partitions.hold_for_attempt``).
    ``beside``: ``retry_keys`` are a lost instance's files (the backend saw it die), and ``attempt``'s job goes on
    with its other instances' files beside the next attempt: it is not stopped. Each file is fenced by its own FILE
    item (the next attempt's PENDING items), and the STEP item records the oldest attempt still running
    (``live_from``), so those instances' heartbeats still pass.
    """
    live_from, lost_taken = None, ()
    if beside:  # one read of the STEP item for both: the oldest job still running, and its lost instances
        step = read_step_item(services.ledger_model(spec), attempt.ref)
        if step is None:
            raise LedgerRecordMissing(record_gap(None, attempt.ref, attempt.number))
        live_from = _oldest_live(step, attempt)
        lost_taken = _lost_instances_of(spec, attempt, step, retry_keys)
    if not beside:
        stop_live_jobs(spec, attempt)
    base = after_capacity_failure(spec, attempt) if capacity else attempt
    if beside:  # one instance in place of each lost one: its share, not the whole step's fleet, goes again
        share = -(-attempt.file_count // attempt.instance_count)
        base = base.model_copy(update={"requested_instances": max(1, -(-len(retry_keys) // max(1, share)))})
    base, retry_keys, parts = _what_a_retry_takes(spec, base, retry_keys, records)
    objects = sized_objects(spec, base, retry_keys, known=sizes, records=records)
    follows = Succession(
        after=attempt.number, reopen_cancelled=by_oncall, parts=parts, live_from=live_from, lost_taken=lost_taken
    )
    nxt = new_attempt(spec, base, attempt.number + 1, objects, follows, may_take=by_oncall, taken_up=taken_up)
    return submit(spec, nxt)


def _lost_instances_of(spec: PipelineSpec, attempt: Attempt, step: StepRecord, keys: list[str]) -> tuple[str, ...]:
    """The lost instances ("attempt/host") of the step's jobs still running that were given any of ``keys``: the
    next attempt takes their unfinished files, so the watch stops reading the step's files for them."""
    wanted = set(keys)
    running = partitions.running_jobs(spec, attempt.ref, step)
    taken = (
        f"{n}/{lost.host}" for n, _, state in running for lost in state.lost_instances if wanted & set(lost.inputs)
    )
    return tuple(sorted(taken))


def _oldest_live(step: StepRecord | None, attempt: Attempt) -> int:
    """The oldest attempt whose job runs now, as the STEP item records it: ``attempt``'s, or an earlier one's."""
    return min((step.live_from if step else None) or attempt.number, attempt.number)


def _live_from(spec: PipelineSpec, attempt: Attempt) -> int:
    """:func:`_oldest_live`, read from the ledger now."""
    return _oldest_live(read_step_item(services.ledger_model(spec), attempt.ref), attempt)


def live_jobs(spec: PipelineSpec, attempt: Attempt) -> list[Attempt]:
    """``attempt``, and every earlier attempt whose job still goes on beside it (``live_from``), oldest first."""
    first = _live_from(spec, attempt)
    return [attempt.model_copy(update={"number": n}) for n in range(first, attempt.number)] + [attempt]


def stop_live_jobs(spec: PipelineSpec, attempt: Attempt) -> None:
    """:func:`stop_and_wait` for ``attempt``'s job and every earlier one still running beside it."""
    for each in live_jobs(spec, attempt):
        stop_and_wait(spec, each)


def _what_a_retry_takes(
    spec: PipelineSpec, base: Attempt, keys: list[str], records: StepRecords | None = None
) -> tuple[Attempt, list[str], dict[str, tuple[str, str]] | None]:
    """An attempt reads one prefix: the step's inputs, or one folder of rejects parts. Inputs of the step go first
    (a part not taken now keeps its status; the next ``--rejects`` takes its rows again); else the parts of the
    first key's folder, each with its source and the source's ETag as its FILE item recorded them."""
    folders = {key: naming.rejects_parts_prefix_of(key) for key in keys}
    inputs = [key for key in keys if folders[key] is None]
    dropped = [key for key in keys if folders[key] is not None and (inputs or folders[key] != folders[keys[0]])]
    if dropped:
        log.warning(
            "step %s: %d rejects part(s) not retried with these files, e.g. %s", base.step, len(dropped), dropped[0]
        )
    if inputs or not keys:
        return base.model_copy(update={"parts_prefix": None}), inputs, None
    taken = [key for key in keys if key not in dropped]
    records = records or read_step_files(spec, base.ref)
    recorded = {f.input_key: (f.part_of, f.source_etag or "") for f in records.files if f.part_of}
    parts = {key: recorded[key] for key in taken if key in recorded}
    return base.model_copy(update={"parts_prefix": folders[keys[0]]}), taken, parts


def submit_parts(
    spec: PipelineSpec,
    latest: Attempt,
    parts_prefix: str,
    objects: list[S3Object],
    parts: dict[str, tuple[str, str]],
    *,
    taken_up: bool = False,
) -> Submitted | MustWait:
    """Plan and submit the attempt after ``latest`` over rejects parts (``objects``, under ``parts_prefix``), fenced
    on ``latest`` as an on-call resubmission is (:mod:`shardline.orchestration.step.rejects` picks them)."""
    stop_live_jobs(spec, latest)
    base = latest.model_copy(update={"parts_prefix": parts_prefix})
    follows = Succession(after=latest.number, reopen_cancelled=True, parts=parts)
    nxt = new_attempt(spec, base, latest.number + 1, objects, follows, may_take=True, taken_up=taken_up)
    return submit(spec, nxt)


STOP_WAIT_SECONDS = 900.0  # SageMaker takes a minute or two to stop a job


def stop_and_wait(spec: PipelineSpec, attempt: Attempt, timeout: float = STOP_WAIT_SECONDS, poll: float = 5.0) -> None:
    """Stop the attempt's job if it still runs, and return once it has ended.

    Raises :class:`~shardline.errors.GaveUpWaiting` if it has not ended by ``timeout``: the next attempt must not start
    beside it (the task's retry tries again later).
    """

    backend = services.backend_for(spec)
    try:
        state = backend.describe(attempt.job_name)
    except JobNotFound:
        return
    if state.status.is_terminal:
        return
    log.warning("stopping job %s (attempt %d) before the next attempt starts", attempt.job_name, attempt.number)
    backend.stop(attempt.job_name)
    state = wait_for(
        lambda: backend.describe(attempt.job_name), lambda s: s.status.is_terminal, timeout=timeout, interval=poll
    )
    if not state.status.is_terminal:
        raise GaveUpWaiting(stop_timeout_text(attempt.job_name, state.status.value, timeout))


def stop_timeout_text(job_name: str, status: str, timeout: float) -> str:
    return (
        f"job {job_name} is still {status} {timeout:.0f}s after it was asked to stop, so the next attempt has "
        "not started (two attempts never run at once): the task's retry tries again later; if the job never "
        "stops, check it in the backend's console"
    )


def resume(spec: PipelineSpec, attempt: Attempt) -> Attempt | MustWait:
    """The newest attempt of the step, given the one this task started from: ``attempt`` itself when it is the newest
    (as the caller left it: submitted or not), else the newest, its job adopted.

    A watch task retried after it resubmitted only knows attempt 1 (from XCom); the STEP
    item knows the newest. Its job is adopted, or submitted if the earlier try died
    between planning it and submitting it (AWS's "not now" to that submit is a :class:`MustWait`).
    """

    records = read_step_files(spec, attempt.ref)
    gap = record_gap(records.step, attempt.ref, attempt.number)
    if gap:  # never "nothing newer": a missing STEP item is no attempt to resume, and resubmitting would loop
        raise LedgerRecordMissing(gap)
    latest = records.step.attempt
    if latest <= attempt.number:
        return attempt
    # A capacity fallback's type and count are in the STEP item's plan, which the newest attempt wrote.
    newest = Attempt.from_plan(
        records.step.plan_json, latest, 0, pipeline=attempt.pipeline, run_id=attempt.run_id, step=attempt.step
    )
    attempt = attempt.model_copy(update={name: getattr(newest, name) for name in CHANGED_BY_CAPACITY})
    name = naming.job_name(attempt.pipeline, attempt.run_id, attempt.step, latest)
    try:
        state = services.backend_for(spec).describe(name)
    except JobNotFound:
        unfinished = [f.input_key for f in records.files if f.attempt == latest and not f.status.is_terminal]
        log.warning("attempt %d of step %s was planned but never submitted; submitting it now", latest, attempt.step)
        objects = sized_objects(spec, attempt, unfinished)
        started = submit(spec, new_attempt(spec, attempt, latest, objects, replan=True))
        return started.attempt if isinstance(started, Submitted) else started
    log.info("resuming at attempt %d (%s, %s)", latest, name, state.status.value)
    files = sum(1 for f in records.files if f.attempt == latest)
    return attempt.model_copy(
        update={"number": latest, "file_count": files, "files": (), "submitted_at": state.created_at or time.time()}
    )


def job_status(spec: PipelineSpec, attempt: Attempt) -> JobStatus:
    return services.backend_for(spec).describe(attempt.job_name).status
