"""A step's plan against moto_server and the local backend: an empty prefix, a plan run again, unsafe keys."""

from __future__ import annotations

import boto3

from shardline.decision.policy import JobStatus
from shardline.ledger.keys import StepRef
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step import watch
from tests.support.pipelines import output_ids, parquet_bytes, plan_request, wait_for_job


def test_plan_skips_an_empty_prefix(pipeline):
    spec, bucket = pipeline
    assert (
        step_plan.plan(
            spec,
            "score",
            step_plan.PlanRequest(
                "run-2",
                input_prefix=f"s3://{bucket}/nothing/",
                output_prefix=f"s3://{bucket}/out/",
                model_uri="s3://x/y",
                instance_count=2,
            ),
        )
        is None
    )


def test_planning_again_takes_only_what_has_not_succeeded(pipeline):
    """A plan task that runs again (retried, or cleared after an upstream resubmission) never starts over."""
    spec, bucket = pipeline
    request = plan_request("run-3", bucket)
    first = step_plan.plan(spec, "score", request)
    assert first.instance_type == spec.step("score").resources.instance_type  # resolved once, at the plan
    assert step_plan.plan(spec, "score", request).number == 1  # never submitted: the same attempt again
    wait_for_job(spec, step_jobs.submit(spec, first).attempt)
    again = step_plan.plan(spec, "score", request)
    assert (again.number, again.file_count) == (1, 4)  # everything succeeded: adopt it
    assert step_jobs.job_status(spec, step_jobs.submit(spec, again).attempt) is JobStatus.COMPLETED  # no new job

    boto3.client("s3").put_object(Bucket=bucket, Key="in/part-late.parquet", Body=parquet_bytes(300, 9000))
    late = step_plan.plan(spec, "score", request)
    assert (late.number, late.file_count) == (2, 1)  # only the new input, as the next attempt
    wait_for_job(spec, step_jobs.submit(spec, late).attempt)
    summary = step_end.summarize(spec, StepRef(spec.pipeline, "run-3", "score"))
    assert (summary.files, summary.succeeded, summary.rows_in, summary.rows_out) == (5, 5, 1500, 1500)


def test_path_escape_key_fails_that_file_with_its_reason_and_the_rest_go_on(pipeline):
    from shardline.oncall.service import OnCall
    from shardline.oncall.values import FileChoice, RunRef

    spec, bucket = pipeline
    boto3.client("s3").put_object(Bucket=bucket, Key="in//tmp/evil.parquet", Body=parquet_bytes(10, 10_000))
    first = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-unsafe", bucket))).attempt
    assert first.file_count == 4  # the crafted key is not in the manifest
    wait_for_job(spec, first, timeout=600)
    decision = watch.decide_now(spec, first)
    assert decision.action.value == "FAIL"  # tolerance 0: one refused file fails the step, naming it
    (refused,) = decision.failed_files
    assert refused.input_key == f"s3://{bucket}/in//tmp/evil.parquet" and refused.error_class == "UnsafeKeyError"
    assert "absolute path" in refused.error_message and "input.exclude" in refused.error_message
    assert sorted(output_ids(bucket)) == list(range(4 * 300))  # the other four files ran
    plan = OnCall({spec.pipeline: spec}).plan_resubmission(
        RunRef(spec.pipeline, "run-unsafe"), "score", FileChoice(all_failed=True)
    )
    assert plan.files == []  # it can never run: listed as failed, never resubmitted
