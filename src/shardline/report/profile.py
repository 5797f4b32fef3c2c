"""What a step's output checks read: a small, mergeable profile of each column, kept while the worker writes.

The worker keeps a :class:`Profile` per file, batch by batch, from the columns it already holds (no second read
of inputs or outputs), and writes it in its manifest beside the file's report; the step's end merges every file's
(:meth:`Profile.merge`) and the checks (:mod:`shardline.report.checks`) read the merged one. Pure: numpy only.

A :class:`ColumnProfile` counts rows and nulls, and then either numbers (a :class:`~.histogram.Histogram`: NaN,
min, max, sum, a sketch any bins and quantiles are read from) or labels (value -> count, exactly, up to
:data:`MAX_LABELS` distinct; past that it counts only the rows and that there were more).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from shardline.report.histogram import Histogram, HistogramFormatError

FORMAT = "shardline.profile/1"
MAX_LABELS = 64  # distinct labels kept exactly; a string output past it is free text, not classes


class ColumnProfile:
    """One column over the rows seen: ``rows``, ``nulls``, and its ``histogram`` (numbers) or ``labels``."""

    def __init__(self, kind: str):
        if kind not in ("numbers", "labels"):
            raise HistogramFormatError(f"a column profile holds numbers or labels, not {kind!r}")
        self.kind = kind
        self.rows = 0
        self.nulls = 0
        self.histogram: Histogram | None = Histogram() if kind == "numbers" else None
        self.labels: dict[str, int] | None = {} if kind == "labels" else None  # None: more than MAX_LABELS

    # -- adding --------------------------------------------------------------------------------

    def add_numbers(self, values: np.ndarray, nulls: int) -> None:
        """Count ``values`` (nulls already NaN in them: ``nulls`` says how many of the NaNs were nulls)."""
        self.rows += int(values.size)
        self.nulls += int(nulls)
        self.histogram.add(values)

    def add_labels(self, counts: Mapping[str, int], nulls: int, rows: int) -> None:
        """Count ``rows`` labels, of which ``nulls`` null and the rest ``counts`` (label -> how many)."""
        self.rows += int(rows)
        self.nulls += int(nulls)
        self._add_label_counts(counts)

    def _add_label_counts(self, counts: Mapping[str, int]) -> None:
        if self.labels is None:
            return
        for label, n in counts.items():
            self.labels[label] = self.labels.get(label, 0) + int(n)
        if len(self.labels) > MAX_LABELS:
            self.labels = None

    def merge(self, other: ColumnProfile) -> ColumnProfile:
        """Add ``other``'s counts into this profile (in place) and return self."""
        if other.kind != self.kind:
            raise HistogramFormatError(f"cannot merge a column of {other.kind} into one of {self.kind}")
        self.rows += other.rows
        self.nulls += other.nulls
        if self.histogram is not None:
            self.histogram.merge(other.histogram)
        elif other.labels is None:
            self.labels = None
        else:
            self._add_label_counts(other.labels)
        return self

    # -- reading -------------------------------------------------------------------------------

    @property
    def nans(self) -> int:
        """NaN values that were not nulls (numbers only)."""
        return self.histogram.nan_count - self.nulls if self.histogram is not None else 0

    def share(self, count: int) -> float | None:
        return count / self.rows if self.rows else None

    @property
    def distinct_at_least(self) -> int:
        """How many distinct values the column holds, at least: exact for labels and for a few integers; for a
        sketch, its non-empty buckets (values within 1% of each other share one, so this is a lower bound)."""
        if self.labels is not None:
            return len(self.labels)
        if self.histogram is None:  # labels past MAX_LABELS
            return MAX_LABELS + 1
        values, _ = self.histogram.buckets()
        return int(values.size)

    def class_shares(self) -> dict[str, float] | None:
        """Each value's share of the non-null rows, when the column is classes (labels, or a few integers kept
        exactly); None when it is not."""
        if self.labels is not None:
            counts = dict(self.labels)
        elif self.histogram is not None and self.histogram.is_exact:
            values, n = self.histogram.buckets()
            counts = {_label(v): int(c) for v, c in zip(values.tolist(), n.tolist(), strict=True)}
        else:
            return None
        total = sum(counts.values())
        return {label: n / total for label, n in sorted(counts.items())} if total else {}

    def metrics(self) -> dict[str, Any]:
        """The column as OpenLineage's data quality metrics name it (``ColumnMetrics``): count, nulls, and for numbers
        sum, min, max and quantiles (within the sketch's 1%); distinct values only where they are counted exactly."""
        found: dict[str, Any] = {"count": self.rows, "nullCount": self.nulls}
        exact = self.labels is not None or (self.histogram is not None and self.histogram.is_exact)
        if exact:
            found["distinctCount"] = self.distinct_at_least
        histogram = self.histogram
        if histogram is not None and histogram.value_count:
            found |= {"sum": histogram.sum, "min": _finite(histogram.min), "max": _finite(histogram.max)}
            found["quantiles"] = {str(q): _finite(histogram.quantile(q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)}
        return found

    # -- storing -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "rows": self.rows, "nulls": self.nulls}
        if self.histogram is not None:
            data["histogram"] = self.histogram.to_dict()
        else:
            data["labels"] = self.labels  # None: more than MAX_LABELS
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ColumnProfile:
        try:
            profile = cls(str(data["kind"]))
            profile.rows, profile.nulls = int(data["rows"]), int(data["nulls"])
            if profile.kind == "numbers":
                profile.histogram = Histogram.from_dict(data["histogram"])
            else:
                labels = data["labels"]
                profile.labels = None if labels is None else {str(k): int(v) for k, v in labels.items()}
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            if isinstance(err, HistogramFormatError):
                raise
            raise HistogramFormatError(f"a malformed column profile: {err!r}") from err
        return profile


class Profile:
    """The columns of a file's (or a step's) outputs, and of the inputs its checks name: ``outputs`` and
    ``inputs``, each name -> :class:`ColumnProfile`, and ``files``: how many files were merged into it."""

    def __init__(self) -> None:
        self.outputs: dict[str, ColumnProfile] = {}
        self.inputs: dict[str, ColumnProfile] = {}
        self.files = 0

    def column(self, side: str, name: str, kind: str) -> ColumnProfile:
        """The ``side``'s column ``name``, made of ``kind`` if new. One that holds the other kind is refused."""
        columns = self.columns_of(side)
        found = columns.get(name)
        if found is None:
            found = columns[name] = ColumnProfile(kind)
        elif found.kind != kind:
            raise HistogramFormatError(f"column {name!r} holds {found.kind} in one batch and {kind} in another")
        return found

    def add_column(self, side: str, name: str, column: Any, numbers: Callable[[Any], np.ndarray] | None = None) -> None:
        """Count one Arrow array of column ``name`` (``side``: "outputs" or "inputs"): numbers (integers, floats,
        booleans, decimals) into its histogram, anything else as labels; an array of nulls only (Arrow's null type)
        as missing values of the kind the column has. ``numbers``: how the array becomes numpy values, nulls as NaN
        (the worker passes its own, which skips Arrow's pandas conversion)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        types = pa.types
        if types.is_null(column.type):
            known = self.columns_of(side).get(name)
            if known is None or known.kind == "numbers":
                self.column(side, name, "numbers").add_numbers(np.full(len(column), np.nan), len(column))
            else:
                known.add_labels({}, len(column), len(column))
            return
        if any(test(column.type) for test in (types.is_integer, types.is_floating, types.is_boolean, types.is_decimal)):
            values = numbers(column) if numbers is not None else _numbers(column)
            self.column(side, name, "numbers").add_numbers(values, column.null_count)
            return
        target = self.column(side, name, "labels")
        if target.labels is None:  # past MAX_LABELS: only rows and nulls are counted
            target.add_labels({}, column.null_count, len(column))
            return
        counts = pc.value_counts(column.drop_null() if column.null_count else column)
        labels = zip(counts.field(0).to_pylist(), counts.field(1).to_pylist(), strict=True)
        target.add_labels({str(v): int(n) for v, n in labels}, column.null_count, len(column))

    def columns_of(self, side: str) -> dict[str, ColumnProfile]:
        return self.outputs if side == "outputs" else self.inputs

    def merge(self, other: Profile) -> Profile:
        """Add ``other`` into this profile (in place) and return self. A column counted as numbers in one file and
        labels in another cannot be merged: HistogramFormatError names it."""
        for side in ("outputs", "inputs"):
            mine, theirs = getattr(self, side), getattr(other, side)
            for name, column in theirs.items():
                if name not in mine:
                    mine[name] = ColumnProfile.from_dict(column.to_dict())
                    continue
                try:
                    mine[name].merge(column)
                except HistogramFormatError as err:
                    raise HistogramFormatError(f"column {name!r}: {err}") from err
        self.files += other.files
        return self

    @classmethod
    def merged(cls, profiles: Iterable[Profile]) -> Profile:
        result = cls()
        for profile in profiles:
            result.merge(profile)
        return result

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "files": self.files,
            "outputs": {name: column.to_dict() for name, column in self.outputs.items()},
            "inputs": {name: column.to_dict() for name, column in self.inputs.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """The profile :meth:`to_dict` wrote. Raises HistogramFormatError for another format or a malformed one."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise HistogramFormatError(f"not a {FORMAT} profile: format {found!r}")
        profile = cls()
        profile.files = int(data.get("files") or 0)
        for side in ("outputs", "inputs"):
            columns = data.get(side) or {}
            if not isinstance(columns, Mapping):
                raise HistogramFormatError(f"a malformed {FORMAT} profile: {side} is not a mapping")
            for name, column in columns.items():
                getattr(profile, side)[str(name)] = ColumnProfile.from_dict(column)
        return profile


def _label(value: float) -> str:
    """An exact integer value as the label a class share names (1.0 -> "1")."""
    return str(int(value)) if np.isfinite(value) and float(value).is_integer() else str(value)


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def _numbers(column: Any) -> np.ndarray:
    """An Arrow array of numbers as float64 numpy values, nulls as NaN."""
    import pyarrow as pa

    return column.cast(pa.float64()).to_numpy(zero_copy_only=False)
