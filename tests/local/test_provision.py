"""What `shardline local up` creates for the shipped specs: tables, buckets, and the demo models they pin.

A model is seeded only where a spec pins the digest of a shipped demo model, so the stack never chooses
the code a pipeline runs; and the shipped pins are the shipped models, so neither can drift.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest
import yaml

from examples import synthetic
from shardline.local.provision import apply, ensure_bucket, make_plan, pinned_models, seed_index
from shardline.spec import load_spec, parse_spec
from tests.support.helpers import SYNTHETIC_COLUMNS, describe, run_worker

REPO = Path(__file__).resolve().parents[2]
PIPELINES = REPO / "dags" / "pipelines"


def test_every_model_a_shipped_spec_names_is_pinned_to_a_shipped_demo_model():
    seeds = seed_index()
    for path in sorted(PIPELINES.glob("*.yaml")):
        spec = load_spec(path)
        assert not any(s.model.allow_unpinned for s in spec.steps), f"{path.name} runs an unpinned model"
        pins = pinned_models(spec)
        assert len(pins) == len(spec.steps), (path.name, pins)
        for uri, digest in pins:
            assert digest in seeds, f"{path.name}: {uri} is pinned to {digest}, which no shipped demo model has"
    planned = {uri for uri, _ in make_plan(PIPELINES).models}
    assert planned == {
        "s3://shardline-demo/models/xgboost/v1/model.tar.gz",
        "s3://shardline-demo/models/sklearn/v1/model.tar.gz",
        "s3://shardline-demo/models/calibration/v1/model.tar.gz",
    }


def test_the_calibration_model_is_what_the_examples_pack_byte_for_byte(tmp_path):
    digest = synthetic.pack(synthetic.calibration_model(tmp_path / "calibration"), tmp_path / "c.tar.gz")
    assert seed_index()[digest].name == "calibration-v1.tar.gz"


def test_an_unpinned_model_or_one_pinned_elsewhere_is_never_seeded(tmp_path):
    folder = tmp_path / "pipelines"
    folder.mkdir()
    base = {
        "pipeline": "p",
        "steps": [{"name": "score", "input": {"prefix": "s3://b/in/"}, "output": {"prefix": "s3://b/out/"}}],
    }
    specs = {
        "unpinned": {"uri": "s3://b/models/xgboost/v1/model.tar.gz", "allow_unpinned": True},
        "elsewhere": {"uri": "s3://b/models/xgboost/v1/model.tar.gz", "sha256": "0" * 64},
    }
    for name, model in specs.items():
        data = {**base, "pipeline": name, "steps": [{**base["steps"][0], "model": model}]}
        parse_spec(data, name)  # a valid spec
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(data))
    assert make_plan(folder).models == ()


@pytest.mark.parametrize(("pipeline", "kind"), [("tabular_scoring_hourly", "xgboost"), ("daily_churn", "sklearn")])
def test_local_up_uploads_each_pinned_demo_model_once_and_it_scores_under_its_pin(aws_env, tmp_path, pipeline, kind):
    bucket = "shardline-demo"
    folder = tmp_path / "pipelines"
    folder.mkdir()
    shutil.copy(PIPELINES / f"{pipeline}.yaml", folder)
    plan = make_plan(folder)
    s3 = boto3.client("s3")
    key = f"models/{kind}/v1/model.tar.gz"
    ensure_bucket(s3, bucket, "us-east-1")
    s3.delete_object(Bucket=bucket, Key=key)  # another test's model may be there: start from none
    said = apply(plan)
    assert f"model s3://{bucket}/{key}: uploaded the demo model {kind}-v1.tar.gz" in said, said
    assert f"model s3://{bucket}/{key}: exists" in apply(plan)  # kept as it is

    # The uploaded model is the one the spec pins, and it scores: the worker refuses any other digest.
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    s3.download_file(bucket, key, str(model_dir / "model.tar.gz"))
    [(_, digest)] = pinned_models(load_spec(folder / f"{pipeline}.yaml"))[:1]
    inputs = synthetic.make_dataset(tmp_path / "in", files=1, rows=500)[0].parent
    result = run_worker(inputs, tmp_path / "out", model_dir, *SYNTHETIC_COLUMNS, "--model-sha256", digest)
    assert result.returncode == 0, describe(result)
    [output] = [p for p in (tmp_path / "out").rglob("*.parquet")]
    assert pq.read_table(output).num_rows == 500


def test_a_model_already_there_is_kept_but_one_that_is_not_the_pinned_one_is_named(aws_env, tmp_path):
    folder = tmp_path / "pipelines"
    folder.mkdir()
    shutil.copy(PIPELINES / "tabular_scoring_hourly.yaml", folder)
    s3 = boto3.client("s3")
    ensure_bucket(s3, "shardline-demo", "us-east-1")
    key = "models/xgboost/v1/model.tar.gz"
    s3.put_object(Bucket="shardline-demo", Key=key, Body=b"an older demo model, trained on this machine")
    [line] = [x for x in apply(make_plan(folder)) if x.startswith("model ")]
    assert "exists, but is not the model the spec pins" in line and "delete it" in line, line
    assert s3.get_object(Bucket="shardline-demo", Key=key)["Body"].read().startswith(b"an older")  # not overwritten
    s3.delete_object(Bucket="shardline-demo", Key=key)
