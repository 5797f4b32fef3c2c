"""What `shardline runs`, `status` and `failed` show (``shardline.oncall.views``), built from the ledger's
records as values, with the clock passed in, and how the ledger and Airflow are compared
(``views.disagreement``). Pure: no server, no AWS, no Airflow. And the pure on-call modules stay pure:
importing them loads no AWS client library, no Airflow and no HTTP client."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest

from shardline.ledger.records import RunRecord, ShardRecord, StepRecord
from shardline.oncall import views
from shardline.oncall.values import FileView, RunRef

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
    assert [(s.host, s.attempt, s.status, s.heartbeat_age_seconds) for s in step.instances] == [
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


@pytest.mark.parametrize(
    ("ledger", "airflow"),
    [
        ("SUCCEEDED", "success"),
        ("PARTIAL", "success"),
        ("FAILED", "failed"),
        ("CANCELLED", "failed"),
        ("RUNNING", "running"),
        ("PLANNED", "queued"),
        ("RUNNING", None),
        ("UNKNOWN", "failed"),
    ],
)
def test_agreeing_states_are_not_flagged(ledger, airflow):
    assert views.disagreement(ledger, airflow, "p/r1", "score") is None


def test_a_run_no_task_drives_is_flagged_with_the_command_that_takes_it_up():
    said = views.disagreement("RUNNING", "failed", "p/r1", "score")
    assert said.startswith("the DAG run's state is failed but the ledger says RUNNING: no task drives this run now")
    assert "`shardline resubmit p/r1 --step score --all-failed` takes it up again" in said
    said = views.disagreement("SUCCEEDED", "failed", "p/r1")
    assert "clears it, so the run turns green" in said and "shardline status p/r1" in said


FORBIDDEN = ("boto3", "botocore", "pynamodb", "airflow", "httpx")


@pytest.mark.parametrize(
    "module",
    [
        "shardline.oncall.views",
        "shardline.oncall.values",
        "shardline.oncall.messages",
        "shardline.oncall.selection",
        "shardline.oncall.errors",
    ],
)
def test_the_pure_on_call_modules_load_no_aws_client_no_airflow_and_no_http(module):
    code = (
        f"import json, sys, {module}\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))))"
    )
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(result.stdout) == []


# --- what `failed` says when no file is left to resubmit --------------------------------------------------------

REF = RunRef("p", "scheduled__2026-11-22T10:00:00+00:00")


def test_a_failed_run_whose_files_are_all_scored_says_what_is_missing_and_prints_rerun():
    """The watch failed after every file succeeded (it lost its hold on the prefix): nothing to resubmit, and yet
    the run is red with no _SUCCESS. The note names the step's end and the command."""
    run = RunRecord("FAILED", message="DAG run failed (task_failure); check the failed task's log in Airflow for why")
    step = StepRecord("FAILED", 2, message="the run no longer holds the lock on s3://b/out/")
    scored = [f("a", "SUCCEEDED", 2, 10, 10), f("b", "SUCCEEDED", 2, 10, 10)]
    note = views.failed_note(REF, run, {"score": step}, scored)
    assert note is not None
    assert note.startswith(f"every file of {REF} was scored, so there is nothing to resubmit; yet the run ended FAILED")
    assert "step score ended FAILED: the run no longer holds the lock on s3://b/out/" in note
    assert "no _SUCCESS" in note
    assert note.endswith(
        f"`shardline rerun {REF}` runs its failed tasks again, which check the outputs and commit them"
    )

    # Every step ended well and the run is still red (its report task failed): the run's end is what is missing.
    done = views.failed_note(REF, run, {"score": StepRecord("SUCCEEDED", 2)}, scored)
    assert "the run's end (its report task) was not recorded" in done and "shardline rerun" in done
    # A later step its run never planned is named.
    two = views.failed_note(REF, run, {"score": StepRecord("SUCCEEDED", 1), "post": None}, scored)
    assert "step post was never planned" in two


def test_no_note_while_a_file_is_left_or_nothing_ended_badly():
    run = RunRecord("FAILED")
    step = StepRecord("FAILED", 1, message="1 of 2 file(s) failed")
    assert views.failed_note(REF, run, {"score": step}, [f("a", "SUCCEEDED", 1), f("b", "FAILED", 1)]) is None
    running = RunRecord("RUNNING")
    assert views.failed_note(REF, running, {"score": StepRecord("RUNNING", 1)}, [f("a", "SUCCEEDED", 1)]) is None
    green = RunRecord("SUCCEEDED")
    assert views.failed_note(REF, green, {"score": StepRecord("SUCCEEDED", 1)}, [f("a", "SUCCEEDED", 1)]) is None
