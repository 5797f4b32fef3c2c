"""A spec's templated URIs rendered outside Airflow (``shardline.spec.templates``), as a run with those dates
renders them, and whether a template names one partition per interval of its schedule."""

from __future__ import annotations

import datetime as dt

import jinja2
import pytest

from shardline.spec.templates import default_params, names_partitions, render_interval, render_uri

START = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)
END = START + dt.timedelta(hours=1)


def test_a_run_that_sets_no_params_renders_the_forms_defaults():
    assert default_params("v3") == {"model_version": "v3", "input_prefix": "", "instance_count": None, "dry_run": False}


@pytest.mark.parametrize(
    ("template", "rendered"),
    [
        ("s3://b/dt={{ ds }}/", "s3://b/dt=2026-11-22/"),
        ("s3://b/{{ ds_nodash }}/{{ ts_nodash }}/", "s3://b/20261122/20261122T100000/"),
        ("s3://b/{{ ts }}/", "s3://b/2026-11-22T10:00:00+00:00/"),
        ("s3://b/hour={{ logical_date.strftime('%H') }}/", "s3://b/hour=10/"),
        (
            "s3://b/{{ data_interval_start | ds }}/{{ data_interval_end | ts_nodash }}/",
            "s3://b/2026-11-22/20261122T110000/",
        ),
        (
            "s3://b/{{ data_interval_end | ds_nodash }}/{{ data_interval_start | ts }}/",
            "s3://b/20261122/2026-11-22T10:00:00+00:00/",
        ),
        ("s3://m/{{ params.model_version }}/model.tar.gz", "s3://m/v7/model.tar.gz"),
    ],
)
def test_a_template_renders_with_airflows_variables_and_filters(template, rendered):
    got = render_uri(template, logical_date=START, start=START, end=END, params={"model_version": "v7"})
    assert got == rendered


def test_a_variable_no_task_has_is_an_error_not_an_empty_string():
    with pytest.raises(jinja2.UndefinedError):
        render_uri("s3://b/{{ dag_run.conf }}/", logical_date=START, start=START, end=END, params={})


def test_an_interval_renders_as_its_scheduled_run_with_the_default_params():
    later = START + dt.timedelta(days=1)
    template = "s3://b/{{ ds }}/{{ data_interval_end | ds }}/{{ params.model_version }}/{{ params.input_prefix }}"
    assert render_interval(template, "v1", START, later) == "s3://b/2026-11-22/2026-11-23/v1/"


def test_a_template_down_to_the_schedules_interval_names_its_partitions():
    hourly = "s3://b/dt={{ data_interval_start | ds }}/hour={{ data_interval_start.strftime('%H') }}/"
    assert names_partitions(hourly, "v1", "@hourly", START) is None
    assert names_partitions("s3://b/dt={{ ds }}/", "v1", "@daily", START) is None


def test_a_template_coarser_than_the_schedule_names_the_two_intervals_that_share_a_folder():
    problem = names_partitions("s3://b/dt={{ ds }}/", "v1", "@hourly", START)
    assert problem.startswith("two intervals share its folder (s3://b/dt=")
    assert "template it down to the schedule's interval" in problem


def test_a_template_that_cannot_render_outside_a_task_is_named_so():
    problem = names_partitions("s3://b/{{ run_id }}/", "v1", "@hourly", START)
    assert problem.startswith("it cannot be rendered outside a task (")
    assert "'run_id' is undefined" in problem
