"""The run report built by one pure function from plain records. No IO.

:func:`build_report` takes what the ledger knows of one step (the records of
:mod:`shardline.report.inputs`), the step's prediction :class:`~shardline.report.histogram.Histogram`
and, when there is one, the previous successful run's, and returns a
:class:`~shardline.report.model.RunReport`: throughput over time per instance, files and bytes per
instance, stragglers and idle instances, cost and cost per 1M predictions with the previous runs'
trend, the PSI with both histograms, and the reconciliation of rows in against rows out.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from shardline.ledger.records import FileRecord
from shardline.ledger.states import FileStatus
from shardline.report.cost import (
    REQUEST_PRICES_SOURCE,
    InstanceUsage,
    Prices,
    UnknownPriceError,
    cost_per_million,
    instance_cost,
    requests_cost,
)
from shardline.report.drift import DEFAULT_BINS, DEFAULT_MAX_PSI, psi_between, verdict
from shardline.report.histogram import Histogram
from shardline.report.inputs import InstanceRecord, PreviousRun, StepIdentity, counted, utc
from shardline.report.model import (
    Bins,
    Cost,
    CostLine,
    Density,
    DriftReport,
    FileRow,
    InstanceSummary,
    Reconciliation,
    RejectRow,
    RunReport,
    Series,
    Timeline,
    TrendPoint,
)

TIMELINE_BUCKETS = 60  # about this many points per instance's throughput line
NICE_SECONDS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400)
STRAGGLER_FACTOR = 1.5  # an instance finishing later than 1.5x the median instance's finish (since the step began)
STRAGGLER_MIN_SECONDS = 5.0  # ... and at least this much later: a 2 s run has no stragglers worth a look
IDLE_FRACTION = 0.25  # an instance busy (any file in flight) less than this share of its time is idle
DENSITY_BINS = 40
_UNFINISHED = frozenset({FileStatus.PENDING.value, FileStatus.RUNNING.value})


def build_report(
    identity: StepIdentity,
    files: Sequence[FileRecord],
    instances: Sequence[InstanceRecord],
    histogram: Histogram | None = None,
    *,
    reference: Histogram | None = None,
    reference_run_id: str | None = None,
    previous_runs: Sequence[PreviousRun] = (),
    prices: Prices | None = None,
    max_psi: float = DEFAULT_MAX_PSI,
    drift_bins: int = DEFAULT_BINS,
    timeline_buckets: int = TIMELINE_BUCKETS,
    straggler_factor: float = STRAGGLER_FACTOR,
    straggler_min_seconds: float = STRAGGLER_MIN_SECONDS,
    idle_fraction: float = IDLE_FRACTION,
    generated_at: dt.datetime | None = None,
    rejects: Mapping[str, Sequence[RejectRow]] | None = None,
    request_prices: Mapping[str, float] | None = None,
) -> RunReport:
    """The report of one step from its records. Pure: the same records give the same report.

    ``instances`` should hold one record per host and attempt; a host that had files but no
    record is added from its files' times (typed like the step's other instances) with a note.
    A price missing from ``prices`` leaves the cost empty with ``cost.error`` saying where to set it.
    ``rejects``: the first rejected rows of each file that rejected some (input key -> rows), as read from their
    rejects lists.
    """
    prices = prices or Prices.default()
    files = [counted(f) for f in files]
    notes: list[str] = []
    instances = _complete_instances(files, instances, notes)
    labels = _labels(instances)
    by_instance: dict[tuple[str, int], list[FileRecord]] = defaultdict(list)
    for record in files:
        if record.host is not None:
            by_instance[(record.host, record.attempt)].append(record)
    windows = {(i.host, i.attempt): _window(i, by_instance[(i.host, i.attempt)]) for i in instances}
    starts = [w[0] for w in windows.values() if w[0]] + [utc(f.started_at) for f in files if f.started_at]
    ends = [w[1] for w in windows.values() if w[1]] + [utc(f.finished_at) for f in files if f.finished_at]
    start, end = (min(starts) if starts else None), (max(ends) if ends else None)

    timeline = _timeline(files, instances, labels, windows, start, end, timeline_buckets)
    summaries = _instance_summaries(identity, instances, labels, by_instance, windows, start, prices)
    summaries = _flag(summaries, straggler_factor, straggler_min_seconds, idle_fraction)
    reconciliation = _reconcile(files, rejects or {})
    cost = _cost(identity, instances, windows, prices, reconciliation.rows_out, previous_runs, request_prices)
    drift = _drift(histogram, reference, reference_run_id, max_psi, drift_bins)
    uncounted = [i for i in instances if not i.requests]
    if uncounted:
        notes.append(
            f"{len(uncounted)} of {len(instances)} instance(s) recorded no AWS request counts (a worker from before "
            "them, or a stack whose job role may not write them: its LedgerWorkerAttributes statement): the control "
            + ("plane is not priced" if len(uncounted) == len(instances) else "plane is priced without theirs")
        )
    if timeline.files_without_times:
        notes.append(
            f"{timeline.files_without_times} file(s) have no recorded times and are left out of the throughput chart"
        )
    return RunReport(
        pipeline=identity.pipeline,
        run_id=identity.run_id,
        step=identity.step,
        attempt=identity.attempt,
        backend=identity.backend,
        generated_at=generated_at,
        started_at=start,
        ended_at=end,
        seconds=(end - start).total_seconds() if start and end else None,
        instances=summaries,
        stragglers=[s.instance for s in summaries if s.straggler],
        idle=[s.instance for s in summaries if s.idle],
        timeline=timeline,
        cost=cost,
        drift=drift,
        reconciliation=reconciliation,
        notes=notes,
    )


def _complete_instances(
    files: Sequence[FileRecord], instances: Sequence[InstanceRecord], notes: list[str]
) -> list[InstanceRecord]:
    known = {(i.host, i.attempt) for i in instances}
    missing = sorted({(f.host, f.attempt) for f in files if f.host is not None} - known, key=lambda k: (k[1], k[0]))
    if not missing:
        return sorted(instances, key=lambda i: (i.attempt, _host_order(i.host)))
    types = Counter(i.instance_type for i in instances)
    instance_type = types.most_common(1)[0][0] if types else "unknown"
    notes.append(
        f"no instance record for {', '.join(f'{h} (attempt {a})' for h, a in missing)}: its time is "
        f"taken from its files, as a {instance_type}"
    )
    added = [InstanceRecord(host=h, attempt=a, instance_type=instance_type) for h, a in missing]
    return sorted([*instances, *added], key=lambda i: (i.attempt, _host_order(i.host)))


def _host_order(host: str) -> tuple[int, str]:
    """algo-2 before algo-10."""
    prefix, _, number = host.rpartition("-")
    return (int(number), prefix) if number.isdigit() else (0, host)


def _labels(instances: Sequence[InstanceRecord]) -> dict[tuple[str, int], str]:
    several = len({i.attempt for i in instances}) > 1
    return {(i.host, i.attempt): f"{i.host} (attempt {i.attempt})" if several else i.host for i in instances}


def _window(instance: InstanceRecord, files: Sequence[FileRecord]) -> tuple[dt.datetime | None, dt.datetime | None]:
    """When an instance ran: from its own record's start to its last heartbeat, and never shorter than its files show
    (a last heartbeat that never landed must not cut its bill short of the files it finished)."""
    first = min((utc(f.started_at) for f in files if f.started_at), default=None)
    last = max((utc(f.finished_at) for f in files if f.finished_at), default=None)
    started = min((t for t in (utc(instance.started_at), first) if t), default=None)
    ended = max((t for t in (utc(instance.ended_at), last) if t), default=None)
    if started and ended and ended < started:
        ended = started
    return started, ended


def _file_interval(record: FileRecord, start: dt.datetime) -> tuple[float, float] | None:
    """A file's (start, finish) in seconds after ``start``; the worker's ``seconds`` fills a missing end."""
    began, finished = utc(record.started_at), utc(record.finished_at)
    if began is None and finished is not None and record.seconds is not None:
        began = finished - dt.timedelta(seconds=record.seconds)
    if finished is None and began is not None and record.seconds is not None and record.status not in _UNFINISHED:
        finished = began + dt.timedelta(seconds=record.seconds)
    if began is None or finished is None:
        return None
    a, b = (began - start).total_seconds(), (finished - start).total_seconds()
    return a, max(a, b)


def _nice_width(span: float, buckets: int) -> float:
    raw = max(span, 1e-9) / max(buckets, 1)
    if raw < 1:
        return float(10 ** math.ceil(math.log10(raw)))
    return float(next((w for w in NICE_SECONDS if w >= raw), math.ceil(raw / 86400) * 86400))


def _timeline(
    files: Sequence[FileRecord],
    instances: Sequence[InstanceRecord],
    labels: Mapping[tuple[str, int], str],
    windows: Mapping[tuple[str, int], tuple[dt.datetime | None, dt.datetime | None]],
    start: dt.datetime | None,
    end: dt.datetime | None,
    buckets: int,
) -> Timeline:
    intervals: dict[tuple[str, int], list[tuple[float, float, int]]] = defaultdict(list)
    without = 0
    for record in files:
        if record.status in _UNFINISHED or record.host is None:
            continue
        interval = _file_interval(record, start) if start else None
        if interval is None:
            without += 1
            continue
        intervals[(record.host, record.attempt)].append((*interval, record.rows_out))
    if start is None or end is None:
        return Timeline(start=start, bucket_seconds=0.0, offsets=[], series=[], files_without_times=without)
    span = max(max((b for v in intervals.values() for _, b, _ in v), default=0.0), (end - start).total_seconds())
    width = _nice_width(span, buckets)
    count = max(1, math.ceil(span / width))
    edges = np.arange(count + 1) * width
    series = []
    for instance in instances:
        key = (instance.host, instance.attempt)
        rates = _rates(intervals.get(key, []), edges)
        began, ended = windows[key]
        points: list[float | None] = rates.tolist()
        if began and ended:  # buckets wholly outside the instance's life are gaps in its line, not zeros
            alive = (edges[1:] > (began - start).total_seconds()) & (edges[:-1] < (ended - start).total_seconds())
            points = [p if a else None for p, a in zip(points, alive.tolist(), strict=True)]
        series.append(Series(instance=labels[key], rows_per_second=points))
    return Timeline(
        start=start, bucket_seconds=width, offsets=edges[:-1].tolist(), series=series, files_without_times=without
    )


def _rates(intervals: Sequence[tuple[float, float, int]], edges: np.ndarray) -> np.ndarray:
    """Rows per second in each bucket, each file's rows spread evenly over its time.

    The rows done by time e are R(e) = sum_i r_i * clip(e - s_i, 0, d_i) with r_i = rows_i / d_i:
    two prefix sums over the files sorted by start and by finish give R at every edge in
    O((files + edges) log files), so 100,000 files cost no more than a few sorts.
    """
    if not intervals:
        return np.zeros(edges.size - 1)
    s, f, rows = (np.asarray(c, dtype=np.float64) for c in zip(*intervals, strict=True))
    f = np.maximum(f, s + 1e-3)  # a file with no measurable time: its rows in its first millisecond
    rate = rows / (f - s)

    def ramp(points: np.ndarray) -> np.ndarray:  # sum over points p < e of rate * (e - p)
        order = np.argsort(points)
        p, r = points[order], rate[order]
        a = np.concatenate([[0.0], np.cumsum(r)])
        b = np.concatenate([[0.0], np.cumsum(r * p)])
        n = np.searchsorted(p, edges, side="left")
        return edges * a[n] - b[n]

    done = ramp(s) - ramp(f)
    return np.maximum(np.diff(done), 0.0) / np.diff(edges)


def _busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of the intervals: time with at least one file in flight."""
    total, current_start, current_end = 0.0, None, None
    for a, b in sorted(intervals):
        if current_end is None or a > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = a, b
        else:
            current_end = max(current_end, b)
    if current_end is not None:
        total += current_end - current_start
    return total


def _instance_summaries(
    identity: StepIdentity,
    instances: Sequence[InstanceRecord],
    labels: Mapping[tuple[str, int], str],
    by_instance: Mapping[tuple[str, int], list[FileRecord]],
    windows: Mapping[tuple[str, int], tuple[dt.datetime | None, dt.datetime | None]],
    start: dt.datetime | None,
    prices: Prices,
) -> list[InstanceSummary]:
    summaries = []
    for instance in instances:
        key = (instance.host, instance.attempt)
        records = by_instance.get(key, [])
        began, ended = windows[key]
        seconds = (ended - began).total_seconds() if began and ended else 0.0
        done = [r for r in records if r.status == FileStatus.SUCCEEDED.value]
        rows = sum(r.rows_out for r in done)
        intervals = [iv for r in records if start and (iv := _file_interval(r, start))]
        busy = min(_busy_seconds(intervals), seconds) if seconds else _busy_seconds(intervals)
        try:
            cost = instance_cost(InstanceUsage(instance.instance_type, seconds), prices, identity.backend)
        except UnknownPriceError:
            cost = None  # the step's Cost says why
        # The instance's own counts, as its manifest has them: a file it failed that a later attempt took over
        # is no longer its FILE item's, but it was still this instance's file, and its failure.
        failed = sum(r.status == FileStatus.FAILED.value for r in records)
        files, succeeded = len(records), len(done)
        if instance.files_assigned:
            files, failed = instance.files_assigned, instance.files_failed or 0
            succeeded = (instance.files_done or 0) - failed
        summaries.append(
            InstanceSummary(
                instance=labels[key],
                host=instance.host,
                attempt=instance.attempt,
                instance_type=instance.instance_type,
                status=instance.status,
                files=files,
                files_succeeded=succeeded,
                files_failed=failed,
                rows_out=rows,
                bytes_in=sum(r.bytes_in for r in records),
                bytes_out=sum(r.bytes_out for r in records),
                started_at=began,
                ended_at=ended,
                seconds=seconds,
                busy_seconds=busy,
                busy_fraction=busy / seconds if seconds else None,
                rows_per_second=rows / seconds if seconds else None,
                started_after_seconds=(began - start).total_seconds() if began and start else None,
                finished_after_seconds=(ended - start).total_seconds() if ended and start else None,
                cost=cost,
                straggler=False,
                idle=False,
            )
        )
    return summaries


def _flag(
    summaries: list[InstanceSummary], factor: float, min_seconds: float, idle_fraction: float
) -> list[InstanceSummary]:
    """Stragglers: finished much later than the median instance of their attempt. Idle: no files, or mostly waiting.

    Finishes count from the attempt's first instance start: a resubmission's instances start
    late by design, and are compared with each other only.
    """
    median: dict[int, float] = {}
    since: dict[int, float] = {}  # each attempt's first start, in the step's seconds
    for attempt in {s.attempt for s in summaries}:
        mine = [s for s in summaries if s.attempt == attempt]
        since[attempt] = min(
            (s.started_after_seconds for s in mine if s.started_after_seconds is not None), default=0.0
        )
        finishes = [
            s.finished_after_seconds - since[attempt] for s in mine if s.files and s.finished_after_seconds is not None
        ]
        if len(finishes) >= 2:
            median[attempt] = statistics.median(finishes)
    flagged = []
    for summary in summaries:
        middle = median.get(summary.attempt)
        finish = (
            None if summary.finished_after_seconds is None else summary.finished_after_seconds - since[summary.attempt]
        )
        late = middle is not None and finish is not None and finish > factor * middle and finish - middle >= min_seconds
        idle = summary.files == 0 or (summary.busy_fraction is not None and summary.busy_fraction < idle_fraction)
        flagged.append(summary.model_copy(update={"straggler": late, "idle": idle}))
    return flagged


def _reconcile(files: Sequence[FileRecord], rejects: Mapping[str, Sequence[RejectRow]]) -> Reconciliation:
    rows = [
        FileRow(
            key=f.input_key,
            host=f.host,
            attempt=f.attempt,
            status=f.status,
            rows_in=f.rows_in,
            rows_out=f.rows_out,
            rows_rejected=f.rows_rejected or 0,
            balanced=f.status != FileStatus.SUCCEEDED.value or f.rows_in == f.rows_out + (f.rows_rejected or 0),
            error=(f.error_line() or None) if f.status == FileStatus.FAILED else None,
        )
        for f in sorted(files, key=lambda f: f.input_key)
    ]
    succeeded = [r for r in rows if r.status == FileStatus.SUCCEEDED.value]
    failures = [r for r in rows if r.status == FileStatus.FAILED.value]
    mismatched = [r.key for r in rows if not r.balanced]
    return Reconciliation(
        files=len(rows),
        succeeded=len(succeeded),
        failed=len(failures),
        unfinished=sum(r.status in _UNFINISHED for r in rows),
        rows_in=sum(r.rows_in for r in succeeded),
        rows_out=sum(r.rows_out for r in succeeded),
        balanced=not mismatched,
        mismatched=mismatched,
        retried=sum(r.attempt > 1 for r in rows),
        max_attempt=max((r.attempt for r in rows), default=0),
        failures=failures,
        rows=rows,
        rows_rejected=sum(r.rows_rejected for r in succeeded),
        rejects=[row for r in succeeded for row in rejects.get(r.key, ())],
        model_warnings=sum(f.model_warnings or 0 for f in files),
    )


def _cost(
    identity: StepIdentity,
    instances: Sequence[InstanceRecord],
    windows: Mapping[tuple[str, int], tuple[dt.datetime | None, dt.datetime | None]],
    prices: Prices,
    predictions: int,
    previous_runs: Sequence[PreviousRun],
    request_prices: Mapping[str, float] | None = None,
) -> Cost:
    seconds_by_type: dict[str, list[float]] = defaultdict(list)
    for instance in instances:
        began, ended = windows[(instance.host, instance.attempt)]
        seconds_by_type[instance.instance_type].append((ended - began).total_seconds() if began and ended else 0.0)
    lines, error = [], None
    for instance_type, seconds in sorted(seconds_by_type.items()):
        try:
            price = prices.hourly(instance_type, identity.backend)
        except UnknownPriceError as err:
            error = str(err)
            continue
        lines.append(
            CostLine(
                instance_type=instance_type,
                instances=len(seconds),
                seconds=sum(seconds),
                price_per_hour=price,
                cost=instance_cost(InstanceUsage(instance_type, sum(seconds)), prices, identity.backend),
            )
        )
    total = None if error else sum(line.cost for line in lines)
    per_million = cost_per_million(total, predictions) if total is not None else None
    requests: Counter[str] = Counter()
    for instance in instances:
        requests.update(instance.requests or {})
    # An instance's inputs and its model are fetched for it (SageMaker's download; the local backend's supervisor):
    # a GET a file, and one for the model.
    downloads = sum(instance.files_assigned or 0 for instance in instances) + len(instances)
    # Every counting instance counts its heartbeats, so no counts at all is "not counted" (a worker from before the
    # counts, or a stack whose job role may not write them), never a control plane of downloads alone.
    counted = any(instance.requests for instance in instances)
    control = requests_cost({**requests, "s3.get": requests["s3.get"] + downloads}, request_prices) if counted else None
    trend = [TrendPoint(run_id=p.run_id, cost_per_million=p.cost_per_million, current=False) for p in previous_runs]
    trend.append(TrendPoint(run_id=identity.run_id, cost_per_million=per_million, current=True))
    source = f"local backend at {prices.local_per_hour:g} USD/h" if identity.backend == "local" else prices.source
    return Cost(
        backend=identity.backend,
        total=total,
        cost_per_million=per_million,
        predictions=predictions,
        instance_seconds=sum(sum(s) for s in seconds_by_type.values()),
        by_type=lines,
        prices_source=source,
        trend=trend,
        error=error,
        requests=dict(sorted(requests.items())),
        downloads=downloads,
        control_plane=control,
        control_plane_per_million=cost_per_million(control, predictions) if control is not None else None,
        request_prices_source=REQUEST_PRICES_SOURCE,
    )


QUANTILES = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def _quantiles(histogram: Histogram | None) -> dict[str, float | None]:
    if histogram is None or histogram.value_count == 0:
        return {}
    return {f"p{round(q * 100)}": _finite(histogram.quantile(q)) for q in QUANTILES}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _drift(
    current: Histogram | None, reference: Histogram | None, reference_run_id: str | None, max_psi: float, bins: int
) -> DriftReport:
    note, result, density = None, None, None
    if current is None or current.count == 0:
        note = "this run recorded no prediction histogram"
    elif reference is None or reference.count == 0:
        note = "no previous successful run of this pipeline and step to compare with"
    else:
        result = psi_between(reference, current, bins=bins)
        density = _density(reference, current)
    return DriftReport(
        reference_run_id=reference_run_id if result else None,
        psi=result.psi if result else None,
        max_psi=max_psi,
        verdict=verdict(result.psi if result else None, max_psi),
        note=note,
        bins=Bins(
            kind=result.kind,
            labels=list(result.labels),
            reference=list(result.reference_fractions),
            current=list(result.current_fractions),
        )
        if result
        else None,
        density=density if density is not None else (_density(None, current) if current and current.count else None),
        current_quantiles=_quantiles(current),
        reference_quantiles=_quantiles(reference),
        current_histogram=current.to_dict() if current is not None else None,
        reference_histogram=reference.to_dict() if reference is not None else None,
    )


def _density(reference: Histogram | None, current: Histogram) -> Density | None:
    """Both histograms over common bins: one per value for a few integers, else equal widths over p0.5-p99.5."""
    sides = [h for h in (reference, current) if h is not None and h.value_count]
    if not sides:
        return None
    exact = all(h.is_exact for h in sides)
    read = [h.buckets(exact=exact) for h in sides]
    union = np.unique(np.concatenate([v for v, _ in read]))
    union = union[np.isfinite(union)]
    if union.size == 0:
        return None

    def fractions(histogram: Histogram | None, bins: np.ndarray, kind: str) -> list[float]:
        if histogram is None or not histogram.value_count:
            return [0.0] * (bins.size if kind == "values" else bins.size - 1)
        values, counts = histogram.buckets(exact=exact)
        keep = np.isfinite(values)
        values, counts = values[keep], counts[keep]
        if kind == "values":
            index = np.searchsorted(bins, values)
            out = np.bincount(index, weights=counts, minlength=bins.size)[: bins.size]
        else:
            out, _ = np.histogram(np.clip(values, bins[0], bins[-1]), bins=bins, weights=counts)
        return (out / histogram.count).tolist()

    if exact and union.size <= DENSITY_BINS:
        return Density(
            kind="values",
            edges=union.tolist(),
            reference=fractions(reference, union, "values"),
            current=fractions(current, union, "values"),
        )
    lows = [h.quantile(0.005) for h in sides]
    highs = [h.quantile(0.995) for h in sides]
    lo = (
        min(v for v in lows if v is not None and math.isfinite(v))
        if any(v is not None and math.isfinite(v) for v in lows)
        else float(union[0])
    )
    hi = (
        max(v for v in highs if v is not None and math.isfinite(v))
        if any(v is not None and math.isfinite(v) for v in highs)
        else float(union[-1])
    )
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    bins = np.linspace(lo, hi, DENSITY_BINS + 1)
    return Density(
        kind="intervals",
        edges=bins.tolist(),
        reference=fractions(reference, bins, "intervals"),
        current=fractions(current, bins, "intervals"),
    )
