"""Auto-tune's decisions (``shardline.worker.tools.tune_decisions``), as pure functions: the splits of the cores,
the ladder of batch sizes and when it stops, the best setting, and the spec snippet."""

from __future__ import annotations

import pytest
import yaml

from shardline.spec import parse_spec
from shardline.worker.tools.tune_decisions import (
    Point,
    Setting,
    batch_ladder,
    best_point,
    core_splits,
    doubling_sweep,
    fell,
    spec_snippet,
    spread,
    within_noise,
)


def _fake(rates: dict[int, list[float]]):
    asked = []

    def measure(rows: int) -> list[float]:
        asked.append(rows)
        return rates[rows]

    return measure, asked


def _point(rates, batch=4096, workers=2):
    return Point("batch", Setting(workers, 1, batch, 262144), list(rates))


@pytest.mark.parametrize(
    ("cores", "splits"),
    [
        (1, [(1, 1)]),
        (2, [(2, 1), (1, 2)]),
        (6, [(6, 1), (3, 2), (2, 3), (1, 6)]),
        (16, [(16, 1), (8, 2), (4, 4), (2, 8), (1, 16)]),
    ],
)
def test_the_splits_are_every_divisor_of_the_cores(cores, splits):
    assert core_splits(cores) == splits
    assert all(w * t == cores for w, t in core_splits(cores))


def test_the_ladder_doubles_from_the_first_size_within_the_cap():
    assert batch_ladder(4096, 1 << 20) == [4096 << i for i in range(9)]
    assert batch_ladder(4096, 50_000) == [4096, 8192, 16384, 32768, 50_000]  # the cap: a whole file a batch
    assert batch_ladder(4096, 4096) == [4096]
    assert batch_ladder(4096, 1000) == [1000]  # files smaller than the first size: one batch holds a file


def test_a_fall_counts_only_beyond_the_noise():
    assert not fell([100.0], [98.0], 0.03)  # within the threshold
    assert not fell([100.0], [120.0], 0.03)
    assert fell([100.0], [96.0], 0.03)
    assert fell([100.0, 104.0], [90.0, 95.0], 0.03)
    assert not fell([100.0, 130.0], [90.0, 105.0], 0.03)  # the runs overlap: noise, not a fall


def test_the_doubling_stops_after_the_first_fall_and_keeps_that_point():
    measure, asked = _fake({4096: [100], 8192: [150], 16384: [180], 32768: [170], 65536: [300]})
    points, why = doubling_sweep(measure, 4096, 1 << 20, tolerance=0.03)
    assert asked == [4096, 8192, 16384, 32768]  # 65536 is never tried, however good it would have been
    assert points == [(4096, [100]), (8192, [150]), (16384, [180]), (32768, [170])]
    assert why.startswith("stopped at 32,768") and "-5.6%" in why


def test_a_dip_within_noise_does_not_stop_the_doubling():
    measure, asked = _fake({4096: [100], 8192: [99], 16384: [150, 200], 32768: [130, 160], 40000: [170]})
    points, why = doubling_sweep(measure, 4096, 40000, tolerance=0.03)
    assert asked == [rows for rows, _ in points] == [4096, 8192, 16384, 32768, 40000]
    assert "reached the cap of 40,000" in why


def test_the_best_is_the_highest_median_and_its_neighbours_within_noise_are_named():
    a, b, c = _point([100, 104], 4096), _point([150, 152], 8192), _point([149, 148], 16384)
    assert best_point([a, b, c]) is b
    assert within_noise([a, b, c], b, 0.03) == [c]
    d = _point([120, 151], 32768)  # its median is far below, but one run matched the best's slowest
    assert within_noise([a, b, d], b, 0.03) == [d]
    assert spread([100, 110]) == pytest.approx(10 / 105)
    assert spread([5.0]) == 0.0


def test_the_snippet_uses_the_spec_fields_and_parses_with_the_spec_parser():
    text = spec_snippet("score", workers=4, batch_rows=131072, cores=16)
    assert "batch_rows: 131072" in text and "workers_per_instance: 4" in text and "16 // 4 = 4" in text
    pasted = yaml.safe_load(text)["steps"][0]
    step = {
        "model": {"uri": "s3://b/m/model.tar.gz", "allow_unpinned": True},
        "input": {"prefix": "s3://b/in/"},
        "output": {"prefix": "s3://b/out/"},
    }
    step.update({k: v for k, v in pasted.items() if k != "resources"}, resources=pasted["resources"])
    spec = parse_spec({"pipeline": "p", "steps": [step]}, "p.yaml")
    assert spec.steps[0].name == "score"
    assert spec.steps[0].batch_rows == 131072
    assert spec.steps[0].resources.workers_per_instance == 4
