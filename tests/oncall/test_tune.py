"""`shardline tune` on moto_server: a staged step's model and the latest run's inputs, fetched over HTTP, tuned by
the real worker (`--tune`) in a subprocess; the pin is the job's own; a step no run planned needs --input-prefix."""

from __future__ import annotations

import json

import boto3
import pytest
import yaml

from shardline.oncall.errors import NotFound
from shardline.oncall.tune import tune_step
from shardline.orchestration.step import plan as step_plan
from shardline.spec import parse_spec
from tests.support.cli import REPO, run
from tests.support.pipelines import parquet_bytes, plan_request, stage_step


@pytest.fixture
def staged(ledger_table, xgboost_model, tmp_path):
    inputs = {f"part-{i}.parquet": parquet_bytes(10_000, i * 10_000) for i in range(4)}
    return stage_step("tune_test", ledger_table, xgboost_model.parent, tmp_path, inputs)


def _dags(tmp_path, spec) -> str:
    folder = tmp_path / "dags"
    (folder / "pipelines").mkdir(parents=True)
    (folder / "pipelines" / f"{spec.pipeline}.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    return str(folder)


def test_tune_samples_the_latest_runs_inputs_and_prints_the_table_the_snippet_and_the_plot(staged, aws_env, tmp_path):
    spec, bucket = staged
    step_plan.plan(spec, "score", plan_request("run-1", bucket))  # the ledger now knows the step's input prefix
    out = tmp_path / "tuned"

    result = run(
        "--dags-folder",
        _dags(tmp_path, spec),
        "tune",
        "tune_test",
        "--rows",
        "20000",
        "--repeat",
        "1",
        "--max-batch-rows",
        "8192",
        "--out",
        str(out),
        env=aws_env,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout
    assert f"sample: the first 2 file(s) under s3://{bucket}/in/ (run run-1)" in text
    assert "<- best" in text and "paste into the step's entry" in text
    assert "- name: score" in text and "workers_per_instance:" in text and "batch_rows:" in text
    assert f"plot: {out / 'tune.png'}" in text
    assert "model xgboost" in text
    figures = json.loads((out / "tune.json").read_text())
    assert figures["sample"]["rows"] == 20_000
    assert all(p["median_rows_per_s"] > 0 for p in figures["points"])
    assert "tune: " in result.stderr  # the sweep's log came through as it ran


def test_the_worker_refuses_a_model_that_is_not_the_pinned_one(staged, aws_env, tmp_path):
    spec, bucket = staged
    data = spec.model_dump(mode="json")
    data["steps"][0]["model"]["sha256"] = "b" * 64
    wrong = parse_spec(data, "tune_test.yaml")

    result = tune_step(
        wrong,
        "score",
        boto3.client("s3"),
        out_dir=tmp_path / "t",
        input_prefix=f"s3://{bucket}/in/",
        rows=5000,
        extra_args=("--tune-repeat", "1", "--tune-max-batch-rows", "4096"),
    )

    assert result.exit_code == 4 and not result.ok
    assert "is pinned. Refusing to load it" in result.render()
    assert not (tmp_path / "t" / "tune.json").exists()


def test_a_step_no_run_has_planned_needs_an_input_prefix(staged, aws_env, tmp_path):
    spec, _ = staged
    with pytest.raises(NotFound, match="pass --input-prefix s3://"):
        tune_step(spec, "score", boto3.client("s3"), out_dir=tmp_path / "t", rows=5000)


def test_tune_help_and_a_prefix_that_is_no_s3_uri():
    result = run("tune", "--help")
    assert result.returncode == 0 and "usage: shardline tune" in result.stdout and "--input-prefix" in result.stdout
    bad = run(
        "--dags-folder",
        str(REPO / "dags"),
        "tune",
        "daily_churn",
        "--input-prefix",
        "data/in/",
        env={"AWS_DEFAULT_REGION": "us-east-1"},
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "shardline tune: --input-prefix must be an s3:// URI, got 'data/in/'"


def test_only_the_regular_files_the_worker_was_to_write_come_out_of_its_folder(tmp_path):
    """The worker's folder is one the model's code can write: a link there is never followed out of it."""
    from shardline.oncall.tune import _copy_regular

    secret = tmp_path / "secret"
    secret.write_text("from the caller's home")
    (tmp_path / "plot.png").write_bytes(b"PNG")
    (tmp_path / "link.png").symlink_to(secret)
    assert _copy_regular(tmp_path / "plot.png", tmp_path / "out.png") and (tmp_path / "out.png").read_bytes() == b"PNG"
    assert not _copy_regular(tmp_path / "link.png", tmp_path / "stolen.png")
    assert not (tmp_path / "stolen.png").exists()
    assert not _copy_regular(tmp_path / "plot.png", tmp_path / "big.png", limit=2)
