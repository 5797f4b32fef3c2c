"""A step's output checks, as the spec declares them (re-exported by :mod:`shardline.spec`).

Every check is computed from what the workers recorded while they scored (no second read), at the step's end,
before ``_SUCCESS``. A ``blocking`` check (the default) that fails holds the marker back and fails the run, naming
the check, its value and its bound; a ``warn`` check is a line in the log and the run report. docs/checks.md
says what each costs and what the on-call engineer does next.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from shardline.spec.base import _Strict

Level = Literal["blocking", "warn"]
Share = Annotated[float, Field(ge=0.0, le=1.0)]
EVERY_OUTPUT = "*"  # a columns key: every output column the model writes (not the passthrough ones)


class RowsOutCheck(_Strict):
    """How many rows the step writes, all files together."""

    at_least: Annotated[int, Field(ge=0)] | None = None
    """fewer rows out than this fails the check"""
    within: Annotated[float, Field(gt=0)] | None = None
    """a fraction: rows out must be within this share of the median of the last ``checks.last`` successful
    partitions (0.5: between half and one and a half times it); no earlier partition: not checked yet"""
    level: Level = "blocking"
    """blocking: holds back _SUCCESS and fails the run; warn: a line in the log and the report"""


class ColumnCheck(_Strict):
    """One output column's values (``columns: {NAME: ...}``, or ``"*"`` for every output column)."""

    min: float | None = None
    """a value below this fails the check"""
    max: float | None = None
    """a value above this fails the check"""
    max_null_share: Share | None = None
    """the largest share of null values (0: none may be null)"""
    max_nan_share: Share | None = None
    """the largest share of NaN values (numbers only)"""
    min_distinct: Annotated[int, Field(ge=1)] | None = None
    """at least this many distinct values (2: a constant output fails)"""
    mean_within: Annotated[float, Field(gt=0)] | None = None
    """a fraction: the mean must be within this share of the reference mean (the median of the last
    ``checks.last`` partitions' means; 0.1: within 10%)"""
    max_psi: Annotated[float, Field(gt=0)] | None = None
    """the population stability index of the column against the reference (``checks.reference``), above which
    the check fails (0.2 is the usual limit)"""
    class_share_within: Share | None = None
    """each class's share of the column's values (nulls and NaN left out) must be within this many points of the
    reference's (0.1: 30% may move to between 20% and 40%); for labels and integer classes only"""
    level: Level = "blocking"
    """blocking: holds back _SUCCESS and fails the run; warn: a line in the log and the report"""

    @model_validator(mode="after")
    def _range_in_order(self) -> ColumnCheck:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class FeatureCheck(_Strict):
    """One input feature's values, counted as the worker reads them (upstream zeros show before anyone blames the
    model)."""

    max_null_share: Share | None = None
    """the largest share of null (or NaN) values"""
    max_psi: Annotated[float, Field(gt=0)] | None = None
    """the population stability index of the feature against the reference (``checks.reference``), above which
    the check fails (0.2 is the usual limit)"""
    level: Level = "blocking"
    """blocking: holds back _SUCCESS and fails the run; warn: a line in the log and the report"""


class ChecksSpec(_Strict):
    """The checks a step's outputs must pass before its ``_SUCCESS`` is written."""

    last: Annotated[int, Field(ge=1, le=30)] = 7
    """how many earlier successful partitions the bands (rows_out.within, mean_within, class_share_within) and
    `shardline checks` compare with"""
    reference: Literal["previous", "baseline"] = "previous"
    """what the PSI checks (columns' and features' max_psi) compare with: the last successful partition, or the
    baseline made once from a file (`shardline checks baseline PIPELINE --step S --from s3://...`)"""
    rows_out: RowsOutCheck | None = None
    """the number of rows written"""
    columns: dict[str, ColumnCheck] = {}
    """output column name (or ``"*"``: each output column) -> its checks"""
    features: dict[str, FeatureCheck] = {}
    """input feature name -> its checks"""

    @property
    def blocking(self) -> bool:
        """Whether any check here may hold back ``_SUCCESS``."""
        checks = [self.rows_out, *self.columns.values(), *self.features.values()]
        return any(check is not None and check.level == "blocking" for check in checks)
