"""A step's jobs against moto_server and the local backend: a cleared submit, a retried watch, two resubmissions
at once, a resubmission's sizes."""

from __future__ import annotations

import boto3

from shardline.decision.policy import JobStatus
from shardline.ledger.keys import StepRef
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step import watch
from shardline.planning.attempt import Attempt
from tests.support.pipelines import output_ids, parquet_bytes, plan_request, wait_for_job


def test_a_cleared_submit_adopts_the_running_job(pipeline, tmp_path):
    spec, bucket = pipeline
    attempt = step_plan.plan(spec, "score", plan_request("run-1", bucket))
    first = step_jobs.submit(spec, attempt).attempt
    again = step_jobs.submit(spec, attempt).attempt  # what a cleared or retried submit task does
    assert again.job_name == first.job_name
    jobs = list((tmp_path / "local" / "jobs").glob("sl-*"))
    assert [j.name for j in jobs] == [first.job_name]  # one job, no twin
    step_jobs.stop(spec, first)  # leave nothing running behind the test
    assert step_jobs.job_status(spec, first) is JobStatus.STOPPED


def test_a_retried_watch_resumes_at_the_newest_attempt(pipeline, tmp_path):
    spec, bucket = pipeline
    first = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-3", bucket))).attempt
    step_jobs.stop(spec, first)
    second = step_jobs.resubmit(spec, first, [f"s3://{bucket}/in/part-1.parquet"]).attempt
    resumed = step_jobs.resume(spec, first)  # what the watch task's next try knows: attempt 1
    assert (resumed.number, resumed.job_name) == (2, second.job_name)
    assert step_jobs.resume(spec, second) == second
    step_jobs.stop(spec, second)
    assert sorted(j.name for j in (tmp_path / "local" / "jobs").glob("sl-*")) == sorted(
        [first.job_name, second.job_name]
    )  # adopted, not submitted twice


def test_fencing_two_resubmissions_at_once_start_one_attempt_and_write_every_row_once(pipeline):
    """Two on-call engineers (or an engineer and the watch task) resubmit the same failed step at the same moment."""
    import threading

    from shardline.ledger.context import StaleAttemptError

    spec, bucket = pipeline
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="in/part-9.parquet", Body=b"PAR1 truncated upload")
    first = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-race", bucket))).attempt
    wait_for_job(spec, first, timeout=600)
    decision = watch.decide_now(spec, first)
    assert decision.action.value == "FAIL", decision  # the corrupt file failed the step
    s3.put_object(Bucket=bucket, Key="in/part-9.parquet", Body=parquet_bytes(300, 9 * 300))  # fixed
    failed = [f"s3://{bucket}/in/part-9.parquet"]
    start, results = threading.Barrier(2), []

    def resubmit(by_oncall: bool) -> None:
        start.wait()
        try:
            results.append(step_jobs.resubmit(spec, first, failed, by_oncall=by_oncall).attempt)
        except StaleAttemptError as err:
            results.append(err)

    # The watch's own retry and an on-call engineer's forced resubmission, both from attempt 1.
    racers = [threading.Thread(target=resubmit, args=(by_oncall,)) for by_oncall in (False, True)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    won = [r for r in results if isinstance(r, Attempt)]
    lost = [r for r in results if isinstance(r, StaleAttemptError)]
    assert len(won) == 1 and len(lost) == 1, results
    assert won[0].number == 2
    wait_for_job(spec, won[0], timeout=600)
    decision = watch.decide_now(spec, won[0])
    assert decision.action.value == "ADVANCE", decision
    ids = output_ids(bucket)
    assert sorted(ids) == list(range(4 * 300)) + list(range(9 * 300, 10 * 300)), len(ids)  # every row once
    summary = step_end.summarize(spec, StepRef(spec.pipeline, "run-race", "score"))
    assert (summary.succeeded, summary.attempts, summary.rows_in) == (5, 2, 1500), summary


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
    first = step_plan.plan(spec, "score", plan_request("run-sized", bucket, instances=2))  # planned, never submitted
    retry = [f"s3://{bucket}/in/{name}" for name in bodies]
    second = step_jobs.resubmit(spec, first, retry).attempt
    step_jobs.stop(spec, second)

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
