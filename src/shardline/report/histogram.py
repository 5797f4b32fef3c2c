"""A mergeable histogram of predictions, kept while the worker writes them. Pure: numpy only.

The worker cannot know the reference run's bins in advance, and must not read its outputs a
second time, so what it keeps is a sketch that any bins can be read from later: DDSketch's
log-bucketed store (Masson, Rim and Lee, VLDB 2019). A value ``x != 0`` goes to bucket
``k = ceil(log_gamma |x|)`` of its sign, with ``gamma = (1 + a) / (1 - a)``, and is read back as
``2 gamma^k / (gamma + 1)``: within ``a`` (1% by default) of ``x``, relative. Values closer to 0
than about 1e-12 count in one zero bucket; NaN, +inf and -inf are counted exactly.

Integer outputs (class labels 0/1/2) are kept exactly: while every value seen is an integer and
there are at most :data:`EXACT_MAX_DISTINCT` distinct ones, the histogram holds value -> count
and the sketch is derived from it only when needed (a merge with a sketch, or a non-integer).

Sketches with the same relative accuracy merge exactly (bucket counts add), so each instance keeps
its own and the report merges them. :meth:`Histogram.to_dict` is compact JSON (runs of adjacent
buckets) for the ledger or a small S3 object.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from shardline.errors import InvalidArgument, PermanentError

FORMAT = "shardline.ddsketch/1"
DEFAULT_RELATIVE_ACCURACY = 0.01
# |x| below about this counts as 0: it bounds the number of buckets (~1,400 per sign per 12 decades at 1%).
ZERO_THRESHOLD = 1e-12
# Outputs with at most this many distinct integer values are kept exactly (class labels, counts).
EXACT_MAX_DISTINCT = 64
_EXACT_MAX_ABS = 2**31
# Below this |x|, float32 keeps log|x| within 4e-4 of a bucket's width: computing in float32 is ~3x faster.
_FLOAT32_SAFE_MAX = 1e37
_RUN_GAP = 4  # zeros inside a run cost 2 characters each; a longer gap starts a new run in to_dict


class HistogramFormatError(PermanentError, ValueError):
    """A stored histogram this version cannot read, or two histograms that cannot be merged."""


class Histogram:
    """A DDSketch-style histogram of numbers with relative accuracy ``relative_accuracy``.

    ``add(values)`` takes a numpy array (any shape, float or integer, NaN allowed) and costs a
    few milliseconds per million values; ``merge`` adds another histogram into this one;
    ``quantile(q)`` and ``buckets()`` read it; ``to_dict``/``from_dict`` store it as JSON.
    """

    def __init__(self, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY):
        if not 0 < relative_accuracy < 1:
            raise InvalidArgument(f"relative_accuracy must be between 0 and 1, got {relative_accuracy}")
        self.relative_accuracy = float(relative_accuracy)
        self._gamma = (1 + self.relative_accuracy) / (1 - self.relative_accuracy)
        self._inv_ln_gamma = 1.0 / math.log(self._gamma)
        # Keys <= this are the zero bucket; array index i holds key _k0 + i (index 0 stays empty).
        self._k0 = math.ceil(math.log(ZERO_THRESHOLD) * self._inv_ln_gamma)
        self._pos = np.zeros(0, dtype=np.int64)
        self._neg = np.zeros(0, dtype=np.int64)
        self._exact: dict[int, int] | None = {}
        self.count = 0  # every value added, NaN included
        self.nan_count = 0
        self.zero_count = 0
        self.pos_inf_count = 0
        self.neg_inf_count = 0
        self.min = math.inf  # of the non-NaN values
        self.max = -math.inf
        self.sum = 0.0  # of the finite values

    # -- adding --------------------------------------------------------------------------------

    def add(self, values: Any) -> Histogram:
        """Count every value of ``values`` (a numpy array or anything ``np.asarray`` takes). Returns self."""
        v = np.asarray(values)
        if v.dtype.kind == "b":
            v = v.astype(np.int8)
        if v.dtype.kind not in "iuf":
            raise TypeError(f"a histogram counts numbers, not {v.dtype}")
        v = v.ravel()
        if v.size == 0:
            return self
        self.count += int(v.size)
        if v.dtype.kind == "f":
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, or float32 overflowing: the slow path
                total = float(v.sum())  # numpy sums pairwise: float32 is precise enough for a mean, and faster
            if not math.isfinite(total):  # the slow path only when there is a NaN or an infinity (or float32 overflows)
                v = self._count_non_finite(v)
                if v.size == 0:
                    return self
                total = float(v.sum(dtype=np.float64))
        else:
            total = float(v.sum(dtype=np.float64))
        self.sum += total
        lo, hi = v.min(), v.max()
        self.min, self.max = min(self.min, float(lo)), max(self.max, float(hi))
        if self._exact is not None:
            if self._add_exact(v, lo, hi):
                return self
            self._to_sketch()
        self._add_sketch(v, float(lo), float(hi))
        return self

    def _count_non_finite(self, v: np.ndarray) -> np.ndarray:
        nan = np.isnan(v)
        self.nan_count += int(np.count_nonzero(nan))
        pos_inf, neg_inf = v == np.inf, v == -np.inf
        n_pos, n_neg = int(np.count_nonzero(pos_inf)), int(np.count_nonzero(neg_inf))
        self.pos_inf_count += n_pos
        self.neg_inf_count += n_neg
        if n_pos:
            self.max = math.inf
        if n_neg:
            self.min = -math.inf
        return v[~(nan | pos_inf | neg_inf)]

    def _add_exact(self, v: np.ndarray, lo, hi) -> bool:
        """Count ``v`` exactly if it is integers of a small variety; False (nothing counted) if not."""
        if not (lo >= -_EXACT_MAX_ABS and hi <= _EXACT_MAX_ABS):
            return False
        if v.dtype.kind == "f":
            head = v[:256]  # a continuous output fails here, at once
            if not (np.array_equal(head, np.rint(head)) and np.array_equal(v, np.rint(v))):
                return False
        ints = v.astype(np.intp, copy=False)
        lo_i, hi_i = int(lo), int(hi)
        if hi_i - lo_i <= 1 << 16:
            counts = np.bincount(ints - lo_i if lo_i else ints)
            values = np.flatnonzero(counts)
            counts = counts[values]
            values = values + lo_i
        else:
            values, counts = np.unique(ints, return_counts=True)
        exact = self._exact
        assert exact is not None
        for value, n in zip(values.tolist(), counts.tolist(), strict=True):
            exact[value] = exact.get(value, 0) + n
        if len(exact) > EXACT_MAX_DISTINCT:
            self._to_sketch()  # these values are counted already; the caller adds nothing more
        return True

    def _to_sketch(self) -> None:
        """Move the exact counts into the sketch's buckets; from here on the histogram is a sketch."""
        exact, self._exact = self._exact, None
        if exact:
            values = np.fromiter(exact.keys(), dtype=np.float64, count=len(exact))
            counts = np.fromiter(exact.values(), dtype=np.int64, count=len(exact))
            self._add_sketch(values, float(values.min()), float(values.max()), counts)

    def _add_sketch(self, v: np.ndarray, lo: float, hi: float, weights: np.ndarray | None = None) -> None:
        # In place on one float array, then one bincount: each pass allocating 8 MB for 1M values costs ~1 ms.
        if v.dtype == np.float32 or (max(abs(lo), abs(hi)) < _FLOAT32_SAFE_MAX and weights is None):
            logs = np.abs(v.astype(np.float32, copy=False))
        else:
            logs = np.abs(v.astype(np.float64, copy=False))
        with np.errstate(divide="ignore"):  # log(0) = -inf, which lands in the zero bucket below
            np.log(logs, out=logs)
        logs *= logs.dtype.type(self._inv_ln_gamma)
        logs -= self._k0  # ceil(x) - k0 == ceil(x - k0): index 0 is the zero bucket, i >= 1 is key _k0 + i
        np.ceil(logs, out=logs)
        np.maximum(logs, 0, out=logs)
        size = int(logs.max()) + 1
        if lo < 0:  # both signs in one bincount: a negative's index i goes to size - i, a positive's to size + i
            np.copysign(logs, v, out=logs)
            logs += size
            counts = np.bincount(logs.astype(np.intp), weights=weights, minlength=2 * size)
            pos, neg = counts[size:], counts[size::-1]
        else:
            pos, neg = np.bincount(logs.astype(np.intp), weights=weights, minlength=size), None
        pos = pos.astype(np.int64)
        self.zero_count += int(pos[0])
        pos[0] = 0
        self._pos = _add_arrays(self._pos, pos)
        if neg is not None:
            neg = neg.astype(np.int64)
            neg[0] = 0  # the shared zero bucket (-0.0 and tiny negatives too), counted above as pos[0]
            self._neg = _add_arrays(self._neg, neg)

    # -- merging -------------------------------------------------------------------------------

    def merge(self, other: Histogram) -> Histogram:
        """Add ``other``'s counts into this histogram (in place) and return self."""
        if other.relative_accuracy != self.relative_accuracy:
            raise HistogramFormatError(
                f"cannot merge histograms of relative accuracy {other.relative_accuracy} and "
                f"{self.relative_accuracy}: every instance of a step must keep the same accuracy"
            )
        if self._exact is not None and other._exact is not None:
            for value, n in other._exact.items():
                self._exact[value] = self._exact.get(value, 0) + n
            if len(self._exact) > EXACT_MAX_DISTINCT:
                self._to_sketch()
        else:
            self._to_sketch()
            pos, neg, zero = other._sketch_arrays()
            self._pos = _add_arrays(self._pos, pos)
            self._neg = _add_arrays(self._neg, neg)
            self.zero_count += zero + other.zero_count  # an exact histogram's zeros are among its values
        self.count += other.count
        self.nan_count += other.nan_count
        self.pos_inf_count += other.pos_inf_count
        self.neg_inf_count += other.neg_inf_count
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.sum += other.sum
        return self

    @classmethod
    def merged(cls, histograms: Iterable[Histogram], relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY) -> Histogram:
        """One histogram of every value the given ones counted (e.g. a step's instances')."""
        result = cls(relative_accuracy)
        for histogram in histograms:
            result.merge(histogram)
        return result

    def _sketch_arrays(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(pos, neg, zero-bucket count from exact values): the sketch, derived from exact counts if need be."""
        if self._exact is None:
            return self._pos, self._neg, 0
        derived = Histogram(self.relative_accuracy)
        derived._exact = dict(self._exact)
        derived._to_sketch()
        return derived._pos, derived._neg, derived.zero_count

    # -- reading -------------------------------------------------------------------------------

    @property
    def is_exact(self) -> bool:
        """Whether every value so far was an integer, of at most EXACT_MAX_DISTINCT kinds (kept exactly)."""
        return self._exact is not None

    @property
    def value_count(self) -> int:
        """How many values are not NaN (those that :meth:`buckets` and :meth:`quantile` see)."""
        return self.count - self.nan_count

    def buckets(self, *, exact: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(values, counts), ascending by value, NaN left out; ±inf appear as values ±inf.

        Each value is a bucket's representative, or with ``exact`` (the default whenever the
        histogram is exact) the integer itself. ``exact=False`` reads an exact histogram through
        the sketch, as if it were one: what comparing it with a sketch needs, so that the same
        number lands on the same value on both sides.
        """
        exact = self.is_exact if exact is None else exact
        if exact and not self.is_exact:
            raise InvalidArgument("this histogram is a sketch now: its exact values are gone")
        parts_v: list[np.ndarray] = []
        parts_c: list[np.ndarray] = []
        if self.neg_inf_count:
            parts_v.append(np.array([-np.inf]))
            parts_c.append(np.array([self.neg_inf_count]))
        if exact:
            assert self._exact is not None
            keys = sorted(self._exact)
            parts_v.append(np.array(keys, dtype=np.float64))
            parts_c.append(np.array([self._exact[k] for k in keys], dtype=np.int64))
        else:
            pos, neg, zero = self._sketch_arrays()
            zero += self.zero_count
            neg_index = np.flatnonzero(neg)[::-1]
            parts_v.append(-self._value_of(neg_index))
            parts_c.append(neg[neg_index])
            if zero:
                parts_v.append(np.array([0.0]))
                parts_c.append(np.array([zero]))
            pos_index = np.flatnonzero(pos)
            parts_v.append(self._value_of(pos_index))
            parts_c.append(pos[pos_index])
        if self.pos_inf_count:
            parts_v.append(np.array([np.inf]))
            parts_c.append(np.array([self.pos_inf_count]))
        if not parts_v:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        return np.concatenate(parts_v).astype(np.float64), np.concatenate(parts_c).astype(np.int64)

    def _value_of(self, index: np.ndarray) -> np.ndarray:
        keys = index.astype(np.float64) + self._k0
        return 2.0 * np.power(self._gamma, keys) / (self._gamma + 1.0)

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0 <= q <= 1) of the non-NaN values, within the relative accuracy; None if none."""
        if not 0 <= q <= 1:
            raise InvalidArgument(f"a quantile is between 0 and 1, got {q}")
        values, counts = self.buckets()
        if counts.size == 0:
            return None
        cumulative = np.cumsum(counts)
        rank = q * (int(cumulative[-1]) - 1)
        value = float(values[int(np.searchsorted(cumulative, rank, side="right"))])
        return min(max(value, self.min), self.max)  # the ends are known exactly

    @property
    def mean(self) -> float | None:
        """Mean of the finite values (exact, not sketched); None if there are none."""
        finite = self.value_count - self.pos_inf_count - self.neg_inf_count
        return self.sum / finite if finite else None

    # -- storing -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A compact JSON-ready dict: runs of adjacent buckets as ``[first_key, [counts...]]``."""
        data: dict[str, Any] = {
            "format": FORMAT,
            "relative_accuracy": self.relative_accuracy,
            "count": self.count,
            "nan": self.nan_count,
            "zero": self.zero_count,
            "pos_inf": self.pos_inf_count,
            "neg_inf": self.neg_inf_count,
            "min": self.min if math.isfinite(self.min) else None,
            "max": self.max if math.isfinite(self.max) else None,
            "sum": self.sum,
        }
        if self._exact is not None:
            data["exact"] = [[value, self._exact[value]] for value in sorted(self._exact)]
        else:
            data["pos"] = _runs(self._pos, self._k0)
            data["neg"] = _runs(self._neg, self._k0)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Histogram:
        """The histogram :meth:`to_dict` wrote. Raises HistogramFormatError for another format."""
        if data.get("format") != FORMAT:
            raise HistogramFormatError(f"not a {FORMAT} histogram: format {data.get('format')!r}")
        try:
            histogram = cls(float(data["relative_accuracy"]))
            histogram.count = int(data["count"])
            histogram.nan_count = int(data["nan"])
            histogram.zero_count = int(data["zero"])
            histogram.pos_inf_count = int(data["pos_inf"])
            histogram.neg_inf_count = int(data["neg_inf"])
            histogram.sum = float(data["sum"])
            if "exact" in data:
                histogram._exact = {int(value): int(n) for value, n in data["exact"]}
            else:
                histogram._exact = None
                histogram._pos = _from_runs(data["pos"], histogram._k0)
                histogram._neg = _from_runs(data["neg"], histogram._k0)
        except (KeyError, TypeError, ValueError) as err:
            raise HistogramFormatError(f"a malformed {FORMAT} histogram: {err!r}") from err
        histogram.min = -math.inf if histogram.neg_inf_count else _or(data.get("min"), math.inf)
        histogram.max = math.inf if histogram.pos_inf_count else _or(data.get("max"), -math.inf)
        return histogram

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Histogram) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        kind = "exact" if self.is_exact else f"sketch ±{self.relative_accuracy:g}"
        return f"Histogram({kind}, count={self.count}, nan={self.nan_count}, min={self.min:g}, max={self.max:g})"


def _or(value: Any, default: float) -> float:
    return default if value is None else float(value)


def _add_arrays(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if b.size > a.size:
        a, b = b, a
    out = a.copy()
    out[: b.size] += b
    return out


def _runs(counts: np.ndarray, k0: int) -> list[list[Any]]:
    """Non-zero stretches of ``counts`` as [first key, counts]; short gaps of zeros stay inside a run."""
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(nonzero) > _RUN_GAP)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [nonzero.size - 1]])
    return [
        [int(nonzero[s]) + k0, counts[nonzero[s] : nonzero[e] + 1].tolist()]
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
    ]


def _from_runs(runs: list[list[Any]], k0: int) -> np.ndarray:
    if not runs:
        return np.zeros(0, dtype=np.int64)
    size = max(int(key) - k0 + len(counts) for key, counts in runs)
    out = np.zeros(size, dtype=np.int64)
    for key, counts in runs:
        index = int(key) - k0
        if index < 1:
            raise InvalidArgument(f"bucket key {key} is inside the zero bucket")
        out[index : index + len(counts)] += np.asarray(counts, dtype=np.int64)
    return out
