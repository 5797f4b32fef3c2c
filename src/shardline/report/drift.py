"""Population stability index: how far a step's predictions moved from the reference run's. Pure.

    PSI = sum over bins of (current_i - reference_i) * ln(current_i / reference_i)

over fractions of each run's values per bin, the bins fixed by the reference. By the usual
reading, below 0.1 is no real change, 0.1 to 0.25 a moderate shift, above 0.25 a large one; a
pipeline picks its own limit (:data:`DEFAULT_MAX_PSI`).

Empty bins: ln(0) has no value, so a fraction of 0 on either side counts as ``epsilon``
(:data:`DEFAULT_EPSILON`, 1e-4) before the sum. A bin that is empty on both sides adds 0; a bin
empty in the reference that holds 10% of the current run adds (0.1 - 1e-4) * ln(0.1 / 1e-4),
about 0.69, which is drift by any reading. The other fractions are left as they are (not
renormalised), as most PSI implementations do.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from shardline.errors import InvalidArgument
from shardline.report.histogram import Histogram

DEFAULT_EPSILON = 1e-4
DEFAULT_BINS = 10
DEFAULT_MAX_PSI = 0.2  # the spec's drift.max_psi default, when it comes
MODERATE_PSI = 0.1  # below: no real change, by the usual reading
_SUM_TOLERANCE = 1e-6


def psi(
    reference_fractions: Sequence[float] | np.ndarray,
    current_fractions: Sequence[float] | np.ndarray,
    epsilon: float = DEFAULT_EPSILON,
) -> float:
    """The PSI of two runs' fractions over the same bins; each side sums to 1.

    A fraction of 0 counts as ``epsilon`` (see the module's docstring). Raises ValueError when
    the two have different lengths, a fraction is negative, or a side does not sum to 1.
    """
    if not epsilon > 0:
        raise InvalidArgument(f"epsilon must be > 0, got {epsilon}")
    ref = np.asarray(reference_fractions, dtype=np.float64)
    cur = np.asarray(current_fractions, dtype=np.float64)
    if ref.ndim != 1 or ref.shape != cur.shape or ref.size == 0:
        raise InvalidArgument(f"psi needs two equal, non-empty lists of fractions, got {ref.shape} and {cur.shape}")
    for name, side in (("reference", ref), ("current", cur)):
        if (side < 0).any() or not np.isfinite(side).all():
            raise InvalidArgument(f"the {name} fractions must be finite and >= 0: {side.tolist()}")
        if abs(side.sum() - 1.0) > _SUM_TOLERANCE:
            raise InvalidArgument(f"the {name} fractions must sum to 1, they sum to {side.sum()!r}")
    ref = np.where(ref == 0, epsilon, ref)
    cur = np.where(cur == 0, epsilon, cur)
    return float(np.sum((cur - ref) * np.log(cur / ref)))


@dataclasses.dataclass(frozen=True)
class Drift:
    """PSI of a current histogram against a reference, with the bins it was computed over.

    ``kind`` is ``"quantile"`` (bins between the reference's quantiles: ``edges`` are the cut
    points, bin i is ``(edges[i-1], edges[i]]``, the ends open) or ``"discrete"`` (the reference
    has at most ``bins`` distinct values: one bin per value, ``edges`` are those values, plus a
    last bin ``other`` for anything else). A ``NaN`` bin is added when either side has NaNs.
    """

    psi: float
    kind: Literal["quantile", "discrete"]
    edges: tuple[float, ...]
    labels: tuple[str, ...]
    reference_fractions: tuple[float, ...]
    current_fractions: tuple[float, ...]
    epsilon: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"edges": [_json_float(e) for e in self.edges]}


def psi_between(
    reference: Histogram, current: Histogram, bins: int = DEFAULT_BINS, epsilon: float = DEFAULT_EPSILON
) -> Drift:
    """The PSI of ``current`` over bins fixed by ``reference``: its quantiles at 1/bins, 2/bins, ...

    Quantiles that coincide (a discrete output, or a mass at one value) are merged, so there
    may be fewer bins than asked. A reference with at most ``bins`` distinct values (class
    labels, a small tree's leaf values) gets one bin per value and an ``other`` bin, so a label
    the reference never had shows as drift rather than hiding in a neighbour's bin.

    Both histograms are read at the same resolution: exactly when both are exact, else both
    through the sketch (within its relative accuracy). Raises ValueError when either is empty.
    """
    if bins < 1:
        raise InvalidArgument(f"bins must be >= 1, got {bins}")
    for name, histogram in (("reference", reference), ("current", current)):
        if histogram.count == 0:
            raise InvalidArgument(f"the {name} histogram is empty: there is nothing to compare")
    exact = reference.is_exact and current.is_exact
    ref_values, ref_counts = reference.buckets(exact=exact)
    cur_values, cur_counts = current.buckets(exact=exact)
    if 0 < ref_values.size <= bins:
        kind: Literal["quantile", "discrete"] = "discrete"
        edges = ref_values
        ref_binned = np.append(ref_counts, 0)
        cur_binned = _discrete(cur_values, cur_counts, edges)
        labels = [f"= {_fmt(e)}" for e in edges] + ["other"]
    else:
        kind = "quantile"
        edges = _quantile_edges(ref_values, ref_counts, bins)
        ref_binned = _binned(ref_values, ref_counts, edges)
        cur_binned = _binned(cur_values, cur_counts, edges)
        labels = _interval_labels(edges)
    if reference.nan_count or current.nan_count:
        ref_binned = np.append(ref_binned, reference.nan_count)
        cur_binned = np.append(cur_binned, current.nan_count)
        labels.append("NaN")
    ref_fractions = ref_binned / reference.count
    cur_fractions = cur_binned / current.count
    return Drift(
        psi=psi(ref_fractions, cur_fractions, epsilon),
        kind=kind,
        edges=tuple(float(e) for e in edges),
        labels=tuple(labels),
        reference_fractions=tuple(ref_fractions.tolist()),
        current_fractions=tuple(cur_fractions.tolist()),
        epsilon=epsilon,
    )


def verdict(psi_value: float | None, max_psi: float = DEFAULT_MAX_PSI) -> str:
    """``"n/a"`` (nothing to compare), ``"stable"`` (< 0.1), ``"moderate"`` (< max_psi) or ``"drift"``."""
    if psi_value is None:
        return "n/a"
    if psi_value >= max_psi:
        return "drift"
    return "stable" if psi_value < min(MODERATE_PSI, max_psi) else "moderate"


def _quantile_edges(values: np.ndarray, counts: np.ndarray, bins: int) -> np.ndarray:
    """The reference's values at ranks 1/bins .. (bins-1)/bins, without repeats."""
    if values.size == 0:  # only NaNs: one bin for every number
        return np.zeros(0)
    cumulative = np.cumsum(counts)
    ranks = np.arange(1, bins) / bins * (cumulative[-1] - 1)
    return np.unique(values[np.searchsorted(cumulative, ranks, side="right")])


def _binned(values: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts per bin (-inf, e0], (e0, e1], ..., (e_last, inf)."""
    index = np.searchsorted(edges, values, side="left")
    return np.bincount(index, weights=counts, minlength=edges.size + 1).astype(np.int64)


def _discrete(values: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts per reference value, and last those of any other value."""
    index = np.minimum(np.searchsorted(edges, values), edges.size - 1)
    known = edges[index] == values
    index = np.where(known, index, edges.size)
    return np.bincount(index, weights=counts, minlength=edges.size + 1).astype(np.int64)


def _interval_labels(edges: np.ndarray) -> list[str]:
    if edges.size == 0:
        return ["all"]
    labels = [f"≤ {_fmt(edges[0])}"]
    labels += [f"({_fmt(a)}, {_fmt(b)}]" for a, b in itertools.pairwise(edges.tolist())]
    return [*labels, f"> {_fmt(edges[-1])}"]


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
