"""Rendering a spec's templated URIs outside Airflow, as a run with a given logical date and data interval
renders them: the CLI's preview and tune, and the arrivals DAG that finds which partition a marker completes."""

from __future__ import annotations

import datetime as dt


def default_params(model_version: str) -> dict:
    """The trigger form's defaults (``dag_factory.params_for``), as a run that sets none renders them."""
    return {"model_version": model_version, "input_prefix": "", "instance_count": None, "dry_run": False}


def render_uri(template: str, *, logical_date: dt.datetime, start: dt.datetime, end: dt.datetime, params: dict) -> str:
    """``template`` rendered with Airflow's date variables and filters for that run. Raises
    ``jinja2.TemplateError`` (an undefined variable included) when it uses anything else."""
    import jinja2

    context = {
        "ds": logical_date.strftime("%Y-%m-%d"),
        "ds_nodash": logical_date.strftime("%Y%m%d"),
        "ts": logical_date.isoformat(),
        "logical_date": logical_date,
        "data_interval_start": start,
        "data_interval_end": end,
        "params": params,
    }
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    # Airflow's own filters, so `{{ data_interval_start | ds }}` renders here as in a task.
    env.filters.update(
        {
            "ds": lambda d: d.strftime("%Y-%m-%d"),
            "ds_nodash": lambda d: d.strftime("%Y%m%d"),
            "ts": lambda d: d.isoformat(),
            "ts_nodash": lambda d: d.strftime("%Y%m%dT%H%M%S"),
        }
    )
    return env.from_string(template).render(**context)


def render_interval(template: str, model_version: str, start: dt.datetime, end: dt.datetime) -> str:
    """``template`` as the run of the interval ``start``-``end`` with the logical date ``start`` renders it (a
    scheduled run's, or one an arrival starts), with the Params' defaults."""
    return render_uri(template, logical_date=start, start=start, end=end, params=default_params(model_version))


def names_partitions(template: str, model_version: str, schedule: str, start_date: dt.datetime) -> str | None:
    """Why ``template`` cannot tell which interval of ``schedule`` a folder is (it fails to render, or two intervals
    share a folder), or None when it can."""
    import jinja2

    from shardline.spec import interval_starts, partition_interval

    first = interval_starts(schedule, start_date, start_date + dt.timedelta(days=800), max_count=2)
    intervals = [partition_interval(schedule, s) for s in first]
    try:
        rendered = [render_interval(template, model_version, s, e) for s, e in intervals]
    except jinja2.TemplateError as err:
        return f"it cannot be rendered outside a task ({err}): use {{{{ ds }}}}, data_interval_start and the like"
    if len(rendered) == 2 and rendered[0] == rendered[1]:
        return (
            f"two intervals share its folder ({rendered[0]}), so a marker there names no one partition: template it "
            "down to the schedule's interval (e.g. hour={{ data_interval_start.strftime('%H') }} for @hourly)"
        )
    return None
