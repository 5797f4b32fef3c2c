"""Green means complete, right and this run's own: what a step's end checks before ``_SUCCESS``.

Each test stages a real step on moto_server and the local backend, lets its job run, then changes the world the
way a user's day does (another run of the same partition, an input replaced or landing late) and asks the
step's end (``steps.finish``) to decide.
"""

from __future__ import annotations

import json

import boto3
import pytest

from examples import synthetic
from shardline.decision.policy import Action
from shardline.ledger.keys import StepRef
from shardline.ledger.states import FileStatus
from shardline.ledger.step_reads import read_step
from shardline.orchestration import outputs, services, steps
from shardline.orchestration.step_files import read_step_files
from shardline.spec import parse_spec
from tests.support.pipelines import parquet_bytes, plan_args, stage_step, wait_for_job


@pytest.fixture
def pipeline(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return stage_step(
        "integrity",
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {f"part-{i}.parquet": parquet_bytes(300, i * 300) for i in range(4)},
    )


def keys(bucket: str, prefix: str = "out/") -> set[str]:
    return {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}


def run_job(spec, bucket: str, run_id: str, **plan_overrides):
    attempt = steps.submit(spec, steps.plan(spec, "score", run_id, **{**plan_args(bucket), **plan_overrides}))
    wait_for_job(spec, attempt)
    return attempt


def test_every_succeeded_file_records_the_sha256_s3_holds_for_its_output(pipeline):
    spec, bucket = pipeline
    run_job(spec, bucket, "run-sha")
    s3 = boto3.client("s3")
    files = read_step_files(spec, StepRef(spec.pipeline, "run-sha", "score"), file_attributes=None).files
    assert [f.status for f in files] == [FileStatus.SUCCEEDED] * 4
    for f in files:
        head = s3.head_object(Bucket=bucket, Key=f.output_key.removeprefix(f"s3://{bucket}/"), ChecksumMode="ENABLED")
        assert outputs.object_sha256(head) == f.output_sha256 and head["ContentLength"] == f.bytes_out


def test_two_runs_of_one_partition_never_vouch_for_each_other(pipeline, sklearn_model, tmp_path):
    """A manual run beside the scheduled one, with another model, writes the same output keys: the first run's
    end finds objects that are not the ones its worker uploaded and fails naming them; the second run, whose
    outputs they are, ends green. Their instances' manifests never share a key."""
    spec, bucket = pipeline
    first = run_job(spec, bucket, "run-a")
    sha = synthetic.pack(sklearn_model.parent, tmp_path / "other.tar.gz")
    boto3.client("s3").upload_file(str(tmp_path / "other.tar.gz"), bucket, "model-b/model.tar.gz")
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["model"] = {"uri": f"s3://{bucket}/model-b/model.tar.gz", "sha256": sha}
    data["steps"][0]["input"]["features"] = synthetic.feature_names()  # this model records none
    other_spec = parse_spec(data, "integrity.yaml")
    second = run_job(other_spec, bucket, "run-b", model_uri=f"s3://{bucket}/model-b/model.tar.gz")

    assert steps.finish(spec, first, "ADVANCE", "all 4 files succeeded").value == "FAILED"
    assert "out/_SUCCESS" not in keys(bucket)
    failed = read_step_files(spec, StepRef(spec.pipeline, "run-a", "score"), file_attributes=None).files
    assert {(f.status, f.error_class) for f in failed} == {(FileStatus.FAILED, outputs.UNVOUCHED_OUTPUT_ERROR)}
    assert "S3 holds" in steps.step_message(spec, first)

    assert steps.finish(other_spec, second, "ADVANCE", "all 4 files succeeded").value == "SUCCEEDED"
    marker = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert marker["run_id"] == "run-b"
    manifests = sorted(k for k in keys(bucket, "out/_shardline/instances/") if k.endswith(".json"))
    assert len(manifests) == 4 and len({k.split("/")[3] for k in manifests}) == 2, manifests  # a folder per run


def test_an_output_deleted_after_it_was_recorded_fails_the_step_naming_it(pipeline):
    spec, bucket = pipeline
    attempt = run_job(spec, bucket, "run-gone")
    boto3.client("s3").delete_object(Bucket=bucket, Key="out/part-2.parquet")
    assert steps.finish(spec, attempt, "ADVANCE", "all 4 files succeeded").value == "FAILED"
    assert "out/part-2.parquet is not in S3" in steps.step_message(spec, attempt)
    assert "out/_SUCCESS" not in keys(bucket)


@pytest.mark.parametrize("change", ["another size", "same size, other bytes"])
def test_an_input_replaced_after_planning_is_late_input_and_is_scored_again(pipeline, change):
    spec, bucket = pipeline
    attempt = run_job(spec, bucket, "run-replaced")
    s3 = boto3.client("s3")
    old = s3.get_object(Bucket=bucket, Key="in/part-1.parquet")["Body"].read()
    new = parquet_bytes(301, 300) if change == "another size" else old[:100] + bytes([old[100] ^ 1]) + old[101:]
    assert (len(new) == len(old)) is (change != "another size")
    s3.put_object(Bucket=bucket, Key="in/part-1.parquet", Body=new)

    with pytest.raises(outputs.LateInputsFound) as found:
        steps.finish(spec, attempt, "ADVANCE", "all 4 files succeeded")
    assert list(found.value.late) == [f"s3://{bucket}/in/part-1.parquet"]
    assert "out/_SUCCESS" not in keys(bucket)
    decision, sizes = outputs.late_inputs_decision(spec, attempt, late=found.value.late)
    assert decision.action is Action.RESUBMIT and decision.retry_files == (f"s3://{bucket}/in/part-1.parquet",)
    assert sizes == {f"s3://{bucket}/in/part-1.parquet": len(new)}


def test_a_file_that_lands_at_the_steps_last_look_goes_to_a_next_attempt_and_the_run_ends_green(pipeline):
    """The watch looked at the input prefix and found nothing new; a file lands before the step's end is
    recorded. The end looks once more: the step is not green without it, a next attempt scores it, and only
    then is _SUCCESS written, covering all five files."""
    spec, bucket = pipeline
    attempt = run_job(spec, bucket, "run-late")
    assert outputs.late_inputs_decision(spec, attempt) is None  # the watch's look
    boto3.client("s3").put_object(Bucket=bucket, Key="in/part-9.parquet", Body=parquet_bytes(300, 9000))

    with pytest.raises(outputs.LateInputsFound):
        steps.finish(spec, attempt, "ADVANCE", "all 4 files succeeded")
    assert "out/_SUCCESS" not in keys(bucket)
    step_item = read_step(services.ledger_model(spec), attempt.ref, files=False).step
    assert step_item.status != "SUCCEEDED"  # the step is not recorded as ended
    decision, sizes = outputs.late_inputs_decision(spec, attempt)
    assert decision.action is Action.RESUBMIT
    nxt = steps.resubmit(spec, attempt, list(decision.retry_files), sizes=sizes)
    wait_for_job(spec, nxt)
    assert steps.finish(spec, nxt, "ADVANCE", "all 5 files succeeded").value == "SUCCEEDED"
    marker = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert (marker["outputs"], marker["rows_out"], marker["attempts"]) == (5, 1500, 2)
