"""Green means complete, right and this run's own: what a step's end checks before ``_SUCCESS``.

Each test stages a real step on moto_server and the local backend, lets its job run, then changes the world the
way a user's day does (another run of the same partition, an input replaced or landing late) and asks the
step's end (``step_end.finish``) to decide.
"""

from __future__ import annotations

import json

import boto3
import pytest

from examples import synthetic
from shardline.decision.policy import Action
from shardline.ledger.keys import StepRef
from shardline.ledger.partitions import read_holder
from shardline.ledger.states import FileStatus, StepStatus
from shardline.ledger.step_reads import read_step
from shardline.orchestration import partitions, services
from shardline.orchestration import run as run_records
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import outputs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.files import read_step_files
from shardline.spec import parse_spec
from tests.support.pipelines import parquet_bytes, plan_request, stage_step, wait_for_job


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
    attempt = step_jobs.submit(
        spec, step_plan.plan(spec, "score", plan_request(run_id, bucket, **plan_overrides))
    ).attempt
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


def other_model_spec(spec, bucket: str, sklearn_model, tmp_path):
    """The same step with another model (a manual run beside the scheduled one, say)."""
    sha = synthetic.pack(sklearn_model.parent, tmp_path / "other.tar.gz")
    boto3.client("s3").upload_file(str(tmp_path / "other.tar.gz"), bucket, "model-b/model.tar.gz")
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["model"] = {"uri": f"s3://{bucket}/model-b/model.tar.gz", "sha256": sha}
    data["steps"][0]["input"]["features"] = synthetic.feature_names()  # this model records none
    return parse_spec(data, "integrity.yaml")


def test_two_runs_of_one_partition_take_turns_and_each_vouches_only_for_its_own(pipeline, sklearn_model, tmp_path):
    """A second run of the partition (another model) is refused the output prefix while the first holds it, and
    writes nothing; once the first has ended green it plans, withdraws the first's _SUCCESS before writing, and
    ends green with its own. Their instances' manifests never share a key."""
    spec, bucket = pipeline
    other_spec = other_model_spec(spec, bucket, sklearn_model, tmp_path)
    first = run_job(spec, bucket, "run-a", instance_count=2)  # several instances' manifests, each run's own

    with pytest.raises(partitions.PartitionHeld) as held:
        step_plan.plan(
            other_spec, "score", plan_request("run-b", bucket, model_uri=f"s3://{bucket}/model-b/model.tar.gz")
        )
    assert held.value.holder.run_id == "run-a" and held.value.output_prefix == f"s3://{bucket}/out/"
    assert read_step(services.ledger_model(spec), StepRef(spec.pipeline, "run-b", "score"), files=False).step is None

    assert step_end.finish(spec, first, Action.ADVANCE, "all 4 files succeeded").value == "SUCCEEDED"
    run_records.finish_run(spec, spec.pipeline, "run-a", StepStatus.SUCCEEDED)
    assert read_holder(services.ledger_model(spec), f"s3://{bucket}/out/").released  # at the run's end

    second = step_plan.plan(
        other_spec, "score", plan_request("run-b", bucket, instances=2, model_uri=f"s3://{bucket}/model-b/model.tar.gz")
    )
    assert "out/_SUCCESS" not in keys(bucket)  # the prefix is being written again: not complete
    second = step_jobs.submit(other_spec, second).attempt
    wait_for_job(other_spec, second)
    assert step_end.finish(other_spec, second, Action.ADVANCE, "all 4 files succeeded").value == "SUCCEEDED"
    marker = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert marker["run_id"] == "run-b"
    manifests = sorted(
        k for k in keys(bucket, "out/_shardline/instances/") if k.rsplit("/", 1)[-1].startswith("manifest-")
    )
    assert len(manifests) == 4 and len({k.split("/")[3] for k in manifests}) == 2, manifests  # a folder per run


def test_a_run_whose_hold_ran_out_is_taken_over_and_marks_nothing_complete(
    pipeline, sklearn_model, tmp_path, monkeypatch
):
    """A run whose Airflow side went away stops renewing its hold; once the lease runs out the next run of the
    partition takes the prefix over (fenced). The old run's end then fails, naming the new holder, and writes no
    _SUCCESS; the new run's is the partition's."""
    spec, bucket = pipeline
    other_spec = other_model_spec(spec, bucket, sklearn_model, tmp_path)
    monkeypatch.setenv(partitions.LEASE_ENV, "-1")  # every hold taken now has run out already
    first = run_job(spec, bucket, "run-a")
    monkeypatch.delenv(partitions.LEASE_ENV)
    second = run_job(other_spec, bucket, "run-b", model_uri=f"s3://{bucket}/model-b/model.tar.gz")
    holder = read_holder(services.ledger_model(spec), f"s3://{bucket}/out/")
    assert (holder.run_id, holder.fence) == ("run-b", 2)

    assert step_end.finish(spec, first, Action.ADVANCE, "all 4 files succeeded").value == "FAILED"
    assert "no longer holds the lock" in step_end.step_message(spec, first)
    assert "run integrity/run-b (step score) holds it now" in step_end.step_message(spec, first)
    assert "shardline resubmit" not in step_end.step_message(spec, first)  # it would be refused: run-b writes there
    assert "out/_SUCCESS" not in keys(bucket)
    with pytest.raises(partitions.PartitionLost, match="run integrity/run-b"):
        partitions.keep(spec, first)
    assert step_end.finish(other_spec, second, Action.ADVANCE, "all 4 files succeeded").value == "SUCCEEDED"
    marker = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert marker["run_id"] == "run-b"


@pytest.mark.parametrize("change", ["deleted", "replaced by another writer"])
def test_an_output_changed_after_it_was_recorded_fails_the_step_naming_it(pipeline, change):
    """The check before _SUCCESS compares each object with the ledger's size and sha256: an object another writer
    put at the output's key (same size, other bytes) is not this run's."""
    spec, bucket = pipeline
    attempt = run_job(spec, bucket, "run-changed")
    s3 = boto3.client("s3")
    if change == "deleted":
        s3.delete_object(Bucket=bucket, Key="out/part-2.parquet")
    else:
        body = s3.get_object(Bucket=bucket, Key="out/part-2.parquet")["Body"].read()
        s3.put_object(Bucket=bucket, Key="out/part-2.parquet", Body=body[:-1] + bytes([body[-1] ^ 1]))
    assert step_end.finish(spec, attempt, Action.ADVANCE, "all 4 files succeeded").value == "FAILED"
    said = "out/part-2.parquet is not in S3" if change == "deleted" else "S3 holds"
    assert said in step_end.step_message(spec, attempt)
    assert "out/_SUCCESS" not in keys(bucket)
    failed = read_step_files(spec, attempt.ref, file_attributes=None).files
    assert {f.error_class for f in failed if f.status is FileStatus.FAILED} == {outputs.UNVOUCHED_OUTPUT_ERROR}


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
        step_end.finish(spec, attempt, Action.ADVANCE, "all 4 files succeeded")
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
        step_end.finish(spec, attempt, Action.ADVANCE, "all 4 files succeeded")
    assert "out/_SUCCESS" not in keys(bucket)
    step_item = read_step(services.ledger_model(spec), attempt.ref, files=False).step
    assert step_item.status != "SUCCEEDED"  # the step is not recorded as ended
    decision, sizes = outputs.late_inputs_decision(spec, attempt)
    assert decision.action is Action.RESUBMIT
    nxt = step_jobs.resubmit(spec, attempt, list(decision.retry_files), sizes=sizes).attempt
    wait_for_job(spec, nxt)
    assert step_end.finish(spec, nxt, Action.ADVANCE, "all 5 files succeeded").value == "SUCCEEDED"
    marker = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert (marker["outputs"], marker["rows_out"], marker["attempts"]) == (5, 1500, 2)
