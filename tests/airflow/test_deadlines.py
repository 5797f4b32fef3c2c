"""A spec's deadline as an Airflow Deadline Alert: the alert a DAG gets, and what its callback says and records.

The callback is called here as Airflow's executor calls it (the spec's path, and the context Airflow hands a
deadline callback), against moto_server; tests/scenarios/test_scheduled_runs.py has a real Airflow fire it.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pytest
import yaml

from shardline.airflow.dag_factory import dag_from_spec
from shardline.airflow.deadlines import PartitionDue, deadline_alert, deadline_missed, missed_of
from shardline.airflow.ui.plugin import ShardlineUiPlugin
from shardline.ledger.keys import RUN_SK, run_pk
from shardline.ledger.records import RunRecord
from shardline.ledger.step_reads import list_runs
from shardline.ledger.step_writes import ensure_run
from shardline.ledger.table import bind_ledger
from shardline.oncall.views import run_message
from shardline.spec import SpecError, load_spec

HOURLY = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "tabular_scoring_hourly.yaml"
RUN_ID = "scheduled__2026-11-22T10:00:00+00:00"


def _context(state: str = "running") -> dict:
    """What Airflow hands a deadline callback: the run as its REST API shows it, and the deadline."""
    return {
        "dag_run": {
            "dag_run_id": RUN_ID,
            "dag_id": "tabular_scoring_hourly",
            "state": state,
            "run_type": "scheduled",
            "logical_date": "2026-11-22T10:00:00Z",
            "data_interval_start": "2026-11-22T10:00:00Z",
            "data_interval_end": "2026-11-22T11:00:00Z",
        },
        "deadline": {"id": str(uuid.uuid4()), "deadline_time": "2026-11-22T11:20:00+00:00"},
    }


def _dags(tmp_path: Path, notify: str | None = None, notify_code: str = "", table: str = "shardline-jobs") -> Path:
    """A DAG folder with the hourly spec, a deadline of 20m and, when given, a notify module of its own."""
    spec = yaml.safe_load(HOURLY.read_text())
    spec["deadline"] = {"after": "20m", **({"notify": notify} if notify else {})}
    spec["ledger_table"] = table
    (tmp_path / "pipelines").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "pipelines" / "hourly.yaml"
    path.write_text(yaml.safe_dump(spec))
    if notify_code:
        (tmp_path / f"{notify.rpartition('.')[0]}.py").write_text(notify_code)
    return path


def test_the_dag_gets_a_deadline_alert_on_the_partitions_due_time_and_a_spec_without_one_none(tmp_path):
    path = _dags(tmp_path)
    dag = dag_from_spec(str(tmp_path / "hourly.py"), "hourly.yaml")
    [alert] = dag.deadline
    assert isinstance(alert.reference, PartitionDue) and alert.interval.total_seconds() == 1200
    assert alert.callback.path == "shardline.airflow.deadlines.deadline_missed"
    assert alert.callback.kwargs == {"spec_path": str(path)}
    # Airflow's scheduler finds a custom reference only through a plugin: Shardline's lists it.
    assert PartitionDue in ShardlineUiPlugin.deadline_references
    assert deadline_alert(load_spec(HOURLY), HOURLY) is None


def test_a_notify_that_does_not_import_is_an_error_naming_the_file_and_the_field(tmp_path):
    path = _dags(tmp_path, notify=f"nowhere_{uuid.uuid4().hex[:8]}.page")
    with pytest.raises(SpecError) as err:
        dag_from_spec(str(tmp_path / "hourly.py"), "hourly.yaml")
    assert str(path) in str(err.value) and "deadline.notify" in str(err.value) and "no module" in str(err.value)
    module = f"alerts_{uuid.uuid4().hex[:8]}"
    _dags(tmp_path, notify=f"{module}.page", notify_code="def other(missed):\n    pass\n")
    with pytest.raises(SpecError, match=f"deadline.notify: '{module}.page': module '{module}' has no 'page'"):
        dag_from_spec(str(tmp_path / "hourly.py"), "hourly.yaml")
    # The module is there but imports what is not installed: the error names that, not the module.
    module = f"alerts_{uuid.uuid4().hex[:8]}"
    _dags(tmp_path, notify=f"{module}.page", notify_code="import pager_sdk_not_installed\n")
    with pytest.raises(SpecError, match=f"module '{module}' imports 'pager_sdk_not_installed', which is not installed"):
        dag_from_spec(str(tmp_path / "hourly.py"), "hourly.yaml")


@pytest.mark.parametrize(
    ("state", "command"),
    [
        ("running", f"shardline status tabular_scoring_hourly/{RUN_ID}"),
        ("queued", f"shardline status tabular_scoring_hourly/{RUN_ID}"),
        ("failed", f"shardline failed tabular_scoring_hourly/{RUN_ID}"),
    ],
)
def test_the_miss_names_the_pipeline_the_partition_the_runs_state_and_the_on_call_command(state, command):
    missed = missed_of("tabular_scoring_hourly", _context(state))
    assert (missed.partition, missed.state, missed.deadline) == ("2026-11-22T10:00:00", state, "2026-11-22T11:20:00Z")
    assert missed.message == (
        f"tabular_scoring_hourly: run {RUN_ID} had not scored partition 2026-11-22T10:00:00 by its deadline "
        f"2026-11-22T11:20:00Z (the Airflow run is {state}); on call: {command}"
    )


def test_the_miss_reads_the_deadline_as_the_executor_hands_it_and_a_run_that_ended_late_says_so():
    # The executor hands the deadline as a datetime; a naive one is UTC, as Airflow stores it; one missing is "?".
    context = _context("success")
    for when in (
        dt.datetime(2026, 11, 22, 11, 20, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 22, 11, 20),
        "2026-11-22T11:20:00",
    ):
        context["deadline"]["deadline_time"] = when
        assert missed_of("tabular_scoring_hourly", context).deadline == "2026-11-22T11:20:00Z"
    # It ended after its deadline, before the scheduler looked: Airflow still fires, and the message says what it is.
    assert missed_of("tabular_scoring_hourly", context).message == (
        f"tabular_scoring_hourly: run {RUN_ID} scored partition 2026-11-22T10:00:00 after its deadline "
        "2026-11-22T11:20:00Z"
    )
    assert missed_of("p", {"dag_run": {"dag_run_id": "r", "state": "running"}}).deadline == "?"


NOTIFY = """import json


def page(missed):
    with open({out!r}, "a") as f:
        f.write(json.dumps({{"message": missed.message, "state": missed.state}}) + "\\n")
"""


def test_the_callback_marks_the_run_late_in_the_ledger_and_calls_notify(tmp_path, ledger_table):
    out = tmp_path / "paged.jsonl"
    module = f"alerts_{uuid.uuid4().hex[:8]}"
    path = _dags(tmp_path, notify=f"{module}.page", notify_code=NOTIFY.format(out=str(out)), table=ledger_table)
    model = bind_ledger(ledger_table)
    ensure_run(model, "tabular_scoring_hourly", RUN_ID, "2026-11-22T10:00:00")

    deadline_missed(str(path), _context())
    run = RunRecord.of(model.Control.get(run_pk("tabular_scoring_hourly", RUN_ID), RUN_SK, consistent_read=True))
    assert (run.missed_deadline, run.deadline_misses) == ("past its deadline 2026-11-22T11:20:00Z (running then)", 1)
    assert run_message(run) == "past its deadline 2026-11-22T11:20:00Z (running then)"
    [paged] = [json.loads(line) for line in out.read_text().splitlines()]
    assert paged["state"] == "running" and "partition 2026-11-22T10:00:00" in paged["message"]
    # Called again (Airflow repeating it), it is counted again, not hidden: the scenario test expects one.
    deadline_missed(str(path), _context("failed"))
    run = RunRecord.of(model.Control.get(run_pk("tabular_scoring_hourly", RUN_ID), RUN_SK, consistent_read=True))
    assert (run.missed_deadline, run.deadline_misses) == ("past its deadline 2026-11-22T11:20:00Z (failed then)", 2)


def test_a_run_late_before_its_ledger_record_is_paged_recorded_late_and_a_failing_notify_fails_the_callback(
    tmp_path, ledger_table
):
    out = tmp_path / "paged.jsonl"
    module = f"alerts_{uuid.uuid4().hex[:8]}"
    code = NOTIFY.format(out=str(out)) + "    raise RuntimeError('the pager is down')\n"
    path = _dags(tmp_path, notify=f"{module}.page", notify_code=code, table=ledger_table)
    # The run's plan never started (no RUN item): the page goes out, the notify's own failure is raised so that
    # Airflow records the callback as failed, and the run is recorded late all the same, with its partition, so
    # `shardline runs`, `status` and the page show it late (it used to be in this log only).
    with pytest.raises(RuntimeError, match="the pager is down"):
        deadline_missed(str(path), _context("queued"))
    assert len(out.read_text().splitlines()) == 1
    model = bind_ledger(ledger_table)
    run = RunRecord.of(model.Control.get(run_pk("tabular_scoring_hourly", RUN_ID), RUN_SK, consistent_read=True))
    assert (run.status, run.partition) == ("RUNNING", "2026-11-22T10:00:00")
    assert (run.missed_deadline, run.deadline_misses) == ("past its deadline 2026-11-22T11:20:00Z (queued then)", 1)
    assert RUN_ID in [r.run_id for r in list_runs(model, "tabular_scoring_hourly")]


class _OneRow:
    """What Airflow's session answers for the run's row (run_type, data_interval_end, created_at, run_after)."""

    def __init__(self, row):
        self.row = row

    def execute(self, statement):
        return self

    def one_or_none(self):
        return self.row


@pytest.mark.parametrize(
    ("run_id", "run_type", "due"),
    [
        ("arrival__2026-11-22T10:00:00", "operator_triggered", "11:00"),  # its marker started it: due at the end
        ("manual__late", "operator_triggered", "15:30"),  # another run a task started: from its trigger
        ("scheduled__2026-11-22T10:00:00", "scheduled", "11:00"),
    ],
)
def test_a_run_its_ready_marker_started_is_due_at_its_intervals_end_however_late_the_marker(run_id, run_type, due):
    end = dt.datetime(2026, 11, 22, 11, tzinfo=dt.UTC)
    triggered = dt.datetime(2026, 11, 22, 15, 30, tzinfo=dt.UTC)
    session = _OneRow((run_type, end, triggered, end))
    answer = PartitionDue()._evaluate_with(session=session, dag_id="hourly", run_id=run_id)
    assert answer == dt.datetime.combine(end.date(), dt.time.fromisoformat(due), dt.UTC)
