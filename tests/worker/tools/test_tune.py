"""worker/tools/tune.py: real --tune runs of the worker (its decisions are in test_tune_decisions.py, its sample in
test_tune_sample.py)."""

from __future__ import annotations

import json

import pytest

from examples import synthetic
from tests.support.helpers import WORKER, clean_env, describe


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
