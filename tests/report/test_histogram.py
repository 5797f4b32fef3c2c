"""The prediction histogram: accuracy, exact integers, NaN and infinities, merging, JSON, speed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardline.report.histogram import EXACT_MAX_DISTINCT, Histogram, HistogramFormatError

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "make",
    [
        lambda n: RNG.normal(size=n),
        RNG.random,
        lambda n: RNG.lognormal(3, 2, size=n),
        lambda n: -RNG.exponential(size=n),
    ],
    ids=["normal", "uniform", "lognormal", "negative"],
)
def test_quantiles_are_within_the_relative_accuracy(make, dtype):
    values = make(200_000).astype(dtype)
    histogram = Histogram().add(values)
    ordered = np.sort(values.astype(np.float64))
    for q in (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0):
        got = histogram.quantile(q)
        # the true rank-q value: DDSketch promises |got - x| <= 1% |x| for the element of that rank
        exact = ordered[int(q * (len(ordered) - 1))]
        assert abs(got - exact) <= 0.0101 * abs(exact) + 1e-12, (q, got, exact)
    assert histogram.min == pytest.approx(float(ordered[0])) and histogram.max == pytest.approx(float(ordered[-1]))
    assert histogram.count == histogram.value_count == len(values)
    assert histogram.mean == pytest.approx(float(values.astype(np.float64).mean()), rel=1e-4, abs=1e-6)
    assert not histogram.is_exact


def test_class_labels_are_counted_exactly_as_ints_or_floats():
    labels = np.array([0] * 5 + [1] * 3 + [2] * 2)
    for values in (labels, labels.astype(np.float32), labels.astype(bool)):
        histogram = Histogram().add(values)
        assert histogram.is_exact
        buckets = histogram.buckets()
        expected = ([0.0, 1.0, 2.0], [5, 3, 2]) if values.dtype != bool else ([0.0, 1.0], [5, 5])
        assert buckets[0].tolist() == expected[0] and buckets[1].tolist() == expected[1]
    histogram = Histogram().add(labels)
    assert histogram.quantile(0.5) == 0.0 and histogram.quantile(0.6) == 1.0 and histogram.quantile(1.0) == 2.0
    assert json.loads(json.dumps(histogram.to_dict()))["exact"] == [[0, 5], [1, 3], [2, 2]]
    # read through the sketch (as against a sketch), every label keeps a bucket of its own
    values, counts = histogram.buckets(exact=False)
    assert counts.tolist() == [5, 3, 2] and values[0] == 0.0
    assert values[1:] == pytest.approx([1.0, 2.0], rel=0.01)


def test_a_non_integer_or_too_many_distinct_values_turn_an_exact_histogram_into_a_sketch():
    histogram = Histogram().add(np.array([0, 1, 1, 2]))
    histogram.add(np.array([0.5]))
    assert not histogram.is_exact
    values, counts = histogram.buckets()
    assert counts.tolist() == [1, 1, 2, 1]  # 0, 0.5, 1, 2: nothing counted twice or lost
    assert values.tolist()[0] == 0.0 and values[1:] == pytest.approx([0.5, 1.0, 2.0], rel=0.01)
    many = Histogram().add(np.arange(EXACT_MAX_DISTINCT + 1))
    assert not many.is_exact and many.count == EXACT_MAX_DISTINCT + 1 and int(many.buckets()[1].sum()) == many.count


def test_nan_infinities_zero_and_signs_are_counted_apart():
    values = np.array([np.nan, np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-15, -2.0, 3.0])
    histogram = Histogram().add(values)
    assert (histogram.count, histogram.nan_count, histogram.value_count) == (9, 2, 7)
    assert (histogram.pos_inf_count, histogram.neg_inf_count, histogram.zero_count) == (1, 1, 3)
    values_, counts = histogram.buckets()
    assert counts.tolist() == [1, 1, 3, 1, 1]
    assert values_[0] == -np.inf and values_[-1] == np.inf and values_[2] == 0.0
    assert values_[1] == pytest.approx(-2.0, rel=0.01) and values_[3] == pytest.approx(3.0, rel=0.01)
    assert histogram.quantile(0.0) == -np.inf and histogram.quantile(1.0) == np.inf
    assert histogram.mean == pytest.approx(1.0 / 5)  # the finite ones: 0, 0, 1e-15, -2, 3
    assert Histogram().add(np.array([np.nan])).quantile(0.5) is None
    assert Histogram().quantile(0.5) is None and Histogram().mean is None


def test_merging_shards_gives_the_histogram_of_all_their_values():
    parts = [RNG.normal(loc=i, size=10_000) for i in range(4)] + [np.array([np.nan, 7, 8])]
    merged = Histogram.merged(Histogram().add(p) for p in parts)
    whole = Histogram().add(np.concatenate(parts))
    assert merged.buckets()[1].tolist() == whole.buckets()[1].tolist()
    assert merged.buckets()[0] == pytest.approx(whole.buckets()[0])
    assert (merged.count, merged.nan_count, merged.min, merged.max) == (whole.count, 1, whole.min, whole.max)
    # an exact shard merged with a sketch: its integers land in the sketch's buckets
    mixed = Histogram().add(np.array([0, 1, 1])).merge(Histogram().add(np.array([0.25, 1.0])))
    assert not mixed.is_exact and mixed.buckets()[1].tolist() == [1, 1, 3]
    with pytest.raises(HistogramFormatError, match="relative accuracy"):
        Histogram(0.01).merge(Histogram(0.02))


def test_to_dict_round_trips_through_json_and_stays_small():
    for values in (
        RNG.random(100_000).astype(np.float32),
        RNG.normal(size=100_000),
        np.array([1, 2, 2]),
        np.array([np.nan, np.inf, -1e300, 0.0]),
    ):
        histogram = Histogram().add(values)
        text = json.dumps(histogram.to_dict(), allow_nan=False)  # strict JSON: no NaN or Infinity literals
        again = Histogram.from_dict(json.loads(text))
        assert again == histogram
        assert again.quantile(0.3) == histogram.quantile(0.3)
        assert len(text) < 12_000, len(text)  # a DynamoDB item holds 400 KB
    with pytest.raises(HistogramFormatError, match="format"):
        Histogram.from_dict({"format": "something/2"})
    with pytest.raises(HistogramFormatError, match="malformed"):
        Histogram.from_dict({"format": "shardline.ddsketch/1", "relative_accuracy": 0.01})


def test_adding_a_million_floats_again_and_again_counts_each_once():
    values = RNG.normal(size=1_000_000).astype(np.float32)
    histogram = Histogram().add(values)
    for _ in range(4):
        histogram.add(values)
    assert histogram.count == 5_000_000
    assert abs(histogram.quantile(0.5)) < 0.01  # the median of a standard normal, at 1% relative accuracy


def test_bad_input_is_refused():
    with pytest.raises(TypeError):
        Histogram().add(np.array(["a"]))
    with pytest.raises(ValueError, match="quantile"):
        Histogram().add(np.array([1.0])).quantile(1.5)
    with pytest.raises(ValueError, match="relative_accuracy"):
        Histogram(0)
    empty = Histogram().add(np.array([]))
    assert empty.count == 0 and empty.buckets()[0].size == 0
