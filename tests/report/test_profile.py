"""The profile a worker keeps per file: counts that merge exactly, labels kept up to a limit, and a stored form that
refuses what it cannot read."""

from __future__ import annotations

import numpy as np
import pytest

from shardline.report.histogram import HistogramFormatError
from shardline.report.profile import MAX_LABELS, ColumnProfile, Profile


def _numbers(values, nulls: int = 0) -> ColumnProfile:
    column = ColumnProfile("numbers")
    column.add_numbers(np.asarray(values, dtype=float), nulls)
    return column


def test_nulls_and_nans_are_told_apart_and_shares_are_of_every_row():
    column = _numbers([1.0, np.nan, np.nan, 4.0], nulls=1)  # one NaN was a null
    assert (column.rows, column.nulls, column.nans) == (4, 1, 1)
    assert column.share(column.nulls) == 0.25
    assert ColumnProfile("numbers").share(0) is None  # no rows: no share, never 0%


def test_distinct_is_exact_for_labels_and_small_integers_and_a_lower_bound_for_a_sketch():
    assert _numbers([3.0] * 100).distinct_at_least == 1
    assert _numbers([0, 1, 1, 2]).distinct_at_least == 3
    spread = _numbers(np.linspace(1.0, 2.0, 10_000))
    assert 30 < spread.distinct_at_least < 10_000  # 1% buckets: values close together share one
    labels = ColumnProfile("labels")
    labels.add_labels({"cat": 3, "dog": 1}, nulls=1, rows=5)
    assert (labels.distinct_at_least, labels.class_shares()) == (2, {"cat": 0.75, "dog": 0.25})


def test_labels_past_the_limit_count_rows_only():
    labels = ColumnProfile("labels")
    labels.add_labels({f"v{i}": 1 for i in range(MAX_LABELS + 1)}, nulls=0, rows=MAX_LABELS + 1)
    assert labels.labels is None and labels.class_shares() is None
    assert labels.distinct_at_least == MAX_LABELS + 1
    labels.add_labels({"v0": 1}, nulls=0, rows=1)
    assert labels.rows == MAX_LABELS + 2


def test_integer_classes_have_shares_and_a_float_output_has_none():
    assert _numbers([0, 0, 0, 1]).class_shares() == {"0": 0.75, "1": 0.25}
    assert _numbers([0.1, 0.2, 0.7]).class_shares() is None


def test_files_merge_into_the_profile_of_all_their_rows():
    first, second = Profile(), Profile()
    for profile, values, labels in ((first, [1.0, 2.0], {"a": 2}), (second, [3.0], {"b": 1})):
        profile.files = 1
        profile.column("outputs", "score", "numbers").add_numbers(np.asarray(values), 0)
        profile.column("outputs", "label", "labels").add_labels(labels, 0, sum(labels.values()))
    merged = Profile.merged([first, second])
    assert merged.files == 2
    assert merged.outputs["score"].histogram.count == 3 and merged.outputs["score"].histogram.max == 3.0
    assert merged.outputs["label"].labels == {"a": 2, "b": 1}
    assert first.outputs["score"].rows == 2  # merging copies: the files' own profiles are left as they were
    assert Profile.from_dict(merged.to_dict()).to_dict() == merged.to_dict()


def test_a_column_of_numbers_in_one_file_and_labels_in_another_cannot_merge():
    numbers, labels = Profile(), Profile()
    numbers.column("outputs", "prediction", "numbers").add_numbers(np.asarray([1.0]), 0)
    labels.column("outputs", "prediction", "labels").add_labels({"yes": 1}, 0, 1)
    with pytest.raises(HistogramFormatError, match="column 'prediction'"):
        Profile.merged([numbers, labels])


@pytest.mark.parametrize(
    "stored", [None, {"format": "other"}, {"format": "shardline.profile/1", "outputs": {"x": {"kind": "numbers"}}}, []]
)
def test_a_stored_profile_it_cannot_read_is_refused(stored):
    with pytest.raises(HistogramFormatError):
        Profile.from_dict(stored)


def test_a_columns_metrics_are_openlineages_and_distinct_only_where_counted_exactly():
    spread = _numbers(np.linspace(0.0, 1.0, 1001))
    metrics = spread.metrics()
    assert (metrics["count"], metrics["nullCount"], metrics["min"], metrics["max"]) == (1001, 0, 0.0, 1.0)
    assert "distinctCount" not in metrics  # a sketch counts buckets, a lower bound: not said as a count
    assert abs(metrics["quantiles"]["0.5"] - 0.5) <= 0.01
    assert _numbers([0, 1, 1]).metrics()["distinctCount"] == 2
    labels = ColumnProfile("labels")
    labels.add_labels({"a": 2}, nulls=1, rows=3)
    assert labels.metrics() == {"count": 3, "nullCount": 1, "distinctCount": 1}


def test_a_batch_of_nulls_counts_as_missing_values_of_the_column_and_a_kind_never_changes():
    import pyarrow as pa

    profile = Profile()
    profile.add_column("outputs", "score", pa.array([None, None], type=pa.null()))
    profile.add_column("outputs", "score", pa.array([0.5, None]))
    score = profile.outputs["score"]
    assert (score.rows, score.nulls, score.nans, score.histogram.count) == (4, 3, 0, 4)
    profile.add_column("outputs", "label", pa.array(["a", None]))
    profile.add_column("outputs", "label", pa.array([None], type=pa.null()))
    assert (profile.outputs["label"].rows, profile.outputs["label"].nulls) == (3, 2)
    with pytest.raises(HistogramFormatError, match="column 'label' holds labels in one batch and numbers"):
        profile.add_column("outputs", "label", pa.array([1.0]))
