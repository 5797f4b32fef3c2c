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

from shardline_ledger.keys import RUN_SK, file_sk, file_sk_prefix, run_pk, step_sk
from shardline_ledger.states import FileStatus, StepStatus
from shardline_ledger.table import LedgerItem

CONDITIONAL_CHECK_FAILED = "ConditionalCheckFailedException"
WRITE_CHUNK = 250  # items per background task (10 BatchWrite calls)
WRITE_THREADS = 8
# Only what the sensor needs; keeps each Query page small.
FILE_ATTRIBUTES = ["pk", "sk", "status", "attempt", "input_key", "error_class", "error_message", "rows_in",
                   "rows_out"]


class StaleOrchestratorError(RuntimeError):
    """Another try of the orchestrator already moved the step to a newer attempt."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ensure_run(model: type[LedgerItem], pipeline: str, run_id: str) -> None:
    """Create the RUN item once; later calls leave it alone."""
    item = model(run_pk(pipeline, run_id), RUN_SK, pipeline=pipeline, run_id=run_id,
                 status=StepStatus.RUNNING.value, started_at=_now())
    try:
        item.save(condition=model.pk.does_not_exist())
    except PutError as err:
        if err.cause_response_code != CONDITIONAL_CHECK_FAILED:
            raise


def begin_attempt(model: type[LedgerItem], pipeline: str, run_id: str, step: str, attempt: int) -> None:
    """Move the STEP item to ``attempt``: attempts only move forward, so two tries cannot both plan.

    Re-planning the same attempt is allowed (a retried task), and idempotent.
    """
    try:
        model(run_pk(pipeline, run_id), step_sk(step)).update(
            actions=[
                model.attempt.set(attempt),
                model.status.set(StepStatus.PLANNED.value),
                model.pipeline.set(pipeline),
                model.run_id.set(run_id),
                model.step.set(step),
                model.started_at.set(_now()),
            ],
            condition=model.attempt.does_not_exist() | (model.attempt <= attempt),
        )
    except UpdateError as err:
        if err.cause_response_code == CONDITIONAL_CHECK_FAILED:
            raise StaleOrchestratorError(
                f"step {step} of run {run_id} is already past attempt {attempt}; not re-planning it"
            ) from err
        raise


def mark_step(model: type[LedgerItem], pipeline: str, run_id: str, step: str, status: StepStatus) -> None:
    model(run_pk(pipeline, run_id), step_sk(step)).update(actions=[model.status.set(status.value)])


class FileRecordWriter:
    """Writes PENDING FILE items for an attempt in the background, a BatchWrite of 25 at a time.

    ``add`` returns at once, so the planner can keep listing while earlier pages are written;
    ``close`` waits for every write and re-raises the first failure.
    """

    def __init__(self, model: type[LedgerItem], pipeline: str, run_id: str, step: str, attempt: int):
        self.model, self.pk, self.step, self.attempt = model, run_pk(pipeline, run_id), step, attempt
        self._pool = ThreadPoolExecutor(max_workers=WRITE_THREADS)
        self._futures = []
        self.count = 0

    def add(self, input_keys: Iterable[tuple[str, int]]) -> None:
        items = [self.model(self.pk, file_sk(self.step, key), status=FileStatus.PENDING.value, attempt=self.attempt,
                            input_key=key, bytes_in=size) for key, size in input_keys]
        self.count += len(items)
        for i in range(0, len(items), WRITE_CHUNK):
            self._futures.append(self._pool.submit(self._write, items[i:i + WRITE_CHUNK]))

    def _write(self, chunk: list[LedgerItem]) -> None:
        with self.model.batch_write() as batch:  # unprocessed items are retried by pynamodb
            for item in chunk:
                batch.save(item)

    def close(self) -> int:
        try:
            for future in self._futures:
                future.result()
        finally:
            self._pool.shutdown(wait=True)
        return self.count


def start_attempt(model: type[LedgerItem], pipeline: str, run_id: str, step: str, attempt: int,
                  input_keys: Iterable[tuple[str, int]]) -> int:
    """Move the STEP item to ``attempt`` and write a PENDING FILE item for each input."""
    begin_attempt(model, pipeline, run_id, step, attempt)
    writer = FileRecordWriter(model, pipeline, run_id, step, attempt)
    writer.add(input_keys)
    return writer.close()


@dataclasses.dataclass(frozen=True)
class StepRecords:
    step: LedgerItem | None
    files: list[LedgerItem]
    shards: list[LedgerItem]
    requests: int  # DynamoDB requests this read cost (Query pages)


def read_step(model: type[LedgerItem], pipeline: str, run_id: str, step: str) -> StepRecords:
    """The STEP item, its SHARD items and its FILE items: two Queries on the run partition."""
    pk = run_pk(pipeline, run_id)
    step_and_shards, step_pages = _query(model, pk, step_sk(step), None)
    step_item = next((item for item in step_and_shards if item.sk == step_sk(step)), None)
    shards = [item for item in step_and_shards if item.sk != step_sk(step)]
    files, file_pages = _query(model, pk, file_sk_prefix(step), FILE_ATTRIBUTES)
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
