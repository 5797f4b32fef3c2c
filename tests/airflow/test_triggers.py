"""The triggers hand no event back before their settle time (Airflow's defer/resume race)."""

from __future__ import annotations

import asyncio
import time

from shardline.airflow.triggers.step import SETTLE_ENV, BackoffTrigger, settle_until


async def _first_event(trigger):
    async for event in trigger.run():
        return event, time.time()


def test_a_backoff_trigger_holds_its_event_until_the_settle_time():
    not_before = time.time() + 0.5
    event, fired_at = asyncio.run(_first_event(BackoffTrigger(0, {"attempt": 1}, not_before=not_before)))
    assert event.payload == {"attempt": 1}
    assert fired_at >= not_before


def test_the_settle_time_survives_serialization():
    trigger = BackoffTrigger(3, {"x": 1}, not_before=123.0)
    path, kwargs = trigger.serialize()
    assert path == "shardline.airflow.triggers.step.BackoffTrigger" and BackoffTrigger(**kwargs).not_before == 123.0


def test_the_settle_window_is_ten_seconds_unless_set(monkeypatch):
    monkeypatch.delenv(SETTLE_ENV, raising=False)
    before = time.time()
    assert before + 10 <= settle_until() <= time.time() + 10
    monkeypatch.setenv(SETTLE_ENV, "0")  # what the demo sets for dag.test()
    before = time.time()
    assert before <= settle_until() <= time.time()


def test_an_unreachable_endpoint_is_told_apart_from_other_errors():
    import botocore.exceptions
    from pynamodb.exceptions import QueryError

    from shardline.orchestration import steps

    refused = botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    try:
        try:
            raise refused
        except botocore.exceptions.EndpointConnectionError as err:
            raise QueryError("Failed to query items") from err
    except QueryError as wrapped:
        assert steps.is_unreachable(wrapped)
        assert "Could not connect to the endpoint URL" in steps.describe_error(wrapped)
    assert steps.is_unreachable(botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:1"))
    assert not steps.is_unreachable(KeyError("step"))
    from shardline.planning.attempt import Attempt

    attempt = Attempt(pipeline="p", run_id="r1", step="score", number=1, input_prefix="s3://b/in/",
                      output_prefix="s3://b/out/", model_uri="s3://b/m.tar.gz")
    reason = steps.unreachable_reason(attempt, 61, refused)
    assert "unreachable for 61s" in reason and f"job {attempt.job_name} may still be running" in reason
    assert reason.endswith("shardline resubmit p/r1 --step score --all-failed")


def test_the_input_trigger_fires_when_the_input_lands_and_says_what_is_missing_at_its_deadline(
        aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    import boto3
    import yaml

    from shardline.airflow.triggers.step import InputTrigger
    from tests.support.pipelines import parquet_bytes, stage_step

    monkeypatch.setenv(SETTLE_ENV, "0")
    spec, bucket = stage_step("inputs_test", ledger_table, xgboost_model.parent, tmp_path, {})
    path = tmp_path / "inputs_test.yaml"
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["input"]["ready_marker"] = "_SUCCESS"
    path.write_text(yaml.safe_dump(data))
    prefix = f"s3://{bucket}/landing/"

    # The deadline has passed: one look, then the event says what is missing.
    event, _ = asyncio.run(_first_event(InputTrigger(str(path), "score", prefix, deadline=0, poll_interval=0.1)))
    assert event.payload == {"ready": False, "reason": f"no {prefix}_SUCCESS (input.ready_marker) yet"}
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="landing/part-0.parquet", Body=parquet_bytes(10, 0))
    event, _ = asyncio.run(_first_event(InputTrigger(str(path), "score", prefix, deadline=0, poll_interval=0.1)))
    assert not event.payload["ready"]  # files alone are not enough when the spec names a marker
    s3.put_object(Bucket=bucket, Key="landing/_SUCCESS", Body=b"")
    event, _ = asyncio.run(_first_event(InputTrigger(str(path), "score", prefix, deadline=time.time() + 600,
                                                     poll_interval=0.1)))
    assert event.payload == {"ready": True, "reason": f"{prefix}_SUCCESS is there"}


def test_a_step_event_travels_as_json_and_comes_back_the_same():
    import json

    from shardline.airflow.triggers.step import TIMEOUT, StepEvent
    from shardline.decision.policy import Action, Decision, FileState
    from shardline.ledger.states import FileStatus
    from shardline.planning.attempt import Attempt

    attempt = Attempt(pipeline="p", run_id="r1", step="score", number=2, input_prefix="s3://b/in/",
                      output_prefix="s3://b/out/", model_uri="s3://b/m.tar.gz", file_count=2, submitted_at=5.0)
    bad = FileState("s3://b/in/a.parquet", FileStatus.FAILED, 2, "CorruptInputError", "x" * 900)
    decision = Decision(Action.FAIL, "1 of 2 file(s) failed", failed_files=(bad,), stop_job=True)
    event = StepEvent.of(decision, attempt)
    payload = json.loads(json.dumps(event.to_event()))  # as Airflow stores it
    back = StepEvent.from_event(payload)
    assert back == event and back.attempt == attempt
    assert back.failed_files[0]["error_message"] == "x" * 500  # bounded: events live in Airflow's database
    timeout = StepEvent.from_event(StepEvent(TIMEOUT, "ran past its deadline", attempt, stop_job=True).to_event())
    assert (timeout.action, timeout.stop_job, timeout.retry_files) == (TIMEOUT, True, ())
