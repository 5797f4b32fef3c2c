"""The plan task (PlanStepOperator), called as Airflow's task runner calls it, over a pipeline staged on moto_server:
a conf it cannot use fails before anything is planned, naming the field; a good run plans attempt 1 and hands it to
the watch task through XCom; a run with no input skips, fails naming the prefix, or waits in a deferral, as
input.when_missing says; a run whose output prefix another run writes waits for it, unless Airflow no longer has that
run; a dry run submits nothing."""

from __future__ import annotations

import datetime as dt
import json
import time

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferred

from shardline.airflow.operators.plan import RECHECK_HOLDER_SECONDS, PlanStepOperator
from shardline.airflow.operators.step import mark_run_failed
from shardline.airflow.triggers.step import InputTrigger, PartitionTrigger
from shardline.orchestration.step.watch import InputWatch, PartitionWatch
from shardline.planning.attempt import Attempt
from tests.airflow.operators.conftest import FILES, PIPELINE, WHEN, FakeDagRun
from tests.support.pipelines import parquet_bytes


def plan_operator(staged, *, spec_path: str | None = None, output: str = "out", **more) -> PlanStepOperator:
    """The first step's plan task as ``dag_from_spec`` builds it, with its templates rendered as Airflow renders them
    for a run (``{{ params.model_version }}``, ``{{ params.dry_run }}``)."""
    return PlanStepOperator(
        task_id="plan_score",
        spec_path=spec_path or staged.spec_path,
        step="score",
        input_prefix=more.pop("input_prefix", staged.uri("in")),
        output_prefix=staged.uri(output),
        model_uri=more.pop("model_uri", staged.model_uri),
        model_version=more.pop("model_version", "latest"),
        takes_input_param=True,
        dry_run=more.pop("dry_run", "False"),
        **more,
    )


def when_missing(staged, action: str) -> str:
    def edit(data):
        data["steps"][0]["input"]["when_missing"] = action

    return staged.variant(f"when-missing-{action}", edit)


def pinned_versions(staged) -> str:
    """The spec with its model picked by the model_version Param: one version (v1) pinned."""

    def edit(data):
        model = data["steps"][0]["model"]
        sha = model.pop("sha256")
        model.update(
            uri=f"s3://{staged.bucket}/models/{{{{ params.model_version }}}}/model.tar.gz",
            versions={"v1": sha},
            version="v1",
        )

    return staged.variant("pinned-versions", edit)


# -- a conf the run cannot use ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, conf, params, expected",
    [
        (
            "unknown-key",
            {"input_prefx": "s3://x/"},
            {},
            "the trigger conf has unknown key(s) 'input_prefx' (did you mean 'input_prefix'?)",
        ),
        ("outside", {}, {"input_prefix": "s3://elsewhere/in/"}, "Param input_prefix 's3://elsewhere/in/' is outside"),
        ("climbs-out", {}, {"input_prefix": "IN../secret/"}, "has an empty, '.' or '..' segment"),
        ("count", {}, {"instance_count": 0}, "Param instance_count 0 must be null or a whole number from 1 to"),
        ("version", {}, {}, "Param model_version 'v2' is not pinned in model.versions of step score (pinned: v1)"),
    ],
)
def test_a_conf_the_run_cannot_use_fails_naming_the_field_before_anything_is_planned(
    staged, context, case, conf, params, expected
):
    run_id = f"run-bad-{case}"
    params = {k: v.replace("IN", staged.uri("in")) if isinstance(v, str) else v for k, v in params.items()}
    if case == "version":  # the spec pins v1 only; the run asks for v2 (as `--conf '{"model_version": "v2"}'`)
        op = plan_operator(
            staged,
            spec_path=pinned_versions(staged),
            model_uri=f"s3://{staged.bucket}/models/v2/model.tar.gz",
            model_version="v2",
        )
    else:
        op = plan_operator(staged, output=f"out-{run_id}")
    with pytest.raises(AirflowFailException) as failed:
        op.execute(context(run_id, conf=conf | params, params=params))
    text = str(failed.value)
    assert expected in text, text
    assert f"Nothing was planned: `shardline rerun {PIPELINE}/{run_id} --conf '{{...}}'`" in text, text
    assert staged.step_item(run_id) is None  # nothing planned: no STEP item, no job
    assert staged.jobs_of(run_id) == []


def test_a_run_whose_conf_is_refused_is_listed_failed_with_why_as_the_on_call_guide_says(staged, context):
    run_id = "run-refused-conf"
    with pytest.raises(AirflowFailException) as failed:
        plan_operator(staged, output="out-refused-conf").execute(context(run_id, conf={"instance_cnt": 1}))
    # Then Airflow calls the DAG's failure callback, as for any run that failed.
    mark_run_failed(staged.spec_path, {"run_id": run_id, "dag_run": FakeDagRun(run_id), "reason": "task_failure"})
    run = staged.run_item(run_id)
    assert run is not None, "the ledger has no record of the run"
    assert run.status == "FAILED" and str(failed.value) in run.message


def test_with_unknown_conf_warn_an_unknown_key_is_only_logged_and_the_run_plans(staged, context):
    def warn(data):
        data["unknown_conf"] = "warn"

    op = plan_operator(staged, spec_path=staged.variant("unknown-conf-warn", warn), output="out-warn")
    planned = Attempt.from_xcom(op.execute(context("run-warn", conf={"input_prefx": "s3://x/"})))
    assert (planned.run_id, planned.number) == ("run-warn", 1)
    assert staged.step_item("run-warn").status == "PLANNED"


# -- a good run -------------------------------------------------------------------------------------------------------


def test_a_good_run_plans_attempt_1_and_returns_it_for_the_watch_task(staged, context):
    run_id = "run-good"
    returned = plan_operator(staged, output="out-good").execute(context(run_id, clear_number=2))
    assert json.loads(json.dumps(returned)) == returned  # XCom holds JSON
    attempt = Attempt.from_xcom(returned)
    assert attempt.to_xcom() == returned
    assert (attempt.pipeline, attempt.run_id, attempt.step, attempt.number, attempt.file_count) == (
        PIPELINE,
        run_id,
        "score",
        1,
        FILES,
    )
    assert (attempt.input_prefix, attempt.output_prefix, attempt.model_uri) == (
        staged.uri("in"),
        staged.uri("out-good"),
        staged.model_uri,
    )
    step = staged.step_item(run_id)
    assert (step.status, step.attempt) == ("PLANNED", 1)
    run = staged.run_item(run_id)
    assert (run.status, run.partition) == ("RUNNING", WHEN.strftime("%Y-%m-%dT%H:%M:%S"))
    assert staged.jobs_of(run_id) == []  # planned only: the watch task submits it


def test_the_input_prefix_param_narrows_the_input_to_a_folder_under_the_spec_s(staged, context):
    s3 = boto3.client("s3")
    for key in ("narrow/early/part-0.parquet", "narrow/late/part-1.parquet"):
        s3.put_object(Bucket=staged.bucket, Key=key, Body=parquet_bytes(5, 0))

    def narrow(data):
        data["steps"][0]["input"]["prefix"] = staged.uri("narrow")

    op = plan_operator(
        staged, spec_path=staged.variant("narrow", narrow), input_prefix=staged.uri("narrow"), output="out-narrowed"
    )
    late = staged.uri("narrow") + "late/"
    attempt = Attempt.from_xcom(op.execute(context("run-narrowed", params={"input_prefix": late})))
    assert (attempt.input_prefix, attempt.file_count) == (late, 1)


def test_a_model_not_at_its_uri_fails_at_once_naming_it_and_the_run_is_listed_failed(staged, context):
    run_id, missing = "run-no-model", f"s3://{staged.bucket}/model/gone.tar.gz"
    with pytest.raises(AirflowFailException) as failed:
        plan_operator(staged, output="out-no-model", model_uri=missing).execute(context(run_id))
    text = str(failed.value)
    assert text.startswith("step score: ") and missing in text, text
    assert (
        f"Nothing was planned or submitted: upload the model there and run `shardline rerun {PIPELINE}/{run_id}`"
        in text
    )
    assert staged.step_item(run_id) is None and staged.jobs_of(run_id) == []
    run = staged.run_item(run_id)
    assert (run.status, run.message) == ("FAILED", text)


# -- no input ---------------------------------------------------------------------------------------------------------


def test_no_input_with_when_missing_skip_skips_and_lists_the_run_as_skipped(staged, context):
    run_id, prefix = "run-skip", staged.uri("empty-skip")
    op = plan_operator(staged, spec_path=when_missing(staged, "skip"), input_prefix=prefix, output="out-skip")
    with pytest.raises(AirflowSkipException) as skipped:
        op.execute(context(run_id))
    assert f"no input file under {prefix}" in str(skipped.value)
    assert str(skipped.value).endswith("(input.when_missing: skip)")
    assert staged.step_item(run_id) is None
    run = staged.run_item(run_id)
    assert (run.status, run.message) == ("SKIPPED", str(skipped.value))


@pytest.mark.parametrize(
    "action, said",
    [("fail", "(input.when_missing: fail)"), (None, "(input.when_missing: fail, the default for a manual run)")],
)
def test_no_input_with_when_missing_fail_or_its_manual_default_fails_naming_the_prefix(staged, context, action, said):
    run_id, prefix = f"run-fail-{action}", staged.uri(f"empty-{action}")
    spec_path = when_missing(staged, action) if action else staged.spec_path
    op = plan_operator(staged, spec_path=spec_path, input_prefix=prefix, output=f"out-fail-{action}")
    with pytest.raises(AirflowFailException) as failed:
        op.execute(context(run_id))
    text = str(failed.value)
    assert f"no input file under {prefix}" in text and said in text, text
    assert f"`shardline rerun {PIPELINE}/{run_id}` plans this run again" in text, text
    assert staged.step_item(run_id) is None
    assert staged.run_item(run_id).status == "FAILED"


def test_no_input_with_when_missing_wait_defers_to_the_input_trigger_on_its_prefix(staged, context):
    run_id, prefix = "run-wait", staged.uri("empty-wait")
    op = plan_operator(staged, spec_path=when_missing(staged, "wait"), input_prefix=prefix, output="out-wait")
    wait = op.spec.step("score").input.wait_timeout_seconds
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context(run_id))
    after = time.time()
    trigger = deferred.value.trigger
    assert isinstance(trigger, InputTrigger) and deferred.value.method_name == "execute_after_wait"
    watch = InputWatch.from_json(trigger.watch)
    assert (watch.input_prefix, watch.ready_marker, watch.aws.ledger_table) == (prefix, None, staged.spec.ledger_table)
    assert before + wait <= trigger.deadline <= after + wait
    assert deferred.value.timeout == dt.timedelta(seconds=wait + 600)
    assert staged.step_item(run_id) is None
    run = staged.run_item(run_id)
    assert run.status == "RUNNING" and f"waiting up to {wait}s for its input (input.when_missing: wait)" in run.message


def test_back_from_the_input_trigger_a_run_plans_once_its_input_is_there_or_fails_having_waited(staged, context):
    prefix = staged.uri("landing")
    op = plan_operator(staged, spec_path=when_missing(staged, "wait"), input_prefix=prefix, output="out-landing")
    wait = op.spec.step("score").input.wait_timeout_seconds
    with pytest.raises(AirflowFailException) as gave_up:
        op.execute_after_wait(context("run-gave-up"), {"ready": False, "reason": f"no input file under {prefix} yet"})
    assert f"step score: waited {wait}s for its input and gave up: no input file under {prefix} yet" in str(
        gave_up.value
    )
    assert staged.step_item("run-gave-up") is None

    boto3.client("s3").put_object(Bucket=staged.bucket, Key="landing/part-0.parquet", Body=parquet_bytes(5, 0))
    returned = op.execute_after_wait(context("run-landed"), {"ready": True, "reason": f"{prefix}part-0.parquet"})
    attempt = Attempt.from_xcom(returned)
    assert (attempt.run_id, attempt.number, attempt.input_prefix, attempt.file_count) == ("run-landed", 1, prefix, 1)
    assert staged.step_item("run-landed").status == "PLANNED"


def test_a_scheduled_run_whose_interval_has_not_ended_waits_until_it_is_complete(staged, context):
    def hourly(data):
        data["schedule"] = "@hourly"
        data["steps"][0]["input"]["settle_seconds"] = 120

    op = plan_operator(staged, spec_path=staged.variant("hourly", hourly), output="out-hourly")
    run_id = "scheduled__later"
    ctx = context(run_id, run_type="scheduled")
    end = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(days=1)
    ctx.update(logical_date=end - dt.timedelta(hours=1), data_interval_start=end - dt.timedelta(hours=1))
    ctx["data_interval_end"] = end
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    trigger = deferred.value.trigger
    assert isinstance(trigger, InputTrigger) and deferred.value.method_name == "execute_after_wait"
    assert trigger.ready_at == end.timestamp() + 120
    # A scheduled run waits for its input by default: up to input.wait_timeout_seconds past the settle time.
    assert trigger.deadline == trigger.ready_at + op.spec.step("score").input.wait_timeout_seconds
    assert staged.step_item(run_id) is None and staged.run_item(run_id).status == "RUNNING"


# -- another run writes the output prefix -----------------------------------------------------------------------------


def test_a_run_whose_output_prefix_another_run_holds_waits_for_it_while_airflow_has_that_run(staged, context):
    plan_operator(staged, output="out-held").execute(context("run-holder"))
    for runs in ({"run-holder"}, None):  # Airflow has the holder; Airflow could not say
        ctx = context("run-waiter", runs=runs)
        with pytest.raises(TaskDeferred) as deferred:
            plan_operator(staged, output="out-held").execute(ctx)
        trigger = deferred.value.trigger
        assert isinstance(trigger, PartitionTrigger) and deferred.value.method_name == "execute_after_partition"
        watch = PartitionWatch.from_json(trigger.watch)
        assert (watch.output_prefix, tuple(watch.ref)) == (staged.uri("out-held"), (PIPELINE, "run-waiter", "score"))
        assert trigger.recheck_seconds == RECHECK_HOLDER_SECONDS
        assert ctx["ti"].asked == [(PIPELINE, ("run-holder",))]
        assert staged.step_item("run-waiter") is None
        assert f"`shardline cancel {PIPELINE}/run-holder` ends it sooner" in staged.run_item("run-waiter").message
    assert staged.run_item("run-holder").status == "RUNNING"  # left as it is


def test_a_run_whose_output_prefix_is_held_by_a_run_airflow_no_longer_has_ends_that_run_and_plans(staged, context):
    plan_operator(staged, output="out-gone").execute(context("run-deleted"))
    ctx = context("run-after", runs=set())  # its DAG run was deleted
    attempt = Attempt.from_xcom(plan_operator(staged, output="out-gone").execute(ctx))
    assert (attempt.run_id, attempt.number, attempt.output_prefix) == ("run-after", 1, staged.uri("out-gone"))
    assert ctx["ti"].asked == [(PIPELINE, ("run-deleted",))]
    gone = staged.run_item("run-deleted")
    assert gone.status == "FAILED" and "its DAG run no longer exists in Airflow (deleted)" in gone.message


# -- a dry run --------------------------------------------------------------------------------------------------------


def test_a_dry_run_previews_the_model_on_the_staged_input_and_submits_nothing(staged, context):
    run_id = "run-dry"
    op = plan_operator(staged, output="out-dry", dry_run="True")  # `{{ params.dry_run }}` rendered
    with pytest.raises(AirflowSkipException) as skipped:
        op.execute(context(run_id, conf={"dry_run": True}, params={"dry_run": True}))
    text = str(skipped.value)
    assert text.startswith(f"dry run: {FILES} file(s), ") and f"MiB under {staged.uri('in')}; would run 1 " in text
    assert "; nothing submitted; preview of " + staged.uri("in") + "part-0.parquet: " in text, text
    assert staged.step_item(run_id) is None and staged.jobs_of(run_id) == []


def test_a_dry_run_with_no_input_fails_as_a_real_run_would(staged, context):
    prefix = staged.uri("empty-dry")
    op = plan_operator(staged, input_prefix=prefix, output="out-dry-empty", dry_run="True")
    with pytest.raises(AirflowFailException) as failed:
        op.execute(context("run-dry-empty"))
    text = str(failed.value)
    assert text.startswith(f"dry run: no input file under {prefix}") and "a real run would fail the same way" in text
    assert staged.step_item("run-dry-empty") is None
