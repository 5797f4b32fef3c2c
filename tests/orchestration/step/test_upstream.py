"""What a ``from_step`` step reads (orchestration/step/upstream.py): exactly the outputs its earlier step's outputs
manifest lists, never a listing of that step's prefix; and, when there is no such manifest to read, an error that
names it. The earlier step is planned and "scored" with the project's own writers on moto_server (no job runs), and
its manifest written by its own end's commit."""

from __future__ import annotations

import json

import boto3
import pytest

from shardline.ledger.states import RunStatus, StepStatus
from shardline.orchestration import run as run_records
from shardline.orchestration.step import outputs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.upstream import UpstreamError, upstream_outputs
from shardline.planning import naming
from shardline.planning.inputs import S3Object
from shardline.spec import parse_spec
from tests.support.pipelines import plan_request, stage_step
from tests.support.scoring import fail_file, output_body, score_file, unloaded_model

INPUTS = {f"part-{i}.parquet": f"input {i} ".encode() * (10 + i) for i in range(3)}


@pytest.fixture
def staged(aws_env, ledger_table, tmp_path, monkeypatch):
    """Two steps: ``score`` over three inputs, and ``calibrate`` reading score's outputs. Nothing planned yet."""
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    spec, bucket = stage_step("upstream_test", ledger_table, unloaded_model(tmp_path / "model"), tmp_path, INPUTS)
    data = spec.model_dump(mode="json", exclude_defaults=True)
    score = data["steps"][0]
    data["steps"].append(
        {
            "name": "calibrate",
            "model": score["model"],
            "input": {"from_step": "score", "passthrough": ["id"]},
            "output": {"prefix": f"s3://{bucket}/calibrated/"},
            "resources": {"instance_count": 1},
        }
    )
    return parse_spec(data, "upstream_test.yaml"), bucket


def plan_score(spec, bucket: str, run_id: str = "run-1"):
    return step_plan.plan(spec, "score", plan_request(run_id, bucket))


def committed(spec, bucket, tmp_path, run_id: str = "run-1", failed: tuple[str, ...] = ()):
    """Score's attempt 1, its files scored (those in ``failed`` FAILED), its outputs committed as its end does."""
    attempt = plan_score(spec, bucket, run_id)
    for name, body in INPUTS.items():
        if name in failed:
            fail_file(spec, attempt, name)
        else:
            score_file(spec, attempt, name, tmp_path, bytes_in=len(body))
    outputs.commit_outputs(spec, attempt, StepStatus.PARTIAL if failed else StepStatus.SUCCEEDED)
    return attempt


def read(spec, bucket: str, run_id: str = "run-1"):
    return upstream_outputs(spec, "calibrate", run_id, f"s3://{bucket}/out/")


def manifest_uri(attempt) -> str:
    return naming.outputs_manifest_key(attempt.output_prefix, attempt.run_id, attempt.step, attempt.metadata_prefix)


def put_manifest(attempt, body: bytes) -> None:
    bucket, _, key = manifest_uri(attempt).removeprefix("s3://").partition("/")
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body)


def edit_manifest(attempt, **changes) -> None:
    bucket, _, key = manifest_uri(attempt).removeprefix("s3://").partition("/")
    manifest = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    put_manifest(attempt, json.dumps({**manifest, **changes}).encode())


def test_a_from_step_step_reads_exactly_the_outputs_its_earlier_steps_manifest_lists(staged, tmp_path):
    spec, bucket = staged
    s3 = boto3.client("s3")
    # Outputs of an older run of the partition, and of an input the step no longer has: in the prefix, not committed.
    s3.put_object(Bucket=bucket, Key="out/part-7.parquet", Body=b"an older run's output")
    attempt = committed(spec, bucket, tmp_path)
    s3.put_object(Bucket=bucket, Key="out/part-8.parquet", Body=b"written after the step ended")

    found = read(spec, bucket)
    want = [S3Object(f"out/part-{i}.parquet", len(output_body(f"part-{i}.parquet"))) for i in range(3)]
    assert (found.step, found.status, found.manifest_uri) == ("score", "SUCCEEDED", manifest_uri(attempt))
    assert sorted(found.objects, key=lambda o: o.key) == want
    assert found.not_succeeded == [] and found.tolerated_text("calibrate") is None


def test_a_partial_earlier_step_gives_its_succeeded_outputs_and_names_the_inputs_it_tolerated(staged, tmp_path):
    spec, bucket = staged
    committed(spec, bucket, tmp_path, failed=("part-1.parquet",))
    found = read(spec, bucket)
    assert found.status == "PARTIAL"
    assert sorted(o.key for o in found.objects) == ["out/part-0.parquet", "out/part-2.parquet"]
    assert [(f["input"], f["status"]) for f in found.not_succeeded] == [(f"s3://{bucket}/in/part-1.parquet", "FAILED")]
    said = found.tolerated_text("calibrate")
    assert "step score ended PARTIAL with 1 input(s) failed" in said
    assert f"s3://{bucket}/in/part-1.parquet (ModelError)" in said and "step calibrate has no rows for them" in said


def test_an_earlier_step_never_planned_in_the_run_is_named(staged):
    spec, bucket = staged
    with pytest.raises(UpstreamError, match="step score was never planned in run run-1"):
        read(spec, bucket)


def test_an_earlier_step_that_has_not_committed_names_the_manifest_it_lacks(staged, tmp_path):
    """Planned, its files even scored, but its end never wrote the manifest: a listing of its prefix is not read."""
    spec, bucket = staged
    attempt = plan_score(spec, bucket)
    score_file(spec, attempt, "part-0.parquet", tmp_path, bytes_in=len(INPUTS["part-0.parquet"]))
    with pytest.raises(UpstreamError) as err:
        read(spec, bucket)
    assert f"step score has not committed its outputs (no {manifest_uri(attempt)})" in str(err.value)


def test_another_runs_manifest_is_not_read_as_this_runs(staged, tmp_path):
    """Run-2 of the same partition writes the same prefix once run-1 ended: its steps read their own manifest only."""
    spec, bucket = staged
    committed(spec, bucket, tmp_path, run_id="run-1")
    run_records.finish_run(spec, spec.pipeline, "run-1", RunStatus.SUCCEEDED)
    plan_score(spec, bucket, "run-2")
    with pytest.raises(UpstreamError, match="has not committed its outputs"):
        read(spec, bucket, "run-2")
    assert read(spec, bucket, "run-1").status == "SUCCEEDED"  # run-1's stands, under run-1's own folder


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"status": "RUNNING"}, "says step score ended RUNNING in run run-1"),
        ({"status": "FAILED"}, "says step score ended FAILED in run run-1"),
        ({"run_id": "run-0"}, "says step score ended SUCCEEDED in run run-0"),
        ({"outputs_missing": ["s3://somewhere/out/part-1.parquet"]}, "lists outputs missing from S3"),
        ({"outputs": [{"output": "s3://elsewhere/out/part-0.parquet", "bytes": 3}]}, "outside s3://"),
    ],
    ids=["running", "failed", "another run", "outputs missing", "outside the prefix"],
)
def test_a_manifest_that_vouches_for_nothing_this_step_may_read_is_refused_naming_it(staged, tmp_path, changes, said):
    spec, bucket = staged
    attempt = committed(spec, bucket, tmp_path)
    assert len(read(spec, bucket).objects) == 3  # the control: as committed, it is read
    edit_manifest(attempt, **changes)
    with pytest.raises(UpstreamError) as err:
        read(spec, bucket)
    assert said in str(err.value) and manifest_uri(attempt) in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{truncated",
        b"[]",
        b'{"status": "SUCCEEDED", "outputs": {}}',
        b'{"status": "SUCCEEDED", "run_id": "run-1", "outputs": [{"bytes": 10}]}',
        b'{"status": "SUCCEEDED", "run_id": "run-1", "outputs": [{"output": "s3://b/out/x.parquet", "bytes": "10"}]}',
        b'{"status": "SUCCEEDED", "run_id": "run-1", "outputs": [{"output": "s3://b/out/x.parquet"}]}',
    ],
    ids=["empty", "not JSON", "a list", "outputs not a list", "no output", "bytes a string", "no bytes"],
)
def test_a_manifest_that_is_not_a_json_object_is_refused_naming_it(staged, tmp_path, body):
    spec, bucket = staged
    attempt = committed(spec, bucket, tmp_path)
    put_manifest(attempt, body)
    with pytest.raises(UpstreamError) as err:
        read(spec, bucket)
    assert manifest_uri(attempt) in str(err.value)
