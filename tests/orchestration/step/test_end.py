"""A step's end against moto_server and the local backend: its outputs manifest and _SUCCESS, a partial end, a
metadata prefix."""

from __future__ import annotations

import boto3

from shardline.decision.policy import Action
from shardline.ledger.states import RunStatus
from shardline.orchestration import run as run_records
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.planning.naming import run_folder
from tests.support.pipelines import plan_request, wait_for_job


def test_a_step_that_succeeds_writes_its_outputs_manifest_and_success_marker_and_a_new_run_withdraws_it(pipeline):
    import json

    spec, bucket = pipeline
    s3 = boto3.client("s3")
    first = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-ok", bucket))).attempt
    wait_for_job(spec, first)
    assert step_end.finish(spec, first, Action.ADVANCE, "all 4 files succeeded").value == "SUCCEEDED"
    marker = json.loads(s3.get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert (marker["run_id"], marker["outputs"], marker["rows_out"]) == ("run-ok", 4, 1200)
    manifest_bucket, _, manifest_key = marker["manifest"].removeprefix("s3://").partition("/")
    manifest = json.loads(s3.get_object(Bucket=manifest_bucket, Key=manifest_key)["Body"].read())
    listed = {o["Key"]: o for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert [o["output"] for o in manifest["outputs"]] == [f"s3://{bucket}/out/part-{i}.parquet" for i in range(4)]
    for entry in manifest["outputs"]:
        stored = listed[entry["output"].removeprefix(f"s3://{bucket}/")]
        assert (entry["attempt"], entry["rows_out"], entry["bytes"], entry["etag"]) == (
            1,
            300,
            stored["Size"],
            stored["ETag"].strip('"'),
        )
    # The same prefix planned again by another run of the partition, once the first has ended: not complete any more.
    run_records.finish_run(spec, spec.pipeline, "run-ok", RunStatus.SUCCEEDED)
    step_plan.plan(spec, "score", plan_request("run-again", bucket))
    assert "out/_SUCCESS" not in {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}


def test_a_partial_step_writes_its_manifest_but_no_success_marker(pipeline):
    spec, bucket = pipeline
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="in/part-9.parquet", Body=b"PAR1 not parquet")
    first = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-partial", bucket))).attempt
    wait_for_job(spec, first)
    assert (
        step_end.finish(spec, first, Action.PARTIAL, "1 of 5 file(s) failed, within the tolerance").value == "PARTIAL"
    )
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert "out/_SUCCESS" not in keys
    assert any(k.endswith(f"/{run_folder('run-partial')}/score/outputs.json") for k in keys), keys


def test_with_a_metadata_prefix_the_data_prefix_holds_only_data_and_its_marker(pipeline, tmp_path):
    import json

    from shardline.spec import parse_spec

    spec, bucket = pipeline
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["output"]["metadata_prefix"] = f"s3://{bucket}/meta/_shardline/"
    spec = parse_spec(data, "steps_test.yaml")
    s3 = boto3.client("s3")
    first = step_jobs.submit(
        spec,
        step_plan.plan(
            spec,
            "score",
            # two instances: each instance's manifest under the metadata prefix
            plan_request("run-meta", bucket, instances=2, metadata_prefix=f"s3://{bucket}/meta/_shardline/"),
        ),
    ).attempt
    wait_for_job(spec, first)
    assert step_end.finish(spec, first, Action.ADVANCE, "all 4 files succeeded").value == "SUCCEEDED"
    data_keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"])
    assert data_keys == ["out/_SUCCESS", *(f"out/part-{i}.parquet" for i in range(4))]
    meta_keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="meta/")["Contents"]}
    assert {
        f"meta/_shardline/instances/{run_folder('run-meta')}/score/attempt-0001/manifest-algo-1.json",
        f"meta/_shardline/instances/{run_folder('run-meta')}/score/attempt-0001/manifest-algo-2.json",
        f"meta/_shardline/manifests/{run_folder('run-meta')}/score/attempt-0001.manifest",
        f"meta/_shardline/manifests/{run_folder('run-meta')}/score/outputs.json",
    } <= meta_keys, meta_keys
    marker = json.loads(s3.get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert marker["manifest"] == f"s3://{bucket}/meta/_shardline/manifests/{run_folder('run-meta')}/score/outputs.json"


def test_conclude_records_nothing_when_unreachable_fails_a_timed_out_step_and_sums_a_done_one(pipeline):
    """The watch task only defers or returns what ``conclude`` decides: an UNREACHABLE end records nothing (the
    ledger could not be reached), a TIMEOUT fails the step with how to resubmit, and a done step's summary counts
    its rows."""
    from shardline.ledger.step_reads import read_step
    from shardline.orchestration import services
    from shardline.orchestration.step import watch
    from shardline.orchestration.step.watch import StepEvent

    spec, bucket = pipeline
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-end", bucket))).attempt
    wait_for_job(spec, attempt)

    def step_status() -> str | None:
        return read_step(services.ledger_model(spec), attempt.ref, files=False).step.status

    unreachable = step_end.conclude(spec, StepEvent(Action.UNREACHABLE, "the endpoint is down", attempt))
    assert (unreachable.action, unreachable.summary, unreachable.retry) == (Action.UNREACHABLE, None, None)
    assert step_status() == "PLANNED"  # as it was: nothing recorded

    decision = watch.decide_now(spec, attempt)
    assert decision.action is Action.ADVANCE, decision
    done = step_end.conclude(spec, StepEvent.of(decision, attempt))
    assert done.action is Action.ADVANCE and done.retry is None and done.message is None
    assert (done.summary.files, done.summary.rows_in, done.summary.rows_out) == (4, 1200, 1200)
    assert step_status() == "SUCCEEDED"

    run_records.finish_run(spec, spec.pipeline, "run-end", RunStatus.SUCCEEDED)  # the partition's prefix is free
    again = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-late", bucket))).attempt
    timed_out = step_end.conclude(spec, StepEvent(Action.TIMEOUT, "ran past its deadline", again, stop_job=True))
    assert timed_out.action is Action.TIMEOUT and timed_out.summary is None and timed_out.retry is None
    step = read_step(services.ledger_model(spec), again.ref, files=False).step
    assert step.status == "FAILED" and "ran past its deadline" in step.message and "shardline resubmit" in step.message


def test_only_on_calls_take_up_ends_an_airflow_life_a_plans_own_next_attempt_does_not(pipeline):
    """A rerun's plan task (life 1) that plans the step's next attempt is no take-up: that life's failure callback
    still ends the run. An on-call resubmission after the watch task ended is: the late callback ends nothing."""
    from shardline.ledger.keys import StepRef
    from shardline.ledger.step_writes import end_life, ensure_run, set_run_status
    from shardline.orchestration import partitions, services

    spec, bucket = pipeline
    model = services.ledger_model(spec)
    for run_id, taken_up, life in (("run-rerun", False, 1), ("run-resubmitted", True, 0)):
        ref = StepRef(spec.pipeline, run_id, "score")
        ensure_run(model, spec.pipeline, run_id)
        set_run_status(model, spec.pipeline, run_id, RunStatus.RUNNING, life=life)
        partitions.hold_for_attempt(spec, ref, f"s3://{bucket}/{run_id}/", number=2, may_take=True, taken_up=taken_up)
        assert end_life(model, spec.pipeline, run_id, life, "DAG run failed") is not taken_up, run_id
