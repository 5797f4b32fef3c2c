"""How every reader sees a run and its steps: the watch task, the CLI, the page and the run report.

They all read a step through :func:`read_step` (one way into the table), with the inputs its plan files
name but no instance has claimed added by :func:`with_unclaimed` (``orchestration.step.files.read_step_files``
does both). Reads are Queries on the run's partition with a sort-key prefix, never Scans."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping

from shardline.ledger.keys import (
    RUN_SK,
    RUNS_PK,
    StepRef,
    file_sk_prefix,
    is_control_sk,
    run_pk,
    runs_pk,
    step_sk,
    step_sk_prefix,
)
from shardline.ledger.records import FileRecord, RunRecord, ShardRecord, StepRecord, settle_parts
from shardline.ledger.table import LedgerItem

# Only what the watch task needs; keeps each Query page small.
FILE_ATTRIBUTES = [
    "pk",
    "sk",
    "status",
    "attempt",
    "input_key",
    "error_class",
    "error_message",
    "rows_in",
    "rows_out",
    "rows_rejected",
    "rejects_key",
    "part_of",
    "source_etag",
]


# What the CLI and the UI show besides: which instance had the file.
FILE_DETAIL_ATTRIBUTES = [*FILE_ATTRIBUTES, "host"]


def list_runs(model: type[LedgerItem], pipeline: str | None = None, limit: int = 20) -> list[LedgerItem]:
    """The newest runs first, of every pipeline or of one: one Query on the run index."""
    found = model.query(
        runs_pk(pipeline) if pipeline else RUNS_PK, scan_index_forward=False, limit=limit, page_size=limit
    )
    return list(found)


def runs_started_since(model: type[LedgerItem], since: str) -> list[LedgerItem]:
    """Every run started at or after ``since`` (ISO-8601 UTC), of every pipeline, oldest first: one Query on the
    run index, paged through."""
    return list(model.query(RUNS_PK, model.sk >= since))


@dataclasses.dataclass(frozen=True)
class RunRecords:
    run: RunRecord | None
    steps: list[StepRecord]  # in step-name order
    shards: list[ShardRecord]


def read_run(model: type[LedgerItem], pipeline: str, run_id: str) -> RunRecords:
    """The RUN item, every STEP item and every SHARD heartbeat: one Query (FILE items are per step)."""
    items, _ = _query(model, run_pk(pipeline, run_id), step_sk_prefix(), None)
    steps = [StepRecord.of(i) for i in items if "#SHARD#" not in i.sk]
    shards = [ShardRecord.of(i) for i in items if "#SHARD#" in i.sk]
    return RunRecords(run=read_run_item(model, pipeline, run_id), steps=steps, shards=shards)


def read_run_item(model: type[LedgerItem], pipeline: str, run_id: str) -> RunRecord | None:
    """A run's RUN item (a consistent read), or None when the ledger has none."""
    try:
        return RunRecord.of(model.Control.get(run_pk(pipeline, run_id), RUN_SK, consistent_read=True))
    except model.Control.DoesNotExist:
        return None


def read_step_items(model: type[LedgerItem], refs: Iterable[StepRef]) -> dict[StepRef, StepRecord]:
    """The STEP items of ``refs`` that exist, by ref: batched reads (100 keys a request)."""
    keys = {(run_pk(r.pipeline, r.run_id), step_sk(r.step)): r for r in refs}
    return {keys[(i.pk, i.sk)]: StepRecord.of(i) for i in model.Control.batch_get(list(keys))} if keys else {}


def read_run_items(model: type[LedgerItem], runs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], RunRecord]:
    """The RUN items of ``runs`` ((pipeline, run id) pairs) that exist, by pair: batched reads."""
    keys = {(run_pk(pipeline, run_id), RUN_SK): (pipeline, run_id) for pipeline, run_id in runs}
    return {keys[(i.pk, i.sk)]: RunRecord.of(i) for i in model.Control.batch_get(list(keys))} if keys else {}


def read_step_item(model: type[LedgerItem], ref: StepRef) -> StepRecord | None:
    """A step's STEP item alone (a consistent read), or None when the ledger has none."""
    try:
        return StepRecord.of(
            model.Control.get(run_pk(ref.pipeline, ref.run_id), step_sk(ref.step), consistent_read=True)
        )
    except model.Control.DoesNotExist:
        return None


@dataclasses.dataclass(frozen=True)
class StepRecords:
    step: StepRecord | None
    files: list[FileRecord]  # the FILE items; with_unclaimed adds the inputs planned but never claimed
    shards: list[ShardRecord]
    requests: int  # DynamoDB requests this read cost (Query pages)
    # From the attempts' plan files (with_unclaimed): each planned input's size.
    planned_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def settled(self) -> list[FileRecord]:
        """The files as a reader counts them: each source file with its rejects parts folded in
        (:func:`~shardline.ledger.records.settle_parts`). ``files`` is the raw view: one record per FILE item."""
        return settle_parts(self.files)


def with_unclaimed(records: StepRecords, planned: Mapping[int, Iterable[tuple[str, int]]]) -> StepRecords:
    """``records`` with every input planned but never claimed, as each attempt's plan file names them.

    ``planned`` maps an attempt to its inputs (full s3:// URI, size). An input's newest planning
    attempt owns it: when its FILE item is older than that (or there is none), no instance of that
    attempt has claimed it yet, so it reads as PENDING there (``FileRecord.unclaimed``), whatever
    an older attempt wrote. This is what a PENDING item written at plan time used to say.
    """
    by_key = {f.input_key: f for f in records.files}
    sizes: dict[str, int] = {}
    added = False
    for attempt in sorted(planned):
        for key, size in planned[attempt]:
            sizes[key] = size
            item = by_key.get(key)
            if item is None or item.attempt < attempt:
                by_key[key] = FileRecord.unclaimed(key, attempt, size)
                added = True
    files = sorted(by_key.values(), key=lambda f: f.input_key) if added else records.files
    return dataclasses.replace(records, files=files, planned_sizes=sizes)


def read_step(
    model: type[LedgerItem], ref: StepRef, *, file_attributes: list[str] = FILE_ATTRIBUTES, files: bool = True
) -> StepRecords:
    """The STEP item, its SHARD and FILE items (as :class:`FileRecord` and :class:`ShardRecord`): two Queries on
    the run partition.

    With ``files=False``, the STEP and SHARD items only: one Query (a page holds thousands of
    heartbeats), however many files the step has.
    """
    pipeline, run_id, step = ref
    pk = run_pk(pipeline, run_id)
    step_and_shards, step_pages = _query(model, pk, step_sk(step), None)
    step_item = next((item for item in step_and_shards if item.sk == step_sk(step)), None)
    shards = [ShardRecord.of(item) for item in step_and_shards if item.sk != step_sk(step)]
    step_record = StepRecord.of(step_item) if step_item is not None else None
    head = StepRecords(step=step_record, files=[], shards=shards, requests=step_pages)
    return with_file_items(model, ref, head, file_attributes=file_attributes) if files else head


def with_file_items(
    model: type[LedgerItem], ref: StepRef, head: StepRecords, *, file_attributes: list[str] = FILE_ATTRIBUTES
) -> StepRecords:
    """``head`` (a ``read_step(..., files=False)``) with the step's FILE items read now: one Query."""
    pipeline, run_id, step = ref
    file_items, file_pages = _query(model, run_pk(pipeline, run_id), file_sk_prefix(step), file_attributes)
    files = [FileRecord.of(item) for item in file_items]
    return dataclasses.replace(head, files=files, requests=head.requests + file_pages)


def _query(model, pk: str, sk_prefix: str, attributes: list[str] | None) -> tuple[list, int]:
    """Every item under a sort-key prefix, one Query page (<= 1 MB) at a time; counts the pages."""
    items, pages, start = [], 0, None
    while True:
        stored = [getattr(model, name).attr_name for name in attributes] if attributes else None
        result = model.query(
            pk, model.sk.startswith(sk_prefix), attributes_to_get=stored, last_evaluated_key=start, consistent_read=True
        )
        page = next(result.page_iter)
        pages += 1
        items.extend(
            (model.Control if is_control_sk(raw["sk"]["S"]) else model).from_raw_data(raw)
            for raw in page.get("Items", [])
        )
        start = result.page_iter.last_evaluated_key
        if start is None:
            return items, pages
