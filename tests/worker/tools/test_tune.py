"""worker/tools/tune*.py: the sweep's decisions as pure functions (no process), the sample, and one real --tune run."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml

from examples import synthetic
from shardline.spec import parse_spec
from shardline.worker.pool.work_units import discover_inputs
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
from shardline.worker.tools.tune_sample import take_sample
from tests.support.helpers import WORKER, clean_env, describe


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


def _fake(rates: dict[int, list[float]]):
    asked = []

    def measure(rows: int) -> list[float]:
        asked.append(rows)
        return rates[rows]

    return measure, asked


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


def _point(rates, batch=4096, workers=2):
    return Point("batch", Setting(workers, 1, batch, 262144), list(rates))


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


def test_the_sample_takes_the_first_files_up_to_the_rows_and_cuts_the_last(tmp_path):
    data = tmp_path / "data"
    synthetic.make_dataset(data, files=3, rows=30_000, row_group_rows=4000)
    synthetic.write_table(synthetic.make_table(500, seed=9), data / "z.csv.gz", "csv")
    files, _ = discover_inputs(data)
    sample = take_sample(files, 15_000, tmp_path / "sample", min_files=2)
    assert sample.source_files == [("part-00000.parquet", 10_000), ("part-00001.parquet", 5_000)]
    assert sample.rows == 15_000 and sample.copies == 1
    cut = pq.ParquetFile(tmp_path / "sample" / "part-00001.parquet")
    assert cut.metadata.num_rows == 5_000 and cut.metadata.row_group(0).num_rows == 4000  # row groups kept
    whole = pq.read_table(tmp_path / "sample" / "part-00000.parquet")
    assert whole.equals(pq.read_table(data / "part-00000.parquet"))

    # Fewer files than the widest split's workers need: the sample is laid out again, the same bytes.
    more = take_sample(files, 15_000, tmp_path / "sample4", min_files=4)
    assert more.copies == 2 and more.rows_per_run == 30_000
    assert sorted(
        p.relative_to(tmp_path / "sample4").as_posix() for p in (tmp_path / "sample4").rglob("*.parquet")
    ) == [
        "copy-0/part-00000.parquet",
        "copy-0/part-00001.parquet",
        "copy-1/part-00000.parquet",
        "copy-1/part-00001.parquet",
    ]


def test_a_text_sample_keeps_its_format_and_cuts_by_lines(tmp_path):
    data = tmp_path / "data"
    synthetic.write_table(synthetic.make_table(900, seed=2), data / "a.csv.gz", "csv")
    files, _ = discover_inputs(data)
    sample = take_sample(files, 300, tmp_path / "sample", min_files=1)
    assert sample.source_files == [("a.csv.gz", 300)]
    import pyarrow.csv as pacsv

    assert pacsv.read_csv(tmp_path / "sample" / "a.csv.gz").num_rows == 300


@pytest.mark.slow
def test_a_tune_run_of_the_real_worker_writes_the_table_the_json_the_plot_and_the_snippet(tmp_path, xgboost_model):
    import subprocess

    data = tmp_path / "data"
    synthetic.make_dataset(data, files=4, rows=20_000)
    out = tmp_path / "tune"
    result = subprocess.run(
        [
            *WORKER,
            "--input-dir",
            str(data),
            "--model-dir",
            str(xgboost_model.parent),
            "--passthrough",
            "id",
            "--output-dir",
            str(tmp_path / "never"),
            "--tune",
            "--tune-rows",
            "20000",
            "--tune-repeat",
            "1",
            "--tune-max-batch-rows",
            "8192",
            "--tune-out",
            str(out),
            "--tune-step",
            "score",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, describe(result)
    figures = json.loads((out / "tune.json").read_text())
    assert (out / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert figures["points"] and all(
        p["median_rows_per_s"] > 0 and all(r > 0 for r in p["rows_per_s"]) for p in figures["points"]
    )
    assert figures["sample"]["rows"] == 20_000
    assert figures["machine"]["cores"] >= 1
    phases = {p["phase"] for p in figures["points"]}
    assert "split" in phases
    assert all(p["batch_rows"] <= 8192 for p in figures["points"] if p["phase"] == "batch")
    assert "workers_per_instance:" in figures["snippet"] and "batch_rows:" in figures["snippet"]
    text = result.stdout
    assert "<- best" in text and "paste into the step's entry" in text and "- name: score" in text
    assert f"plot: {out / 'tune.png'}" in text
    assert not (tmp_path / "never").exists() or not any((tmp_path / "never").iterdir())  # writes no output


@pytest.mark.slow
def test_on_gpu_workers_the_tune_sweeps_the_gpu_batch_rows_and_says_the_spec_has_no_field_for_it(
    tmp_path, xgboost_model
):
    import subprocess

    data = tmp_path / "data"
    synthetic.make_dataset(data, files=2, rows=10_000)
    out = tmp_path / "tune"
    result = subprocess.run(
        [
            *WORKER,
            "--input-dir",
            str(data),
            "--model-dir",
            str(xgboost_model.parent),
            "--tune",
            "--tune-rows",
            "10000",
            "--tune-repeat",
            "1",
            "--tune-max-batch-rows",
            "4096",
            "--tune-out",
            str(out),
        ],
        env=clean_env(SHARDLINE_SIMULATED_GPUS="1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, describe(result)
    figures = json.loads((out / "tune.json").read_text())
    assert figures["on_gpu"] and figures["machine"]["simulated_gpus"]
    assert [(p["phase"], p["workers"], p["gpu_batch_rows"]) for p in figures["points"]] == [("gpu batch", 1, 4096)]
    assert "simulated: computing on the CPU" in result.stdout
    assert "--gpu-batch-rows is the flag that sets it" in result.stdout
