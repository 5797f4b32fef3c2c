"""Every DAG in dags/ imports cleanly, and a bad spec is an import error naming the file and field.

Parsed in a subprocess with its own AIRFLOW_HOME, as the dag-processor would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"dags": {d: sorted(t.task_id for t in dag.tasks) for d, dag in bag.dags.items()},
                  "errors": bag.import_errors,
                  "params": {d: sorted(dag.params.keys()) for d, dag in bag.dags.items()}}))
"""


def parse(dag_folder: Path, tmp_path: Path) -> dict:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dag_folder),
    }
    result = subprocess.run(
        [sys.executable, "-c", PARSE, str(dag_folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_dag_in_the_repo_imports(tmp_path):
    parsed = parse(REPO / "dags", tmp_path)
    assert parsed["errors"] == {}
    assert parsed["dags"]["tabular_scoring_hourly"] == ["plan_score", "report", "watch_score"]
    assert parsed["dags"]["daily_churn"] == sorted(
        ["plan_score", "watch_score", "plan_calibrate", "watch_calibrate", "report"]
    )
    assert parsed["params"]["daily_churn"] == ["dry_run", "input_prefix", "instance_count", "model_version"]


def test_a_bad_spec_is_an_import_error_naming_file_and_field(tmp_path):
    dags = tmp_path / "dags"
    shutil.copytree(REPO / "dags", dags)
    spec = yaml.safe_load((dags / "pipelines" / "daily_churn.yaml").read_text())
    spec["steps"][0]["resources"]["instance_count"] = 0
    (dags / "pipelines" / "daily_churn.yaml").write_text(yaml.safe_dump(spec))
    parsed = parse(dags, tmp_path)
    assert "tabular_scoring_hourly" in parsed["dags"]  # one bad spec does not take the others down
    assert "daily_churn" not in parsed["dags"]
    [(path, message)] = parsed["errors"].items()
    assert path.endswith("daily_churn.py")
    assert "pipelines/daily_churn.yaml: invalid pipeline spec" in message
    assert "steps[0].resources.instance_count" in message


@pytest.mark.parametrize("schedule", ["@hourly", "@daily", "@weekly", "@monthly", "*/15 * * * *", "0 6 * * 1-5"])
def test_a_scheduled_pipeline_scores_whole_intervals_and_the_cli_renders_the_same_interval(schedule):
    """A run's templates read its data interval. The DAG's timetable starts a run once its interval has ended, and
    the CLI's preview and tune (no Airflow there) render a manual run's interval as Airflow infers it."""
    import datetime as dt

    import pendulum
    from airflow.timetables.interval import CronDataIntervalTimetable

    from shardline.airflow.dag_factory import timetable_for
    from shardline.spec import data_interval

    assert type(timetable_for(schedule)).__name__ == "CronDataIntervalTimetable"
    assert timetable_for(None) is None
    core = CronDataIntervalTimetable(schedule, timezone="UTC")
    for when in (
        "2026-11-22T11:00:00",
        "2026-11-22T11:34:10",
        "2026-11-23T00:00:00",
        "2026-11-29T07:15:00",
        "2027-01-01T00:00:00",
        "2026-11-22T11:00:30",
        "2026-11-22T11:00:00.250000",
    ):
        logical = dt.datetime.fromisoformat(when).replace(tzinfo=dt.UTC)
        airflow_interval = core.infer_manual_data_interval(run_after=pendulum.instance(logical))
        assert data_interval(schedule, logical) == (airflow_interval.start, airflow_interval.end), (schedule, when)


ADMISSION = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"errors": bag.import_errors,
                  "tasks": {d: {t.task_id: [t.pool, t.pool_slots, t.priority_weight, str(t.weight_rule),
                                            t.max_active_tis_per_dag]
                                for t in dag.tasks} for d, dag in bag.dags.items()},
                  "max_instances": {d: dag.params.get_param("instance_count").schema.get("maximum")
                                    for d, dag in bag.dags.items()}}))
"""


def _parse_admission(dags: Path, tmp_path: Path) -> dict:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    result = subprocess.run(
        [sys.executable, "-c", ADMISSION, str(dags)], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_quota_in_fleet_yaml_admits_a_steps_tasks_through_its_pool_with_its_pipelines_priority(tmp_path):
    dags = tmp_path / "dags"
    shutil.copytree(REPO / "dags", dags)
    (dags / "fleet.yaml").write_text("quotas:\n  ml.c5.2xlarge: 6\n")  # the hourly pipeline's type
    hourly = dags / "pipelines" / "tabular_scoring_hourly.yaml"
    spec = yaml.safe_load(hourly.read_text())
    spec["priority"] = "high"
    spec["steps"][0]["resources"]["max_concurrent_instances"] = 5
    hourly.write_text(yaml.safe_dump(spec))
    parsed = _parse_admission(dags, tmp_path)
    assert parsed["errors"] == {}
    tasks = parsed["tasks"]["tabular_scoring_hourly"]
    # The watch (it submits the step's jobs) holds one slot per instance (2) of the type's pool, from the submit
    # until the step ends, and at most 5 // 2 of its runs' watches hold instances at once; the plan and report
    # need none.
    assert tasks["watch_score"] == ["sagemaker-ml.c5.2xlarge", 2, 100, "absolute", 2]
    assert tasks["plan_score"][:2] == ["default_pool", 1] and tasks["report"][:2] == ["default_pool", 1]
    # The Param stays within the quota (6), and at the capped step's own count (2): its cap counts 2 a job.
    assert parsed["max_instances"]["tabular_scoring_hourly"] == 2
    # A type without a quota: the default pool, at the default priority (normal).
    assert {tuple(t[:3]) for t in parsed["tasks"]["daily_churn"].values()} == {("default_pool", 1, 10)}
    assert {t[4] for t in parsed["tasks"]["daily_churn"].values()} == {None}  # no cap but the quota


def test_a_pooled_steps_instance_count_param_stops_at_the_slots_its_watch_holds(tmp_path):
    """Its watch holds the spec's count of its pool's slots: the Param may lower the count, never raise it to
    the quota (the job would run on instances no slot admitted)."""
    dags = tmp_path / "dags"
    shutil.copytree(REPO / "dags", dags)
    (dags / "fleet.yaml").write_text("quotas:\n  ml.c5.2xlarge: 20\n")  # the hourly pipeline's type
    parsed = _parse_admission(dags, tmp_path)
    assert parsed["errors"] == {}
    assert parsed["tasks"]["tabular_scoring_hourly"]["watch_score"][:2] == ["sagemaker-ml.c5.2xlarge", 2]
    assert parsed["max_instances"]["tabular_scoring_hourly"] == 2  # was the quota, 20
    assert parsed["max_instances"]["daily_churn"] == 100  # a type without a quota: nothing counts its instances


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ("quotas:\n  ml.c5.2xlarge: 1\n", "steps.score.resources.instance_count is 2, over the quota of 1"),
        ("quotas:\n  c5.2xlarge: 4\n", "quotas.c5.2xlarge"),
        ("quotas:\n  ml.c5.2xlarge: 0\n", "quotas.ml.c5.2xlarge"),
        ("quota:\n  ml.c5.2xlarge: 4\n", "quota"),
        ("- ml.c5.2xlarge\n", "a fleet file must be a YAML mapping"),
    ],
)
def test_a_bad_fleet_file_is_an_import_error_naming_the_file_and_the_field(tmp_path, fleet, expected):
    dags = tmp_path / "dags"
    shutil.copytree(REPO / "dags", dags)
    (dags / "fleet.yaml").write_text(fleet)
    errors = _parse_admission(dags, tmp_path)["errors"]
    hourly = next(text for path, text in errors.items() if path.endswith("tabular_scoring_hourly.py"))
    assert expected in hourly, hourly
    assert "fleet.yaml" in hourly


ARRIVALS = """
import json, sys
import pendulum
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
bag = DagBag(dag_folder=sys.argv[1])
out = {"errors": bag.import_errors, "dags": {d: sorted(t.task_id for t in dag.tasks) for d, dag in bag.dags.items()}}
if not bag.import_errors:
    pipeline = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["arrivals_hourly"]))
    timetable = pipeline.timetable
    interval = timetable.infer_manual_data_interval(run_after=pendulum.datetime(2026, 11, 29, 17))
    arrivals = DagSerialization.to_dict(bag.dags["arrivals_hourly__arrivals"])["dag"]
    out.update(
        timetable=type(timetable).__name__,
        summary=timetable.summary,
        next=timetable.next_dagrun_info(last_automated_data_interval=None, restriction=None),
        interval=[interval.start.isoformat(), interval.end.isoformat()],
        schedule=json.dumps(arrivals["timetable"]),
        triggers=json.dumps([t for t in arrivals["tasks"] if t["__var"]["task_id"] == "start_partition"]),
    )
print(json.dumps(out, default=str))
"""


def test_a_pipeline_started_on_arrival_is_two_dags_and_the_scheduler_starts_neither_by_the_clock(tmp_path):
    """The pipeline's own DAG keeps its schedule only to name its intervals (the scheduler creates no run of it,
    and a run started at an interval's end gets that interval); the arrivals DAG beside it is scheduled on the
    asset that the queue's watcher feeds, and starts the pipeline's runs without adding conf keys to them."""
    dags = tmp_path / "dags"
    shutil.copytree(REPO / "dags", dags)
    spec = yaml.safe_load((dags / "pipelines" / "tabular_scoring_hourly.yaml").read_text())
    spec["pipeline"] = "arrivals_hourly"
    spec["trigger"] = {"on": "ready_marker", "queue": "score-markers"}
    spec["steps"][0]["input"]["ready_marker"] = "_SUCCESS"
    spec["steps"][0]["output"]["table"]["name"] = "arrivals_hourly"  # a table of its own, beside the hourly one's
    (dags / "pipelines" / "arrivals_hourly.yaml").write_text(yaml.safe_dump(spec))
    (dags / "arrivals_hourly.py").write_text(
        "from shardline.airflow.dag_factory import dag_from_spec\n"
        "dag = dag_from_spec(__file__, 'arrivals_hourly.yaml')\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    result = subprocess.run(
        [sys.executable, "-c", ARRIVALS, str(dags)], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed["errors"] == {}
    assert parsed["dags"]["arrivals_hourly"] == ["plan_score", "report", "watch_score"]
    assert parsed["dags"]["arrivals_hourly__arrivals"] == ["partitions", "start_partition", "unmatched_markers"]
    assert parsed["timetable"] == "ArrivalTimetable" and parsed["summary"] == "0 * * * *, started on arrival"
    assert parsed["next"] is None
    assert parsed["interval"] == ["2026-11-29T16:00:00+00:00", "2026-11-29T17:00:00+00:00"]
    schedule = parsed["schedule"]
    assert "shardline-ready-markers-arrivals_hourly" in schedule
    assert "shardline.airflow.triggers.arrival.ReadyMarkerTrigger" in schedule and "score-markers" in schedule
    assert '"openlineage_inject_parent_info": false' in parsed["triggers"]
    assert '"skip_when_already_exists": true' in parsed["triggers"]


def test_two_pipelines_replacing_partitions_of_one_table_are_an_import_error_naming_both(tmp_path):
    """Each run replaces its partition of the table: two pipelines on one table would replace each other's rows. A
    table of its own, or both appending, is fine."""
    dags = tmp_path / "dags"
    shutil.copytree(REPO / "dags", dags)
    base = yaml.safe_load((dags / "pipelines" / "tabular_scoring_hourly.yaml").read_text())
    for name, table in (
        ("same_table", {}),  # the hourly pipeline's table, replacing
        ("own_table", {"name": "own_scores"}),
        ("appending", {"name": "shared_log", "mode": "append"}),
        ("appending_too", {"name": "shared_log", "mode": "append"}),
    ):
        spec = {**base, "pipeline": name}
        spec["steps"] = [{**base["steps"][0], "output": {**base["steps"][0]["output"]}}]
        spec["steps"][0]["output"]["table"] = {**base["steps"][0]["output"]["table"], **table}
        (dags / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        (dags / f"{name}.py").write_text(
            f"from shardline.airflow.dag_factory import dag_from_spec\ndag = dag_from_spec(__file__, '{name}.yaml')\n"
        )
    parsed = parse(dags, tmp_path)
    assert {"own_table", "appending", "appending_too"} <= set(parsed["dags"]), parsed["errors"]
    assert "same_table" not in parsed["dags"] and "tabular_scoring_hourly" not in parsed["dags"]
    message = parsed["errors"][str(dags / "same_table.py")]
    assert (
        "same_table.yaml: step 'score' output.table scoring.hourly_scores (catalog 'local') is also "
        "steps[0].output.table of tabular_scoring_hourly.yaml" in message
    ), message
    assert "output.table.mode: append" in message


def test_two_pipelines_on_one_queue_are_an_import_error_naming_both(tmp_path):
    """Each pipeline's watcher deletes every message it reads: on one queue, each would lose the other's markers."""
    dags = tmp_path / "dags"
    shutil.copytree(REPO / "dags", dags)
    base = yaml.safe_load((dags / "pipelines" / "tabular_scoring_hourly.yaml").read_text())
    base["steps"][0]["input"]["ready_marker"] = "_SUCCESS"
    base["steps"][0]["output"].pop("table")  # the queue is what they share
    for name in ("first_on_queue", "second_on_queue"):
        spec = {**base, "pipeline": name, "trigger": {"on": "ready_marker", "queue": "shared-markers"}}
        (dags / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        (dags / f"{name}.py").write_text(
            f"from shardline.airflow.dag_factory import dag_from_spec\ndag = dag_from_spec(__file__, '{name}.yaml')\n"
        )
    parsed = parse(dags, tmp_path)
    assert "first_on_queue" not in parsed["dags"] and "second_on_queue" not in parsed["dags"]
    assert "tabular_scoring_hourly" in parsed["dags"]
    message = parsed["errors"][str(dags / "first_on_queue.py")]
    assert "first_on_queue.yaml: trigger.queue 'shared-markers' is also the queue of second_on_queue.yaml" in message
