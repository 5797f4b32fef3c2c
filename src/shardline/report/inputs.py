"""What the run report is built from: plain records of one step, and where they come from. No IO.

The ledger's :class:`~shardline.ledger.records.FileRecord` per input file (the one file record every reader
shares), an :class:`InstanceRecord` per instance and attempt (its SHARD record, with its instance type and the
window it ran in), the :class:`StepIdentity` and the :class:`PreviousRun` list are what
:func:`shardline.report.build.build_report` takes. :func:`records_from_ledger` makes them from one step's ledger
records (as ``read_step(..., file_attributes=None)`` returns them, or the items' attribute dicts), so this room
never touches DynamoDB itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from shardline.ledger.records import FileRecord, ShardRecord, StepRecord
from shardline.ledger.states import FileStatus

# -- what goes in ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One instance of one attempt: what it was and when it ran."""

    host: str
    instance_type: str
    attempt: int = 1
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    status: str | None = None  # a ShardStatus value
    # What the instance itself counted in its last heartbeat (its manifest says the same): the files it was
    # given, finished (failed included) and failed. None when it never reported them.
    files_assigned: int | None = None
    files_done: int | None = None
    files_failed: int | None = None
    requests: Mapping[str, int] | None = None  # its AWS requests by kind, as its last heartbeat counted them


@dataclasses.dataclass(frozen=True, slots=True)
class StepIdentity:
    pipeline: str
    run_id: str
    step: str
    attempt: int = 1  # the step's newest attempt
    backend: Literal["sagemaker", "local"] = "sagemaker"


@dataclasses.dataclass(frozen=True, slots=True)
class PreviousRun:
    """An earlier run of the same pipeline and step, for the cost trend (oldest first)."""

    run_id: str
    cost_per_million: float | None
    finished_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class ReportRecords:
    """What :func:`records_from_ledger` found: the arguments :func:`build_report` starts from."""

    identity: StepIdentity
    files: list[FileRecord]
    instances: list[InstanceRecord]


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """``value`` in UTC; a naive time is taken to be UTC already."""
    if value is None:
        return None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


# -- from the ledger ------------------------------------------------------------------------------------


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def counted(item: Any, planned_sizes: Mapping[str, int] | None = None) -> FileRecord:
    """A file as the report counts it: every figure a number (0 where the worker wrote none), attempt 1 at least,
    and its planned size (``planned_sizes``: input key -> bytes) for a file claimed but never finished."""
    record = item if isinstance(item, FileRecord) else FileRecord.of(item)
    planned_sizes = planned_sizes or {}
    return dataclasses.replace(
        record,
        status=FileStatus(record.status),
        attempt=record.attempt or 1,
        rows_in=record.rows_in or 0,
        rows_out=record.rows_out or 0,
        rows_rejected=record.rows_rejected or 0,
        bytes_in=record.bytes_in or planned_sizes.get(record.input_key, 0),
        bytes_out=record.bytes_out or 0,
    )


def records_from_ledger(
    step_item: Any,
    file_items: Iterable[Any],
    shard_items: Iterable[Any],
    *,
    instance_type: str,
    backend: Literal["sagemaker", "local"] = "sagemaker",
    pipeline: str | None = None,
    run_id: str | None = None,
    step: str | None = None,
    planned_sizes: Mapping[str, int] | None = None,
    instance_types: Mapping[int, str] | None = None,
) -> ReportRecords:
    """The report's records from one step's ledger records (or its items, or their attribute dicts).

    ``step_item``, ``file_items`` and ``shard_items`` are what
    ``shardline.ledger.step_reads.read_step(model, ref, file_attributes=None)`` returns: the STEP item and
    the FILE and SHARD records (the default attributes leave out the files' hosts, bytes and times). The ledger
    does not record an instance's type (the spec's ``resources.instance_type`` does). An instance runs from its start
    (its SHARD item's ``started_at``, the worker's start-up; from an older worker, which did not record it, its first
    file's claim) to its last heartbeat.
    ``pipeline``/``run_id``/``step`` fill what a missing STEP item cannot tell. ``planned_sizes`` (input key ->
    bytes, from the plan files) gives the bytes of a file claimed but never finished, whose item has none.
    ``instance_types``: the type each attempt's job really ran on (after a capacity move, not the spec's), by
    attempt number; an attempt missing from it is taken to have run on ``instance_type``.
    """
    step_record = StepRecord.of(step_item) if step_item is not None else None
    identity = StepIdentity(
        pipeline=_get(step_item, "pipeline") or pipeline or "",
        run_id=_get(step_item, "run_id") or run_id or "",
        step=_get(step_item, "step") or step or "",
        attempt=(step_record.attempt if step_record else 0) or 1,
        backend=backend,
    )
    files = [counted(item, planned_sizes) for item in file_items]
    first_claim: dict[tuple[str, int], dt.datetime] = {}
    for record in files:
        if record.host and record.started_at:
            key = (record.host, record.attempt)
            first_claim[key] = min(first_claim.get(key, record.started_at), record.started_at)
    step_started = step_record.started_at if step_record else None
    instances = []
    for item in shard_items:
        shard = item if isinstance(item, ShardRecord) else ShardRecord.of(item)
        if not shard.host:
            continue
        attempt = shard.attempt or 1
        instances.append(
            InstanceRecord(
                host=shard.host,
                attempt=attempt,
                instance_type=(instance_types or {}).get(attempt, instance_type),
                status=shard.status,
                started_at=shard.started_at or first_claim.get((shard.host, attempt)) or step_started,
                ended_at=shard.heartbeat_at,
                files_assigned=shard.files_assigned,
                files_done=shard.files_done,
                files_failed=shard.files_failed,
                requests=shard.requests,
            )
        )
    return ReportRecords(identity=identity, files=files, instances=instances)


def reject_where(row: Mapping[str, Any]) -> str:
    """Where a rejected row is, from its line in a rejects list: "line 4687 (id=4685)", "row 12"."""
    place = f"line {row['line']}" if row.get("line") else f"row {row.get('row', '?')}"
    ids = row.get("ids") or {}
    return place + (" (" + ", ".join(f"{k}={v}" for k, v in ids.items()) + ")" if ids else "")
