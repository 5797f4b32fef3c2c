"""What the operators share (airflow/operators/base.py): ``fails_fast`` fails a task at once on an error no retry can
mend and leaves every other error to Airflow's retries; the spec a task reads once; how a run is named, typed,
partitioned and counted in lives from the context Airflow hands a task. No AWS: nothing here reaches it."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest
from airflow.sdk.api.datamodels._generated import DagRunType  # what a task's DAG run carries: str() is not its value
from airflow.sdk.exceptions import AirflowFailException

from shardline import errors
from shardline.airflow.operators.base import TaskRun, fails_fast, partition_text, utc_time
from shardline.airflow.operators.plan import PlanStepOperator
from shardline.planning.arrivals import ARRIVAL_RUN_PREFIX
from tests.airflow.operators.conftest import FakeDagRun

REPO = Path(__file__).resolve().parents[3]


class Task:
    """An operator's method, as the operators wrap theirs: it raises what it is given, or returns its arguments."""

    @fails_fast
    def execute(self, context, *args, error: BaseException | None = None, **kwargs):
        """Run the task."""
        if error is not None:
            raise error
        return context, args, kwargs


@pytest.mark.parametrize(
    "error",
    [
        errors.PermanentError("the spec says no"),
        errors.InvalidArgument("bad --files"),
        errors.SetupError("the model is not there"),
        errors.CorruptInputError("not parquet"),
        errors.LedgerRecordMissing("the ledger has no record of step score"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_fails_fast_fails_the_task_at_once_on_a_permanent_error_with_its_message(error):
    with pytest.raises(AirflowFailException) as failed:
        Task().execute({}, error=error)
    assert str(failed.value) == str(error) and failed.value.__cause__ is error


@pytest.mark.parametrize(
    "error",
    [
        errors.ShardlineError("the endpoint is busy"),
        errors.HostSetupError("this host's disk is full"),  # a SetupError whose class turns `permanent` off
        errors.GaveUpWaiting("gave up"),
        KeyError("step"),
        ConnectionError("reset by peer"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_fails_fast_leaves_any_other_error_to_airflows_retries(error):
    with pytest.raises(type(error)) as raised:
        Task().execute({}, error=error)
    assert raised.value is error


def test_fails_fast_passes_arguments_and_the_return_value_through_and_keeps_the_methods_name():
    assert Task().execute({"run_id": "r"}, 1, 2, flag=True) == ({"run_id": "r"}, (1, 2), {"flag": True})
    assert (Task.execute.__name__, Task.execute.__doc__) == ("execute", "Run the task.")


def test_an_operator_with_a_spec_it_cannot_read_fails_at_once_naming_the_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("pipeline: [\n")
    op = PlanStepOperator(
        task_id="plan_score", spec_path=str(bad), step="score", input_prefix="", output_prefix="", model_uri=""
    )
    with pytest.raises(AirflowFailException) as failed:
        op.execute({"run_id": "r"})
    assert str(failed.value).startswith(f"{bad}: not valid YAML")
    assert isinstance(failed.value.__cause__, errors.PermanentError)
    # A spec file that is not there (a DAGs folder still syncing) is no SpecError: Airflow retries.
    gone = PlanStepOperator(
        task_id="plan_score",
        spec_path=str(tmp_path / "gone.yaml"),
        step="s",
        input_prefix="",
        output_prefix="",
        model_uri="",
    )
    with pytest.raises(FileNotFoundError):
        gone.execute({"run_id": "r"})


def test_a_task_reads_its_spec_once(tmp_path):
    path = tmp_path / "tabular_scoring_hourly.yaml"
    shutil.copy(REPO / "dags" / "pipelines" / path.name, path)
    op = PlanStepOperator(
        task_id="plan_score", spec_path=str(path), step="score", input_prefix="", output_prefix="", model_uri=""
    )
    spec = op.spec
    assert spec.pipeline == "tabular_scoring_hourly"
    path.write_text("pipeline: [\n")  # edited while the task runs: the task goes on with what it read
    assert op.spec is spec


def test_a_run_is_named_typed_and_counted_as_the_context_says():
    def run(context: dict) -> TaskRun:
        return TaskRun.of(context)

    manual = run(
        {"run_id": "manual__1", "dag_run": FakeDagRun("manual__1", run_type=DagRunType.MANUAL, clear_number=2)}
    )
    assert manual.ref("p") == "p/manual__1"
    assert (manual.run_type, manual.input_run_type, manual.life, manual.has_dag_run) == ("manual", "manual", 2, True)
    plain = run({"run_id": "x", "dag_run": FakeDagRun("x", run_type="scheduled", clear_number=None)})
    assert (plain.run_type, plain.life) == ("scheduled", 0)
    callback = run({"run_id": "x"})  # a callback's context: no DAG run
    assert (callback.run_type, callback.life, callback.has_dag_run, callback.param("input_prefix")) == (
        "",
        0,
        False,
        None,
    )
    # A run an arrival started reads input.when_missing as its partition's scheduled run, whatever Airflow's type.
    arrival = run({"run_id": f"{ARRIVAL_RUN_PREFIX}2026-11-22T10", "dag_run": FakeDagRun("a", run_type="manual")})
    assert (arrival.run_type, arrival.input_run_type) == ("manual", "scheduled")
    assert run({"run_id": "r", "params": {"instance_count": 3}}).param("instance_count") == 3


def test_a_runs_partition_is_its_data_intervals_start_in_utc():
    start = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)
    logical = dt.datetime(2026, 11, 22, 11, tzinfo=dt.UTC)
    assert (
        TaskRun.of({"run_id": "r", "data_interval_start": start, "logical_date": logical}).partition
        == "2026-11-22T10:00:00"
    )
    assert (
        TaskRun.of({"run_id": "r", "data_interval_start": None, "logical_date": logical}).partition
        == "2026-11-22T11:00:00"
    )
    assert TaskRun.of({"run_id": "r"}).partition is None
    paris = dt.timezone(dt.timedelta(hours=1))
    assert partition_text(dt.datetime(2026, 11, 22, 11, 30, tzinfo=paris)) == "2026-11-22T10:30:00"
    assert partition_text(dt.datetime(2026, 11, 22, 10)) == "2026-11-22T10:00:00"  # naive: UTC, as Airflow stores
    assert partition_text("2026-11-22T10:00:00Z") == "2026-11-22T10:00:00"  # ISO text, as the REST API gives it
    assert utc_time("2026-11-22T11:00:00+01:00") == start
    assert utc_time("") is None and utc_time(None) is None
