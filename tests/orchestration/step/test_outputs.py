"""What a step's end vouches for before ``_SUCCESS`` (orchestration/step/outputs.py), with no job run.

A step is planned with the project's own planner on moto_server, and each of its files is "scored" the way an
instance scores one: its output uploaded by the worker's own uploader (S3 keeps its SHA-256 checksum) and its FILE
item claimed and finished by the worker's own ledger writer. Then the world is changed the way a user's day does
(an object replaced or deleted, an input landing late) and the end's checks are asked.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json

import boto3
import pytest

from shardline import contract
from shardline.decision.policy import LATE_INPUT_ERROR, Action
from shardline.ledger.states import FileStatus, StepStatus
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import outputs, watch
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.files import read_step_files
from shardline.planning import naming
from tests.support.pipelines import plan_request, stage_step
from tests.support.scoring import fail_file, output_body, score_file, unloaded_model, upload_output

INPUTS = {f"part-{i}.parquet": f"input {i} ".encode() * (10 + i) for i in range(3)}


@pytest.fixture
def staged(aws_env, ledger_table, tmp_path, monkeypatch):
    """A one-step pipeline over three inputs, planned (attempt 1), no job submitted. The model is never loaded."""
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    spec, bucket = stage_step("outputs_test", ledger_table, unloaded_model(tmp_path / "model"), tmp_path, INPUTS)
    attempt = step_plan.plan(spec, "score", plan_request("run-1", bucket))
    return spec, bucket, attempt


def score(spec, attempt, name: str, tmp_path, **recorded) -> None:
    score_file(spec, attempt, name, tmp_path, bytes_in=len(INPUTS[name]), **recorded)


def score_all(spec, attempt, tmp_path) -> None:
    for name in INPUTS:
        score(spec, attempt, name, tmp_path)


def keys(bucket: str, prefix: str = "out/") -> set[str]:
    return {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}


def stored_manifest(bucket: str, attempt) -> dict:
    uri = naming.outputs_manifest_key(attempt.output_prefix, attempt.run_id, attempt.step, attempt.metadata_prefix)
    return json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=uri.split("/", 3)[3])["Body"].read())


def marker(bucket: str) -> dict:
    return json.loads(boto3.client("s3").get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())


# -- vouching ---------------------------------------------------------------------------------------------------


def test_outputs_the_worker_uploaded_and_recorded_are_vouched_for_and_the_end_writes_success(staged, tmp_path):
    """The control for the refusals below: the same staging, untouched, ends green with a marker of this run."""
    spec, bucket, attempt = staged
    score_all(spec, attempt, tmp_path)
    assert outputs.unvouched_outputs(spec, attempt) == []
    assert step_end.finish(spec, attempt, Action.ADVANCE, "all 3 files succeeded") is StepStatus.SUCCEEDED
    found = marker(bucket)
    assert (found["run_id"], found["step"], found["attempts"], found["outputs"], found["rows_out"]) == (
        "run-1",
        "score",
        1,
        3,
        21,
    )


def replace_with_same_size(spec, attempt, bucket, tmp_path):
    """Another writer puts other bytes of the same size at part-1's output key (with S3's checksum of its own)."""
    old = output_body("part-1.parquet")
    upload_output(attempt, "part-1.parquet", bytes([old[0] ^ 1]) + old[1:], tmp_path / "other-writer")


CHANGES = {
    # The ledger item says another size than S3 holds.
    "size recorded otherwise": ({"bytes_out": len(output_body("part-1.parquet")) + 1}, None, "bytes and S3 holds"),
    # The ledger item says another sha256 than S3's checksum of the object.
    "sha256 recorded otherwise": ({"sha256": hashlib.sha256(b"other").hexdigest()}, None, "S3 holds another object"),
    # The object was replaced after it was recorded: same size, other bytes.
    "object replaced": ({}, replace_with_same_size, "S3 holds another object"),
    # The object is gone.
    "object deleted": (
        {},
        lambda spec, attempt, bucket, tmp_path: boto3.client("s3").delete_object(
            Bucket=bucket, Key="out/part-1.parquet"
        ),
        "out/part-1.parquet is not in S3",
    ),
    # The ledger names an output outside the step's prefix.
    "output outside the prefix": ({"output_key": "s3://elsewhere/out/part-1.parquet"}, None, "is not under"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_an_output_the_ledger_and_s3_disagree_on_is_unvouched(staged, tmp_path, change):
    spec, bucket, attempt = staged
    recorded, after, said = CHANGES[change]
    for name in INPUTS:
        score(spec, attempt, name, tmp_path, **(recorded if name == "part-1.parquet" else {}))
    if after is not None:
        after(spec, attempt, bucket, tmp_path)

    unvouched = outputs.unvouched_outputs(spec, attempt)
    assert [(u.input_key, u.attempt) for u in unvouched] == [(f"s3://{bucket}/in/part-1.parquet", 1)], unvouched
    assert said in unvouched[0].reason, unvouched[0].reason


@pytest.mark.parametrize("change", ["sha256 recorded otherwise", "object deleted"])
def test_an_end_that_finds_an_unvouched_output_fails_the_step_and_writes_no_success(staged, tmp_path, change):
    """What the step's end makes of it (the report it renders each time is the cost: two of the changes above)."""
    spec, bucket, attempt = staged
    recorded, after, said = CHANGES[change]
    for name in INPUTS:
        score(spec, attempt, name, tmp_path, **(recorded if name == "part-1.parquet" else {}))
    if after is not None:
        after(spec, attempt, bucket, tmp_path)

    assert step_end.finish(spec, attempt, Action.ADVANCE, "all 3 files succeeded") is StepStatus.FAILED
    assert said in step_end.step_message(spec, attempt)
    assert "out/_SUCCESS" not in keys(bucket)
    files = {f.input_key: f for f in read_step_files(spec, attempt.ref, file_attributes=None).files}
    assert files[f"s3://{bucket}/in/part-1.parquet"].status is FileStatus.FAILED
    assert files[f"s3://{bucket}/in/part-1.parquet"].error_class == outputs.UNVOUCHED_OUTPUT_ERROR
    assert [files[f"s3://{bucket}/in/part-{i}.parquet"].status for i in (0, 2)] == [FileStatus.SUCCEEDED] * 2


def test_one_output_recorded_for_two_inputs_vouches_for_neither(staged, tmp_path):
    spec, bucket, attempt = staged
    score(spec, attempt, "part-0.parquet", tmp_path)
    # part-1's item names part-0's output (and its size and sha256): not a worker's record.
    body = output_body("part-0.parquet")
    score(spec, attempt, "part-1.parquet", tmp_path, body=body, output_key=f"s3://{bucket}/out/part-0.parquet")
    score(spec, attempt, "part-2.parquet", tmp_path)
    unvouched = outputs.unvouched_outputs(spec, attempt)
    assert sorted(u.input_key for u in unvouched) == [f"s3://{bucket}/in/part-{i}.parquet" for i in (0, 1)]
    assert all("is recorded for 2 inputs" in u.reason for u in unvouched), unvouched


def test_commit_writes_no_marker_while_an_output_the_ledger_records_is_missing(staged, tmp_path):
    """commit_outputs itself never marks a prefix complete whose recorded outputs S3 lacks (an end whose check was
    skipped): the manifest names the missing output."""
    spec, bucket, attempt = staged
    score_all(spec, attempt, tmp_path)
    boto3.client("s3").delete_object(Bucket=bucket, Key="out/part-2.parquet")
    manifest = outputs.commit_outputs(spec, attempt, StepStatus.SUCCEEDED)
    assert manifest["outputs_missing"] == [f"s3://{bucket}/out/part-2.parquet"]
    assert stored_manifest(bucket, attempt)["outputs_missing"] == manifest["outputs_missing"]
    assert "out/_SUCCESS" not in keys(bucket)


# -- the sha256 an object's HEAD gives -------------------------------------------------------------------------


def test_object_sha256_reads_s3s_full_object_checksum_else_the_uploaders_metadata():
    digest = hashlib.sha256(b"body").digest()
    checksum = base64.b64encode(digest).decode()
    meta = {"Metadata": {contract.OUTPUT_SHA256_METADATA: "ab" * 32}}
    assert outputs.object_sha256({"ChecksumSHA256": checksum}) == digest.hex()
    assert outputs.object_sha256({"ChecksumSHA256": checksum, "ChecksumType": "FULL_OBJECT", **meta}) == digest.hex()
    # A multipart object's checksum is of its parts: the uploader's own digest is the object's.
    assert outputs.object_sha256({"ChecksumSHA256": f"{checksum}-3", **meta}) == "ab" * 32
    assert outputs.object_sha256({"ChecksumSHA256": checksum, "ChecksumType": "COMPOSITE", **meta}) == "ab" * 32
    assert outputs.object_sha256({}) is None
    assert outputs.object_sha256({"ChecksumSHA256": "not base64!"}) is None


# -- the outputs manifest -------------------------------------------------------------------------------------


def test_the_outputs_manifest_lists_exactly_the_succeeded_outputs_and_a_partial_step_writes_no_marker(staged, tmp_path):
    spec, bucket, attempt = staged
    score(spec, attempt, "part-0.parquet", tmp_path)
    score(spec, attempt, "part-2.parquet", tmp_path)
    fail_file(spec, attempt, "part-1.parquet")

    manifest = outputs.commit_outputs(spec, attempt, StepStatus.PARTIAL)
    assert manifest == stored_manifest(bucket, attempt)
    listed = {o["Key"]: o for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="out/part-")["Contents"]}
    assert [(o["input"], o["output"]) for o in manifest["outputs"]] == [
        (f"s3://{bucket}/in/part-{i}.parquet", f"s3://{bucket}/out/part-{i}.parquet") for i in (0, 2)
    ]
    for entry in manifest["outputs"]:
        stored = listed[entry["output"].removeprefix(f"s3://{bucket}/")]
        name = entry["input"].rsplit("/", 1)[1]
        assert (entry["attempt"], entry["rows_out"], entry["bytes"], entry["etag"], entry["sha256"]) == (
            1,
            7,
            stored["Size"],
            stored["ETag"].strip('"'),
            hashlib.sha256(output_body(name)).hexdigest(),
        )
    assert manifest["not_succeeded"] == [
        {"input": f"s3://{bucket}/in/part-1.parquet", "status": "FAILED", "attempt": 1, "error_class": "ModelError"}
    ]
    assert (manifest["status"], manifest["files"], manifest["rows_out"], manifest["outputs_missing"]) == (
        "PARTIAL",
        3,
        14,
        [],
    )
    assert "out/_SUCCESS" not in keys(bucket)


# -- the last look for inputs that landed or changed ----------------------------------------------------------


def test_no_late_inputs_while_the_prefix_holds_what_was_scored(staged, tmp_path):
    spec, _bucket, attempt = staged
    score_all(spec, attempt, tmp_path)
    assert outputs.late_inputs(spec, attempt) == {}
    assert outputs.late_inputs_decision(spec, attempt) is None


def test_an_input_that_landed_after_planning_goes_to_a_next_attempt(staged, tmp_path):
    spec, bucket, attempt = staged
    score_all(spec, attempt, tmp_path)
    boto3.client("s3").put_object(Bucket=bucket, Key="in/part-9.parquet", Body=b"late" * 5)
    decision, sizes = outputs.late_inputs_decision(spec, attempt)
    late = f"s3://{bucket}/in/part-9.parquet"
    assert decision.action is Action.RESUBMIT and decision.retry_files == (late,)
    assert sizes == {late: 20}


@pytest.mark.parametrize("change", ["same size, other bytes", "another size"])
def test_an_input_replaced_after_it_was_scored_goes_to_a_next_attempt(staged, tmp_path, change):
    spec, bucket, attempt = staged
    score_all(spec, attempt, tmp_path)
    old = INPUTS["part-1.parquet"]
    new = bytes([old[0] ^ 1]) + old[1:] if change == "same size, other bytes" else old + b"more"
    boto3.client("s3").put_object(Bucket=bucket, Key="in/part-1.parquet", Body=new)
    decision, sizes = outputs.late_inputs_decision(spec, attempt)
    replaced = f"s3://{bucket}/in/part-1.parquet"
    assert decision.action is Action.RESUBMIT and decision.retry_files == (replaced,)
    assert sizes == {replaced: len(new)}


def test_late_inputs_after_the_last_attempt_are_recorded_failed(staged, tmp_path):
    spec, bucket, attempt = staged
    score_all(spec, attempt, tmp_path)
    boto3.client("s3").put_object(Bucket=bucket, Key="in/part-9.parquet", Body=b"late")
    last = dataclasses.replace(watch.policy_for(spec, "score"), max_attempts=1)
    decision, _sizes = outputs.late_inputs_decision(spec, attempt, last)
    assert decision.action is Action.FAIL
    files = {f.input_key: f for f in read_step_files(spec, attempt.ref, file_attributes=None).files}
    late = files[f"s3://{bucket}/in/part-9.parquet"]
    assert (late.status, late.error_class, late.attempt) == (FileStatus.FAILED, LATE_INPUT_ERROR, 1)


def test_an_input_landing_between_the_last_look_and_the_marker_withdraws_it(staged, tmp_path):
    """commit_outputs lists the inputs once more after writing _SUCCESS: a file that landed since ``look`` takes the
    marker back, and the manifest no longer says the step ended."""
    spec, bucket, attempt = staged
    score_all(spec, attempt, tmp_path)
    look = outputs.look_at_inputs(spec, attempt)
    assert look is not None and look.late == {}
    boto3.client("s3").put_object(Bucket=bucket, Key="in/part-9.parquet", Body=b"late")
    with pytest.raises(outputs.LateInputsFound) as found:
        outputs.commit_outputs(spec, attempt, StepStatus.SUCCEEDED, look=look)
    assert list(found.value.late) == [f"s3://{bucket}/in/part-9.parquet"]
    assert "out/_SUCCESS" not in keys(bucket)
    manifest = stored_manifest(bucket, attempt)
    assert manifest["status"] == "RUNNING"
    assert manifest["landed_after_last_look"] == [f"s3://{bucket}/in/part-9.parquet"]


# -- withdrawing a marker ---------------------------------------------------------------------------------------


def test_withdraw_own_marker_removes_only_the_marker_its_own_attempt_wrote(staged, tmp_path):
    spec, bucket, attempt = staged
    score_all(spec, attempt, tmp_path)
    outputs.commit_outputs(spec, attempt, StepStatus.SUCCEEDED)
    assert outputs.success_marker_of(spec, attempt.output_prefix)["run_id"] == "run-1"

    others = [
        attempt.model_copy(update={"number": 2}),  # a later attempt of the same step
        attempt.model_copy(update={"run_id": "run-2"}),  # another run of the partition
        attempt.model_copy(update={"step": "calibrate"}),  # another step
    ]
    for other in others:
        assert outputs.withdraw_own_marker(spec, other) is False, other
        assert "out/_SUCCESS" in keys(bucket)

    assert outputs.withdraw_own_marker(spec, attempt) is True
    assert "out/_SUCCESS" not in keys(bucket)
    assert outputs.success_marker_of(spec, attempt.output_prefix) is None
    assert outputs.withdraw_own_marker(spec, attempt) is False  # nothing left to withdraw


def test_a_marker_that_is_not_json_is_no_attempts_and_is_not_withdrawn(staged):
    spec, bucket, attempt = staged
    boto3.client("s3").put_object(Bucket=bucket, Key="out/_SUCCESS", Body=b"")  # a bare marker, by hand or a tool
    assert outputs.success_marker_of(spec, attempt.output_prefix) == {}
    assert outputs.withdraw_own_marker(spec, attempt) is False
    assert "out/_SUCCESS" in keys(bucket)
