"""A step's output checks, evaluated (pure): each kind passes and fails on the values it reads, the bands come from
the earlier partitions, and a check that cannot be computed fails rather than passes."""

from __future__ import annotations

import numpy as np
import pytest

from shardline.report.checks import Partition, blocked_message, evaluate
from shardline.report.profile import Profile
from shardline.spec.checks import ChecksSpec


def _profile(outputs: dict | None = None, inputs: dict | None = None, nulls: dict | None = None) -> Profile:
    profile = Profile()
    profile.files = 1
    for side, columns in (("outputs", outputs or {}), ("inputs", inputs or {})):
        for name, values in columns.items():
            if isinstance(values, dict):  # labels
                profile.column(side, name, "labels").add_labels(values, 0, sum(values.values()))
            else:
                array = np.asarray(values, dtype=float)
                profile.column(side, name, "numbers").add_numbers(array, (nulls or {}).get(name, 0))
    return profile


def _check(spec: dict, current: Partition, history=(), files=None, missing=None, baseline=None):
    return {r.check: r for r in evaluate(ChecksSpec(**spec), current, history, files, missing, baseline)}


def test_a_range_passes_inside_and_fails_outside_naming_the_file_that_drives_it():
    spec = {"columns": {"score": {"min": 0, "max": 1}}}
    inside = _profile({"score": [0.0, 0.5, 1.0]})
    results = _check(spec, Partition("r", 3, inside))
    assert (results["checks.columns.score.min"].verdict, results["checks.columns.score.max"].verdict) == (
        "pass",
        "pass",
    )
    a, b = _profile({"score": [0.2, 0.4]}), _profile({"score": [0.3, 7.5]})
    results = _check(spec, Partition("r", 4, Profile.merged([a, b])), files={"a.csv": a, "b.csv": b})
    high = results["checks.columns.score.max"]
    assert (high.verdict, high.value, high.bound, high.files[0]) == ("fail", 7.5, "at most 1", "b.csv")
    assert high.line() == "checks.columns.score.max: 7.5 against at most 1 (most in b.csv, a.csv)"


def test_null_and_nan_shares_each_have_their_own_bound():
    spec = {"columns": {"score": {"max_null_share": 0.1, "max_nan_share": 0.1}}}
    profile = _profile({"score": [1.0, np.nan, np.nan, 2.0]}, nulls={"score": 1})
    results = _check(spec, Partition("r", 4, profile))
    null, nan = results["checks.columns.score.max_null_share"], results["checks.columns.score.max_nan_share"]
    assert (null.verdict, null.shown, null.bound) == ("fail", "25%", "at most 10%")
    assert (nan.verdict, nan.value) == ("fail", 0.25)
    clean = _check(spec, Partition("r", 2, _profile({"score": [1.0, 2.0]})))
    assert {r.verdict for r in clean.values()} == {"pass"}


def test_a_constant_output_fails_min_distinct_and_blocks():
    spec = {"columns": {"*": {"min_distinct": 2}}}
    results = _check(spec, Partition("r", 500, _profile({"score": [0.42] * 500, "label": {"yes": 500}})))
    assert results["checks.columns.* (score).min_distinct"].verdict == "fail"
    assert results["checks.columns.* (label).min_distinct"].value == 1
    message = blocked_message(list(results.values()))
    assert message == (
        "checks: blocked by checks.columns.* (score).min_distinct: 1 against at least 2 (and 1 more blocking check(s))"
    )


def test_a_warn_check_never_blocks():
    results = evaluate(
        ChecksSpec(columns={"score": {"min_distinct": 2, "level": "warn"}}),
        Partition("r", 3, _profile({"score": [1.0, 1.0, 1.0]})),
    )
    assert [r.verdict for r in results] == ["fail"] and blocked_message(results) is None


def test_rows_out_against_a_floor_and_the_median_of_the_last_partitions():
    spec = {"last": 3, "rows_out": {"at_least": 100, "within": 0.5}}
    history = [Partition(f"r{i}", rows, None) for i, rows in enumerate([1000, 1200, 800, 10])]  # the 4th: past last
    ok = _check(spec, Partition("now", 1100, None), history)
    assert ok["checks.rows_out.within"].verdict == "pass" and ok["checks.rows_out.within"].history == [1000, 1200, 800]
    low = _check(spec, Partition("now", 400, None), history)["checks.rows_out.within"]
    assert (low.verdict, low.bound) == ("fail", "500 to 1,500 (the median 1,000 of 3 earlier partition(s))")
    first = _check(spec, Partition("now", 50, None))
    assert first["checks.rows_out.within"].verdict == "n/a" and first["checks.rows_out.at_least"].verdict == "fail"


def test_the_mean_is_held_to_the_median_mean_of_the_last_partitions():
    spec = {"columns": {"score": {"mean_within": 0.1}}}
    history = [Partition(f"r{i}", 3, _profile({"score": [m - 0.1, m, m + 0.1]})) for i, m in enumerate([0.5, 0.52])]
    near = _check(spec, Partition("now", 3, _profile({"score": [0.5, 0.52, 0.54]})), history)
    assert near["checks.columns.score.mean_within"].verdict == "pass"
    far = _check(spec, Partition("now", 3, _profile({"score": [0.0, 0.01, 0.02]})), history)
    result = far["checks.columns.score.mean_within"]
    assert result.verdict == "fail" and result.value == pytest.approx(0.01)
    assert result.bound.startswith("0.459 to 0.561")


def test_class_shares_are_held_to_the_last_partitions_and_a_new_class_counts():
    spec = {"columns": {"label": {"class_share_within": 0.1}}}
    history = [Partition("r1", 100, _profile({"label": {"yes": 30, "no": 70}}))]
    same = _check(spec, Partition("now", 100, _profile({"label": {"yes": 35, "no": 65}})), history)
    assert same["checks.columns.label.class_share_within"].verdict == "pass"
    moved = _check(spec, Partition("now", 100, _profile({"label": {"yes": 2, "no": 70, "maybe": 28}})), history)
    result = moved["checks.columns.label.class_share_within"]
    assert result.verdict == "fail" and result.shown in ("class maybe at 28%", "class yes at 2%")
    floats = _check(spec, Partition("now", 3, _profile({"label": [0.1, 0.2, 0.3]})), history)
    assert floats["checks.columns.label.class_share_within"].verdict == "fail"  # not classes: the setting is wrong


def test_an_input_features_nulls_and_psi():
    spec = {"features": {"f0": {"max_null_share": 0.05, "max_psi": 0.2}}}
    rng = np.random.default_rng(0)
    history = [Partition("r1", 1000, _profile(inputs={"f0": rng.standard_normal(1000)}))]
    same = _check(spec, Partition("now", 1000, _profile(inputs={"f0": rng.standard_normal(1000)})), history)
    assert {r.verdict for r in same.values()} == {"pass"}
    zeros = np.where(np.arange(1000) < 600, 0.0, rng.standard_normal(1000))  # upstream sends zeros
    zeros[:100] = np.nan
    results = _check(spec, Partition("now", 1000, _profile(inputs={"f0": zeros})), history)
    assert results["checks.features.f0.max_null_share"].shown == "10%"
    assert results["checks.features.f0.max_psi"].verdict == "fail"
    assert "against run r1" in results["checks.features.f0.max_psi"].bound


def test_what_cannot_be_computed_fails_and_says_why():
    spec = {"columns": {"score": {"min_distinct": 2}}, "features": {"f0": {"max_null_share": 0.1}}}
    missing = _check(spec, Partition("r", 10, None), missing="the manifest s3://b/m.json was not found")
    assert {r.verdict for r in missing.values()} == {"fail"}
    assert missing["checks.columns.score"].bound == "the manifest s3://b/m.json was not found"
    typo = _check(spec, Partition("r", 2, _profile({"prediction": [1.0, 2.0]})))
    assert typo["checks.columns.score"].bound == "the step wrote no column 'score' (its columns: prediction)"
    assert typo["checks.features.f0"].verdict == "fail"


def test_an_empty_step_has_nothing_for_column_checks_to_read():
    results = _check({"columns": {"score": {"min_distinct": 2}}}, Partition("r", 0, _profile({"score": []})))
    assert results["checks.columns.score.min_distinct"].verdict == "n/a"


def test_psi_against_the_baseline_or_why_there_is_none():
    from shardline.report.checks import Baseline

    rng = np.random.default_rng(1)
    spec = {"reference": "baseline", "columns": {"score": {"max_psi": 0.2}}, "features": {"f0": {"max_psi": 0.2}}}
    current = Partition("now", 1000, _profile({"score": rng.random(1000)}, inputs={"f0": rng.standard_normal(1000)}))
    # The baseline file holds the prediction and the feature as plain columns: a feature is found among them.
    made = _profile({"score": rng.random(1000), "f0": rng.standard_normal(1000)})
    results = _check(spec, current, baseline=Baseline(made, "the baseline made from s3://b/v.parquet"))
    assert {r.verdict for r in results.values()} == {"pass"}
    assert results["checks.features.f0.max_psi"].bound.endswith("(against the baseline made from s3://b/v.parquet)")
    none = _check(spec, current, baseline=Baseline(None, "no baseline was made for step score: make one with ..."))
    assert {r.verdict for r in none.values()} == {"fail"}
    assert none["checks.columns.score.max_psi"].bound.startswith("no baseline was made")
    lacking = _check(spec, current, baseline=Baseline(_profile({"score": rng.random(10)}), "the baseline of v"))
    assert lacking["checks.features.f0.max_psi"].bound == "the baseline of v has no column 'f0'"


def test_a_column_of_only_nulls_or_nans_fails_its_checks_and_an_empty_one_has_none_to_fail():
    spec = {"columns": {"score": {"min": 0, "max": 1, "min_distinct": 2, "mean_within": 0.1}}}
    history = [Partition("r1", 3, _profile({"score": [0.2, 0.3, 0.4]}))]
    nothing = _check(spec, Partition("now", 3, _profile({"score": [np.nan] * 3}, nulls={"score": 1})), history)
    assert {r.verdict for r in nothing.values()} == {"fail"}
    assert nothing["checks.columns.score.mean_within"].bound == "every one of its 3 rows is null or NaN"
    empty = _check(spec, Partition("now", 0, _profile({"score": []})), history)
    assert {r.verdict for r in empty.values()} == {"n/a"}
