"""PSI against hand-computed values, its bins, and the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardline.report.drift import DEFAULT_EPSILON, psi, psi_between, verdict
from shardline.report.histogram import Histogram

RNG = np.random.default_rng(11)


def test_psi_of_two_bins_by_hand():
    # (0.4 - 0.5) ln(0.4/0.5) + (0.6 - 0.5) ln(0.6/0.5) = 0.1 * 0.22314 + 0.1 * 0.18232 = 0.040546
    # (each term is >= 0: the difference and the log always have the same sign)
    expected = (0.4 - 0.5) * math.log(0.4 / 0.5) + (0.6 - 0.5) * math.log(0.6 / 0.5)
    assert expected == pytest.approx(0.0405465, abs=1e-7)
    assert psi([0.5, 0.5], [0.4, 0.6]) == pytest.approx(expected, rel=1e-12)


def test_psi_of_four_bins_by_hand():
    reference, current = [0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]
    # -0.15 ln(0.4) - 0.05 ln(0.8) + 0.05 ln(1.2) + 0.15 ln(1.6)
    # = 0.137444 + 0.011157 + 0.009116 + 0.070501 = 0.228218
    expected = -0.15 * math.log(0.4) - 0.05 * math.log(0.8) + 0.05 * math.log(1.2) + 0.15 * math.log(1.6)
    assert expected == pytest.approx(0.228218, abs=1e-6)
    assert psi(reference, current) == pytest.approx(expected, rel=1e-12)
    assert psi(current, reference) == pytest.approx(expected, rel=1e-12)  # symmetric


def test_an_empty_bin_counts_as_epsilon():
    # reference [0.5, 0.5, 0], current [0.4, 0.5, 0.1]: the third bin's reference counts as 1e-4
    # (0.4-0.5) ln(0.4/0.5) + 0 + (0.1-0.0001) ln(0.1/0.0001) = 0.022314 + 0.0999 * 6.907755 = 0.712399
    expected = (0.4 - 0.5) * math.log(0.4 / 0.5) + (0.1 - 1e-4) * math.log(0.1 / 1e-4)
    assert expected == pytest.approx(0.712399, abs=1e-6)
    assert psi([0.5, 0.5, 0.0], [0.4, 0.5, 0.1]) == pytest.approx(expected, rel=1e-12)
    assert DEFAULT_EPSILON == 1e-4
    # a bin empty on both sides adds nothing; a larger epsilon softens an empty bin
    assert psi([0.5, 0.5, 0.0], [0.5, 0.5, 0.0]) == 0.0
    assert psi([0.5, 0.5, 0.0], [0.4, 0.5, 0.1], epsilon=0.01) == pytest.approx(
        (0.4 - 0.5) * math.log(0.8) + (0.1 - 0.01) * math.log(0.1 / 0.01), rel=1e-12
    )


@pytest.mark.parametrize(
    ("reference", "current", "message"),
    [
        ([0.5, 0.5], [1.0], "equal"),
        ([0.5, 0.6], [0.5, 0.5], "sum to 1"),
        ([1.5, -0.5], [0.5, 0.5], ">= 0"),
        ([], [], "non-empty"),
    ],
)
def test_psi_refuses_what_is_not_two_distributions(reference, current, message):
    with pytest.raises(ValueError, match=message):
        psi(reference, current)


def test_identical_distributions_give_zero():
    values = RNG.normal(size=50_000)
    assert psi_between(Histogram().add(values), Histogram().add(values)).psi == 0.0
    labels = RNG.integers(0, 3, 10_000)
    assert psi_between(Histogram().add(labels), Histogram().add(labels)).psi == 0.0


def test_the_same_distribution_sampled_twice_gives_a_small_psi_and_a_shifted_normal_a_large_one():
    reference = Histogram().add(RNG.normal(size=100_000))
    same = psi_between(reference, Histogram().add(RNG.normal(size=100_000)))
    assert same.psi < 0.01 and verdict(same.psi) == "stable"
    assert same.kind == "quantile" and len(same.edges) == 9 and len(same.labels) == 10
    assert all(f == pytest.approx(0.1, abs=0.01) for f in same.reference_fractions)  # deciles: 10% each
    shifted = psi_between(reference, Histogram().add(RNG.normal(loc=1.0, size=100_000)))
    assert shifted.psi > 0.5 and verdict(shifted.psi) == "drift"
    nudged = psi_between(reference, Histogram().add(RNG.normal(loc=0.3, size=100_000)))
    assert same.psi < nudged.psi < shifted.psi


def test_psi_between_matches_psi_over_its_own_fractions_by_hand():
    # reference 0 x4, 1 x4, 2 x2 (10 values): one bin per label + "other"
    # current   0 x2, 1 x4, 2 x4:  PSI = (0.2-0.4) ln(0.2/0.4) + 0 + (0.4-0.2) ln(0.4/0.2) = 0.4 ln 2 = 0.277259
    reference = Histogram().add(np.array([0] * 4 + [1] * 4 + [2] * 2))
    current = Histogram().add(np.array([0] * 2 + [1] * 4 + [2] * 4))
    drift = psi_between(reference, current)
    assert drift.kind == "discrete" and drift.labels == ("= 0", "= 1", "= 2", "other")
    assert drift.reference_fractions == (0.4, 0.4, 0.2, 0.0) and drift.current_fractions == (0.2, 0.4, 0.4, 0.0)
    assert drift.psi == pytest.approx(0.4 * math.log(2), rel=1e-12)


def test_a_label_the_reference_never_had_is_drift():
    reference = Histogram().add(np.array([0] * 50 + [1] * 50))
    current = Histogram().add(np.array([0] * 45 + [1] * 45 + [2] * 10))
    drift = psi_between(reference, current)
    # the "other" bin: reference 0 -> 1e-4, current 0.1; and 0.45 vs 0.5 twice
    expected = 2 * (0.45 - 0.5) * math.log(0.45 / 0.5) + (0.1 - 1e-4) * math.log(0.1 / 1e-4)
    assert drift.psi == pytest.approx(expected, rel=1e-12) and verdict(drift.psi) == "drift"


def test_discrete_outputs_read_through_the_sketch_get_deduplicated_quantile_bins():
    # a sketch (no integers) of 3 distinct values; with bins=2 that is more values than bins, so quantile bins:
    # the one cut point (the median, 0.25) leaves 2 bins; with bins=10, one bin per value
    values = np.array([0.25] * 60 + [0.5] * 30 + [0.75] * 10)
    drift = psi_between(Histogram().add(values), Histogram().add(values), bins=2)
    assert drift.kind == "quantile" and len(drift.edges) == 1 and drift.psi == 0.0
    ten = psi_between(Histogram().add(values), Histogram().add(values), bins=10)
    assert ten.kind == "discrete" and len(ten.edges) == 3


def test_nan_predictions_get_a_bin_of_their_own():
    reference = Histogram().add(RNG.normal(size=10_000))
    current = Histogram().add(np.concatenate([RNG.normal(size=9_000), np.full(1_000, np.nan)]))
    drift = psi_between(reference, current)
    assert drift.labels[-1] == "NaN" and drift.reference_fractions[-1] == 0.0
    assert drift.current_fractions[-1] == pytest.approx(0.1)
    assert drift.psi > (0.1 - 1e-4) * math.log(0.1 / 1e-4)  # the NaN bin alone: 0.69


def test_an_exact_reference_against_a_sketch_compares_through_the_sketch():
    reference = Histogram().add(np.array([0, 1] * 500))
    current = Histogram().add(np.array([0.0, 1.0] * 450 + [0.5] * 100))  # 0.5 is no integer: a sketch
    drift = psi_between(reference, current)
    assert drift.kind == "discrete"
    assert drift.current_fractions == pytest.approx((0.45, 0.45, 0.1))


def test_empty_histograms_and_bad_bins_are_refused():
    with pytest.raises(ValueError, match="reference histogram is empty"):
        psi_between(Histogram(), Histogram().add(np.array([1.0])))
    with pytest.raises(ValueError, match="bins"):
        psi_between(Histogram().add(np.array([1.0])), Histogram().add(np.array([1.0])), bins=0)


def test_verdict():
    assert [verdict(v) for v in (None, 0.0, 0.099, 0.1, 0.19, 0.2, 3.0)] == [
        "n/a",
        "stable",
        "stable",
        "moderate",
        "moderate",
        "drift",
        "drift",
    ]
    assert verdict(0.06, max_psi=0.05) == "drift" and verdict(0.04, max_psi=0.05) == "stable"
