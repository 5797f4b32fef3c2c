"""What the run report is built from: plain records of one step, and where they come from. No IO.

A :class:`FileRecord` per input file, an :class:`InstanceRecord` per instance and attempt, the
:class:`StepIdentity` and the :class:`PreviousRun` list are what :func:`shardline.report.build.build_report`
takes. :func:`records_from_ledger` maps the ledger's STEP, FILE and SHARD items (pynamodb items or
their attribute dicts, as ``read_step(..., file_attributes=None)`` returns them) to these records,
so this room never touches DynamoDB itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from shardline.errors import error_line
from shardline.ledger.states import FileStatus

# -- what goes in ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FileRecord:
    """One input file's last attempt, as the ledger's FILE item holds it."""

    key: str
    status: str  # a FileStatus value
    host: str | None = None  # the instance that had it (algo-N)
    attempt: int = 1
    rows_in: int = 0
    rows_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    started_at: dt.datetime | None = None  # claimed
    finished_at: dt.datetime | None = None
    seconds: float | None = None  # the worker's own measure of the file's time
    error: str | None = None  # class and message of a failure


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


def _time(value: Any) -> dt.datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        return utc(value)
    return utc(dt.datetime.fromisoformat(str(value)))


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


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
) -> ReportRecords:
    """The report's records from one step's ledger items (pynamodb items or their attribute dicts).

    ``step_item``, ``file_items`` and ``shard_items`` are what
    ``shardline.ledger.step_reads.read_step(model, pipeline, run_id, step, file_attributes=None)``
    returns (the default attributes leave out the files' hosts, bytes and times). The ledger
    does not record an instance's type (the spec's ``resources.instance_type`` does), nor when an
    instance started: its first file's claim is taken for that, and its last heartbeat for its end.
    ``pipeline``/``run_id``/``step`` fill what a missing STEP item cannot tell. ``planned_sizes`` (input key ->
    bytes, from the plan files) gives the bytes of a file claimed but never finished, whose item has none.
    """
    identity = StepIdentity(
        pipeline=_get(step_item, "pipeline") or pipeline or "",
        run_id=_get(step_item, "run_id") or run_id or "",
        step=_get(step_item, "step") or step or "",
        attempt=_int(_get(step_item, "attempt")) or 1,
        backend=backend,
    )
    files = []
    for item in file_items:
        error_class, error_message = _get(item, "error_class"), _get(item, "error_message")
        error = error_line(error_class, error_message) or None
        key = _get(item, "input_key") or str(_get(item, "sk") or "").split("#", 2)[-1]
        files.append(
            FileRecord(
                key=key,
                status=str(_get(item, "status") or FileStatus.PENDING.value),
                host=_get(item, "host"),
                attempt=_int(_get(item, "attempt")) or 1,
                rows_in=_int(_get(item, "rows_in")),
                rows_out=_int(_get(item, "rows_out")),
                bytes_in=_int(_get(item, "bytes_in")) or (planned_sizes or {}).get(key, 0),
                bytes_out=_int(_get(item, "bytes_out")),
                started_at=_time(_get(item, "started_at")),
                finished_at=_time(_get(item, "finished_at")),
                seconds=float(s) if (s := _get(item, "seconds")) is not None else None,
                error=error if _get(item, "status") == FileStatus.FAILED.value else None,
            )
        )
    first_claim: dict[tuple[str, int], dt.datetime] = {}
    for record in files:
        if record.host and record.started_at:
            key = (record.host, record.attempt)
            first_claim[key] = min(first_claim.get(key, record.started_at), record.started_at)
    instances = []
    for item in shard_items:
        host, attempt = _get(item, "host"), _int(_get(item, "attempt")) or 1
        if not host:
            continue
        instances.append(
            InstanceRecord(
                host=host,
                attempt=attempt,
                instance_type=instance_type,
                status=_get(item, "status"),
                started_at=first_claim.get((host, attempt)) or _time(_get(step_item, "started_at")),
                ended_at=_time(_get(item, "heartbeat_at")),
                files_assigned=_int(_get(item, "files_assigned")),
                files_done=_int(_get(item, "files_done")),
                files_failed=_int(_get(item, "files_failed")),
            )
        )
    return ReportRecords(identity=identity, files=files, instances=instances)
