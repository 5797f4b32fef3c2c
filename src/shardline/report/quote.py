"""What a step will cost before it runs: instance-seconds, dollars and cost per 1M predictions, as a range and an
expected figure, from what the same model on the same instance type did before. Pure: the records come in as
values (``orchestration.quote`` reads them from the ledger and the run reports, or from a sample run).

The model of a step's instance-seconds, as its run report counts them (each instance from its first file's claim
to its last heartbeat), is ``per_instance x instances + per_row x rows``:

- ``per_row``: seconds of an instance per prediction while it has files in flight;
- ``per_instance``: what an instance adds whatever its share: the tail after its last file, and the last files'
  wait for one another when they no longer fill every worker.

With two or more earlier runs of different sizes both are fitted (least squares on relative error, so a small
partition counts as much as a big one); with one, ``per_instance`` is its instances' time outside files. The range
is the expected figure widened by how far the earlier runs themselves stray from the fit, plus a margin that
shrinks with the number of runs (:func:`margin_for`): one run, or a sample, cannot show its own noise.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Literal

from shardline.errors import InvalidArgument

# The range's margin beyond the earlier runs' own stray from the fit, by how the rate was measured.
SAMPLE_MARGIN = 0.5  # a sample run on this machine: another machine, and a few hundred thousand rows
OTHER_VERSION_MARGIN = 0.35  # runs of another model version of the step: another model may be slower
# Measured, not chosen: `make bench-quote` on a 2-core machine, where runs of a few seconds vary by 10-20% on their
# own, saw expected figures up to 24% off from two runs (docs/benchmarks.md); these keep each actual in its range.
ONE_RUN_MARGIN = 0.30
FEW_RUNS_MARGIN = 0.25  # two runs
MANY_RUNS_MARGIN = 0.15  # three or more
ROWS_GUESS_MARGIN = 0.05  # rows guessed from bytes (text inputs): on top of the history's own spread of rows/byte

Basis = Literal["history", "other-version", "sample"]


@dataclasses.dataclass(frozen=True)
class PastRun:
    """An earlier successful run of the step, as its run report and STEP item recorded it."""

    run_id: str
    instances: int
    rows: int  # predictions written (rows out of succeeded files)
    instance_seconds: float  # what its report priced: each instance's first claim to last heartbeat, summed
    busy_seconds: float  # of those, with at least one file in flight
    bytes_in: int = 0
    rows_in: int = 0
    startup_seconds: float | None = None  # from the step's plan to its first file (provisioning, image, model load)


@dataclasses.dataclass(frozen=True)
class Work:
    """What the quoted step will be given: its inputs and the instances it will run on."""

    files: int
    bytes: int
    instances: int
    instance_type: str
    rows: int | None = None  # known exactly (parquet footers, an upstream quote's expected rows), or None: guessed


@dataclasses.dataclass(frozen=True)
class Span:
    """A figure as a range and an expected value (low <= expected <= high)."""

    low: float
    expected: float
    high: float

    def __post_init__(self) -> None:
        if not (self.low <= self.expected <= self.high) or self.low < 0:
            raise InvalidArgument(f"a span must be 0 <= low <= expected <= high, got {self}")

    def scaled(self, factor: float) -> Span:
        return Span(self.low * factor, self.expected * factor, self.high * factor)

    def __add__(self, other: Span) -> Span:
        return Span(self.low + other.low, self.expected + other.expected, self.high + other.high)

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high


ZERO = Span(0.0, 0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class Rates:
    """The fitted model and how far to trust it."""

    per_instance: float  # seconds an instance adds whatever its share
    per_row: float  # instance-seconds per prediction
    below: float  # the range's low side, as a fraction under the expected figure
    above: float  # its high side, over it
    basis: Basis
    runs: tuple[str, ...]  # the runs (or the sample) the figures came from
    rows_per_byte: float | None = None  # for inputs whose rows are not known before reading (text)
    rows_per_byte_spread: float = 0.0  # how far the runs' rows/byte stray from it, as a fraction
    startup_seconds: float | None = None  # the median time from plan to first file

    @property
    def rows_per_second(self) -> float:
        """One instance's predictions per second while it has files in flight."""
        return 1.0 / self.per_row if self.per_row > 0 else math.inf


@dataclasses.dataclass(frozen=True)
class StepQuote:
    step: str
    work: Work
    rows: Span  # predictions
    rows_known: bool  # exactly (footers), or guessed from bytes
    instance_seconds: Span
    usd: Span
    price_per_hour: float
    wall_seconds: float  # expected, plan to last file: start-up, then the rows over the instances
    rates: Rates

    @property
    def per_million(self) -> Span | None:
        """USD per 1M predictions: the dollars' range over the expected rows (None with no rows)."""
        if self.rows.expected <= 0:
            return None
        return self.usd.scaled(1_000_000 / self.rows.expected)

    @property
    def instance_hours(self) -> Span:
        return self.instance_seconds.scaled(1 / 3600)


def margin_for(basis: Basis, runs: int) -> float:
    """The margin the range gets beyond the runs' own stray from the fit."""
    if basis == "sample":
        return SAMPLE_MARGIN
    if basis == "other-version":
        return OTHER_VERSION_MARGIN
    return ONE_RUN_MARGIN if runs <= 1 else FEW_RUNS_MARGIN if runs == 2 else MANY_RUNS_MARGIN


def _fit(points: Sequence[PastRun]) -> tuple[float, float]:
    """(per_instance, per_row) minimising the runs' squared relative error; per_instance >= 0, per_row > 0."""
    # Weighted normal equations of S = a N + b R with weights 1 / S^2.
    w = [1.0 / (p.instance_seconds**2) for p in points]
    snn = sum(wi * p.instances * p.instances for wi, p in zip(w, points, strict=True))
    snr = sum(wi * p.instances * p.rows for wi, p in zip(w, points, strict=True))
    srr = sum(wi * p.rows * p.rows for wi, p in zip(w, points, strict=True))
    sns = sum(wi * p.instances * p.instance_seconds for wi, p in zip(w, points, strict=True))
    srs = sum(wi * p.rows * p.instance_seconds for wi, p in zip(w, points, strict=True))
    det = snn * srr - snr * snr
    if det > 1e-12 * snn * srr:
        a = (sns * srr - srs * snr) / det
        b = (snn * srs - snr * sns) / det
        if a >= 0 and b > 0:
            return a, b
    # Sizes too alike to part the two, or a fit below zero: the time outside files per instance, and the rest per row.
    a = statistics.median(max(0.0, p.instance_seconds - p.busy_seconds) / p.instances for p in points)
    b = sum(max(p.instance_seconds - a * p.instances, 0.0) for p in points) / sum(p.rows for p in points)
    return a, b


def rates_from(runs: Sequence[PastRun], basis: Basis) -> Rates:
    """The model fitted to ``runs`` (each with rows and instance-seconds), and its range."""
    usable = [r for r in runs if r.rows > 0 and r.instance_seconds > 0 and r.instances > 0]
    if not usable:
        raise InvalidArgument("a quote needs at least one earlier run (or a sample) with rows and instance-seconds")
    if len(usable) == 1:
        only = usable[0]
        a = max(0.0, only.instance_seconds - only.busy_seconds) / only.instances
        b = max(only.instance_seconds - a * only.instances, 0.0) / only.rows
    else:
        a, b = _fit(usable)
    stray = [r.instance_seconds / (a * r.instances + b * r.rows) - 1 for r in usable]
    margin = margin_for(basis, len(usable))
    per_byte = [r.rows_in / r.bytes_in for r in usable if r.bytes_in > 0 and r.rows_in > 0]
    rows_per_byte = statistics.median(per_byte) if per_byte else None
    startups = [r.startup_seconds for r in usable if r.startup_seconds is not None and r.startup_seconds >= 0]
    return Rates(
        per_instance=a,
        per_row=b,
        below=min(0.95, margin - min(0.0, *stray)),
        above=margin + max(0.0, *stray),
        basis=basis,
        runs=tuple(r.run_id for r in usable),
        rows_per_byte=rows_per_byte,
        rows_per_byte_spread=max((abs(x / rows_per_byte - 1) for x in per_byte), default=0.0) if per_byte else 0.0,
        startup_seconds=statistics.median(startups) if startups else None,
    )


def expected_rows(work: Work, rates: Rates) -> tuple[Span, bool]:
    """The predictions the step will make: exact when the work knows its rows, else its bytes x rows/byte."""
    if work.rows is not None:
        return Span(work.rows, work.rows, work.rows), True
    if rates.rows_per_byte is None:
        raise InvalidArgument(
            "the inputs' rows are not known before reading them, and no earlier run recorded rows per byte"
        )
    guess = work.bytes * rates.rows_per_byte
    spread = rates.rows_per_byte_spread + ROWS_GUESS_MARGIN
    return Span(guess * max(0.0, 1 - spread), guess, guess * (1 + spread)), False


def quote_step(step: str, work: Work, rates: Rates, price_per_hour: float) -> StepQuote:
    """The step's quote: instance-seconds from the fitted model, widened to its range, and priced."""
    if price_per_hour < 0 or work.instances < 1:
        raise InvalidArgument(f"a quote needs a price >= 0 and at least one instance, got {price_per_hour}, {work}")
    rows, known = expected_rows(work, rates)
    seconds = rates.per_instance * work.instances + rates.per_row * rows.expected
    low = (rates.per_instance * work.instances + rates.per_row * rows.low) * (1 - rates.below)
    high = (rates.per_instance * work.instances + rates.per_row * rows.high) * (1 + rates.above)
    instance_seconds = Span(max(0.0, low), seconds, high)
    wall = (rates.startup_seconds or 0.0) + rates.per_instance + rates.per_row * rows.expected / work.instances
    return StepQuote(
        step=step,
        work=work,
        rows=rows,
        rows_known=known,
        instance_seconds=instance_seconds,
        usd=instance_seconds.scaled(price_per_hour / 3600),
        price_per_hour=price_per_hour,
        wall_seconds=wall,
        rates=rates,
    )


@dataclasses.dataclass(frozen=True)
class Total:
    """Several steps' (or partitions') quotes added up: each range's ends summed, so the range stays a bound."""

    usd: Span
    instance_seconds: Span
    rows: Span

    @property
    def per_million(self) -> Span | None:
        return self.usd.scaled(1_000_000 / self.rows.expected) if self.rows.expected > 0 else None


def total_of(quotes: Sequence[StepQuote]) -> Total:
    usd, seconds, rows = ZERO, ZERO, ZERO
    for q in quotes:
        usd, seconds, rows = usd + q.usd, seconds + q.instance_seconds, rows + q.rows
    return Total(usd=usd, instance_seconds=seconds, rows=rows)
