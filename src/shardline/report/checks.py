"""A step's output checks, evaluated: each check of the spec's ``checks`` (and the drift policy's PSI) against the
profile the step's workers recorded while they scored, and the profiles of the last successful partitions. Pure.

A check that cannot be computed (the profile is missing, a column the step did not write) fails: a blocking check
never passes on absence. A band check with no earlier partition to compare with is ``n/a`` and says so.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from shardline.ledger.states import HELD_BACK
from shardline.report.drift import psi_between
from shardline.report.model import CheckResult
from shardline.report.profile import ColumnProfile, Profile
from shardline.spec.checks import EVERY_OUTPUT, ChecksSpec, ColumnCheck, FeatureCheck, Level

DRIVING_FILES = 3  # files a failed check names, those that drive it most
Verdict = Literal["pass", "fail", "n/a"]


class Partition:
    """What a check reads of one partition's step: its rows out and merged profile (None: none was recorded)."""

    def __init__(self, run_id: str, rows_out: int | None, profile: Profile | None):
        self.run_id, self.rows_out, self.profile = run_id, rows_out, profile


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The reference made once from a file (``checks.reference: baseline``): its profile, or why there is none, and
    what it is called in a bound."""

    profile: Profile | None
    said: str  # "the baseline made from s3://... at ...", or why there is none


def evaluate(
    checks: ChecksSpec,
    current: Partition,
    history: Sequence[Partition] = (),
    files: Mapping[str, Profile] | None = None,
    missing: str | None = None,
    baseline: Baseline | None = None,
) -> list[CheckResult]:
    """Every check's result for ``current`` against ``history`` (the last successful partitions, newest first;
    only the first ``checks.last`` are read). ``files``: each input file's own profile, to name the files that
    drive a failed check. ``missing``: why the profile is not whole (a manifest not found): every column check
    fails with it. ``baseline``: the PSI checks' reference with ``checks.reference: baseline``."""
    history = list(history)[: checks.last]
    reference = _Reference(checks.reference, history, baseline)
    results: list[CheckResult] = []
    if checks.rows_out is not None:
        results += _rows_out(checks, current, history)
    profile = current.profile
    for key, column_check in checks.columns.items():
        if profile is None or missing:
            results += _uncomputable(f"checks.columns.{key}", column_check, missing or "no profile was recorded")
            continue
        names = list(profile.outputs) if key == EVERY_OUTPUT else [key]
        if not names:
            results.append(_missing_column(f"checks.columns.{key}", column_check, "the step wrote no output column"))
        for name in names:
            column = profile.outputs.get(name)
            where = f"checks.columns.{key}" + (f" ({name})" if key == EVERY_OUTPUT else "")
            if column is None:
                found = ", ".join(profile.outputs) or "none"
                results.append(
                    _missing_column(where, column_check, f"the step wrote no column {name!r} (its columns: {found})")
                )
                continue
            per_file = {k: p.outputs[name] for k, p in (files or {}).items() if name in p.outputs}
            past = [(p.run_id, p.profile.outputs.get(name)) for p in history if p.profile is not None]
            results += _column(where, column_check, column, per_file, [(r, c) for r, c in past if c is not None])
            if column_check.max_psi is not None:
                results.append(_psi(f"{where}.max_psi", column_check, column, reference.of("outputs", name)))
    for name, feature_check in checks.features.items():
        where = f"checks.features.{name}"
        if profile is None or missing:
            results += _uncomputable(where, feature_check, missing or "no profile was recorded")
            continue
        column = profile.inputs.get(name)
        if column is None:
            results.append(
                _missing_column(
                    where,
                    feature_check,
                    f"the workers read no feature {name!r}: name one of the model's features "
                    f"(read: {', '.join(profile.inputs) or 'none'})",
                )
            )
            continue
        per_file = {k: p.inputs[name] for k, p in (files or {}).items() if name in p.inputs}
        results += _feature(where, feature_check, column, per_file)
        if feature_check.max_psi is not None:
            results.append(_psi(f"{where}.max_psi", feature_check, column, reference.of("inputs", name)))
    return results


def blocked_by(results: Sequence[CheckResult]) -> list[CheckResult]:
    """The blocking checks that failed: any holds back ``_SUCCESS``."""
    return [r for r in results if r.level == "blocking" and r.verdict == "fail"]


def blocked_message(results: Sequence[CheckResult]) -> str | None:
    """``checks: blocked by <check>: <value> against <bound>`` for the first blocking failure (and how many more),
    or None when nothing blocks."""
    blocking = blocked_by(results)
    if not blocking:
        return None
    first = blocking[0]
    more = f" (and {len(blocking) - 1} more blocking check(s))" if len(blocking) > 1 else ""
    return f"{HELD_BACK} {first.line()}{more}"


# -- rows out ----------------------------------------------------------------------------------------------------


def _rows_out(checks: ChecksSpec, current: Partition, history: list[Partition]) -> list[CheckResult]:
    spec, rows = checks.rows_out, current.rows_out
    results = []
    if spec.at_least is not None:
        results.append(
            _result("checks.rows_out.at_least", spec.level, rows, f"at least {spec.at_least:,}", rows >= spec.at_least)
        )
    if spec.within is not None:
        past = [p.rows_out for p in history if p.rows_out is not None]
        name = "checks.rows_out.within"
        if not past:
            results.append(_not_yet(name, spec.level, rows))
        else:
            median = statistics.median(past)
            low, high = median * (1 - spec.within), median * (1 + spec.within)
            bound = f"{_num(low)} to {_num(high)} (the median {_num(median)} of {len(past)} earlier partition(s))"
            results.append(_result(name, spec.level, rows, bound, low <= rows <= high, history=past))
    return results


# -- one output column -------------------------------------------------------------------------------------------


def _column(
    where: str,
    check: ColumnCheck,
    column: ColumnProfile,
    per_file: Mapping[str, ColumnProfile],
    past: list[tuple[str, ColumnProfile]],
) -> list[CheckResult]:
    level = check.level
    results: list[CheckResult] = []
    histogram = column.histogram
    if check.min is not None or check.max is not None:
        if histogram is None:
            results.append(_refused(f"{where}.min/max", level, "the column holds labels, not numbers"))
        elif histogram.value_count == 0:
            results.append(_nothing(f"{where}.min/max", level, column))
        else:
            if check.min is not None:
                low = histogram.min
                results.append(
                    _result(
                        f"{where}.min",
                        level,
                        low,
                        f"at least {_num(check.min)}",
                        low >= check.min,
                        files=_driving(per_file, lambda c: -_finite_or(c.histogram.min, math.inf)),
                    )
                )
            if check.max is not None:
                high = histogram.max
                results.append(
                    _result(
                        f"{where}.max",
                        level,
                        high,
                        f"at most {_num(check.max)}",
                        high <= check.max,
                        files=_driving(per_file, lambda c: _finite_or(c.histogram.max, -math.inf)),
                    )
                )
    if check.max_null_share is not None:
        share = column.share(column.nulls)
        results.append(
            _share(f"{where}.max_null_share", level, share, check.max_null_share, per_file, lambda c: c.nulls)
        )
    if check.max_nan_share is not None:
        if histogram is None:
            results.append(_refused(f"{where}.max_nan_share", level, "the column holds labels, which are never NaN"))
        else:
            share = column.share(column.nans)
            results.append(
                _share(f"{where}.max_nan_share", level, share, check.max_nan_share, per_file, lambda c: c.nans)
            )
    if check.min_distinct is not None:
        name = f"{where}.min_distinct"
        if column.rows - column.nulls == 0:
            results.append(_nothing(name, level, column))
        else:
            distinct = column.distinct_at_least
            results.append(
                _result(
                    name,
                    level,
                    distinct,
                    f"at least {check.min_distinct}",
                    distinct >= check.min_distinct,
                    files=_driving(per_file, lambda c: -c.distinct_at_least) if distinct < check.min_distinct else (),
                )
            )
    if check.mean_within is not None:
        results.append(_mean(f"{where}.mean_within", check, column, per_file, past))
    if check.class_share_within is not None:
        results.append(_class_share(f"{where}.class_share_within", check, column, past))
    return results


def _mean(
    name: str,
    check: ColumnCheck,
    column: ColumnProfile,
    per_file: Mapping[str, ColumnProfile],
    past: list[tuple[str, ColumnProfile]],
) -> CheckResult:
    if column.histogram is None:
        return _refused(name, check.level, "the column holds labels, which have no mean")
    mean = column.histogram.mean
    if mean is None:
        return _nothing(name, check.level, column)
    means = [c.histogram.mean for _, c in past if c.histogram is not None and c.histogram.mean is not None]
    if not means:
        return _not_yet(name, check.level, mean)
    reference = statistics.median(means)
    allowed = check.mean_within * abs(reference) if reference else check.mean_within
    bound = f"{_num(reference - allowed)} to {_num(reference + allowed)} (the median mean of {len(means)} earlier)"
    return _result(
        name,
        check.level,
        mean,
        bound,
        abs(mean - reference) <= allowed,
        files=_driving(per_file, lambda c: abs(_or(c.histogram.mean, reference) - reference)),
        history=means,
    )


def _class_share(
    name: str, check: ColumnCheck, column: ColumnProfile, past: list[tuple[str, ColumnProfile]]
) -> CheckResult:
    shares = column.class_shares()
    if shares is None:
        return _refused(
            name,
            check.level,
            "the column is not classes (more than 64 distinct values, or not integers): use mean_within or min/max",
        )
    if not shares:
        return _nothing(name, check.level, column)
    earlier = [s for _, c in past if (s := c.class_shares())]
    if not earlier:
        return _not_yet(name, check.level, None)
    classes = sorted(set(shares).union(*earlier))
    reference = {label: statistics.median(s.get(label, 0.0) for s in earlier) for label in classes}
    worst = max(classes, key=lambda label: abs(shares.get(label, 0.0) - reference[label]))
    value, expected = shares.get(worst, 0.0), reference[worst]
    low, high = max(0.0, expected - check.class_share_within), min(1.0, expected + check.class_share_within)
    bound = f"{_pct(low)} to {_pct(high)} for class {worst} (its median share in {len(earlier)} earlier)"
    return _result(
        name,
        check.level,
        value,
        bound,
        abs(value - expected) <= check.class_share_within,
        shown=f"class {worst} at {_pct(value)}",
    )


# -- one input feature -------------------------------------------------------------------------------------------


def _feature(
    where: str, check: FeatureCheck, column: ColumnProfile, per_file: Mapping[str, ColumnProfile]
) -> list[CheckResult]:
    if check.max_null_share is None:
        return []
    missing = column.histogram.nan_count if column.histogram is not None else column.nulls

    def missing_of(c: ColumnProfile) -> int:
        return c.histogram.nan_count if c.histogram is not None else c.nulls

    share, most = column.share(missing), check.max_null_share
    return [_share(f"{where}.max_null_share", check.level, share, most, per_file, missing_of)]


# -- against a reference: the last successful partition, or the baseline ---------------------------------------


class _Reference:
    """Where a PSI check's reference column comes from: ``previous`` (the newest earlier partition that has it) or
    ``baseline`` (the file's profile: a feature is looked for among its columns too)."""

    def __init__(self, kind: str, history: list[Partition], baseline: Baseline | None):
        self.kind, self.history, self.baseline = kind, history, baseline

    def of(self, side: str, name: str) -> tuple[ColumnProfile | None, str]:
        """(the reference column, what it is called), or (None, why there is none)."""
        if self.kind == "baseline":
            found = self.baseline.profile if self.baseline is not None else None
            if found is None:
                return None, self.baseline.said if self.baseline is not None else "no baseline was read"
            column = getattr(found, side).get(name) or found.outputs.get(name)
            return column, self.baseline.said if column is not None else f"{self.baseline.said} has no column {name!r}"
        for partition in self.history:
            if partition.profile is not None and name in getattr(partition.profile, side):
                return getattr(partition.profile, side)[name], f"run {partition.run_id}"
        return None, ""


def _psi(
    name: str, check: ColumnCheck | FeatureCheck, column: ColumnProfile, reference: tuple[ColumnProfile | None, str]
) -> CheckResult:
    against, said = reference
    if column.histogram is None:
        return _refused(name, check.level, "the column holds text, not numbers: PSI compares numbers")
    if column.histogram.count == 0:
        return _no_rows(name, check.level)
    if against is None or against.histogram is None or against.histogram.count == 0:
        if said:  # a baseline that is missing, or lacks the column: the setting asks for what is not there
            return CheckResult(
                check=name, level=check.level, verdict="fail", value=None, shown="not computed", bound=said
            )
        return _not_yet(name, check.level, None)
    drift = psi_between(against.histogram, column.histogram)
    return _result(
        name, check.level, drift.psi, f"below {_num(check.max_psi)} (against {said})", drift.psi < check.max_psi
    )


# -- shared shapes -----------------------------------------------------------------------------------------------


def _share(
    name: str,
    level: Level,
    share: float | None,
    most: float,
    per_file: Mapping[str, ColumnProfile],
    count: Callable[[ColumnProfile], int],
) -> CheckResult:
    if share is None:
        return _no_rows(name, level)
    return _result(
        name,
        level,
        share,
        f"at most {_pct(most)}",
        share <= most,
        shown=_pct(share),
        files=_driving(per_file, lambda c: count(c) / c.rows if c.rows else 0.0),
    )


def _result(
    name: str,
    level: Level,
    value: float | None,
    bound: str,
    passed: bool,
    *,
    shown: str | None = None,
    files: Sequence[str] = (),
    history: Sequence[float] = (),
) -> CheckResult:
    return CheckResult(
        check=name,
        level=level,
        verdict="pass" if passed else "fail",
        value=_finite(value),
        shown=shown if shown is not None else _num(value),
        bound=bound,
        files=list(files) if not passed else [],
        history=[float(h) for h in history],
    )


def _not_yet(name: str, level: Level, value: float | None) -> CheckResult:
    return CheckResult(
        check=name,
        level=level,
        verdict="n/a",
        value=_finite(value),
        shown=_num(value),
        bound="no earlier successful partition to compare with yet",
    )


def _nothing(name: str, level: Level, column: ColumnProfile) -> CheckResult:
    """A column with no value to check: n/a when it has no rows, a failure when every row is null or NaN (a model
    that answers nothing is not one that passes)."""
    if column.rows == 0:
        return _no_rows(name, level)
    return CheckResult(
        check=name,
        level=level,
        verdict="fail",
        value=None,
        shown="no value",
        bound=f"every one of its {column.rows:,} rows is null or NaN",
    )


def _no_rows(name: str, level: Level) -> CheckResult:
    return CheckResult(check=name, level=level, verdict="n/a", value=None, shown="no rows", bound="(nothing to check)")


def _refused(name: str, level: Level, why: str) -> CheckResult:
    """A check the column cannot have: it fails, naming the setting to change."""
    return CheckResult(check=name, level=level, verdict="fail", value=None, shown="not computable", bound=why)


def _missing_column(name: str, check: ColumnCheck | FeatureCheck, why: str) -> CheckResult:
    return CheckResult(check=name, level=check.level, verdict="fail", value=None, shown="missing", bound=why)


def _uncomputable(name: str, check: ColumnCheck | FeatureCheck, why: str) -> list[CheckResult]:
    return [CheckResult(check=name, level=check.level, verdict="fail", value=None, shown="not computed", bound=why)]


def _driving(per_file: Mapping[str, ColumnProfile], measure: Callable[[ColumnProfile], float]) -> list[str]:
    """The files whose own profile drives a failed check most (highest ``measure`` first)."""
    ranked = sorted(per_file.items(), key=lambda item: (-measure(item[1]), item[0]))
    return [key for key, _ in ranked[:DRIVING_FILES]]


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default


def _num(value: float | None) -> str:
    if value is None:
        return "none"
    if isinstance(value, int) or (math.isfinite(value) and float(value).is_integer() and abs(value) >= 1000):
        return f"{int(value):,}"
    return f"{value:.4g}"


def _pct(share: float) -> str:
    return f"{share * 100:.3g}%"
