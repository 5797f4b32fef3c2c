"""The run report's typed data: :class:`RunReport` and its parts, and its JSON form.

:func:`shardline.report.build.build_report` makes one from plain records; :meth:`RunReport.to_json`
is what is written beside the outputs as report.json, and :func:`shardline.report.render.render_html`
draws its page.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

REPORT_FORMAT = "shardline.report/1"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class Series(_Model):
    instance: str  # the label the charts use: the host, with its attempt when the step had several
    rows_per_second: list[float | None]  # None: the instance was not running in that bucket


class Timeline(_Model):
    """Rows per second per instance, in buckets of ``bucket_seconds`` from ``start``."""

    start: dt.datetime | None
    bucket_seconds: float
    offsets: list[float]  # each bucket's start, seconds after ``start``
    series: list[Series]
    files_without_times: int  # left out: no start nor finish recorded


class InstanceSummary(_Model):
    """One instance of one attempt, as the report shows it: its files, rows, bytes, time, cost and flags."""

    instance: str
    host: str
    attempt: int
    instance_type: str
    status: str | None
    files: int
    files_succeeded: int
    files_failed: int
    rows_out: int
    bytes_in: int
    bytes_out: int
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    seconds: float  # started to ended: what is billed (as far as the ledger saw)
    busy_seconds: float  # with at least one file in flight
    busy_fraction: float | None
    rows_per_second: float | None  # rows out over its seconds
    started_after_seconds: float | None  # its start, seconds after the step's first instance began
    finished_after_seconds: float | None  # its end, likewise
    cost: float | None
    straggler: bool
    idle: bool


class CostLine(_Model):
    instance_type: str
    instances: int
    seconds: float
    price_per_hour: float
    cost: float


class TrendPoint(_Model):
    run_id: str
    cost_per_million: float | None
    current: bool


class Cost(_Model):
    backend: str
    total: float | None  # USD; None when a price is missing (``error`` says which and where to set it)
    cost_per_million: float | None  # USD per 1M predictions; None with no predictions
    predictions: int
    instance_seconds: float
    by_type: list[CostLine]
    prices_source: str
    trend: list[TrendPoint]
    error: str | None = None
    # The control plane: the AWS requests the step's instances counted (their heartbeats), by kind, and the GETs that
    # fetched their inputs and model (one a file and one a model per instance, as SageMaker downloads them), priced
    # apart from the instances. ``total`` and ``cost_per_million`` above are the instances' (compute) alone.
    requests: dict[str, int] = {}
    downloads: int = 0
    control_plane: float | None = None  # USD; None: a report from before the control plane was counted
    control_plane_per_million: float | None = None
    request_prices_source: str = ""


class Bins(_Model):
    kind: str
    labels: list[str]
    reference: list[float]
    current: list[float]


class Density(_Model):
    """Both runs' fractions over common bins, for the side-by-side chart."""

    kind: Literal["values", "intervals"]
    edges: list[float]  # values: each bar's value; intervals: len(fractions) + 1 edges
    reference: list[float]
    current: list[float]


class DriftReport(_Model):
    reference_run_id: str | None
    psi: float | None
    max_psi: float
    verdict: str  # n/a, stable, moderate, drift
    note: str | None
    bins: Bins | None
    density: Density | None
    current_quantiles: dict[str, float | None]
    reference_quantiles: dict[str, float | None]
    current_histogram: dict[str, Any] | None
    reference_histogram: dict[str, Any] | None


class FileRow(_Model):
    key: str
    host: str | None
    attempt: int
    status: str
    rows_in: int
    rows_out: int
    balanced: bool  # a succeeded file wrote a row out per row in, or rejected it (tolerance.rows)
    error: str | None
    rows_rejected: int = 0


class RejectRow(_Model):
    """A row a file rejected (tolerance.rows): where it is, and why."""

    key: str  # the input file
    where: str  # "line 4687 (id=4685)", "row 12"
    reason: str


class Reconciliation(_Model):
    files: int
    succeeded: int
    failed: int
    unfinished: int
    rows_in: int  # of the succeeded files
    rows_out: int
    balanced: bool  # every succeeded file: rows in == rows out + rows rejected
    mismatched: list[str]
    retried: int  # files whose last attempt is not the first
    max_attempt: int
    failures: list[FileRow]
    rows_rejected: int = 0  # of the succeeded files
    rejects: list[RejectRow] = []  # the first rejected rows, file by file
    model_warnings: int = 0  # lines the model code said that may signal a problem (WARNING in the job's log)
    rows: list[FileRow]


class CheckResult(_Model):
    """One output check of the step (its spec's ``checks``), evaluated at the step's end (report/checks.py)."""

    check: str  # the setting's path: checks.columns.prediction.min_distinct
    level: Literal["blocking", "warn"]
    verdict: Literal["pass", "fail", "n/a"]
    value: float | None  # what was measured (None: not computable, or not a number)
    shown: str  # the value as people read it: "1", "12.5%", "class 1 at 99.8%"
    bound: str  # what it was held to: "at least 2", "1,000 to 3,000 (the median 2,000 of 7 earlier partitions)"
    files: list[str] = []  # a failed check: the files that drive it most
    history: list[float] = []  # the earlier partitions' values a band was made from, newest first

    def line(self) -> str:
        """``<check>: <value> against <bound>``, as the step's message and the summary print it."""
        return f"{self.check}: {self.shown} against {self.bound}" + (
            f" (most in {', '.join(self.files)})" if self.files else ""
        )


class RunReport(_Model):
    format: str = REPORT_FORMAT
    pipeline: str
    run_id: str
    step: str
    attempt: int
    backend: str
    generated_at: dt.datetime | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    seconds: float | None
    # Written as "instances"; a report.json written before the rename says "shards", and still reads.
    instances: list[InstanceSummary] = Field(validation_alias=AliasChoices("instances", "shards"))
    stragglers: list[str]
    idle: list[str]
    timeline: Timeline
    cost: Cost
    drift: DriftReport
    reconciliation: Reconciliation
    notes: list[str]
    checks: list[CheckResult] = []  # the step's output checks (none: a report from before checks, or none set)
    profile: dict[str, Any] | None = None  # the step's merged output profile (report/profile.py): what they read
    approval: dict[str, Any] | None = None  # held-back outputs accepted by on-call: by, at, reason, attempt, held_back
    # what the step's end committed to its output table (orchestration.tables.TableCommit's fields): written once the
    # commit landed; None without `output.table`, or before (a report read by the checks it holds back)
    table: dict[str, Any] | None = None

    def to_json(self, *, indent: int | None = None) -> str:
        """The report as JSON (what is written beside the outputs as report.json)."""
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str) -> RunReport:
        return cls.model_validate_json(text)
