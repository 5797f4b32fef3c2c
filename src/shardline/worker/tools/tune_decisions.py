"""Auto-tune's decisions, pure: what to try, when to stop, what to recommend (``worker/tools/tune.py`` runs them).

The splits of the cores into workers x threads, the ladder of rows per batch and the rule that stops
it ("increase the batch size until throughput decreases", beyond the noise), the best setting and
those as good as far as the runs can tell, and the spec snippet with what it cannot say.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

FIRST_BATCH_ROWS = 4096
TOLERANCE = 0.03  # a fall smaller than this is noise: the doubling goes on


@dataclasses.dataclass(frozen=True)
class Setting:
    workers: int
    threads: int
    batch_rows: int
    gpu_batch_rows: int

    @property
    def split(self) -> str:
        return f"{self.workers}x{self.threads}"


@dataclasses.dataclass
class Point:
    """One setting and the rows/s of each of its runs."""

    phase: str  # split | batch | gpu batch
    setting: Setting
    rates: list[float] = dataclasses.field(default_factory=list)
    rows: int = 0  # rows of one run
    startup_s: list[float] = dataclasses.field(default_factory=list)  # pool start-up of each run (excluded)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """(max - min) / median of the runs: 0 with one run."""
        return spread(self.rates)

    def to_dict(self) -> dict:
        return {
            "phase": self.phase,
            **dataclasses.asdict(self.setting),
            "rows_per_run": self.rows,
            "rows_per_s": [round(r, 1) for r in self.rates],
            "median_rows_per_s": round(self.median, 1),
            "spread": round(self.spread, 4),
            "startup_s": [round(s, 3) for s in self.startup_s],
        }


def spread(rates: list[float]) -> float:
    middle = statistics.median(rates)
    return (max(rates) - min(rates)) / middle if middle > 0 else 0.0


def core_splits(cores: int) -> list[tuple[int, int]]:
    """Every (workers, threads) with workers x threads == cores, most workers first."""
    return [(w, cores // w) for w in range(cores, 0, -1) if cores % w == 0]


def batch_ladder(first: int, cap: int) -> list[int]:
    """Rows per batch to try: ``first`` doubled while it stays within ``cap``, then ``cap`` itself (the largest
    file's rows, when that is the cap: a batch of a whole file)."""
    if cap < first:
        return [cap]
    ladder = [first]
    while ladder[-1] * 2 <= cap:
        ladder.append(ladder[-1] * 2)
    return ladder if ladder[-1] == cap else [*ladder, cap]


def fell(previous: list[float], current: list[float], tolerance: float = TOLERANCE) -> bool:
    """Throughput decreased beyond the noise: the median fell by more than ``tolerance`` and the runs' ranges do
    not overlap (every run of ``current`` is slower than every run of ``previous``)."""
    return statistics.median(current) < statistics.median(previous) * (1 - tolerance) and max(current) < min(previous)


def doubling_sweep(
    measure: Callable[[int], list[float]], first: int, cap: int, tolerance: float = TOLERANCE
) -> tuple[list[tuple[int, list[float]]], str]:
    """Measure rows per batch from ``first``, doubling, until throughput falls beyond the noise against the
    previous size (that point is measured, and kept) or the cap is reached. ``measure`` returns the rows/s
    of each run of one size.

    Returns the (batch rows, rows/s of each run) measured, and why the sweep stopped.
    """
    points: list[tuple[int, list[float]]] = []
    for rows in batch_ladder(first, cap):
        points.append((rows, measure(rows)))
        if len(points) >= 2 and fell(points[-2][1], points[-1][1], tolerance):
            (before, was), (_, now) = points[-2], points[-1]
            change = statistics.median(now) / statistics.median(was) - 1
            return points, (
                f"stopped at {rows:,}: {change:+.1%} against {before:,}, a fall beyond the noise "
                f"(more than {tolerance:.0%}, and every run slower)"
            )
    return points, f"reached the cap of {cap:,} rows without a fall beyond the noise"


def best_point(points: list[Point]) -> Point:
    """The highest median rows/s (the first of equals)."""
    return max(points, key=lambda p: p.median)


def within_noise(points: list[Point], best: Point, tolerance: float = TOLERANCE) -> list[Point]:
    """The other points as good as the best, as far as the runs can tell: within ``tolerance`` of its median, or
    with a run as fast as its slowest."""
    return [
        p
        for p in points
        if p is not best and (p.median >= best.median * (1 - tolerance) or max(p.rates) >= min(best.rates))
    ]


def spec_snippet(step: str, *, workers: int, batch_rows: int, cores: int) -> str:
    """The spec lines to paste (YAML: ``steps[].batch_rows`` and ``steps[].resources.workers_per_instance``)."""
    threads = max(1, cores // workers)
    return (
        f"steps:\n"
        f"  - name: {step}\n"
        f"    batch_rows: {batch_rows}\n"
        f"    resources:\n"
        f"      workers_per_instance: {workers}  # threads per worker = cores // workers = {cores} // {workers} "
        f"= {threads} here\n"
    )


def snippet_notes(*, workers: int, threads: int, cores: int, gpu_batch_rows: int | None) -> list[str]:
    """What the snippet cannot say, and what does not transfer."""
    notes = [
        f"the spec has no threads field: each worker gets cores // workers_per_instance threads ({cores} // "
        f"{workers} = {threads} on this machine); the worker's --threads-per-worker flag would set it apart",
        "workers_per_instance is a count, not a share of the cores: on an instance type with other cores the "
        "split changes (2 workers on 8 vCPUs get 4 threads each). Tune on the instance type the step runs on: "
        "figures from a laptop do not transfer to an ml.* instance",
    ]
    if gpu_batch_rows is not None:
        notes.insert(
            0,
            f"GPU batch rows {gpu_batch_rows:,}: the spec has no field for it; the pipeline's worker "
            "runs with its default --gpu-batch-rows (262,144), and --gpu-batch-rows is the flag that "
            "sets it",
        )
    return notes
