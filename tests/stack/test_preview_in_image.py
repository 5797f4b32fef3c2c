"""``shardline preview`` and ``shardline tune`` run the model's code in the worker image, with no network and
nothing of this machine but the sample's folder; an unpinned model, refused as a process, runs there."""

from __future__ import annotations

import io

import boto3
import numpy as np
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.oncall.tune import tune_step
from shardline.orchestration.step.preview import PreviewError, preview_step
from shardline.spec import parse_spec


@pytest.fixture
def unpinned(aws_env, ledger_table, xgboost_model, tmp_path, worker_image):
    s3 = boto3.client("s3")
    bucket = "stack-preview"
    s3.create_bucket(Bucket=bucket)
    buf = io.BytesIO()
    pq.write_table(synthetic.make_table(20_000, seed=5), buf)
    s3.put_object(Bucket=bucket, Key="in/a.parquet", Body=buf.getvalue())
    synthetic.pack(xgboost_model.parent, tmp_path / "model.tar.gz")
    s3.upload_file(str(tmp_path / "model.tar.gz"), bucket, "model/model.tar.gz")
    spec = parse_spec(
        {
            "pipeline": "stack_preview",
            "ledger_table": ledger_table,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{bucket}/model/model.tar.gz", "allow_unpinned": True},
                    "input": {"prefix": f"s3://{bucket}/in/", "passthrough": ["id"]},
                    "output": {"prefix": f"s3://{bucket}/out/"},
                }
            ],
        },
        "stack_preview.yaml",
    )
    return spec, s3, bucket


def test_preview_and_tune_run_an_unpinned_model_in_the_image_only(unpinned, tmp_path, monkeypatch):
    spec, s3, bucket = unpinned
    uris = {"model_uri": f"s3://{bucket}/model/model.tar.gz", "input_uri": f"s3://{bucket}/in/"}
    monkeypatch.setenv("SHARDLINE_LOCAL_RUNTIME", "process")
    monkeypatch.delenv("SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS")
    with pytest.raises(PreviewError, match="not pinned"):
        preview_step(spec, "score", s3, rows=50, **uris)

    monkeypatch.setenv("SHARDLINE_LOCAL_RUNTIME", "docker")
    boxed = preview_step(spec, "score", s3, rows=50, **uris)
    assert boxed.ok, boxed.render() + boxed.log
    assert "/opt/ml/sample" in boxed.log  # the worker saw the container's paths
    monkeypatch.setenv("SHARDLINE_LOCAL_RUNTIME", "process")
    monkeypatch.setenv("SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS", "1")
    here = preview_step(spec, "score", s3, rows=50, **uris)
    column = boxed.report["columns"].index("prediction")
    np.testing.assert_array_equal([r[column] for r in boxed.report["table"]], [r[column] for r in here.report["table"]])

    monkeypatch.setenv("SHARDLINE_LOCAL_RUNTIME", "docker")
    monkeypatch.delenv("SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS")
    tuned = tune_step(
        spec,
        "score",
        s3,
        out_dir=tmp_path / "tune",
        input_prefix=f"s3://{bucket}/in/",
        rows=20_000,
        extra_args=("--tune-repeat", "1", "--tune-max-batch-rows", "8192"),
    )
    assert tuned.ok, tuned.render() + tuned.log
    assert (tmp_path / "tune" / "tune.json").is_file() and tuned.figures
