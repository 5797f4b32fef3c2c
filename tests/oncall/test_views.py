"""What `shardline runs`, `status` and `failed` show (``shardline.oncall.views``), built from the ledger's
records as values, with the clock passed in. Pure: no server, no AWS, no Airflow. And the pure on-call
modules stay pure: importing them loads no AWS client library, no Airflow and no HTTP client."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest

from shardline.oncall import views
from shardline.oncall.errors import BadRequest
from shardline.oncall.views import FileView, RunRecord, RunRef, ShardRecord, StepRecord

NOW = dt.datetime(2026, 11, 22, 10, 0, 0, tzinfo=dt.UTC)
STARTED = NOW - dt.timedelta(seconds=100)


def f(
    name: str,
    status: str,
    attempt: int,
    rows_in: int | None = None,
    rows_out: int | None = None,
    host: str | None = "algo-1",
) -> FileView:
    return FileView("score", f"s3://b/in/{name}", status, attempt, host, rows_in, rows_out, None, None)


# Attempt 2 of a step, 100 s in: 4 of its files ended (3 succeeded, 1 failed), 3 are left; one file
# succeeded in attempt 1 already.
FILES = [
    f("a", "SUCCEEDED", 1, 50, 50),
    f("b", "SUCCEEDED", 2, 100, 100),
    f("c", "SUCCEEDED", 2, 100, 100),
    f("d", "SUCCEEDED", 2, 100, 100),
    f("e", "FAILED", 2),
    f("f", "RUNNING", 2),
    f("g", "PENDING", 2, host=None),
    f("h", "PENDING", 2, host=None),
]
SHARDS = [
    ShardRecord("algo-1", 2, "RUNNING", 4, 3, 1, 300, NOW - dt.timedelta(seconds=7)),
    ShardRecord("algo-2", 2, None, 4, 0, 0, 0, None),
    ShardRecord("algo-1", 1, "PARTIAL", 1, 1, 0, 50, None),
]


def test_a_running_step_counts_its_files_and_its_attempts_throughput_and_eta():
    step = views.step_view(
        "score",
        StepRecord("RUNNING", 2, STARTED, None, None),
        FILES,
        SHARDS,
        job_name="sl-p-score-a2",
        job_status="InProgress",
        now=NOW,
    )
    assert (step.files, step.succeeded, step.failed, step.running, step.pending) == (8, 4, 1, 1, 2)
    assert (step.rows_in, step.rows_out) == (350, 350)  # every succeeded file, whichever attempt
    # Over attempt 2 only: 300 rows out of its 4 ended files in 100 s; 3 files left at 4 files per 100 s.
    assert step.rows_per_second == 3.0 and step.eta_seconds == 75.0
    assert (step.started_at, step.job_name, step.job_status) == (STARTED.isoformat(), "sl-p-score-a2", "InProgress")
    assert [(s.host, s.attempt, s.status, s.heartbeat_age_seconds) for s in step.shards] == [
        ("algo-1", 2, "RUNNING", 7.0),
        ("algo-2", 2, "?", None),
        ("algo-1", 1, "PARTIAL", None),
    ]
    assert step.file_rows == []  # only asked for by the page
    assert (
        views.step_view(
            "score",
            StepRecord("RUNNING", 2, STARTED),
            FILES,
            [],
            job_name=None,
            job_status=None,
            now=NOW,
            with_files=True,
        ).file_rows
        == FILES
    )


def test_a_planned_step_whose_job_runs_shows_running_and_an_ended_one_is_measured_until_it_ended():
    planned = views.step_view(
        "score", StepRecord("PLANNED", 1, STARTED), [], [], job_name="j", job_status="InProgress", now=NOW
    )
    assert planned.status == "RUNNING" and planned.rows_per_second is None and planned.eta_seconds is None
    assert (
        views.step_view("score", StepRecord(None, 1), [], [], job_name="j", job_status=None, now=NOW).status
        == "PLANNED"
    )
    ended = [f("b", "SUCCEEDED", 2, 100, 100), f("c", "FAILED", 2)]
    step = views.step_view(
        "score",
        StepRecord("PARTIAL", 2, STARTED, STARTED + dt.timedelta(seconds=50), "1 failed"),
        ended,
        [],
        job_name="j",
        job_status="Completed",
        now=NOW + dt.timedelta(hours=5),
    )
    assert step.rows_per_second == 2.0 and step.eta_seconds is None and step.message == "1 failed"


def test_a_job_the_backend_does_not_know_ran_elsewhere_if_its_instances_reported():
    assert views.missing_job_status(SHARDS, 2) == "NotFoundHere"
    assert views.missing_job_status(SHARDS, 3) == "NotSubmitted"
    assert views.missing_job_status([], 1) == "NotSubmitted"


def test_a_run_view_names_the_step_to_take_up_when_airflow_disagrees():
    def step(name: str, status: str):
        return views.step_view(name, StepRecord(status, 1), [], [], job_name=None, job_status=None, now=NOW)

    ref = RunRef("p", "run-1")
    run = RunRecord("RUNNING", STARTED, None, "step score running")
    view = views.run_view(
        ref, run, [step("score", "SUCCEEDED"), step("calibrate", "FAILED"), step("rank", "PLANNED")], "failed"
    )
    assert (view.ref, view.status, view.started_at, view.finished_at) == (
        "p/run-1",
        "RUNNING",
        STARTED.isoformat(),
        None,
    )
    assert "`shardline resubmit p/run-1 --step rank --all-failed` takes it up again" in view.disagreement
    ended = views.run_view(
        ref, RunRecord("SUCCEEDED"), [step("score", "SUCCEEDED"), step("calibrate", "SUCCEEDED")], "failed"
    )
    assert "--step calibrate" in ended.disagreement and "turns green" in ended.disagreement  # the last step
    assert views.run_view(ref, RunRecord("RUNNING"), [], "running").disagreement is None
    assert views.run_view(ref, RunRecord(None), [], None).status == "UNKNOWN"


def test_a_run_row_without_its_run_item_is_unknown_and_airflow_is_set_beside_the_ledger():
    row = views.run_row("p", "run-1", STARTED, None)
    assert (row.status, row.started_at, row.finished_at, row.message) == ("UNKNOWN", STARTED.isoformat(), None, None)
    done = views.run_row("p", "run-2", STARTED, RunRecord("FAILED", STARTED, NOW, "step score failed"))
    assert (done.status, done.finished_at, done.message) == ("FAILED", NOW.isoformat(), "step score failed")
    assert views.with_airflow(done, "failed").disagreement is None
    flagged = views.with_airflow(done, "success")
    assert flagged.airflow_state == "success" and "shardline status p/run-2" in flagged.disagreement
    assert views.with_airflow(done, None) == done


def test_the_ledger_items_are_copied_as_they_were_read():
    """The records the service reads are pynamodb items; the views get plain copies of them (no table needed)."""
    from shardline.ledger.table import ControlItem, LedgerItem

    control = ControlItem(pk="RUN#p#run-1", sk="STEP#score", status="PARTIAL", attempt=2, started_at=STARTED)
    assert StepRecord.of(control) == StepRecord("PARTIAL", 2, STARTED, None, None)
    assert RunRecord.of(ControlItem(pk="x", sk="RUN", status="FAILED")).status == "FAILED"
    shard = LedgerItem(pk="x", sk="SHARD#2#algo-2", host="algo-2", attempt=2, files_assigned=4, heartbeat_at=NOW)
    assert ShardRecord.of(shard) == ShardRecord("algo-2", 2, None, 4, 0, 0, 0, NOW)
    item = LedgerItem(
        pk="x",
        sk="FILE#a",
        input_key="s3://b/in/a",
        status="FAILED",
        attempt=3,
        rows_in=10,
        error_class="CorruptInputError",
        error_message="bad",
    )
    assert views.file_view("score", item) == FileView(
        "score", "s3://b/in/a", "FAILED", 3, None, 10, None, "CorruptInputError", "bad"
    )


def test_a_run_is_named_pipeline_slash_run_id():
    ref = RunRef.parse("p/scheduled__2026-11-22T10:00:00+00:00")
    assert (
        ref == RunRef("p", "scheduled__2026-11-22T10:00:00+00:00")
        and str(ref) == "p/scheduled__2026-11-22T10:00:00+00:00"
    )
    for text in ("no-slash", "/r", "p/"):
        with pytest.raises(BadRequest, match="PIPELINE/RUN_ID"):
            RunRef.parse(text)


def test_a_half_done_resubmission_prints_the_command_that_repeats_it():
    ref = RunRef("p", "manual__2026-11-22T10:00:00+00:00")
    assert (
        views.resubmit_command(ref, "score", shard=None, files=(), all_failed=True, force=False)
        == "shardline resubmit p/manual__2026-11-22T10:00:00+00:00 --step score --all-failed"
    )
    assert views.resubmit_command(
        ref, "score", shard=None, files=["a b.parquet", "c"], all_failed=False, force=True
    ).endswith("--file 'a b.parquet' --file c --force")
    assert views.resubmit_command(ref, "score", shard="algo-2", files=(), all_failed=False, force=False).endswith(
        "--step score --shard algo-2"
    )


FORBIDDEN = ("boto3", "botocore", "pynamodb", "airflow", "httpx")


@pytest.mark.parametrize("module", ["shardline.oncall.views", "shardline.oncall.selection", "shardline.oncall.errors"])
def test_the_pure_on_call_modules_load_no_aws_client_no_airflow_and_no_http(module):
    code = (
        f"import json, sys, {module}\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))))"
    )
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(result.stdout) == []
