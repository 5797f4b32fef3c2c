"""A run's budget against moto_server and the local backend: a step whose run spends past ``budget.run_usd`` is stopped
between files, keeps what it finished and says what it spent; ``shardline resubmit --budget-usd`` raises the budget
and finishes the unfinished files only, every row once."""

from __future__ import annotations

import collections
import datetime as dt
import time
from pathlib import Path

import pytest

from shardline.backends import JobNotFound
from shardline.decision.budget import RUN_SETTING
from shardline.decision.policy import Action
from shardline.errors import InvalidArgument, OverBudgetRefused
from shardline.ledger.states import FileStatus
from shardline.oncall.service import OnCall
from shardline.oncall.values import FileChoice, RunRef
from shardline.orchestration import services
from shardline.orchestration.admission import next_day
from shardline.orchestration.budget import RAISED_SETTING, budget_for
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step import watch
from shardline.orchestration.step.files import latest_attempt, read_step_files
from shardline.spec import parse_spec
from tests.orchestration.test_quote import report_of, run_to_end
from tests.support.cli import run
from tests.support.pipelines import output_ids, plan_request, stage_step

FILES, ROWS = 8, 200
# A model that takes 1.5 s a call: each file (one batch of 200 rows) takes that long, whatever the machine.
SLOW_SCRIPT = """
import time


def model_fn(model_dir):
    return None


def predict_fn(data, model):
    time.sleep(1.5)  # a slow model
    return data[:, 0]
"""
PRICE = 3600.0  # USD an hour of the local instance: a dollar a second, so the budget reads in seconds
BUDGET = 4.0  # about four seconds: the instance's start-up and two or three files


@pytest.fixture
def slow_step(aws_env, ledger_table, tmp_path, monkeypatch):
    import io

    import pyarrow.parquet as pq

    from examples import synthetic
    from tests.support.helpers import write_inference_script

    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    write_inference_script(tmp_path / "script", SLOW_SCRIPT)
    inputs = {}
    for i in range(FILES):
        buf = io.BytesIO()
        pq.write_table(synthetic.make_table(ROWS, first_id=i * ROWS, n_features=4, seed=i), buf)
        inputs[f"part-{i:02d}.parquet"] = buf.getvalue()
    staged, bucket = stage_step(
        "budgeted",
        ledger_table,
        tmp_path / "script",
        tmp_path,
        inputs,
        features=synthetic.feature_names(4),
        step_settings={"resources": {"instance_count": 1, "workers_per_instance": 1}},
    )
    data = staged.model_dump(mode="json", exclude_defaults=True)
    data["cost"] = {"local_price_per_hour": PRICE}
    data["budget"] = {"run_usd": BUDGET}
    data["poll_interval_seconds"] = 0.5
    return parse_spec(data, "budgeted.yaml"), bucket


def drive(spec, attempt):
    """Poll as the watch's trigger polls, and end the step as its watch task ends it: the end, and the decision."""
    held = watch.StepWatch.of(spec, attempt.step, attempt)
    while True:
        decision = watch.decide_now(held, attempt)
        if decision.action is not Action.WAIT:
            return step_end.conclude(spec, watch.StepEvent.of(decision, attempt, held.policy)), decision
        time.sleep(spec.poll_interval_seconds)


def test_a_run_past_its_budget_is_stopped_between_files_and_the_raised_resubmit_finishes_it_every_row_once(slow_step):
    spec, bucket = slow_step
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-b", bucket))).attempt
    budget = budget_for(spec, attempt)
    assert (budget.run_usd, budget.setting, budget.price_per_hour, budget.spent_before_usd) == (
        4.0,
        RUN_SETTING,
        PRICE,
        0,
    )

    ended, decision = drive(spec, attempt)
    assert ended.action is Action.FAIL and decision.stop_job
    assert decision.reason.startswith("over budget: the run spent $")
    assert f"of its $4.0000 ({RUN_SETTING}), so this step was stopped between files with " in decision.reason
    command = decision.reason.split("`")[1]
    assert command.startswith("shardline resubmit budgeted/run-b --step score --budget-usd ")
    records = read_step_files(spec, attempt.ref, file_attributes=None)
    done = [f for f in records.files if f.status is FileStatus.SUCCEEDED]
    assert 0 < len(done) < FILES, "the budget stops the step part way"
    # What the stop let it spend: the run report's figure (each instance from its start to its last heartbeat), at
    # most one file's worth past the budget (a file takes 1.5 s here: $1.50).
    file_seconds = max(f.seconds for f in done)
    spent = report_of(spec, "run-b").cost.total
    assert BUDGET < spent <= BUDGET + file_seconds * PRICE / 3600, (spent, file_seconds)

    # On-call raises the budget as the message says: the unfinished files go again, the finished ones never
    raised = float(command.rsplit(" ", 1)[1])
    result = OnCall({"budgeted": spec}).resubmit(
        RunRef("budgeted", "run-b"), "score", FileChoice(all_failed=True), ledger_only=True, budget_usd=raised
    )
    assert result.attempt == 2 and len(result.plan.files) == FILES - len(done)
    # As the cleared watch task takes it up: the newest attempt from the ledger, watched from now
    second = latest_attempt(spec, attempt.ref).model_copy(update={"submitted_at": time.time()})
    again = budget_for(spec, second)
    assert (again.run_usd, again.setting) == (raised, RAISED_SETTING)
    ended, _ = drive(spec, second)
    assert ended.action is Action.ADVANCE, ended.reason
    ids = collections.Counter(output_ids(bucket))
    assert sorted(ids) == list(range(FILES * ROWS)) and set(ids.values()) == {1}, "every row once"


def test_a_job_whose_quote_passes_what_is_left_is_not_started_it_fails_naming_the_budget_or_waits_a_day(quoted):
    spec, bucket = quoted
    run_to_end(spec, bucket, "run-a", "a")  # the history a quote is made from
    report = report_of(spec, "run-a")
    per_file = report.cost.total / 2
    tight = _with_budget(spec, {"run_usd": per_file})  # less than the 5 files of b/ are quoted at
    attempt = step_plan.plan(
        tight, "score", plan_request("run-1", bucket, output="out/b", input_prefix=f"s3://{bucket}/in/b/")
    )
    with pytest.raises(OverBudgetRefused) as refused:
        step_jobs.submit(tight, attempt)
    said = str(refused.value)
    assert said.startswith("step score's job not started: its quote, $") and "(from 1 earlier run(s))" in said
    assert f"would pass what is left of the run's budget: ${per_file:,.4f} of ${per_file:,.4f} (budget.run_usd)" in said
    assert "`shardline resubmit quoted/run-1 --step score --budget-usd " in said
    with pytest.raises(JobNotFound):  # nothing was submitted
        services.backend_for(tight).describe(attempt.job_name)

    # The day's budget, spent by run-a already: with on_exceed: wait, the submit waits for the next UTC day, visibly
    daily = _with_budget(spec, {"daily_usd": report.cost.total * 1.01, "on_exceed": "wait"})
    second = step_plan.plan(
        daily, "score", plan_request("run-2", bucket, output="out/c", input_prefix=f"s3://{bucket}/in/c/")
    )
    waiting = step_jobs.submit(daily, second)
    assert isinstance(waiting, step_jobs.MustWait)
    tomorrow = next_day(dt.datetime.now(dt.UTC)).timestamp()
    assert tomorrow < waiting.retry_at <= tomorrow + 120
    assert "(budget.daily_usd); it waits for the next UTC day's budget (budget.on_exceed)" in waiting.note
    status = run("--dags-folder", str(_dags(daily, bucket)), "status", "quoted/run-2")
    assert "budget.daily_usd" in status.stdout, status.stdout + status.stderr
    # with on_exceed: fail, the same submit fails naming the day's budget
    failing = _with_budget(spec, {"daily_usd": report.cost.total * 1.01})
    with pytest.raises(
        OverBudgetRefused, match=r"budget for \d{4}-\d\d-\d\d \(UTC\): .* \(budget.daily_usd\); it fails"
    ):
        step_jobs.submit(failing, second)


def _with_budget(spec, budget: dict):
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["budget"] = budget
    return parse_spec(data, "quoted.yaml")


def _dags(spec, bucket) -> Path:
    import tempfile

    import yaml

    dags = Path(tempfile.mkdtemp(prefix="dags-")) / "dags"
    (dags / "pipelines").mkdir(parents=True)
    (dags / "pipelines" / f"{spec.pipeline}.yaml").write_text(
        yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True))
    )
    return dags


def test_a_budget_of_a_step_that_cannot_be_priced_is_refused_naming_the_setting_not_counted_at_nothing():
    """An instance type with no price would count $0 a second and never pass its budget: fail closed instead."""
    from shardline.orchestration.budget import step_price

    def spec_of(**step):
        return parse_spec(
            {
                "pipeline": "unpriced",
                "budget": {"run_usd": 1.0},
                "steps": [
                    {
                        "name": "score",
                        "model": {"uri": "s3://b/m.tar.gz", "sha256": "a" * 64},
                        "input": {"prefix": "s3://b/in/"},
                        "output": {"prefix": "s3://b/out/"},
                        **step,
                    }
                ],
            },
            "unpriced.yaml",
        )

    unknown = spec_of(resources={"instance_type": "ml.z9.xlarge"})
    with pytest.raises(InvalidArgument, match=r"cost.local_price_per_hour.*a budget cannot hold a run it cannot price"):
        step_price(unknown, "score")
    data = unknown.model_dump(mode="json", exclude_defaults=True)
    data.update(
        backend="sagemaker",
        sagemaker={
            "role_arn": "arn:aws:iam::123456789012:role/r",
            "image_uri": "1.dkr.ecr.us-east-1.amazonaws.com/w:1",
            "kms_key_id": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        },
    )
    sagemaker = parse_spec(data, "u.yaml")
    with pytest.raises(InvalidArgument, match=r"cost\.prices.*a budget cannot hold"):
        step_price(sagemaker, "score")
    assert step_price(spec_of(), "score") == 0.23  # ml.m5.xlarge, the local backend priced as SageMaker would
