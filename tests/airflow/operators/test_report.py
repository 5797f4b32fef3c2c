"""The report task (ReportOperator), called as Airflow's task runner calls it, with the watch tasks' XComs as Airflow
would hand them, over a pipeline staged on moto_server: a step that wrote other numbers of rows than it read fails the
run naming the file; a run whose every step was skipped skips; a summary the ledger no longer vouches for (its STEP
item gone, its _SUCCESS gone) fails the run, never green; a step that succeeded ends the run SUCCEEDED and tells
downstream DAGs through the Asset event."""

from __future__ import annotations

import json

import boto3
import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from shardline.airflow.operators.report import ReportOperator
from shardline.airflow.operators.step import WatchStepOperator
from shardline.decision.policy import Action
from shardline.decision.summary import StepSummary
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.watch import StepEvent, StepWatch, decide_now
from shardline.planning.naming import outputs_manifest_key
from tests.airflow.operators.conftest import FILES, PIPELINE, ROWS, WHEN
from tests.support.pipelines import wait_for_job

PARTITION = WHEN.strftime("%Y-%m-%dT%H:%M:%S")


def report_operator(staged, *, spec_path: str | None = None, outlets=()) -> ReportOperator:
    """The report task as ``dag_from_spec`` builds it for a one-step pipeline."""
    return ReportOperator(
        task_id="report", spec_path=spec_path or staged.spec_path, watch_task_ids=["watch_score"], outlets=list(outlets)
    )


def plan(staged, run_id: str):
    return step_plan.plan(
        staged.spec,
        "score",
        step_plan.PlanRequest(
            run_id,
            input_prefix=staged.uri("in"),
            output_prefix=staged.uri(f"out-{run_id}"),
            model_uri=staged.model_uri,
            instance_count=1,
        ),
    )


def summary(**changes) -> StepSummary:
    """A step's summary as a watch task returns it: ``FILES`` files that all succeeded, rows in = rows out."""
    values = dict(
        step="score",
        files=FILES,
        succeeded=FILES,
        failed=0,
        rows_in=FILES * ROWS,
        rows_out=FILES * ROWS,
        rows_rejected=0,
        attempts=1,
        outcome=Action.ADVANCE,
    )
    return StepSummary(**(values | changes))


def test_a_step_whose_rows_out_differ_from_its_rows_in_fails_the_run_naming_the_file(staged, context):
    run_id = "run-mismatch"
    plan(staged, run_id)
    bad = f"{staged.uri('in')}part-1.parquet"
    returned = summary(rows_out=FILES * ROWS - 3, rows_mismatched_files=(bad,)).to_xcom()
    with pytest.raises(AirflowFailException) as failed:
        report_operator(staged).execute(context(run_id, xcoms={"watch_score": returned}))
    text = str(failed.value)
    assert text.startswith(f"rows in != rows out + rows rejected for 1 succeeded file(s): [{bad!r}]"), text
    run = staged.run_item(run_id)
    assert (run.status, run.message) == ("FAILED", text)


def test_a_run_whose_every_step_was_skipped_skips_and_records_nothing(staged, context):
    run_id = "run-all-skipped"
    with pytest.raises(AirflowSkipException) as skipped:
        report_operator(staged).execute(context(run_id, xcoms={"watch_score": None}))
    assert str(skipped.value) == "every step was skipped: none had input"
    assert staged.run_item(run_id) is None


def test_a_summary_whose_step_the_ledger_has_no_record_of_fails_the_run(staged, context):
    run_id = "run-no-record"  # never planned here: its STEP item is not in the ledger (a table lost, say)
    with pytest.raises(AirflowFailException) as failed:
        report_operator(staged).execute(context(run_id, xcoms={"watch_score": summary().to_xcom()}))
    text = str(failed.value)
    assert f"the ledger has no record of step score of run {run_id}, which planned attempt 1" in text, text
    assert text.endswith(f"Plan the run again: shardline rerun {PIPELINE}/{run_id}"), text
    run = staged.run_item(run_id)
    assert (run.status, run.message) == ("FAILED", text)


def test_a_step_that_succeeded_ends_the_run_green_and_tells_downstream_until_its_success_marker_is_gone(
    staged, context
):
    run_id = "run-green"
    attempt = step_jobs.submit(staged.spec, plan(staged, run_id)).attempt
    wait_for_job(staged.spec, attempt)
    watch = StepWatch.of(staged.spec, "score")
    event = StepEvent.of(decide_now(watch, attempt), attempt, watch.policy).to_event()
    watch_op = WatchStepOperator(task_id="watch_score", spec_path=staged.spec_path, plan_task_id="plan_score")
    returned = json.loads(json.dumps(watch_op.execute_complete(context(run_id), event)))  # the watch task's XCom

    def partitioned(data):  # its Asset event carries the run's partition as the partition key too
        data.update(schedule="@hourly", partitioned_asset=True)

    asset = Asset(staged.uri(f"out-{run_id}"))
    op = report_operator(staged, spec_path=staged.variant("partitioned", partitioned), outlets=[asset])
    ctx = context(run_id, xcoms={"watch_score": returned})
    assert op.execute(ctx) == {"steps": [returned]}
    run = staged.run_item(run_id)
    assert run.status == "SUCCEEDED" and run.finished_at is not None
    told = ctx["outlet_events"][asset]
    assert told.partitions == [PARTITION]
    prefix = staged.uri(f"out-{run_id}")
    assert told.extra == {
        "run_id": run_id,
        "partition": PARTITION,
        "status": "SUCCEEDED",
        "steps": [
            {
                "step": "score",
                "outcome": "ADVANCE",
                "files": FILES,
                "succeeded": FILES,
                "failed": 0,
                "rows_out": FILES * ROWS,
                "rows_rejected": 0,
                "attempts": 1,
                "output_prefix": prefix,
                "outputs_manifest": outputs_manifest_key(prefix, run_id, "score", None),
                "success_marker": f"{prefix}_SUCCESS",
                "approval": None,  # no output check held it back
                "table": None,  # its spec commits to no table
            }
        ],
    }

    # The same XCom, once the step's outputs were removed: what it says no longer stands, and the run is not green.
    boto3.client("s3").delete_object(Bucket=staged.bucket, Key=f"out-{run_id}/_SUCCESS")
    with pytest.raises(AirflowFailException) as failed:
        report_operator(staged).execute(context(run_id, xcoms={"watch_score": returned}))
    assert f"step score succeeded, but {prefix}_SUCCESS is gone" in str(failed.value)
    assert staged.run_item(run_id).status == "FAILED"
