"""What the orchestrator writes to the ledger: runs, attempts, a step's end, refusals and cancellations.

Every write that moves a step on is conditional on the attempt the writer knows (attempt fencing): two
resubmissions at once start one attempt, and a zombie writer's late write is refused. Reads are in
:mod:`shardline.ledger.step_reads`; what an instance writes is in :mod:`shardline.ledger.job_writes`."""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from pynamodb.exceptions import PutError, UpdateError

from shardline.errors import InvalidArgument, LedgerRecordMissing, ShardlineError, UnsafeKeyError
from shardline.ledger.context import StaleAttemptError
from shardline.ledger.keys import (
    RUN_SK,
    RUNS_PK,
    StepRef,
    failures_pk,
    file_sk,
    run_pk,
    runs_index_sk,
    runs_pk,
    step_sk,
)
from shardline.ledger.record_gaps import check_refusal, table_gone, table_gone_text
from shardline.ledger.states import (
    HELD_BACK,
    RUN_TERMINAL,
    STEP_TERMINAL,
    FileStatus,
    RunStatus,
    StepStatus,
    Succession,
)
from shardline.ledger.table import MAX_ERROR_CHARS, LedgerItem, condition_failed, update_if

log = logging.getLogger(__name__)


# Batch writes (a retry's fence, the refused keys' FAILED items): BatchWriteItem calls of 25 items (its limit) over this
# many threads, within the client's pool of 10 connections. What a call leaves unprocessed (the table
# throttled it) is sent again after a backoff with full jitter, doubling from BACKOFF_SECONDS up to
# BACKOFF_CAP_SECONDS, at most BATCH_TRIES calls in all.
BATCH_ITEMS = 25


WRITE_THREADS = 8


BATCH_TRIES = 10


BACKOFF_SECONDS = 0.05


BACKOFF_CAP_SECONDS = 5.0


class LedgerThrottledError(ShardlineError):
    """DynamoDB kept leaving a batch of writes unprocessed: the table is short of write capacity."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ensure_run(model: type[LedgerItem], pipeline: str, run_id: str, partition: str | None = None) -> None:
    """Create the RUN item and its entry in the run index once; later calls leave them alone.

    A retry after a crash between the two writes re-derives the index entry from the RUN
    item's own start time, so the entry is written exactly once under one key. ``partition``: what
    the run scores (its data interval's start), shown by `shardline runs`.
    """
    control = model.Control
    item = control(
        run_pk(pipeline, run_id),
        RUN_SK,
        pipeline=pipeline,
        run_id=run_id,
        status=StepStatus.RUNNING.value,
        started_at=_now(),
        reopened_at=_now(),  # RUNNING since (see set_run_status): a late failure callback of an earlier life skips it
        expires_at=control.expiry(),
        partition=partition,
    )
    try:
        item.save(condition=control.pk.does_not_exist())
    except PutError as err:
        if not condition_failed(err):
            raise
        item = control.get(run_pk(pipeline, run_id), RUN_SK, consistent_read=True)
    sk = runs_index_sk(item.started_at.isoformat(), pipeline, run_id)
    with model.batch_write() as batch:  # all runs, and this pipeline's runs
        for index in (RUNS_PK, runs_pk(pipeline)):
            batch.save(
                model(
                    index, sk, pipeline=pipeline, run_id=run_id, started_at=item.started_at, expires_at=model.expiry()
                )
            )


def finish_step(
    model: type[LedgerItem], ref: StepRef, attempt: int, status: StepStatus, message: str = "", table: str | None = None
) -> bool:
    """Record how the step ended, fenced on its attempt: a newer attempt's result is never overwritten. ``table``:
    what its end committed to its output table (JSON), or None (an earlier end's is removed). Returns False when a
    newer attempt owns the step (someone resubmitted meanwhile) or an operator cancelled it: their state stands.
    Raises :class:`LedgerRecordMissing` when the refusal's cause is a STEP item that is gone (:func:`check_refusal`).
    """
    pipeline, run_id, step = ref
    if status not in STEP_TERMINAL:
        raise InvalidArgument(f"{status} is not a terminal step status")
    c = model.Control
    try:
        c(run_pk(pipeline, run_id), step_sk(step)).update(
            actions=[
                c.status.set(status.value),
                c.message.set(message[:2000] or None),
                c.table_commit.set(table) if table else c.table_commit.remove(),
                c.waiting.remove(),
                c.finished_at.set(_now()),
                c.expires_at.set(c.expiry()),
            ],
            condition=(c.attempt == attempt) & (c.status != StepStatus.CANCELLED.value),
        )
    except UpdateError as err:
        if condition_failed(err):
            check_refusal(model, ref, attempt)
            return False
        if table_gone(err):
            raise LedgerRecordMissing(table_gone_text(model, ref)) from err
        raise
    return True


def record_approval(model: type[LedgerItem], ref: StepRef, attempt: int, approval: str) -> bool:
    """Record that on-call accepts the outputs the step's blocking checks held back (``approval``: JSON), fenced on
    the facts it accepts: the step is FAILED at ``attempt`` and its message says the checks held it back. False when
    it is not (it moved on, or it failed for another reason). Raises LedgerRecordMissing for a STEP item that is
    gone."""
    pipeline, run_id, step = ref
    c = model.Control
    if update_if(
        c(run_pk(pipeline, run_id), step_sk(step)),
        [c.approval.set(approval)],
        (c.attempt == attempt) & (c.status == StepStatus.FAILED.value) & c.message.startswith(HELD_BACK),
    ):
        return True
    check_refusal(model, ref, attempt)
    return False


def withdraw_approval(model: type[LedgerItem], ref: StepRef, attempt: int) -> None:
    """Take back an approval recorded for ``attempt`` that could not be acted on (its run could not take its prefix
    up again); fenced on the attempt, so a newer attempt's state is left alone."""
    pipeline, run_id, step = ref
    c = model.Control
    update_if(c(run_pk(pipeline, run_id), step_sk(step)), [c.approval.remove()], c.attempt == attempt)


def note_step(model: type[LedgerItem], ref: StepRef, attempt: int, waiting: str | None) -> bool:
    """Record on the STEP item why its attempt's job is not running yet (``waiting``: a ``decision.fleet.Waiting``
    as JSON; None clears it), fenced like :func:`finish_step`: only while that attempt owns the step and it has not
    ended; and on the RUN item (``shardline runs``). ``shardline status`` and the page render it. False when the
    step is no longer that attempt's."""
    pipeline, run_id, step = ref
    c = model.Control
    if not update_if(
        c(run_pk(pipeline, run_id), step_sk(step)),
        actions=[c.waiting.set(waiting) if waiting else c.waiting.remove()],
        condition=(c.attempt == attempt) & c.status.is_in(*(s.value for s in StepStatus if s not in STEP_TERMINAL)),
    ):
        return False
    _note_run(model, ref, waiting)
    return True


def _note_run(model: type[LedgerItem], ref: StepRef, waiting: str | None) -> None:
    """The same on the RUN item, with the step's name, so `shardline runs` says why a run is not moving: only while
    the run is RUNNING and no other step's wait is recorded there (never another's)."""
    pipeline, run_id, step = ref
    c = model.Control
    mine = c.waiting_step == step
    if waiting:
        actions = [c.waiting.set(waiting), c.waiting_step.set(step)]
        condition = (c.status == StepStatus.RUNNING.value) & (c.waiting_step.does_not_exist() | mine)
    else:
        actions, condition = [c.waiting.remove(), c.waiting_step.remove()], mine
    try:
        c(run_pk(pipeline, run_id), RUN_SK).update(actions=actions, condition=condition)
    except UpdateError as err:
        if not condition_failed(err):
            raise


def set_run_status(
    model: type[LedgerItem],
    pipeline: str,
    run_id: str,
    status: RunStatus,
    message: str = "",
    *,
    only_if_running: bool = False,
    taken_up: bool = False,
    life: int | None = None,
) -> bool:
    """Record the run's status. ``only_if_running``: leave a run that already ended (or never started) alone.

    Every RUNNING write records its time (``reopened_at``, for the views). Airflow runs a DAG's failure callback
    some time after the run failed; by then on-call may have resubmitted or rerun it, and the callback must neither
    mark the reopened run failed again nor release the prefixes it holds again. So a RUNNING write that takes the
    run up again says which of its Airflow lives is over, and :func:`end_life` compares lives, never clocks:
    ``taken_up``: an on-call engineer takes the run up again after it failed: the life it failed in is over;
    ``life``: a plan task of that Airflow life (its DAG run's clear_number) sets the run RUNNING.
    """
    c = model.Control
    actions = [
        c.status.set(status.value),
        c.message.set(message[:2000]) if message else c.message.remove(),  # absent, not NULL: end_life keeps a message
        c.finished_at.set(_now()) if status in RUN_TERMINAL else c.finished_at.remove(),
        c.expires_at.set(c.expiry()),
    ]
    if status == RunStatus.RUNNING:
        actions.append(c.reopened_at.set(_now()))
        if taken_up:  # the Airflow life it failed in is over: that life's failure callback, however late, ends nothing
            actions.append(c.ended_life.set(c.airflow_life | 0))
        if life is not None:
            actions.append(c.airflow_life.set(life))
    else:  # a run that ended waits for no step's job
        actions += [c.waiting.remove(), c.waiting_step.remove()]
    condition = c.status == RunStatus.RUNNING.value if only_if_running else None
    return update_if(c(run_pk(pipeline, run_id), RUN_SK), actions, condition)  # no condition: never False


def note_life(model: type[LedgerItem], pipeline: str, run_id: str, life: int) -> None:
    """Record that a task of the run started in Airflow life ``life`` (its DAG run's clear_number): a failure
    callback for an earlier life is then late. Never lowers it, and never makes a RUN item up."""
    c = model.Control
    try:
        c(run_pk(pipeline, run_id), RUN_SK).update(
            actions=[c.airflow_life.set(life)],
            condition=c.status.exists() & (c.airflow_life.does_not_exist() | (c.airflow_life < life)),
        )
    except UpdateError as err:
        if not condition_failed(err):
            raise


def end_life(model: type[LedgerItem], pipeline: str, run_id: str, life: int, message: str) -> bool:
    """The run's Airflow life ``life`` failed (its DAG failure callback): mark the run FAILED (keeping the message a
    failed step recorded) and the life over. False, writing nothing, when the run was taken up again since (by
    on-call, or by a task of a later life), ended otherwise (SUCCEEDED, CANCELLED), or this life was ended already:
    compare-and-set on the lives, never on clocks."""
    c = model.Control
    return update_if(
        c(run_pk(pipeline, run_id), RUN_SK),
        actions=[
            c.status.set(StepStatus.FAILED.value),
            c.message.set(c.message | message[:2000]),
            c.finished_at.set(_now()),
            c.ended_life.set(life),
            c.airflow_life.set(life),  # never lower (the condition): an on-call take-up then ends this life
            c.waiting.remove(),
            c.waiting_step.remove(),
            c.expires_at.set(c.expiry()),
        ],
        condition=c.status.is_in(StepStatus.RUNNING.value, StepStatus.FAILED.value)
        & (c.ended_life.does_not_exist() | (c.ended_life < life))
        & (c.airflow_life.does_not_exist() | (c.airflow_life <= life)),
    )


def record_deadline_missed(model: type[LedgerItem], pipeline: str, run_id: str, mark: str) -> bool:
    """Count a missed deadline on the run's RUN item, with what the views show (``mark``). False when the run has
    no RUN item (its first plan task never started): the alert's log and notify still say it."""
    c = model.Control
    return update_if(
        c(run_pk(pipeline, run_id), RUN_SK),
        actions=[c.missed_deadline.set(mark[:2000]), c.deadline_misses.add(1)],
        condition=c.pk.exists(),
    )


def start_attempt(
    model: type[LedgerItem],
    ref: StepRef,
    attempt: int,
    input_keys: Iterable[tuple[str, int]] = (),
    plan_json: str | None = None,
    *,
    follows: Succession | None = None,
    plan_file: str | None = None,
) -> int:
    """Move the STEP item from attempt ``follows.after`` (default ``attempt - 1``) to ``attempt``; for a retry,
    fence its inputs (``follows`` None: it follows the attempt before). Of two planners racing for one attempt
    exactly one wins; the other gets :class:`StaleAttemptError` and writes nothing (ARCHITECTURE.md, "Fencing").

    Attempt 1 writes no FILE item (an instance's claim creates it; readers take the unclaimed inputs from the
    plan file). A retry writes a PENDING item at ``attempt`` for each of its ``input_keys``, in parallel batches
    (:func:`put_items`): the fence that refuses a zombie's late finish. A cancelled step stays cancelled unless
    ``follows.reopen_cancelled``. ``plan_json`` records what the step was planned with; ``plan_file`` the
    attempt's plan file, in the same fenced update. Returns the number of FILE items written.
    """
    pipeline, run_id, step = ref
    follows = follows or Succession()
    after = attempt - 1 if follows.after is None else follows.after
    live_from, lost_taken = follows.live_from, follows.lost_taken
    c = model.Control
    pk = run_pk(pipeline, run_id)
    condition = c.attempt.does_not_exist() if after == 0 else (c.attempt == after)
    if not follows.reopen_cancelled:
        condition &= c.status != StepStatus.CANCELLED.value
    files_action, files_condition = _plan_files_update(model, pk, step, attempt, plan_file)
    if files_condition is not None:
        condition &= files_condition
    try:
        c(pk, step_sk(step)).update(
            actions=[
                *([c.plan_json.set(plan_json)] if plan_json else []),
                *files_action,
                c.attempt.set(attempt),
                c.status.set(StepStatus.PLANNED.value),
                c.pipeline.set(pipeline),
                c.run_id.set(run_id),
                c.step.set(step),
                c.started_at.set(_now()),
                c.live_from.set(live_from) if live_from else c.live_from.remove(),
                # Added to while earlier jobs run beside the new attempt; gone once none does.
                *([c.lost_taken.add(set(lost_taken))] if live_from and lost_taken else []),
                *([] if live_from else [c.lost_taken.remove()]),
                c.message.remove(),
                c.waiting.remove(),  # an earlier attempt's wait is not this one's
                c.finished_at.remove(),
                c.expires_at.set(c.expiry()),
            ],
            condition=condition,
        )
    except UpdateError as err:
        if condition_failed(err):
            if after:
                check_refusal(model, ref, after)
            raise StaleAttemptError(
                f"step {step} of run {run_id} is no longer at attempt {after} (someone planned attempt {attempt} "
                f"or later first, or cancelled it): not planning attempt {attempt}"
            ) from err
        raise
    _note_run(model, ref, None)  # the RUN item's word of this step's wait was an earlier attempt's
    if attempt == 1:
        return 0
    return _fence_retried_files(model, pk, step, attempt, input_keys, follows.parts or {})


def _fence_retried_files(
    model: type[LedgerItem],
    pk: str,
    step: str,
    attempt: int,
    input_keys: Iterable[tuple[str, int]],
    parts: Mapping[str, tuple[str, str]],
) -> int:
    """A PENDING FILE item at ``attempt`` for each input a retry takes (see :func:`start_attempt`)."""
    # The items differ only in their key, input and bytes: serialize the rest once (100k pynamodb models would
    # cost the planner seconds of CPU for nothing).
    same = _attributes(model, pk=pk, status=FileStatus.PENDING.value, attempt=attempt, expires_at=model.expiry())
    sk, input_key, bytes_in = (getattr(model, name) for name in ("sk", "input_key", "bytes_in"))
    items = [
        {
            **same,
            sk.attr_name: {"S": file_sk(step, key)},
            input_key.attr_name: {"S": key},
            bytes_in.attr_name: {"N": bytes_in.serialize(size)},
            **(_attributes(model, part_of=parts[key][0], source_etag=parts[key][1]) if key in parts else {}),
        }
        for key, size in input_keys
    ]
    put_items(model, items)
    return len(items)


def record_refused(
    model: type[LedgerItem],
    ref: StepRef,
    attempt: int,
    refused: Iterable[tuple[str, int, str]],
    error_class: str = UnsafeKeyError.__name__,
) -> int:
    """Write a FAILED FILE item for each input the planner refused: (key, size, reason).

    No job ever sees these keys; the items make each one show in `shardline failed` with its
    reason and count against the step's tolerance, instead of vanishing from the run.
    """
    pipeline, run_id, step = ref
    pk, now, expires = run_pk(pipeline, run_id), _now(), model.expiry()
    items = [
        model(
            pk,
            file_sk(step, key),
            status=FileStatus.FAILED.value,
            attempt=attempt,
            input_key=key,
            bytes_in=size,
            error_class=error_class,
            error_message=reason[:MAX_ERROR_CHARS],
            failed_pk=failures_pk(pipeline),
            failed_at=f"{now.isoformat()}#{run_id}#{step}",
            finished_at=now,
            expires_at=expires,
        )
        for key, size, reason in refused
    ]
    put_items(model, [item.serialize() for item in items])
    return len(items)


def continue_attempt(
    model: type[LedgerItem],
    ref: StepRef,
    attempt: int,
    input_keys: Iterable[tuple[str, int]] = (),
    *,
    plan_file: str | None = None,
) -> int:
    """Take up planning ``attempt`` again: the STEP item holds it, but its job never started.

    A planner that died between its STEP update and its job submission leaves this for its
    retry, which writes a new plan file first (``plan_file``, recorded here in place of the
    attempt's earlier one) and the manifest again. Fenced: the step must still be this attempt,
    PLANNED (not cancelled, not moved on), and its plan files what this planner read.

    A retry's fence (see :func:`start_attempt`) is written again, each item conditionally: a late
    re-plan must never reset a file that the attempt's job (submitted by someone else meanwhile)
    already claimed or finished, so only a missing item, an older attempt's item, or this
    attempt's PENDING item is written. Returns the number of FILE items written.
    """
    pipeline, run_id, step = ref
    pk = run_pk(pipeline, run_id)
    c = model.Control
    files_action, files_condition = _plan_files_update(model, pk, step, attempt, plan_file)
    condition = (c.attempt == attempt) & (c.status == StepStatus.PLANNED.value)
    if files_condition is not None:
        condition &= files_condition
    try:  # still this attempt's, and not cancelled
        c(pk, step_sk(step)).update(
            actions=[c.started_at.set(_now()), c.expires_at.set(c.expiry()), *files_action], condition=condition
        )
    except UpdateError as err:
        if condition_failed(err):
            check_refusal(model, ref, attempt)
            raise StaleAttemptError(
                f"step {step} of run {run_id} is no longer a planned attempt {attempt}: not re-planning it"
            ) from err
        raise
    if attempt == 1:
        return 0
    written = []

    def write(key_and_size: tuple[str, int]) -> None:
        key, size = key_and_size
        try:
            model(pk, file_sk(step, key)).update(
                actions=[
                    model.status.set(FileStatus.PENDING.value),
                    model.attempt.set(attempt),
                    model.input_key.set(key),
                    *([model.bytes_in.set(size)] if size else []),
                    model.expires_at.set(model.expiry()),
                ],
                condition=model.attempt.does_not_exist()
                | (model.attempt < attempt)
                | ((model.attempt == attempt) & (model.status == FileStatus.PENDING.value)),
            )
            written.append(key)
        except UpdateError as err:
            if not condition_failed(err):
                raise

    with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
        list(pool.map(write, list(input_keys)))
    return len(written)


def _plan_files_update(model: type[LedgerItem], pk: str, step: str, attempt: int, plan_file: str | None):
    """The STEP item's record of each attempt's plan file, with ``attempt``'s set to ``plan_file``.

    Returns the update's action and its condition: the record must still be what was read here,
    so of two planners only one records its file (the fenced update fails for the other). Each
    plan file has a name of its own, so the file a reader takes from this record is never
    overwritten, and an older attempt's is found even where a later attempt's output settings differ.
    """
    c = model.Control
    if plan_file is None:
        return [], None
    try:
        recorded = c.get(pk, step_sk(step), consistent_read=True, attributes_to_get=[c.plan_files.attr_name]).plan_files
    except c.DoesNotExist:
        recorded = None
    files = {**json.loads(recorded or "{}"), str(attempt): plan_file}
    condition = c.plan_files.does_not_exist() if recorded is None else (c.plan_files == recorded)
    return [c.plan_files.set(json.dumps(files, sort_keys=True))], condition


def cancel_step(model: type[LedgerItem], ref: StepRef, attempt: int, reason: str) -> bool:
    """Mark the step CANCELLED, fenced on the attempt the on-call engineer saw, if it has not ended.

    Returns False when the step moved to another attempt or ended meanwhile: that state stands,
    and the on-call engineer looks again.
    """
    pipeline, run_id, step = ref
    c = model.Control
    return update_if(
        c(run_pk(pipeline, run_id), step_sk(step)),
        actions=[
            c.status.set(StepStatus.CANCELLED.value),
            c.message.set(reason[:2000] or None),
            c.waiting.remove(),
            c.finished_at.set(_now()),
            c.expires_at.set(c.expiry()),
        ],
        condition=(c.attempt == attempt) & c.status.is_in(*[s.value for s in StepStatus if s not in STEP_TERMINAL]),
    )


def _attributes(model: type[LedgerItem], **values) -> dict[str, dict[str, str]]:
    """Attribute values as DynamoDB takes them, under their stored names: ``{"st": {"S": "PENDING"}, ...}``."""
    return {
        getattr(model, name).attr_name: {getattr(model, name).attr_type: getattr(model, name).serialize(value)}
        for name, value in values.items()
    }


def put_items(model: type[LedgerItem], items: list[dict], *, threads: int = WRITE_THREADS) -> None:
    """Put serialized items (each key once): BatchWriteItem calls of 25 over ``threads`` threads.

    Plain puts, unconditional and idempotent: a call sent twice (a retry after a timeout) writes
    the same item again. Callers write only items no one else can have written yet (see
    :func:`start_attempt`). Unprocessed items are sent again with backoff (:func:`write_batch`).
    """
    connection = model._get_connection()

    def send(batch: list[dict]) -> list[dict]:
        answer = connection.batch_write_item(put_items=batch) or {}
        return [
            request["PutRequest"]["Item"]
            for request in answer.get("UnprocessedItems", {}).get(model.Meta.table_name, [])
        ]

    batches = [items[i : i + BATCH_ITEMS] for i in range(0, len(items), BATCH_ITEMS)]
    if len(batches) <= 1 or threads <= 1:
        for batch in batches:
            write_batch(send, batch)
        return
    # The calls are independent, and each mostly waits on the network: side by side, a 100k-file plan
    # takes 4,000 calls / threads round trips.
    with ThreadPoolExecutor(max_workers=min(threads, len(batches))) as pool:
        list(pool.map(lambda batch: write_batch(send, batch), batches))


def write_batch(
    send: Callable[[list[dict]], list[dict]],
    batch: list[dict],
    *,
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
) -> int:
    """Send one batch until nothing is left unprocessed; returns the calls it took.

    ``send`` makes one BatchWriteItem call and returns the items DynamoDB left unprocessed
    (it does that, instead of failing the call, when the table throttles). They are sent
    again after a full-jitter backoff (:func:`backoff_seconds`), at most :data:`BATCH_TRIES`
    calls in all; then :class:`LedgerThrottledError`.
    """
    for calls in range(1, BATCH_TRIES + 1):
        batch = send(batch)
        if not batch:
            return calls
        if calls < BATCH_TRIES:
            log.info(
                "ledger write: %d item(s) unprocessed (throttled), sending them again (call %d of %d)",
                len(batch),
                calls + 1,
                BATCH_TRIES,
            )
            sleep(backoff_seconds(calls, jitter()))
    raise LedgerThrottledError(
        f"{len(batch)} ledger item(s) still unprocessed after {BATCH_TRIES} BatchWriteItem calls: the table is "
        "throttling writes. Retry the task; if it keeps happening, raise the table's on-demand maximum or warm "
        "throughput (DynamoDB's UpdateTable), or plan fewer files per step"
    )


def backoff_seconds(calls: int, jitter: float) -> float:
    """The pause after the ``calls``-th call left items unprocessed: full jitter (``jitter`` in [0, 1))."""
    return jitter * min(BACKOFF_CAP_SECONDS, BACKOFF_SECONDS * 2**calls)
