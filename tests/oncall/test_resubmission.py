"""A resubmission (``shardline.oncall.resubmission``): which files a selection takes, and the resubmissions that are
refused with nothing submitted: a newer run writes the output prefix, or the job ran under another local root."""

from __future__ import annotations

import uuid

import boto3
import pytest

from shardline.decision.policy import Action
from shardline.ledger.keys import StepRef
from shardline.ledger.states import StepStatus
from shardline.ledger.step_writes import finish_step
from shardline.ledger.table import bind_ledger
from shardline.oncall.errors import OnCallError
from shardline.oncall.service import OnCall
from shardline.oncall.values import FileChoice, RunRef
from shardline.orchestration import run as run_records
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.files import latest_attempt
from shardline.s3uri import parse_s3_uri
from shardline.spec import parse_spec
from tests.support.pipelines import plan_request, wait_for_job


def test_a_resubmission_of_an_older_run_is_refused_while_a_newer_run_writes_its_prefix(failed_run):
    """Run 1 failed; run 2 of the same partition took the output prefix. Resubmitting run 1's failed file now would
    mix its output with run 2's: refused, naming run 2 and what to do, with nothing submitted, and run 1 stays
    FAILED. Once run 2 has ended it is still refused: the prefix holds run 2's outputs now."""
    spec, bucket, _, ref = failed_run
    oncall = OnCall({spec.pipeline: spec})
    second = step_plan.plan(spec, "score", plan_request("run-2", bucket))
    with pytest.raises(OnCallError, match=r"not resubmitted: s3://.*/out/ was written by run oncall_test/run-2"):
        oncall.resubmit(ref, "score", FileChoice(all_failed=True), ledger_only=True)
    assert latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score")).number == 1
    assert oncall.status(ref).status == "FAILED"  # not left reopened by the refused attempt
    wait_for_job(spec, step_jobs.submit(spec, second).attempt)
    step_end.finish(spec, second, Action.FAIL, "1 of 5 file(s) failed")
    run_records.finish_run(spec, spec.pipeline, "run-2", StepStatus.FAILED)
    with pytest.raises(OnCallError, match=r"was written by run oncall_test/run-2 \(step score\) after"):
        oncall.resubmit(ref, "score", FileChoice(all_failed=True), ledger_only=True)


def test_a_shard_selection_takes_the_files_its_instance_never_claimed(aws_env, ledger_table, tmp_path, monkeypatch):
    """An instance that died before claiming anything: its files are found from the manifest's deal."""
    from shardline.contract import deal as dealt

    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    s3 = boto3.client("s3")
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for i in range(7):
        s3.put_object(Bucket=bucket, Key=f"in/part-{i}.parquet", Body=b"x" * (100 + i))
    spec = parse_spec(
        {
            "pipeline": "shard_test",
            "ledger_table": ledger_table,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{bucket}/m.tar.gz", "sha256": "a" * 64},
                    "input": {"prefix": f"s3://{bucket}/in/"},
                    "output": {"prefix": f"s3://{bucket}/out/"},
                    "resources": {"instance_count": 3},
                    "sharding": "by_size",
                }
            ],
        },
        "shard_test.yaml",
    )
    attempt = step_plan.plan(
        spec,
        "score",
        step_plan.PlanRequest(
            "run-1",
            input_prefix=f"s3://{bucket}/in/",
            output_prefix=f"s3://{bucket}/out/",
            model_uri=f"s3://{bucket}/m.tar.gz",
            instance_count=3,
        ),
    )
    finish_step(bind_ledger(ledger_table), StepRef("shard_test", "run-1", "score"), 1, StepStatus.FAILED, "lost")
    body = __import__("json").loads(
        s3.get_object(Bucket=bucket, Key=parse_s3_uri(attempt.manifest_uri)[1])["Body"].read()
    )
    expected = [body[0]["prefix"] + e for e in dealt(body[1:], attempt.instance_count)[1]]  # algo-2's share
    oncall = OnCall({spec.pipeline: spec})
    chosen = oncall.plan_resubmission(RunRef("shard_test", "run-1"), "score", FileChoice(instance="algo-2")).files
    assert chosen == sorted(expected) and 2 <= len(chosen) <= 3


@pytest.mark.slow
def test_a_cli_that_looks_in_another_local_root_submits_nothing_beside_airflows_job(failed_run, tmp_path, monkeypatch):
    """The local backend's jobs live under a directory (AIRFLOW_HOME/shardline-local). A shell with another one
    would start attempt 2 beside the one Airflow's watch task starts: it is refused, and status says where to look."""
    spec, _, _, ref = failed_run
    oncall = OnCall({spec.pipeline: spec})
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "another-shell"))
    assert oncall.status(ref).steps[0].job_status == "NotFoundHere"
    with pytest.raises(OnCallError, match=r"ran, but not under .*another-shell.*nothing was submitted.*AIRFLOW_HOME"):
        oncall.resubmit(ref, "score", FileChoice(all_failed=True), ledger_only=True)
    assert latest_attempt(spec, StepRef(ref.pipeline, ref.run_id, "score")).number == 1
    assert not (tmp_path / "another-shell").exists()
