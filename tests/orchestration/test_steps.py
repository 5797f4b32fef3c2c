"""Step functions against moto_server and the local backend: plan, submit twice (a cleared task), report."""

from __future__ import annotations

import boto3
import pytest

from shardline.decision.policy import JobStatus
from shardline.ledger.keys import StepRef
from shardline.ledger.states import StepStatus
from shardline.orchestration import steps, watch
from shardline.planning.attempt import Attempt
from shardline.planning.naming import run_folder
from tests.support.pipelines import parquet_bytes, plan_args, stage_step, wait_for_job


@pytest.fixture
def pipeline(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return stage_step(
        "steps_test",
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {f"part-{i}.parquet": parquet_bytes(300, i * 300) for i in range(4)},
    )


def test_a_cleared_submit_adopts_the_running_job(pipeline, tmp_path):
    spec, bucket = pipeline
    attempt = steps.plan(spec, "score", "run-1", **plan_args(bucket))
    first = steps.submit(spec, attempt)
    again = steps.submit(spec, attempt)  # what a cleared or retried submit task does
    assert again.job_name == first.job_name
    jobs = list((tmp_path / "local" / "jobs").glob("sl-*"))
    assert [j.name for j in jobs] == [first.job_name]  # one job, no twin
    steps.stop(spec, first)  # leave nothing running behind the test
    assert steps.job_status(spec, first) is JobStatus.STOPPED


def test_plan_skips_an_empty_prefix(pipeline):
    spec, bucket = pipeline
    assert (
        steps.plan(
            spec,
            "score",
            "run-2",
            input_prefix=f"s3://{bucket}/nothing/",
            output_prefix=f"s3://{bucket}/out/",
            model_uri="s3://x/y",
            instance_count=2,
        )
        is None
    )


def test_a_retried_watch_resumes_at_the_newest_attempt(pipeline, tmp_path):
    spec, bucket = pipeline
    first = steps.submit(spec, steps.plan(spec, "score", "run-3", **plan_args(bucket)))
    steps.stop(spec, first)
    second = steps.resubmit(spec, first, [f"s3://{bucket}/in/part-1.parquet"])
    resumed = steps.resume(spec, first)  # what the watch task's next try knows: attempt 1
    assert (resumed.number, resumed.job_name) == (2, second.job_name)
    assert steps.resume(spec, second) == second
    steps.stop(spec, second)
    assert sorted(j.name for j in (tmp_path / "local" / "jobs").glob("sl-*")) == sorted(
        [first.job_name, second.job_name]
    )  # adopted, not submitted twice


def test_planning_again_takes_only_what_has_not_succeeded(pipeline):
    """A plan task that runs again (retried, or cleared after an upstream resubmission) never starts over."""
    spec, bucket = pipeline
    kwargs = plan_args(bucket)
    first = steps.plan(spec, "score", "run-3", **kwargs)
    assert steps.plan(spec, "score", "run-3", **kwargs).number == 1  # never submitted: the same attempt again
    wait_for_job(spec, steps.submit(spec, first))
    again = steps.plan(spec, "score", "run-3", **kwargs)
    assert (again.number, again.file_count) == (1, 4)  # everything succeeded: adopt it
    assert steps.job_status(spec, steps.submit(spec, again)) is JobStatus.COMPLETED  # no new job

    boto3.client("s3").put_object(Bucket=bucket, Key="in/part-late.parquet", Body=parquet_bytes(300, 9000))
    late = steps.plan(spec, "score", "run-3", **kwargs)
    assert (late.number, late.file_count) == (2, 1)  # only the new input, as the next attempt
    wait_for_job(spec, steps.submit(spec, late))
    summary = steps.report(spec, StepRef(spec.pipeline, "run-3", "score"))
    assert (summary["files"], summary["succeeded"], summary["rows_in"], summary["rows_out"]) == (5, 5, 1500, 1500)


def _output_ids(bucket: str) -> list[int]:
    import io

    import pyarrow.parquet as pq

    s3 = boto3.client("s3")
    ids = []
    for item in s3.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", []):
        if item["Key"].endswith(".parquet") and "/_" not in item["Key"]:
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            ids += pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist()
    return ids


def test_fencing_two_resubmissions_at_once_start_one_attempt_and_write_every_row_once(pipeline):
    """Two on-call engineers (or an engineer and the watch task) resubmit the same failed step at the same moment."""
    import threading

    from shardline.ledger.step_writes import StaleOrchestratorError

    spec, bucket = pipeline
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="in/part-9.parquet", Body=b"PAR1 truncated upload")
    first = steps.submit(spec, steps.plan(spec, "score", "run-race", **plan_args(bucket)))
    wait_for_job(spec, first, timeout=600)
    decision = watch.decide_now(spec, first)
    assert decision.action.value == "FAIL", decision  # the corrupt file failed the step
    s3.put_object(Bucket=bucket, Key="in/part-9.parquet", Body=parquet_bytes(300, 9 * 300))  # fixed
    failed = [f"s3://{bucket}/in/part-9.parquet"]
    start, results = threading.Barrier(2), []

    def resubmit(by_oncall: bool) -> None:
        start.wait()
        try:
            results.append(steps.resubmit(spec, first, failed, by_oncall=by_oncall))
        except StaleOrchestratorError as err:
            results.append(err)

    # The watch's own retry and an on-call engineer's forced resubmission, both from attempt 1.
    racers = [threading.Thread(target=resubmit, args=(by_oncall,)) for by_oncall in (False, True)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    won = [r for r in results if isinstance(r, Attempt)]
    lost = [r for r in results if isinstance(r, StaleOrchestratorError)]
    assert len(won) == 1 and len(lost) == 1, results
    assert won[0].number == 2
    wait_for_job(spec, won[0], timeout=600)
    decision = watch.decide_now(spec, won[0])
    assert decision.action.value == "ADVANCE", decision
    ids = _output_ids(bucket)
    assert sorted(ids) == list(range(4 * 300)) + list(range(9 * 300, 10 * 300)), len(ids)  # every row once
    summary = steps.report(spec, StepRef(spec.pipeline, "run-race", "score"))
    assert (summary["succeeded"], summary["attempts"], summary["rows_in"]) == (5, 2, 1500), summary


def test_path_escape_key_fails_that_file_with_its_reason_and_the_rest_go_on(pipeline):
    from shardline.oncall.service import OnCall
    from shardline.oncall.values import RunRef

    spec, bucket = pipeline
    boto3.client("s3").put_object(Bucket=bucket, Key="in//tmp/evil.parquet", Body=parquet_bytes(10, 10_000))
    first = steps.submit(spec, steps.plan(spec, "score", "run-unsafe", **plan_args(bucket)))
    assert first.file_count == 4  # the crafted key is not in the manifest
    wait_for_job(spec, first, timeout=600)
    decision = watch.decide_now(spec, first)
    assert decision.action.value == "FAIL"  # tolerance 0: one refused file fails the step, naming it
    (refused,) = decision.failed_files
    assert refused.input_key == f"s3://{bucket}/in//tmp/evil.parquet" and refused.error_class == "UnsafeKeyError"
    assert "absolute path" in refused.error_message and "input.exclude" in refused.error_message
    assert sorted(_output_ids(bucket)) == list(range(4 * 300))  # the other four files ran
    plan = OnCall({spec.pipeline: spec}).plan_resubmission(
        RunRef(spec.pipeline, "run-unsafe"), "score", all_failed=True
    )
    assert plan.files == []  # it can never run: listed as failed, never resubmitted


def test_a_step_that_succeeds_writes_its_outputs_manifest_and_success_marker_and_a_new_run_withdraws_it(pipeline):
    import json

    spec, bucket = pipeline
    s3 = boto3.client("s3")
    first = steps.submit(spec, steps.plan(spec, "score", "run-ok", **plan_args(bucket)))
    wait_for_job(spec, first)
    assert steps.finish(spec, first, "ADVANCE", "all 4 files succeeded").value == "SUCCEEDED"
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
    steps.finish_run(spec, spec.pipeline, "run-ok", StepStatus.SUCCEEDED)
    steps.plan(spec, "score", "run-again", **plan_args(bucket))
    assert "out/_SUCCESS" not in {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}


def test_a_partial_step_writes_its_manifest_but_no_success_marker(pipeline):
    spec, bucket = pipeline
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="in/part-9.parquet", Body=b"PAR1 not parquet")
    first = steps.submit(spec, steps.plan(spec, "score", "run-partial", **plan_args(bucket)))
    wait_for_job(spec, first)
    assert steps.finish(spec, first, "PARTIAL", "1 of 5 file(s) failed, within the tolerance").value == "PARTIAL"
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
    first = steps.submit(
        spec,
        steps.plan(spec, "score", "run-meta", **plan_args(bucket), metadata_prefix=f"s3://{bucket}/meta/_shardline/"),
    )
    wait_for_job(spec, first)
    assert steps.finish(spec, first, "ADVANCE", "all 4 files succeeded").value == "SUCCEEDED"
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


def test_a_resubmission_deals_its_files_by_size_and_records_their_bytes(pipeline):
    """sharding by_size holds on every attempt, not only the first: a resubmission used to plan its files with
    size 0, so its deal fell back to key order (two big files on one instance) and the ledger said bytes_in 0."""
    import json

    from shardline.contract import deal as dealt
    from shardline.ledger.step_reads import FILE_ATTRIBUTES, read_step
    from shardline.orchestration import services
    from shardline.planning.inputs import S3Object
    from tests.support.helpers import makespan

    spec, bucket = pipeline
    s3 = boto3.client("s3")
    # Blind to sizes, the planner fills each instance's bin in key order: both big files on the first one.
    bodies = {
        "retry-a.parquet": parquet_bytes(20_000, 10_000),
        "retry-b.parquet": parquet_bytes(20_000, 40_000),
        "retry-c.parquet": parquet_bytes(50, 70_000),
        "retry-d.parquet": parquet_bytes(50, 80_000),
    }
    for name, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=f"in/{name}", Body=body)
    first = steps.plan(spec, "score", "run-sized", **plan_args(bucket))  # planned, never submitted
    retry = [f"s3://{bucket}/in/{name}" for name in bodies]
    second = steps.resubmit(spec, first, retry)
    steps.stop(spec, second)

    manifest_bucket, _, manifest_key = second.manifest_uri.removeprefix("s3://").partition("/")
    entries = json.loads(s3.get_object(Bucket=manifest_bucket, Key=manifest_key)["Body"].read())[1:]
    sizes = {f"in/{name}": len(body) for name, body in bodies.items()}
    deal = dealt([S3Object(f"in/{e}", sizes[f"in/{e}"]) for e in entries], second.instance_count)
    big = max(len(bodies["retry-a.parquet"]), len(bodies["retry-b.parquet"]))
    small = max(len(bodies["retry-c.parquet"]), len(bodies["retry-d.parquet"]))
    assert second.instance_count == 2 and makespan(deal) <= big + small, [[o.key for o in s] for s in deal]

    records = read_step(
        services.ledger_model(spec),
        StepRef(spec.pipeline, "run-sized", "score"),
        file_attributes=[*FILE_ATTRIBUTES, "bytes_in"],
    )
    recorded = {f.input_key: (int(f.attempt), int(f.bytes_in or 0)) for f in records.files if f.input_key in retry}
    assert recorded == {f"s3://{bucket}/{key}": (2, size) for key, size in sizes.items()}
