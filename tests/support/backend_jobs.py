"""A planned job on moto_server for the backends to run, and how to wait for one: shared by the backend and grant
tests (import the fixtures into a test module to use them)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
import uuid

import boto3
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.backends.local import LocalBackend
from shardline.ledger.table import bind_ledger
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import list_inputs, manifest_body, write_manifest
from shardline.planning.request import build_processing_request
from shardline.spec import parse_spec
from tests.support.records import hold_run

ROLE = "arn:aws:iam::123456789012:role/shardline"
IMAGE = "shardline-worker:cpu"
ROWS_PER_FILE = 500


def upload_model(s3, model_dir, bucket, key):
    tarball = model_dir.parent / f"{model_dir.name}-packed" / "model.tar.gz"
    sha = synthetic.pack(model_dir, tarball)
    s3.upload_file(str(tarball), bucket, key)
    return sha


@pytest.fixture
def job(aws_env, ledger_table, xgboost_model, tmp_path):
    """Six input files, a packed model and a planned attempt on moto_server; returns a request builder."""
    s3 = boto3.client("s3")
    tag = uuid.uuid4().hex[:8]  # moto_server lives for the session: each test gets its own buckets
    raw, out, models = f"raw-{tag}", f"out-{tag}", f"models-{tag}"
    for bucket in (raw, out, models):
        s3.create_bucket(Bucket=bucket)
    for i in range(6):
        buf = io.BytesIO()
        pq.write_table(synthetic.make_table(ROWS_PER_FILE, first_id=i * ROWS_PER_FILE, seed=i), buf)
        s3.put_object(Bucket=raw, Key=f"dt=2026-11-22/part-{i}.parquet", Body=buf.getvalue())
    sha = upload_model(s3, xgboost_model.parent, models, "xgb/model.tar.gz")

    def build(run_id="run-1", model_key="xgb/model.tar.gz", model_sha=sha, instances=2):
        spec = parse_spec(
            {
                "pipeline": "scoring",
                "ledger_table": ledger_table,
                "steps": [
                    {
                        "name": "score",
                        "model": {"uri": f"s3://{models}/{model_key}", "sha256": model_sha},
                        "input": {"prefix": f"s3://{raw}/dt=2026-11-22/", "passthrough": ["id"]},
                        "output": {"prefix": f"s3://{out}/{run_id}/"},
                        "resources": {"instance_count": instances},
                    }
                ],
            },
            "test.yaml",
        )
        objects = list_inputs(s3, f"s3://{raw}/dt=2026-11-22/")
        attempt = Attempt(
            pipeline="scoring",
            run_id=run_id,
            step="score",
            number=1,
            input_prefix=f"s3://{raw}/dt=2026-11-22/",
            output_prefix=f"s3://{out}/{run_id}/",
            model_uri=f"s3://{models}/{model_key}",
            requested_instances=instances,
            file_count=len(objects),
        )
        write_manifest(s3, attempt.manifest_uri, manifest_body(f"s3://{raw}/dt=2026-11-22/", [o.key for o in objects]))
        hold_run(bind_ledger(ledger_table), "scoring", run_id, "score", attempt.output_prefix)
        return build_processing_request(spec, attempt, image_uri=IMAGE, role_arn=ROLE)

    build.buckets = {"raw": raw, "out": out, "models": models}
    return build


def uploaded(bucket: str, prefix: str) -> list[str]:
    """What a job uploaded under ``prefix``: every key but the input manifest the orchestrator wrote before it ran."""
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return [o["Key"] for o in listed if "/_shardline/manifests/" not in o["Key"]]


def wait_terminal(backend, name, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = backend.describe(name)
        if state.status.is_terminal:
            return state
        time.sleep(0.3)
    raise AssertionError(f"{name} still {backend.describe(name).status} after {timeout}s")


@pytest.fixture
def local_backend(tmp_path):
    """A LocalBackend whose jobs' process groups are killed at teardown, should a test leave one running."""
    backend = LocalBackend(tmp_path / "lb")
    yield backend
    for state in (backend.root / "jobs").glob("*/state.json"):
        pid = json.loads(state.read_text()).get("pid")
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def wait_until(condition, what, timeout=120):
    """Poll until ``condition()`` holds; the timeout only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {timeout}s")
        time.sleep(0.1)
    return result
