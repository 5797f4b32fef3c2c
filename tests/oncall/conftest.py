"""Fixtures the on-call tests share."""

from __future__ import annotations

import boto3
import pytest

from shardline.decision.policy import Action
from shardline.oncall.values import RunRef
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from tests.support.pipelines import parquet_bytes, plan_request, stage_step, wait_for_job


@pytest.fixture
def failed_run(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    """A finished step of 4 good files and one corrupt one, run for real by the local backend."""
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    inputs = {f"part-{i}.parquet": parquet_bytes(250, i * 250) for i in range(4)}
    inputs["part-9.parquet"] = b"PAR1 not parquet at all"
    spec, bucket = stage_step("oncall_test", ledger_table, xgboost_model.parent, tmp_path, inputs)
    s3 = boto3.client("s3")
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-1", bucket))).attempt
    wait_for_job(spec, attempt)
    step_end.finish(spec, attempt, Action.FAIL, "1 of 5 file(s) failed")
    return spec, bucket, s3, RunRef("oncall_test", "run-1")
