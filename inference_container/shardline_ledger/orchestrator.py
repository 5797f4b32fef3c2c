"""What the orchestrator writes and reads: plans, attempts, and the step's state.

The sensor, the CLI and the UI all read the ledger through :func:`read_step`, so
there is one way into the table. Reads are Queries on the run's partition with a
sort-key prefix, never Scans.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from pynamodb.exceptions import PutError, UpdateError

from shardline_ledger.keys import (
    RUN_SK,
    RUNS_PK,
    file_sk,
    file_sk_prefix,
    run_pk,
    runs_index_sk,
    runs_pk,
    step_sk,
    step_sk_prefix,
)
from shardline_ledger.states import STEP_TERMINAL, FileStatus, StepStatus
from shardline_ledger.table import LedgerItem

CONDITIONAL_CHECK_FAILED = "ConditionalCheckFailedException"
WRITE_CHUNK = 2500  # items per writer thread (100 BatchWrite calls)
WRITE_THREADS = 8
# Only what the sensor needs; keeps each Query page small.
FILE_ATTRIBUTES = ["pk", "sk", "status", "attempt", "input_key", "error_class", "error_message", "rows_in",
                   "rows_out"]
# What the CLI and the UI show besides: which instance had the file.
FILE_DETAIL_ATTRIBUTES = [*FILE_ATTRIBUTES, "host"]


class StaleOrchestratorError(RuntimeError):
    """Another try of the orchestrator already moved the step to a newer attempt."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ensure_run(model: type[LedgerItem], pipeline: str, run_id: str) -> None:
    """Create the RUN item and its entry in the run index once; later calls leave them alone.

    A retry after a crash between the two writes re-derives the index entry from the RUN
    item's own start time, so the entry is written exactly once under one key.
    """
    item = model(run_pk(pipeline, run_id), RUN_SK, pipeline=pipeline, run_id=run_id,
                 status=StepStatus.RUNNING.value, started_at=_now())
    try:
        item.save(condition=model.pk.does_not_exist())
    except PutError as err:
        if err.cause_response_code != CONDITIONAL_CHECK_FAILED:
            raise
        item = model.get(run_pk(pipeline, run_id), RUN_SK, consistent_read=True)
    sk = runs_index_sk(item.started_at.isoformat(), pipeline, run_id)
    with model.batch_write() as batch:  # all runs, and this pipeline's runs
        for index in (RUNS_PK, runs_pk(pipeline)):
            batch.save(model(index, sk, pipeline=pipeline, run_id=run_id, started_at=item.started_at))


def list_runs(model: type[LedgerItem], pipeline: str | None = None, limit: int = 20) -> list[LedgerItem]:
    """The newest runs first, of every pipeline or of one: one Query on the run index."""
    found = model.query(runs_pk(pipeline) if pipeline else RUNS_PK, scan_index_forward=False, limit=limit,
                        page_size=limit)
    return list(found)


@dataclasses.dataclass(frozen=True)
class RunRecords:
    run: LedgerItem | None
    steps: list[LedgerItem]  # STEP items in step-name order
    shards: list[LedgerItem]


def read_run(model: type[LedgerItem], pipeline: str, run_id: str) -> RunRecords:
    """The RUN item, every STEP item and every SHARD heartbeat: one Query (FILE items are per step)."""
    pk = run_pk(pipeline, run_id)
    items, _ = _query(model, pk, step_sk_prefix(), None)
    try:
        run = model.get(pk, RUN_SK, consistent_read=True)
    except model.DoesNotExist:
        run = None
    steps = [i for i in items if "#SHARD#" not in i.sk]
    shards = [i for i in items if "#SHARD#" in i.sk]
    return RunRecords(run=run, steps=steps, shards=shards)


def finish_step(model: type[LedgerItem], pipeline: str, run_id: str, step: str, attempt: int, status: StepStatus,
                message: str = "") -> bool:
    """Record how the step ended, fenced on its attempt: a newer attempt's result is never overwritten.

    Returns False when a newer attempt owns the step (someone resubmitted meanwhile) or an
    operator cancelled it: their state stands.
    """
    if status not in STEP_TERMINAL:
        raise ValueError(f"{status} is not a terminal step status")
    try:
        model(run_pk(pipeline, run_id), step_sk(step)).update(
            actions=[model.status.set(status.value), model.message.set(message[:2000] or None),
                     model.finished_at.set(_now())],
            condition=(model.attempt == attempt) & (model.status != StepStatus.CANCELLED.value),
        )
    except UpdateError as err:
        if err.cause_response_code == CONDITIONAL_CHECK_FAILED:
            return False
        raise
    return True


def set_run_status(model: type[LedgerItem], pipeline: str, run_id: str, status: StepStatus, message: str = "",
                   *, only_if_running: bool = False) -> bool:
    """Record the run's status. ``only_if_running``: leave a run that already ended (or never started) alone."""
    try:
        model(run_pk(pipeline, run_id), RUN_SK).update(
            actions=[model.status.set(status.value), model.message.set(message[:2000] or None),
                     model.finished_at.set(_now()) if status in STEP_TERMINAL else model.finished_at.remove()],
            condition=(model.status == StepStatus.RUNNING.value) if only_if_running else None,
        )
    except UpdateError as err:
        if only_if_running and err.cause_response_code == CONDITIONAL_CHECK_FAILED:
            return False
        raise
    return True


def start_attempt(model: type[LedgerItem], pipeline: str, run_id: str, step: str, attempt: int,
                  input_keys: Iterable[tuple[str, int]], plan_json: str | None = None,
                  after: int | None = None) -> int:
    """Move the STEP item to ``attempt`` and write a PENDING FILE item for each input.

    The STEP update is conditional (attempt only moves forward), so two tries of the
    same task cannot both plan; re-planning the same attempt is idempotent. FILE items
    go in BatchWrite calls of 25. ``plan_json`` records what the step was planned with.
    Returns the number of files written.

    The sensor's own retries never reopen a step an operator cancelled. An operator's
    resubmission passes ``after`` (the attempt it saw as the newest): if anyone moved the
    step meanwhile, it loses instead of rewriting their attempt.
    """
    pk = run_pk(pipeline, run_id)
    step_item = model(pk, step_sk(step))
    try:
        step_item.update(
            actions=[
                *([model.plan_json.set(plan_json)] if plan_json else []),
                model.attempt.set(attempt),
                model.status.set(StepStatus.PLANNED.value),
                model.pipeline.set(pipeline),
                model.run_id.set(run_id),
                model.step.set(step),
                model.started_at.set(_now()),
                model.message.remove(),
                model.finished_at.remove(),
            ],
            condition=_attempt_condition(model, attempt, after),
        )
    except UpdateError as err:
        if err.cause_response_code == CONDITIONAL_CHECK_FAILED:
            raise StaleOrchestratorError(
                f"step {step} of run {run_id} moved on (past attempt {after if after is not None else attempt}, "
                f"or cancelled) while attempt {attempt} was being planned; not planning it"
            ) from err
        raise
    items = [model(pk, file_sk(step, key), status=FileStatus.PENDING.value, attempt=attempt, input_key=key,
                   bytes_in=size) for key, size in input_keys]
    chunks = [items[i:i + WRITE_CHUNK] for i in range(0, len(items), WRITE_CHUNK)]

    def write(chunk: list[LedgerItem]) -> None:
        with model.batch_write() as batch:  # 25 items a call; unprocessed items are retried
            for item in chunk:
                batch.save(item)

    # BatchWrite calls are independent: a few in parallel plan a 100k-file step in seconds, not minutes.
    with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, max(1, len(chunks)))) as pool:
        list(pool.map(write, chunks))
    return len(items)


def _attempt_condition(model, attempt: int, after: int | None):
    if after is not None:
        return model.attempt == after
    moves_forward = model.attempt.does_not_exist() | (model.attempt <= attempt)
    if attempt == 1:
        return moves_forward
    return moves_forward & (model.status != StepStatus.CANCELLED.value)


@dataclasses.dataclass(frozen=True)
class StepRecords:
    step: LedgerItem | None
    files: list[LedgerItem]
    shards: list[LedgerItem]
    requests: int  # DynamoDB requests this read cost (Query pages)


def read_step(model: type[LedgerItem], pipeline: str, run_id: str, step: str, *,
              file_attributes: list[str] = FILE_ATTRIBUTES) -> StepRecords:
    """The STEP item, its SHARD items and its FILE items: two Queries on the run partition."""
    pk = run_pk(pipeline, run_id)
    step_and_shards, step_pages = _query(model, pk, step_sk(step), None)
    step_item = next((item for item in step_and_shards if item.sk == step_sk(step)), None)
    shards = [item for item in step_and_shards if item.sk != step_sk(step)]
    files, file_pages = _query(model, pk, file_sk_prefix(step), file_attributes)
    return StepRecords(step=step_item, files=files, shards=shards, requests=step_pages + file_pages)


def _query(model, pk: str, sk_prefix: str, attributes: list[str] | None) -> tuple[list, int]:
    """Every item under a sort-key prefix, one Query page (<= 1 MB) at a time; counts the pages."""
    items, pages, start = [], 0, None
    while True:
        stored = [getattr(model, name).attr_name for name in attributes] if attributes else None
        result = model.query(pk, model.sk.startswith(sk_prefix), attributes_to_get=stored,
                             last_evaluated_key=start, consistent_read=True)
        page = next(result.page_iter)
        pages += 1
        items.extend(model.from_raw_data(raw) for raw in page.get("Items", []))
        start = result.page_iter.last_evaluated_key
        if start is None:
            return items, pages
