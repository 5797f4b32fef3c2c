"""AWS's ordinary refusals against the local emulator's account (moto_server, the local backend, real boto3):
a refused submit is no attempt and goes through later, the quota holds in the emulator's own record, and a job
SageMaker could not provision goes again, uncounted, on the step's fallback instance type."""

from __future__ import annotations

import json

from shardline.backends.local_fleet import FLEET_ENV, peak_in_use, read_record
from shardline.decision import fleet
from shardline.decision.policy import Action, JobStatus
from shardline.ledger.records import StepRecord
from shardline.ledger.step_reads import read_step
from shardline.orchestration import services
from shardline.orchestration.step import capacity, watch
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.planning.attempt import Attempt
from tests.support.pipelines import parquet_bytes, plan_request, stage_step, wait_for_job


def _stage(tmp_path, ledger_table, model, monkeypatch, fleet: dict, **step_settings):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    monkeypatch.setenv(FLEET_ENV, json.dumps(fleet))
    inputs = {f"part-{i}.parquet": parquet_bytes(200, i * 200) for i in range(4)}
    return stage_step("fleet_test", ledger_table, model.parent, tmp_path, inputs, step_settings=step_settings)


def _instance_type(tmp_path, attempt: Attempt) -> str:
    request = json.loads((tmp_path / "local" / "jobs" / attempt.job_name / "request.json").read_text())
    return request["ProcessingResources"]["ClusterConfig"]["InstanceType"]


def test_a_refused_submit_is_no_attempt_and_the_same_attempt_goes_through_later(
    aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch
):
    spec, bucket = _stage(
        tmp_path, ledger_table, xgboost_model, monkeypatch, {"refuse_first": {"ThrottlingException": 1}}
    )
    monkeypatch.setenv(step_jobs.SUBMIT_WAIT_ENV, "1")  # the first wait: 1 s, drawn in its upper half
    attempt = step_plan.plan(spec, "score", plan_request("run-1", bucket))
    waits = step_jobs.submit(spec, attempt)
    assert isinstance(waits, step_jobs.MustWait) and waits.attempt == attempt and waits.refusals == 1
    assert "not submitted yet: SageMaker throttled the request (ThrottlingException: Rate exceeded)" in waits.note
    assert 0.5 <= waits.delay_seconds < 1.0 and waits.waited == waits.delay_seconds
    step = StepRecord.of(read_step(services.ledger_model(spec), attempt.ref, files=False).step)
    # Recorded as data; a view renders it.
    waiting = fleet.Waiting.from_json(step.waiting)
    assert (step.attempt, waiting.job_name, waiting.retry_at, step.message) == (
        1,
        attempt.job_name,
        waits.retry_at,
        None,
    )
    assert waiting.text() == waits.note
    submitted = step_jobs.submit_again(spec, json.loads(json.dumps(waits.again()))).attempt  # after the wait
    assert StepRecord.of(read_step(services.ledger_model(spec), attempt.ref, files=False).step).waiting is None
    wait_for_job(spec, submitted)
    assert watch.decide_now(spec, submitted).action is Action.ADVANCE
    assert submitted.number == 1 and not (tmp_path / "local" / "jobs" / f"{submitted.job_name[:-1]}2").exists()


def test_the_emulators_quota_refuses_past_it_and_its_record_never_exceeds_it(
    aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch
):
    spec, bucket = _stage(tmp_path, ledger_table, xgboost_model, monkeypatch, {"quotas": {"ml.m5.xlarge": 3}})
    first = step_jobs.submit(
        spec, step_plan.plan(spec, "score", plan_request("run-a", bucket, instances=2))
    ).attempt  # 2 instances
    second = step_plan.plan(spec, "score", plan_request("run-b", bucket, "out-b", instances=2))  # 2 more: 4 > 3
    refused = step_jobs.submit(spec, second)
    assert isinstance(refused, step_jobs.MustWait) and "ResourceLimitExceeded" in refused.note
    assert "is 3 Instances, with current utilization of 2 Instances and a request delta of 2" in refused.note
    wait_for_job(spec, first)  # its supervisor gives its instances back as it ends
    wait_for_job(spec, step_jobs.submit(spec, second).attempt)
    assert peak_in_use(read_record(tmp_path / "local")) == {"ml.m5.xlarge": 2}


def test_a_job_holds_its_instances_while_they_start_up_and_a_stop_then_gives_them_back(
    aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch
):
    """The emulator's ``startup_seconds`` stands for SageMaker's provisioning: the job is in progress, and counted
    against the quota, before its container runs."""
    fleet = {"quotas": {"ml.m5.xlarge": 2}, "startup_seconds": 3600}
    spec, bucket = _stage(tmp_path, ledger_table, xgboost_model, monkeypatch, fleet)
    first = step_jobs.submit(
        spec, step_plan.plan(spec, "score", plan_request("run-a", bucket, instances=2))
    ).attempt  # 2 instances
    assert step_jobs.job_status(spec, first) is JobStatus.IN_PROGRESS
    second = step_plan.plan(spec, "score", plan_request("run-b", bucket, "out-b", instances=2))
    refused = step_jobs.submit(spec, second)
    assert isinstance(refused, step_jobs.MustWait) and "ResourceLimitExceeded" in refused.note
    step_jobs.stop(spec, first)
    wait_for_job(spec, first)
    assert step_jobs.job_status(spec, first) is JobStatus.STOPPED
    assert not list((tmp_path / "local" / "jobs" / first.job_name).glob("algo-*"))  # no instance ever ran
    assert isinstance(step_jobs.submit(spec, second), step_jobs.Submitted)  # the stopped job's instances are free again
    assert peak_in_use(read_record(tmp_path / "local")) == {"ml.m5.xlarge": 2}
    step_jobs.stop(spec, second)


def test_a_capacity_failure_goes_again_uncounted_and_moves_to_the_fallback_type(
    aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch
):
    spec, bucket = _stage(
        tmp_path,
        ledger_table,
        xgboost_model,
        monkeypatch,
        {"capacity_errors": {"ml.m5.xlarge": 1.0}},
        resources={"instance_count": 2, "instance_type": "ml.m5.xlarge", "fallback_instance_types": ["ml.c5.2xlarge"]},
        retry={"max_attempts": 1, "backoff_seconds": 0},
    )
    attempt = first = step_jobs.submit(
        spec, step_plan.plan(spec, "score", plan_request("run-1", bucket, instances=2))
    ).attempt
    seen = []
    for _ in range(3):
        wait_for_job(spec, attempt)
        decision = watch.decide_now(spec, attempt)
        seen.append((attempt.number, _instance_type(tmp_path, attempt), step_jobs.job_status(spec, attempt)))
        if decision.action is not Action.RESUBMIT:
            break
        assert decision.capacity and "not counted against retry.max_attempts" in decision.reason
        attempt = step_jobs.resubmit(spec, attempt, list(decision.retry_files), capacity=True).attempt
    # Twice on the step's own type, then on the fallback: 1 instance of 8 vCPUs for 2 of 4.
    assert seen == [
        (1, "ml.m5.xlarge", JobStatus.FAILED),
        (2, "ml.m5.xlarge", JobStatus.FAILED),
        (3, "ml.c5.2xlarge", JobStatus.COMPLETED),
    ]
    assert decision.action is Action.ADVANCE  # with retry.max_attempts: 1, after 3 jobs
    assert (attempt.instance_type, attempt.instance_count, attempt.counted_number) == ("ml.c5.2xlarge", 1, 1)
    assert (attempt.capacity_failures, attempt.planned_instances) == ({"ml.m5.xlarge": 2}, 2)
    # A retried watch knows only attempt 1 (its plan task's XCom): it resumes at attempt 3 as it is, from the
    # STEP item's plan, so it counts the same and the next capacity failure is charged to the right type.
    resumed = step_jobs.resume(spec, first)
    assert (resumed.number, resumed.instance_type, resumed.capacity_failures, resumed.counted_number) == (
        3,
        "ml.c5.2xlarge",
        {"ml.m5.xlarge": 2},
        1,
    )
    assert (resumed.instance_count, resumed.planned_instances) == (1, 2)
    # The step has moved on from attempt 1: a wait of attempt 1's submit would say nothing, and stop.
    wait = fleet.submit_wait("ThrottlingException", "", 1, 0.0)
    assert not capacity.note_waiting(spec, first, fleet.Waiting(submit=wait, job_name=first.job_name))
