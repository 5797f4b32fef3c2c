"""The triggers hand no event back before their settle time (Airflow's defer/resume race)."""

from __future__ import annotations

import asyncio
import json
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

    from shardline.orchestration.step import watch

    refused = botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    try:
        try:
            raise refused
        except botocore.exceptions.EndpointConnectionError as err:
            raise QueryError("Failed to query items") from err
    except QueryError as wrapped:
        assert watch.is_unreachable(wrapped)
        assert "Could not connect to the endpoint URL" in watch.describe_error(wrapped)
    assert watch.is_unreachable(botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:1"))
    assert not watch.is_unreachable(KeyError("step"))
    from shardline.planning.attempt import Attempt

    attempt = Attempt(
        pipeline="p",
        run_id="r1",
        step="score",
        number=1,
        input_prefix="s3://b/in/",
        output_prefix="s3://b/out/",
        model_uri="s3://b/m.tar.gz",
    )
    reason = watch.unreachable_reason(attempt, 61, refused)
    assert "unreachable for 61s" in reason and f"job {attempt.job_name} may still be running" in reason
    assert reason.endswith("shardline resubmit p/r1 --step score --all-failed")


def test_the_input_trigger_fires_when_the_input_lands_and_says_what_is_missing_at_its_deadline(
    aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch
):
    import boto3
    import yaml

    from shardline.airflow.triggers.step import InputTrigger
    from shardline.orchestration.step.watch import InputWatch
    from shardline.spec import load_spec
    from tests.support.pipelines import parquet_bytes, stage_step

    monkeypatch.setenv(SETTLE_ENV, "0")
    spec, bucket = stage_step("inputs_test", ledger_table, xgboost_model.parent, tmp_path, {})
    path = tmp_path / "inputs_test.yaml"
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["input"]["ready_marker"] = "_SUCCESS"
    path.write_text(yaml.safe_dump(data))
    prefix = f"s3://{bucket}/landing/"

    watch = InputWatch.of(load_spec(path), "score", prefix).to_json()

    # The deadline has passed: one look, then the event says what is missing.
    event, _ = asyncio.run(_first_event(InputTrigger(watch, deadline=0, poll_interval=0.1)))
    assert event.payload == {"ready": False, "reason": f"no {prefix}_SUCCESS (input.ready_marker) yet"}
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="landing/part-0.parquet", Body=parquet_bytes(10, 0))
    event, _ = asyncio.run(_first_event(InputTrigger(watch, deadline=0, poll_interval=0.1)))
    assert not event.payload["ready"]  # files alone are not enough when the spec names a marker
    s3.put_object(Bucket=bucket, Key="landing/_SUCCESS", Body=b"")
    event, _ = asyncio.run(_first_event(InputTrigger(watch, deadline=time.time() + 600, poll_interval=0.1)))
    assert event.payload == {"ready": True, "reason": f"{prefix}_SUCCESS is there"}


def test_a_step_event_travels_as_json_and_comes_back_the_same():
    import json

    from shardline.decision.policy import Action, Decision
    from shardline.ledger.records import FileRecord
    from shardline.ledger.states import FileStatus
    from shardline.orchestration.step.watch import StepEvent
    from shardline.planning.attempt import Attempt

    attempt = Attempt(
        pipeline="p",
        run_id="r1",
        step="score",
        number=2,
        input_prefix="s3://b/in/",
        output_prefix="s3://b/out/",
        model_uri="s3://b/m.tar.gz",
        file_count=2,
        submitted_at=5.0,
    )
    bad = FileRecord(
        "s3://b/in/a.parquet", FileStatus.FAILED, 2, error_class="CorruptInputError", error_message="x" * 900
    )
    decision = Decision(Action.FAIL, "1 of 2 file(s) failed", failed_files=(bad,), stop_job=True)
    event = StepEvent.of(decision, attempt)
    payload = json.loads(json.dumps(event.to_event()))  # as Airflow stores it
    back = StepEvent.from_event(payload)
    assert back == event and back.attempt == attempt
    assert back.failed_files[0]["error_message"] == "x" * 500  # bounded: events live in Airflow's database
    timeout = StepEvent.from_event(
        StepEvent(Action.TIMEOUT, "ran past its deadline", attempt, stop_job=True).to_event()
    )
    assert (timeout.action, timeout.stop_job, timeout.retry_files) == (Action.TIMEOUT, True, ())


def _as_airflow_stores_it(trigger):
    """The trigger Airflow's triggerer builds: from its ``serialize()``, through JSON (the database)."""
    import importlib
    import json

    path, kwargs = trigger.serialize()
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))


def test_the_triggers_serialize_json_values_only_and_come_back_the_same():
    from shardline.airflow.triggers.step import InputTrigger, StepTrigger
    from shardline.decision.policy import Policy
    from shardline.orchestration.services import AwsSettings
    from shardline.orchestration.step.watch import InputWatch, StepWatch
    from shardline.planning.attempt import Attempt

    aws = AwsSettings("sagemaker", "aws_prod", "shardline-ledger", 30)
    policy = Policy(4, 30.0, 2.0, 1, 2.5, 600.0, 7200.0)
    attempt = Attempt(
        pipeline="p",
        run_id="r1",
        step="score",
        number=2,
        input_prefix="s3://b/in/",
        output_prefix="s3://b/out/",
        model_uri="s3://b/m.tar.gz",
        file_count=3,
        submitted_at=5.0,
    )
    step = StepTrigger(
        attempt.to_xcom(), StepWatch(aws, policy).to_json(), poll_interval=7.5, deadline=99.0, not_before=12.0
    )
    back = _as_airflow_stores_it(step)
    assert back.serialize() == step.serialize()
    assert StepWatch.from_json(back.watch) == StepWatch(aws, policy)
    assert Attempt.from_xcom(back.attempt) == attempt
    assert (back.poll_interval, back.deadline, back.not_before) == (7.5, 99.0, 12.0)

    watch = InputWatch(aws, "s3://b/landing/", "_SUCCESS", ("*.parquet",), ("_tmp*",))
    waiting = InputTrigger(watch.to_json(), deadline=50.0, poll_interval=3.0, not_before=1.0, ready_at=40.0)
    back = _as_airflow_stores_it(waiting)
    assert back.serialize() == waiting.serialize() and InputWatch.from_json(back.watch) == watch
    assert (back.deadline, back.poll_interval, back.not_before, back.ready_at) == (50.0, 3.0, 1.0, 40.0)
    # No spec path: the triggerer reads no file, so a spec edited mid-run changes no running attempt.
    for trigger in (step, waiting):
        text = json.dumps(trigger.serialize()[1])
        assert "spec_path" not in text and ".yaml" not in text, text


def test_an_attempt_keeps_the_policy_it_started_with_when_the_spec_is_edited_while_it_runs(
    aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch
):
    """A step that tolerates no failed file is being watched; meanwhile someone raises its tolerance in the spec.
    The running attempt still fails on its corrupt file; an attempt watched from the edited spec would not."""
    import yaml

    from shardline.airflow.triggers.step import StepTrigger
    from shardline.decision.policy import Action
    from shardline.orchestration.step import jobs as step_jobs
    from shardline.orchestration.step import plan as step_plan
    from shardline.orchestration.step import watch
    from shardline.orchestration.step.watch import StepEvent
    from shardline.spec import load_spec
    from tests.support.pipelines import parquet_bytes, plan_request, stage_step

    monkeypatch.setenv(SETTLE_ENV, "0")
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    inputs = {
        "part-0.parquet": parquet_bytes(200, 0),
        "part-1.parquet": parquet_bytes(200, 200),
        "part-2.parquet": b"PAR1 truncated upload",
    }
    staged, bucket = stage_step("policy_test", ledger_table, xgboost_model.parent, tmp_path, inputs)
    path = tmp_path / "policy_test.yaml"
    data = staged.model_dump(mode="json", exclude_defaults=True)
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(path)
    assert spec.step("score").tolerance.max_failed_files == 0
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-edit", bucket))).attempt
    trigger = _as_airflow_stores_it(
        StepTrigger(attempt.to_xcom(), watch.StepWatch.of(spec, "score").to_json(), poll_interval=0.2)
    )

    async def edit_between_polls():
        events = trigger.run()
        first = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.5)  # a poll or more has been made (or the event is in already: the same answer)
        data["steps"][0]["tolerance"] = {"max_failed_files": 5}
        path.write_text(yaml.safe_dump(data))
        return await asyncio.wait_for(first, timeout=600)

    event = StepEvent.from_event(asyncio.run(edit_between_polls()).payload)
    assert event.action == Action.FAIL, event
    assert [f["input"] for f in event.failed_files] == [f"s3://{bucket}/in/part-2.parquet"]
    assert event.policy is not None and event.policy.max_failed_files == 0  # what the watch task acts by
    edited = load_spec(path)
    assert edited.step("score").tolerance.max_failed_files == 5
    assert watch.decide_now(edited, attempt).action is Action.PARTIAL  # the edit would have changed the answer


def test_a_partition_wait_comes_back_to_ask_airflow_again_and_keeps_its_recheck_when_stored(aws_env, ledger_table):
    """A trigger cannot ask Airflow whether the run holding the prefix still exists (a deleted DAG run never ends its
    hold): after ``recheck_seconds`` it hands the task back a not-free event, and the task asks."""
    import datetime as dt

    from shardline.airflow.triggers.step import PartitionTrigger
    from shardline.ledger.keys import StepRef
    from shardline.ledger.partitions import take
    from shardline.ledger.states import StepStatus
    from shardline.ledger.step_writes import ensure_run, set_run_status
    from shardline.ledger.table import bind_ledger
    from shardline.orchestration.services import AwsSettings
    from shardline.orchestration.step.watch import PartitionWatch

    model = bind_ledger(ledger_table)
    holder = StepRef("p", "manual__holder", "score")
    ensure_run(model, "p", holder.run_id)
    set_run_status(model, "p", holder.run_id, StepStatus.RUNNING)
    take(model, "s3://b/out/", holder, dt.datetime.now(dt.UTC) + dt.timedelta(hours=6))
    watch = PartitionWatch(AwsSettings("local", None, ledger_table, 30), "s3://b/out/", StepRef("p", "r2", "score"))
    trigger = PartitionTrigger(watch.to_json(), poll_interval=0.1, recheck_seconds=0.0)
    assert _as_airflow_stores_it(trigger).serialize() == trigger.serialize()
    event, _ = asyncio.run(_first_event(trigger))
    assert event.payload["free"] is False and event.payload["recheck"] is True
    assert "is held by run p/manual__holder" in event.payload["reason"]
