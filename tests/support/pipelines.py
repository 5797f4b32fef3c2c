"""Helpers for step-level tests: one staged single-step pipeline on moto_server, run by the local backend.

The bucket, inputs and model are real objects on moto_server; the spec is parsed as a DAG's would be.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import boto3
import pyarrow.parquet as pq

from examples import synthetic
from shardline.decision.policy import JobStatus
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step.plan import PlanRequest
from shardline.spec import PipelineSpec, parse_spec


def parquet_bytes(rows: int, first_id: int) -> bytes:
    """A parquet file of ``rows`` synthetic rows whose ids start at ``first_id``."""
    buf = io.BytesIO()
    pq.write_table(synthetic.make_table(rows, first_id=first_id, seed=first_id), buf)
    return buf.getvalue()


def stage_step(
    pipeline: str,
    ledger_table: str,
    model_dir: Path,
    tmp_path: Path,
    inputs: dict[str, bytes],
    features: Sequence[str] | None = None,
    step_settings: dict | None = None,
    bucket: str | None = None,
) -> tuple[PipelineSpec, str]:
    """A fresh bucket with ``inputs`` under ``in/``, the packed model, and a one-step spec over them.

    ``features``: input.features, which a model that records no feature names needs. ``step_settings``: more of
    the step's fields (``resources`` replaces the default of one instance: a test about several says so).
    ``bucket``: its name, when the test must know it first."""
    s3 = boto3.client("s3")
    bucket = bucket or f"b-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for name, body in inputs.items():
        s3.put_object(Bucket=bucket, Key=f"in/{name}", Body=body)
    tarball = tmp_path / "model.tar.gz"
    sha = synthetic.pack(model_dir, tarball)
    s3.upload_file(str(tarball), bucket, "model/model.tar.gz")
    spec = parse_spec(
        {
            "pipeline": pipeline,
            "ledger_table": ledger_table,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{bucket}/model/model.tar.gz", "sha256": sha},
                    "input": {
                        "prefix": f"s3://{bucket}/in/",
                        "passthrough": ["id"],
                        **({"features": list(features)} if features else {}),
                    },
                    "output": {"prefix": f"s3://{bucket}/out/"},
                    "resources": {"instance_count": 1},
                    **(step_settings or {}),
                }
            ],
        },
        f"{pipeline}.yaml",
    )
    return spec, bucket


def plan_request(run_id: str, bucket: str, output: str = "out", instances: int = 1, **more) -> PlanRequest:
    """What `step_plan.plan` is asked for a staged step, ``more`` overriding any field. Two runs that are to run at
    once write two ``output`` prefixes: one prefix is written by one run at a time (its partition lock). One
    instance unless the test is about several: each instance is a worker, its forkserver and a supervisor, about 2
    CPU-s."""
    fields = {
        "input_prefix": f"s3://{bucket}/in/",
        "output_prefix": f"s3://{bucket}/{output}/",
        "model_uri": f"s3://{bucket}/model/model.tar.gz",
        "instance_count": instances,
    }
    return PlanRequest(run_id, **{**fields, **more})


def wait_for_job(spec: PipelineSpec, attempt: dict, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while step_jobs.job_status(spec, attempt) is JobStatus.IN_PROGRESS:
        assert time.monotonic() < deadline, f"job {attempt.job_name} did not finish in {timeout:.0f}s"
        time.sleep(0.5)


def output_ids(bucket: str, prefix: str = "out/") -> list[int]:
    """The ``id`` column of every parquet output under ``prefix`` (markers and metadata left out)."""
    s3 = boto3.client("s3")
    ids = []
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        if item["Key"].endswith(".parquet") and "/_" not in item["Key"]:
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            ids += pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist()
    return ids
