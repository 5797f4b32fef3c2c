"""A quote before launch: what a pipeline's partitions will cost, from what its steps did before.

For each step of each partition: the inputs are listed as the plan task lists them (and their rows read from parquet
footers; text inputs' rows are guessed from their bytes), the instances are chosen as the plan chooses them, and the
rates come from the newest successful runs of the same step whose model URI (its version rendered in) and instance
type are this one's, read from the ledger's STEP items and the runs' report.json. With none, runs of another model
version on the same type are used, said so and with a wider range; with none of those either, a short sample run of
the step's own worker settings on this machine (``sampler``, which the CLI passes; the plan task has none, so it
quotes from history only). The figures themselves are :mod:`shardline.report.quote`'s.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import botocore.exceptions

from shardline.errors import InvalidArgument, ShardlineError
from shardline.ledger.keys import StepRef
from shardline.ledger.states import StepStatus
from shardline.ledger.step_reads import list_runs, read_step_item
from shardline.orchestration import services
from shardline.orchestration.budget import prices_for, step_price
from shardline.orchestration.footers import parquet_footer
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import S3Object, choose_instance_count, list_inputs
from shardline.report.cost import UnknownPriceError
from shardline.report.model import RunReport
from shardline.report.quote import PastRun, Rates, StepQuote, Total, Work, quote_step, rates_from, total_of
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec, partition_interval
from shardline.spec.templates import default_params, render_uri

log = logging.getLogger(__name__)

QUOTE_RUNS = 10  # the newest matching runs a step's rates are fitted to
SCAN_RUNS = 200  # how many of the pipeline's newest runs are looked through for them
MAX_FOOTERS = 2_000  # inputs whose footers are read for their rows; past this, the rest are guessed from bytes
FOOTER_THREADS = 32

# (model URI, model version, input URI, instance type) -> the rates of a sample run; raises QuoteError
Sampler = Callable[[PipelineSpec, str, str, str | None, str], Rates]


class QuoteError(ShardlineError):
    """No quote can be made: the message says what is missing and what to do."""


@dataclasses.dataclass(frozen=True)
class PartitionQuote:
    """One run's quote: its partition (None: an unscheduled pipeline's one run) and each step's."""

    partition: dt.datetime | None
    steps: list[StepQuote]

    @property
    def total(self) -> Total:
        return total_of(self.steps)


@dataclasses.dataclass(frozen=True)
class Quote:
    pipeline: str
    partitions: list[PartitionQuote]
    notes: list[str]

    @property
    def total(self) -> Total:
        return total_of([s for p in self.partitions for s in p.steps])


def past_runs(spec: PipelineSpec, step: str, model_uri: str, instance_type: str) -> tuple[list[PastRun], list[PastRun]]:
    """The newest successful runs of ``step`` on ``instance_type`` (every instance of them on it): those with
    ``model_uri``, and those with another model URI. At most :data:`QUOTE_RUNS` of each."""
    model = services.ledger_model(spec)
    s3 = services.s3_client(spec)
    same: list[PastRun] = []
    other: list[PastRun] = []
    for run in list_runs(model, spec.pipeline, limit=SCAN_RUNS):
        if len(same) >= QUOTE_RUNS:
            break
        record = read_step_item(model, StepRef(spec.pipeline, run.run_id, step))
        if record is None or record.status != StepStatus.SUCCEEDED or not record.plan_json:
            continue
        attempt = Attempt.from_plan(
            record.plan_json, record.attempt or 1, 0, pipeline=spec.pipeline, run_id=run.run_id, step=step
        )
        report = _report(s3, attempt)
        if report is None or report.backend != spec.backend:
            continue
        if not report.instances or any(i.instance_type != instance_type for i in report.instances):
            continue
        past = past_run(run.run_id, report, record.started_at)
        if attempt.model_uri == model_uri:
            same.append(past)
        elif len(other) < QUOTE_RUNS:
            other.append(past)
    return same, other


def _report(s3, attempt: Attempt) -> RunReport | None:
    bucket, key = parse_s3_uri(attempt.report_uri("json"))
    try:
        return RunReport.from_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None  # a run from before reports, or one whose report was never written
    except ValueError as err:
        log.warning("the report of run %s is unreadable and left out of the quote: %s", attempt.run_id, err)
        return None


def past_run(run_id: str, report: RunReport, planned_at: dt.datetime | None) -> PastRun:
    """What a run's report says of its rate: its instances, predictions, instance-seconds and start-up."""
    starts = [i.started_at for i in report.instances if i.started_at]
    startup = (min(starts) - planned_at).total_seconds() if starts and planned_at else None
    return PastRun(
        run_id=run_id,
        instances=len(report.instances),
        rows=report.reconciliation.rows_out,
        instance_seconds=report.cost.instance_seconds,
        busy_seconds=sum(i.busy_seconds for i in report.instances),
        bytes_in=sum(i.bytes_in for i in report.instances),
        rows_in=report.reconciliation.rows_in,
        startup_seconds=startup if startup is not None and startup >= 0 else None,
    )


def input_rows(s3, bucket: str, objects: Sequence[S3Object], notes: list[str]) -> int | None:
    """The inputs' rows from their parquet footers (every one, up to :data:`MAX_FOOTERS`; past that, those read
    scaled by bytes); None when any input is not plain parquet (its rows are not known before reading it). An input
    named .parquet that has no footer is noted: its run will fail that file."""
    if not objects or any(not o.key.lower().endswith(".parquet") for o in objects):
        return None
    read = list(objects[:MAX_FOOTERS])
    with ThreadPoolExecutor(max_workers=FOOTER_THREADS) as pool:
        footers = list(pool.map(lambda o: parquet_footer(s3, bucket, o.key), read))
    unreadable = [o.key for o, f in zip(read, footers, strict=True) if f is None]
    if unreadable:
        notes.append(
            f"{len(unreadable)} input(s) named .parquet have no parquet footer (s3://{bucket}/{unreadable[0]} "
            "first): the run will fail them; their rows are guessed from bytes"
        )
        return None
    rows = sum(meta.num_rows for meta, _ in footers)
    if len(read) == len(objects):
        return rows
    read_bytes = sum(o.size for o in read)
    return round(rows * sum(o.size for o in objects) / read_bytes) if read_bytes else None


def rates_for(
    spec: PipelineSpec,
    step: str,
    model_uri: str,
    model_version: str | None,
    input_uri: str,
    sampler: Sampler | None,
    notes: list[str],
) -> Rates:
    """The step's rates: from its runs with this model, else another version's, else a sample run."""
    instance_type = spec.step(step).resources.instance_type
    same, other = past_runs(spec, step, model_uri, instance_type)
    if same:
        return rates_from(same, "history")
    if other:
        notes.append(
            f"step {step}: no successful run with model {model_uri} on {instance_type}; quoted from "
            f"{len(other)} run(s) of another model version, with a wider range"
        )
        return rates_from(other, "other-version")
    if sampler is None:
        raise QuoteError(
            f"step {step} has no successful run on {instance_type} to quote from: run "
            f"`shardline quote {spec.pipeline}`, which measures a sample here"
        )
    notes.append(
        f"step {step}: no successful run on {instance_type}; quoted from a sample run on this machine, "
        "not on that instance type: trust it as a first guess"
    )
    return sampler(spec, step, model_uri, model_version, input_uri)


def quote_partition(
    spec: PipelineSpec,
    partition: dt.datetime | None,
    *,
    model_version: str | None = None,
    input_prefix: str | None = None,
    instance_count: int | None = None,
    sampler: Sampler | None = None,
    notes: list[str] | None = None,
    rates_seen: dict | None = None,
) -> PartitionQuote:
    """Quote one run of ``spec``: of the partition starting at ``partition`` (its interval's start), or, unscheduled,
    of ``input_prefix``. ``rates_seen`` keeps each step's rates across partitions (one history read, one sample)."""
    notes = notes if notes is not None else []
    rates_seen = rates_seen if rates_seen is not None else {}
    version = model_version or spec.steps[0].model.version
    params = {**default_params(version), "input_prefix": input_prefix or ""}
    if partition is not None:
        start, end = partition_interval(spec.schedule, partition)
    else:
        start = end = dt.datetime.now(dt.UTC)
    s3 = services.s3_client(spec)
    quotes: list[StepQuote] = []
    for s in spec.steps:

        def render(template: str) -> str:
            return render_uri(template, logical_date=start, start=start, end=end, params=params)

        model_uri = render(s.model.uri)
        key = (s.name, model_uri)
        if s.input.from_step:
            upstream = next(q for q in quotes if q.step == s.input.from_step)
            work = Work(
                files=upstream.work.files,
                bytes=0,
                instances=choose_instance_count(instance_count or s.resources.instance_count, upstream.work.files),
                instance_type=s.resources.instance_type,
                rows=round(upstream.rows.expected),
            )
            input_uri = render(spec.step(s.input.from_step).output.prefix)
        else:
            input_uri = input_prefix if (input_prefix and s is spec.steps[0]) else render(s.input.prefix)
            try:
                objects = list_inputs(s3, input_uri, s.input.include, s.input.exclude)
            except botocore.exceptions.ClientError as err:  # a bucket not there, a prefix the caller may not list
                raise QuoteError(f"step {s.name}: its input {input_uri} could not be listed: {err}") from err
            if not objects:
                notes.append(f"step {s.name}: no input under {input_uri} yet: quoted as nothing to score")
                break
            work = Work(
                files=len(objects),
                bytes=sum(o.size for o in objects),
                instances=choose_instance_count(instance_count or s.resources.instance_count, len(objects)),
                instance_type=s.resources.instance_type,
                rows=input_rows(s3, parse_s3_uri(input_uri)[0], objects, notes),
            )
        if key not in rates_seen:
            rates_seen[key] = rates_for(spec, s.name, model_uri, version, input_uri, sampler, notes)
        prices, _ = prices_for(spec, s.name)
        try:
            price = prices.hourly(s.resources.instance_type, spec.backend)
        except UnknownPriceError as err:
            raise QuoteError(str(err)) from err
        try:
            quotes.append(quote_step(s.name, work, rates_seen[key], price))
        except InvalidArgument as err:
            raise QuoteError(f"step {s.name}: {err}") from err
    return PartitionQuote(partition=start if partition is not None else None, steps=quotes)


def quote(
    spec: PipelineSpec,
    partitions: Sequence[dt.datetime | None],
    *,
    model_version: str | None = None,
    input_prefix: str | None = None,
    instance_count: int | None = None,
    sampler: Sampler | None = None,
) -> Quote:
    """Quote each of ``partitions`` (interval starts; ``[None]``: an unscheduled pipeline's run of ``input_prefix``)."""
    notes: list[str] = []
    rates_seen: dict = {}
    found = [
        quote_partition(
            spec,
            p,
            model_version=model_version,
            input_prefix=input_prefix,
            instance_count=instance_count,
            sampler=sampler,
            notes=notes,
            rates_seen=rates_seen,
        )
        for p in partitions
    ]
    return Quote(pipeline=spec.pipeline, partitions=found, notes=list(dict.fromkeys(notes)))


# -- what people read ----------------------------------------------------------------------------------------------

PARTITION_LINES = 24  # partitions listed one by one; past this, only the totals per step


def _usd(value: float) -> str:
    return f"${value:,.2f}" if value >= 10 else f"${value:,.4f}"


def _span_usd(span) -> str:
    return f"{_usd(span.expected)} (range {_usd(span.low)} to {_usd(span.high)})"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def step_line(q: StepQuote) -> str:
    """One step of one partition: its work and its figures, on one line."""
    rows = f"{q.rows.expected:,.0f} predictions" + ("" if q.rows_known else " (guessed from bytes)")
    per_million = q.per_million
    return (
        f"step {q.step}: {q.work.files:,} file(s), {q.work.bytes / 2**20:,.1f} MiB, {rows}, {q.work.instances} x "
        f"{q.work.instance_type}: {_span_usd(q.usd)}, {q.instance_hours.expected:,.3f} instance-hours "
        f"({q.instance_hours.low:,.3f} to {q.instance_hours.high:,.3f})"
        + (f", {_usd(per_million.expected)} per 1M predictions" if per_million else "")
        + f", about {_duration(q.wall_seconds)} from plan to last file"
    )


def basis_line(step: str, rates: Rates) -> str:
    """Where a step's rates came from."""
    where = {
        "history": f"{len(rates.runs)} earlier run(s) with the same model and instance type",
        "other-version": f"{len(rates.runs)} earlier run(s) of another model version on the same instance type",
        "sample": "a sample run on this machine",
    }[rates.basis]
    runs = ", ".join(rates.runs[:5]) + (f" and {len(rates.runs) - 5} more" if len(rates.runs) > 5 else "")
    return (
        f"step {step}: from {where} ({runs}): {rates.rows_per_second:,.0f} predictions/s an instance, "
        f"{rates.per_instance:,.1f} s an instance besides; range -{rates.below:.0%} / +{rates.above:.0%}"
    )


def quote_lines(q: Quote) -> list[str]:
    """The quote as ``shardline quote`` prints it and the plan task logs it."""
    count = len(q.partitions)
    lines = [f"quote of {q.pipeline}: {count} run(s)"]
    if count <= PARTITION_LINES:
        for p in q.partitions:
            head = f"{p.partition:%Y-%m-%dT%H:%M}" if p.partition else "run"
            lines.extend(f"  {head} {step_line(s)}" for s in p.steps)
    total = q.total
    per_million = total.per_million
    lines.append(
        f"in all: {_span_usd(total.usd)}, {total.instance_seconds.expected / 3600:,.3f} instance-hours "
        f"({total.instance_seconds.low / 3600:,.3f} to {total.instance_seconds.high / 3600:,.3f}), "
        f"{total.rows.expected:,.0f} predictions"
        + (f", {_usd(per_million.expected)} per 1M predictions" if per_million else "")
    )
    seen: dict[str, Rates] = {}
    for p in q.partitions:
        for s in p.steps:
            seen.setdefault(s.step, s.rates)
    lines.extend(f"figures: {basis_line(step, rates)}" for step, rates in seen.items())
    lines.append(
        "counted as the run report counts it: each instance from its start to its last heartbeat; "
        "provisioning before an instance starts is not in it"
    )
    lines.extend(f"note: {n}" for n in q.notes)
    return lines


def _span_dict(span) -> dict:
    return {"low": span.low, "expected": span.expected, "high": span.high}


def quote_data(q: Quote) -> dict:
    """The quote as ``--json`` prints it."""
    total = q.total
    return {
        "pipeline": q.pipeline,
        "usd": _span_dict(total.usd),
        "instance_hours": _span_dict(total.instance_seconds.scaled(1 / 3600)),
        "predictions": _span_dict(total.rows),
        "usd_per_million": _span_dict(total.per_million) if total.per_million else None,
        "partitions": [
            {
                "partition": p.partition.isoformat() if p.partition else None,
                "steps": [
                    {
                        "step": s.step,
                        "files": s.work.files,
                        "bytes": s.work.bytes,
                        "instances": s.work.instances,
                        "instance_type": s.work.instance_type,
                        "price_per_hour": s.price_per_hour,
                        "predictions": _span_dict(s.rows),
                        "predictions_known": s.rows_known,
                        "usd": _span_dict(s.usd),
                        "instance_hours": _span_dict(s.instance_hours),
                        "usd_per_million": _span_dict(s.per_million) if s.per_million else None,
                        "wall_seconds": round(s.wall_seconds, 1),
                        "basis": s.rates.basis,
                        "runs": list(s.rates.runs),
                    }
                    for s in p.steps
                ],
            }
            for p in q.partitions
        ],
        "notes": q.notes,
    }


def attempt_quote(spec: PipelineSpec, attempt: Attempt) -> StepQuote | None:
    """The quote of a planned attempt from history only (the plan and the submit never run a sample): its files and
    instances as planned, rows guessed from bytes (no footer is read on the plan's path). None without history."""
    instance_type = attempt.instance_type or spec.step(attempt.step).resources.instance_type
    same, other = past_runs(spec, attempt.step, attempt.model_uri, instance_type)
    if not (same or other):
        return None
    rates = rates_from(same or other, "history" if same else "other-version")
    work = Work(
        files=attempt.file_count or len(attempt.files),
        bytes=sum(f.size for f in attempt.files),
        instances=attempt.instance_count,
        instance_type=instance_type,
    )
    return quote_step(attempt.step, work, rates, step_price(spec, attempt.step, instance_type))


def attempt_quote_lines(spec: PipelineSpec, attempt: Attempt) -> list[str]:
    """What the plan task logs of :func:`attempt_quote`: the quote and its figures' source, a line saying why there
    is none, or that it could not be made (never an error: it informs)."""
    try:
        found = attempt_quote(spec, attempt)
    except Exception as err:  # a quote informs; it never stops a plan
        log.warning("quote: step %s could not be quoted", attempt.step, exc_info=True)
        return [f"quote: step {attempt.step} could not be quoted: {type(err).__name__}: {err}"]
    if found is None:
        instance_type = attempt.instance_type or spec.step(attempt.step).resources.instance_type
        return [
            f"quote: step {attempt.step} has no successful run on {instance_type} yet, so no quote; "
            f"`shardline quote {spec.pipeline}` quotes it from a sample run"
        ]
    return [f"quote: {step_line(found)}", f"quote figures: {basis_line(attempt.step, found.rates)}"]
