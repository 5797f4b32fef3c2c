"""A run's actions (``shardline.oncall.run_actions``): `shardline trigger` and the scheduler's own run of the same
partition.

Once a run holding a partition's logical date is deleted (as the trigger's refusal says to do), the scheduler
creates that partition's run on its next loop; a trigger at that moment races it for the logical date, and
Airflow's scheduler does not survive losing that race (its insert fails the unique key and its loop ends: seen in
a real `airflow standalone`). The trigger waits for the scheduler's run instead. Airflow here is a script of what
its REST API answers; the real one is in tests/scenarios/test_scheduled_runs.py.
"""

from __future__ import annotations

import datetime as dt

import pytest

from shardline.oncall.errors import Conflict
from shardline.oncall.service import OnCall
from shardline.spec import parse_spec

U = dt.UTC
START = dt.datetime(2026, 11, 22, 12, 0, tzinfo=U)
NOW = START + dt.timedelta(hours=1, seconds=2)  # the hour has ended: its run is due


def spec():
    return parse_spec(
        {
            "pipeline": "hourly",
            "schedule": "@hourly",
            "steps": [
                {
                    "name": "score",
                    "model": {
                        "uri": "s3://m/{{ params.model_version }}/model.tar.gz",
                        "version": "v1",
                        "versions": {"v1": "0" * 64, "v2": "1" * 64},
                    },
                    "input": {"prefix": "s3://in/{{ ds }}/"},
                    "output": {"prefix": "s3://out/{{ ds }}/"},
                }
            ],
        },
        "hourly.yaml",
    )


class ScriptedAirflow:
    """The DAG's next run is the partition at START; the scheduler's run of it appears after ``appears_after``
    polls (never if None); ``held`` is a run that holds the logical date already."""

    def __init__(self, *, next_date=START, paused=False, appears_after=2, held=None):
        self.next_date, self.paused, self.appears_after, self.held = next_date, paused, appears_after, held
        self.polls, self.triggered = 0, []

    def dag(self, dag_id):
        return {
            "is_paused": self.paused,
            "next_dagrun_logical_date": self.next_date.isoformat().replace("+00:00", "Z"),
            "next_dagrun_run_after": (self.next_date + dt.timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
        }

    def runs_at(self, dag_id, logical_date):
        assert dt.datetime.fromisoformat(logical_date) == START
        if self.held:
            return [self.held]
        self.polls += 1
        if self.appears_after is not None and self.polls > self.appears_after:
            return [
                {"dag_run_id": "scheduled__2026-11-22T13:00:00+00:00", "data_interval_start": "2026-11-22T12:00:00Z"}
            ]
        return []

    def trigger(self, dag_id, conf, *, logical_date=None, data_interval=None):
        self.triggered.append((logical_date, data_interval))
        return {"dag_run_id": "manual__x"}


def service(airflow) -> OnCall:
    slept = []
    oncall = OnCall({"hourly": spec()}, airflow=airflow, now=lambda: NOW, sleep=slept.append)
    oncall.slept = slept
    return oncall


def test_a_trigger_of_the_partition_the_scheduler_is_creating_waits_for_its_run_and_makes_none():
    airflow = ScriptedAirflow(appears_after=2)
    said = service(airflow).trigger("hourly", START, {})
    assert airflow.triggered == []
    assert "scheduler started the run" in said[0] and "scheduled__2026-11-22T13:00:00+00:00" in said[0], said


def test_with_a_conf_it_says_how_to_score_the_schedulers_run_with_it():
    with pytest.raises(Conflict, match=r"shardline rerun hourly/scheduled__2026-11-22T13:00:00\+00:00 --conf"):
        service(ScriptedAirflow(appears_after=1)).trigger("hourly", START, {"model_version": "v2"})


@pytest.mark.parametrize(
    "airflow",
    [
        ScriptedAirflow(paused=True),  # a paused DAG creates nothing
        ScriptedAirflow(next_date=START + dt.timedelta(hours=3)),  # the scheduler is past it: it is MISSING
        ScriptedAirflow(held={"dag_run_id": "manual__held", "data_interval_start": "2026-11-22T11:00:00Z"}),
        ScriptedAirflow(appears_after=None),  # the scheduler never came (down?): trigger after the wait
    ],
    ids=["paused", "scheduler-past-it", "date-held", "scheduler-never-came"],
)
def test_otherwise_the_trigger_makes_the_run_itself(airflow):
    oncall = service(airflow)
    said = oncall.trigger("hourly", START, {})
    assert airflow.triggered == [
        ("2026-11-22T12:00:00+00:00", ("2026-11-22T12:00:00+00:00", "2026-11-22T13:00:00+00:00"))
    ]
    assert "triggered hourly" in said[0], said
    assert len(oncall.slept) == (
        60
        if airflow.appears_after is None and not airflow.paused and not airflow.held and airflow.next_date == START
        else 0
    )


class HeldAirflow(ScriptedAirflow):
    """Airflow refuses the trigger (409): ``held`` holds the partition's logical date."""

    def trigger(self, dag_id, conf, *, logical_date=None, data_interval=None):
        from shardline.oncall.airflow_client import AirflowApiError

        raise AirflowApiError("REST API answered 409: conflict", status=409)


def test_a_refused_trigger_names_the_run_that_holds_the_date_and_the_commands_that_work_as_printed():
    """The MISSING interval's command, refused: it names the run in the way (no PIPELINE/RUN_ID placeholder) and
    says how to move a manual run of the interval before out of it (its `rerun --conf` takes its own interval's
    start), or, for the partition's own run, how to score it again."""
    boundary = {
        "dag_run_id": "manual__2026-11-22T12:00:00+00:00",
        "data_interval_start": "2026-11-22T11:00:00Z",
        "state": "success",
        "conf": {"model_version": "v2"},
    }
    later = START + dt.timedelta(hours=3)  # the scheduler is past it: the interval is MISSING
    with pytest.raises(Conflict) as refused:
        service(HeldAirflow(next_date=later, held=boundary)).trigger("hourly", START, {})
    said = str(refused.value)
    assert "PIPELINE/RUN_ID" not in said
    assert "hourly/manual__2026-11-22T12:00:00+00:00, a manual run of the interval before" in said
    assert '`shardline rerun hourly/manual__2026-11-22T12:00:00+00:00 --conf \'{"model_version": "v2"}\'`' in said
    assert said.endswith("then `shardline trigger hourly --partition 2026-11-22T12:00`")

    running = {**boundary, "state": "running"}
    with pytest.raises(Conflict, match=r"\(it is running\)\. Once it has ended, move it"):
        service(HeldAirflow(next_date=later, held=running)).trigger("hourly", START, {})

    own = {"dag_run_id": "scheduled__2026-11-22T12:00:00+00:00", "data_interval_start": "2026-11-22T12:00:00Z"}
    with pytest.raises(Conflict, match=r"scores this partition; to score it again: `shardline rerun hourly/scheduled"):
        service(HeldAirflow(next_date=later, held=own)).trigger("hourly", START, {})


def test_a_rerun_checks_an_input_prefix_against_the_partition_its_own_logical_date_renders():
    """A manual run's logical date need not be its interval's start: its plan task renders ``{{ ds }}`` from the
    logical date, and so must on-call's check, or a folder of the run's own partition is refused (and another's
    let through)."""
    from shardline.oncall.run_actions import conf_problem
    from tests.support.specs import minimal

    spec = parse_spec(minimal(), "p.yaml")  # input s3://data/raw/dt={{ ds }}/, hourly
    interval = ("2026-11-22T23:00:00+00:00", "2026-11-23T00:00:00+00:00")
    own_day, other_day = (
        {"input_prefix": "s3://data/raw/dt=2026-11-23/"},
        {"input_prefix": "s3://data/raw/dt=2026-11-22/"},
    )
    # The logical date the run holds (the interval's end, as Airflow's inference gives a manual run).
    at = "2026-11-23T00:00:00+00:00"
    assert conf_problem(spec, own_day, None, interval, at) is None
    assert "is not in this run's partition s3://data/raw/dt=2026-11-23/" in conf_problem(
        spec, other_day, None, interval, at
    )
    # Without it, the interval's start renders the prefix, as `shardline trigger` starts a run.
    assert conf_problem(spec, other_day, None, interval) is None
    assert "is not in this run's partition" in conf_problem(spec, own_day, None, interval)
