"""The ledger's items as every reader sees them: one record type per item (FILE, SHARD, STEP, RUN).

The watch's decision, the run report, on-call's views and the page all read these, never a pynamodb
item: :mod:`shardline.ledger.step_reads` hands out :class:`FileRecord`, :class:`ShardRecord`,
:class:`StepRecord` and :class:`RunRecord` values (``read_step``, ``read_run``, ``read_step_item``, ...). Each
record says its own failure with ``error_line()`` ("Class: message", :func:`shardline.errors.error_line`).

``of`` takes a pynamodb item or its attribute dict (what a Query with ``attributes_to_get`` returns,
or a test's literal): a field the read did not fetch is None. Pure: no IO.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

from shardline.errors import error_line
from shardline.ledger.states import SETUP_ERROR, SHARD_TERMINAL, FileStatus, StepStatus


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _int(value: Any) -> int | None:
    return int(value) if value is not None else None


def _requests(value: Any) -> dict[str, int] | None:
    """A SHARD item's request counts (JSON of kind -> count); None when absent or not counts (a view never fails on
    them)."""
    if not value:
        return None
    try:
        found = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    return {str(k): int(v) for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _time(value: Any) -> dt.datetime | None:
    """A UTC time from an item's attribute: a datetime (naive is taken as UTC) or its ISO text."""
    if value is None or value == "":
        return None
    if not isinstance(value, dt.datetime):
        value = dt.datetime.fromisoformat(str(value))
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


@dataclasses.dataclass(frozen=True, slots=True)
class FileRecord:
    """One input file of a step: its FILE item, or (never claimed yet) a PENDING line of an attempt's plan file.

    The figures are None until the worker writes them: a file still PENDING or RUNNING has none.
    """

    input_key: str
    status: FileStatus
    attempt: int = 0
    host: str | None = None  # the instance that had it (algo-N)
    rows_in: int | None = None
    rows_out: int | None = None
    rows_rejected: int | None = None  # tolerance.rows: rows in = rows out + rows rejected
    rejects_key: str | None = None  # s3:// URI of its rejected rows' list
    model_warnings: int | None = None  # lines the model code said that may signal a problem
    bytes_in: int | None = None
    bytes_out: int | None = None
    seconds: float | None = None  # the worker's own measure of the file's time
    output_key: str | None = None
    output_sha256: str | None = None  # the output's sha256 as uploaded (hex)
    started_at: dt.datetime | None = None  # claimed
    finished_at: dt.datetime | None = None
    error_class: str | None = None
    error_message: str | None = None
    part_of: str | None = None  # a rejects part's source file (its input key); None for a file of the input
    source_etag: str | None = None  # the ETag of the source a rejects part's rows were picked from
    parts: tuple[str, ...] = ()  # a source's rejects parts' outputs (settled by :func:`settle_parts`)

    @classmethod
    def of(cls, item: Any) -> FileRecord:
        key = _get(item, "input_key") or str(_get(item, "sk") or "").split("#", 2)[-1]
        seconds = _get(item, "seconds")
        return cls(
            input_key=key,
            status=FileStatus(_get(item, "status") or FileStatus.PENDING),
            attempt=_int(_get(item, "attempt")) or 0,
            host=_get(item, "host"),
            rows_in=_int(_get(item, "rows_in")),
            rows_out=_int(_get(item, "rows_out")),
            rows_rejected=_int(_get(item, "rows_rejected")),
            rejects_key=_get(item, "rejects_key"),
            model_warnings=_int(_get(item, "model_warnings")),
            bytes_in=_int(_get(item, "bytes_in")),
            bytes_out=_int(_get(item, "bytes_out")),
            seconds=float(seconds) if seconds is not None else None,
            output_key=_get(item, "output_key"),
            output_sha256=_get(item, "output_sha256"),
            started_at=_time(_get(item, "started_at")),
            finished_at=_time(_get(item, "finished_at")),
            error_class=_get(item, "error_class"),
            error_message=_get(item, "error_message"),
            part_of=_get(item, "part_of"),
            source_etag=_get(item, "source_etag"),
        )

    @classmethod
    def unclaimed(cls, input_key: str, attempt: int, size: int) -> FileRecord:
        """An input ``attempt`` planned that no instance has claimed yet: PENDING, with only its size known."""
        return cls(input_key, FileStatus.PENDING, attempt, bytes_in=size)

    def error_line(self) -> str:
        """ "Class: message" of the file's failure; empty when it has none."""
        return error_line(self.error_class, self.error_message)


def settle_parts(files: list[FileRecord]) -> list[FileRecord]:
    """The step's files as a reader counts them: each source file with its rejects parts folded in.

    ``shardline resubmit --rejects`` scores a file's rejected rows again as a file of their own, a *rejects part*
    (``part_of``). Each part takes exactly the rows its source still had rejected, so once a part SUCCEEDED its
    source's rows out grow by the part's rows out, and what stays rejected is what the newest part rejected
    (listed in its rejects list): rows in = rows out + rows rejected still holds for the source. The newest part of
    a source, when it has not succeeded, stays in the list as a file of its own (its failure is the step's, until
    the next ``--rejects`` takes its rows again); an older one that did not succeed was taken again by a newer part.
    A part older than its source's own attempt is of an earlier version of the source, scored again whole since:
    it counts for nothing.
    """
    sources = {f.input_key for f in files if not f.part_of}
    parts = current_parts(files)
    if not parts:
        return [f for f in files if not f.part_of or f.part_of not in sources]
    settled = []
    for f in files:
        if f.part_of:
            mine = parts.get(f.part_of, [])
            if f.part_of not in sources or (
                f in mine and f.status != FileStatus.SUCCEEDED and f.attempt == max(p.attempt for p in mine)
            ):
                settled.append(f)  # the newest part, not (yet) succeeded; or an orphan whose source is not read
            continue
        done = [p for p in parts.get(f.input_key, []) if p.status == FileStatus.SUCCEEDED]
        if not done or f.status != FileStatus.SUCCEEDED:
            settled.append(f)
            continue
        newest = done[-1]
        settled.append(
            dataclasses.replace(
                f,
                rows_out=(f.rows_out or 0) + sum(p.rows_out or 0 for p in done),
                rows_rejected=newest.rows_rejected or 0,
                rejects_key=newest.rejects_key,
                model_warnings=(f.model_warnings or 0) + sum(p.model_warnings or 0 for p in done) or f.model_warnings,
                bytes_out=(f.bytes_out or 0) + sum(p.bytes_out or 0 for p in done) if f.bytes_out is not None else None,
                parts=tuple(p.output_key for p in done if p.output_key),
            )
        )
    return settled


def sources_with_rejects(files: Iterable[FileRecord]) -> list[FileRecord]:
    """The source files that still have rows rejected (as the newest of their parts left them): what
    ``resubmit --rejects`` takes."""
    return [
        f
        for f in settle_parts(list(files))
        if not f.part_of and f.status == FileStatus.SUCCEEDED and f.rows_rejected and f.rejects_key
    ]


def current_parts(files: list[FileRecord]) -> dict[str, list[FileRecord]]:
    """Each source file's rejects parts (by its input key), in attempt order: those of its version now, newer than
    the attempt that scored it (an older one is stale: :func:`stale_parts`)."""
    attempts = {f.input_key: f.attempt for f in files if not f.part_of}
    parts: dict[str, list[FileRecord]] = {}
    for f in sorted((f for f in files if f.part_of), key=_attempt):
        if f.part_of in attempts and f.attempt > attempts[f.part_of]:
            parts.setdefault(f.part_of, []).append(f)
    return parts


def stale_parts(files: list[FileRecord]) -> set[str]:
    """The rejects parts (input keys) of an earlier version of their source, scored again whole since: their
    outputs are not the file's rows any more."""
    attempts = {f.input_key: f.attempt for f in files if not f.part_of}
    return {f.input_key for f in files if f.part_of and attempts.get(f.part_of, -1) >= f.attempt}


def _attempt(f: FileRecord) -> int:
    return f.attempt


@dataclasses.dataclass(frozen=True, slots=True)
class ShardRecord:
    """One instance of one attempt, as its last heartbeat (its SHARD item) reported it."""

    host: str | None
    attempt: int
    status: str | None = None  # a ShardStatus value
    files_assigned: int = 0
    files_done: int = 0  # failed ones included
    files_failed: int = 0
    rows_done: int = 0
    heartbeat_at: dt.datetime | None = None
    error_class: str | None = None
    error_message: str | None = None
    started_at: dt.datetime | None = None  # the instance's start (its first heartbeat's; None: an older worker)
    step: str | None = None
    # Its AWS requests by billing kind (ledger.requests), as its last heartbeat counted them; None: not counted
    requests: Mapping[str, int] | None = None

    @classmethod
    def of(cls, item: Any) -> ShardRecord:
        return cls(
            host=_get(item, "host"),
            attempt=_int(_get(item, "attempt")) or 0,
            status=_get(item, "status"),
            files_assigned=_int(_get(item, "files_assigned")) or 0,
            files_done=_int(_get(item, "files_done")) or 0,
            files_failed=_int(_get(item, "files_failed")) or 0,
            rows_done=_int(_get(item, "rows_done")) or 0,
            heartbeat_at=_time(_get(item, "heartbeat_at")),
            error_class=_get(item, "error_class"),
            error_message=_get(item, "error_message"),
            started_at=_time(_get(item, "started_at")),
            step=_get(item, "step"),
            requests=_requests(_get(item, "requests")),
        )

    @property
    def finished(self) -> bool:
        """The instance reported a terminal status: silence after that is expected."""
        return self.status in SHARD_TERMINAL

    @property
    def setup_error(self) -> str | None:
        """Why the instance could not start (its model or its arguments, in the worker's words), if it could not."""
        return self.error_message if self.error_class == SETUP_ERROR else None

    def heartbeat_age(self, now: float) -> float:
        """Seconds since its last heartbeat at ``now`` (epoch seconds); infinite when it never sent one."""
        return now - self.heartbeat_at.timestamp() if self.heartbeat_at else float("inf")

    def error_line(self) -> str:
        return error_line(self.error_class, self.error_message)


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """A step's STEP item: its latest attempt, and how that ended (``message`` says why)."""

    status: str | None
    attempt: int
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    message: str | None = None
    instance_type: str | None = None  # the newest attempt's, from the step's plan
    capacity_failures: Mapping[str, int] = dataclasses.field(default_factory=dict)  # jobs per type, all attempts
    waiting: str | None = None  # why its job is not running yet: decision.fleet.Waiting as JSON (views render it)
    live_from: int | None = None  # the oldest attempt whose job still runs beside the newest (a lost instance's)
    step: str | None = None
    plan_json: str | None = None  # the newest attempt's plan (planning.attempt.Attempt.from_plan reads it)
    plan_files: Mapping[int, str] = dataclasses.field(default_factory=dict)  # each attempt's plan file
    lost_taken: frozenset[str] = frozenset()  # "attempt/host" of lost instances whose files a later attempt took
    fence: int | None = None  # the fence of the partition take the step holds
    approval: str | None = None  # held-back outputs accepted by on-call (orchestration.step.approval), as JSON
    table_commit: str | None = None  # what its end committed to its output table (orchestration.tables), as JSON

    @property
    def table(self) -> dict[str, Any] | None:
        """What the step's end committed to its output table (orchestration.tables.TableCommit's fields), or None."""
        return json.loads(self.table_commit) if self.table_commit else None

    @classmethod
    def of(cls, item: Any) -> StepRecord:
        if isinstance(item, StepRecord):
            return item
        plan = _plan(_get(item, "plan_json"))
        return cls(
            _get(item, "status"),
            _int(_get(item, "attempt")) or 0,
            _time(_get(item, "started_at")),
            _time(_get(item, "finished_at")),
            _get(item, "message"),
            plan.get("instance_type") or None,
            {str(k): int(v) for k, v in (plan.get("capacity_failures") or {}).items()},
            _get(item, "waiting"),
            _int(_get(item, "live_from")),
            step=_get(item, "step"),
            plan_json=_get(item, "plan_json"),
            plan_files=_plan_files(_get(item, "plan_files")),
            lost_taken=frozenset(_get(item, "lost_taken") or ()),
            fence=_int(_get(item, "fence")),
            approval=_get(item, "approval"),
            table_commit=_get(item, "table_commit"),
        )

    @property
    def live_attempts(self) -> range:
        """The attempts whose jobs may still run: the newest, and each earlier one from ``live_from`` (a lost
        instance's files went on as a next attempt while its job's other instances went on)."""
        newest = self.attempt or 1
        return range(min(self.live_from or newest, newest), newest + 1)

    def error_line(self) -> str:
        """Why the step failed, as its STEP item records it; empty unless it FAILED."""
        return (self.message or "") if self.status == StepStatus.FAILED else ""


def _plan_files(text: Any) -> dict[int, str]:
    """Each attempt's plan file as a STEP item records it ({} for a step planned before plan files). Strict: the
    plan files say which inputs a step owes, so one that cannot be read is an error, never "no inputs"."""
    try:
        files = json.loads(text) if text else {}
        return {int(attempt): str(uri) for attempt, uri in files.items()}
    except (ValueError, TypeError, AttributeError) as err:
        raise ValueError(f"the STEP item's plan files are unreadable ({err}): {str(text)[:200]!r}") from err


def _plan(text: Any) -> dict:
    """A STEP item's plan (planning.attempt.PLAN_FIELDS), or {} when it has none or is not a plan."""
    try:
        plan = json.loads(text) if text else {}
    except ValueError:
        return {}
    return plan if isinstance(plan, dict) else {}


@dataclasses.dataclass(frozen=True, slots=True)
class RunRecord:
    """A run's RUN item."""

    status: str | None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    message: str | None = None
    partition: str | None = None  # what a scheduled run scores: its data interval's start (UTC)
    waiting: str | None = None  # why a step's job is not running yet (decision.fleet.Waiting as JSON) ...
    waiting_step: str | None = None  # ... and which step
    missed_deadline: str | None = None  # the run missed its deadline: when, and the run's state then
    deadline_misses: int = 0  # how often its deadline alert fired (once, unless Airflow repeated it)
    budget_usd: float | None = None  # what on-call raised the run's budget to (`resubmit --budget-usd`)

    @classmethod
    def of(cls, item: Any) -> RunRecord:
        if isinstance(item, RunRecord):
            return item
        return cls(
            _get(item, "status"),
            _time(_get(item, "started_at")),
            _time(_get(item, "finished_at")),
            _get(item, "message"),
            _get(item, "partition"),
            _get(item, "waiting"),
            _get(item, "waiting_step"),
            _get(item, "missed_deadline"),
            int(_get(item, "deadline_misses") or 0),
            _float(_get(item, "budget_usd")),
        )

    def error_line(self) -> str:
        """Why the run failed, as its RUN item records it; empty unless it FAILED."""
        return (self.message or "") if self.status == StepStatus.FAILED else ""
