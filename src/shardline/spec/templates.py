"""Rendering a spec's templated URIs outside Airflow, as a run with a given logical date and data interval
renders them: the CLI's preview and tune, and the arrivals DAG that finds which partition a marker completes."""

from __future__ import annotations

import datetime as dt
import functools

WINDOW_CHECKED = 200  # how many consecutive intervals `names_partitions` renders (a marker's window, mostly)


def default_params(model_version: str) -> dict:
    """The trigger form's defaults (``dag_factory.params_for``), as a run that sets none renders them."""
    return {"model_version": model_version, "input_prefix": "", "instance_count": None, "dry_run": False}


@functools.lru_cache(maxsize=64)
def _compiled(template: str):
    import jinja2

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
    return env.from_string(template)


def render_uri(template: str, *, logical_date: dt.datetime, start: dt.datetime, end: dt.datetime, params: dict) -> str:
    """``template`` rendered with Airflow's date variables and filters for that run (its dates pendulum's, as a
    task's are). Raises ``jinja2.TemplateError`` (an undefined variable included) when it uses anything else."""
    import pendulum

    logical = pendulum.instance(logical_date)
    context = {
        "ds": logical.strftime("%Y-%m-%d"),
        "ds_nodash": logical.strftime("%Y%m%d"),
        "ts": logical.isoformat(),
        "ts_nodash": logical.strftime("%Y%m%dT%H%M%S"),
        "ts_nodash_with_tz": logical.isoformat().replace("-", "").replace(":", ""),
        "logical_date": logical,
        "data_interval_start": pendulum.instance(start),
        "data_interval_end": pendulum.instance(end),
        "params": params,
    }
    return _compiled(template).render(**context)


def render_interval(template: str, model_version: str, start: dt.datetime, end: dt.datetime) -> str:
    """``template`` as the run of the interval ``start``-``end`` with the logical date ``start`` renders it (a
    scheduled run's, or one an arrival starts), with the Params' defaults."""
    return render_uri(template, logical_date=start, start=start, end=end, params=default_params(model_version))


def names_partitions(template: str, model_version: str, schedule: str, start_date: dt.datetime) -> str | None:
    """Why ``template`` cannot tell which interval of ``schedule`` a folder is (it fails to render, or two of
    ``WINDOW_CHECKED`` consecutive intervals share a folder), or None when it can."""
    import jinja2

    from shardline.spec import intervals_between

    window = intervals_between(schedule, start_date, start_date + dt.timedelta(days=400), max_count=WINDOW_CHECKED)
    seen: dict[str, dt.datetime] = {}
    for start, end in window:
        try:
            folder = render_interval(template, model_version, start, end)
        except jinja2.TemplateError as err:
            return f"it cannot be rendered outside a task ({err}): use {{{{ ds }}}}, data_interval_start and the like"
        if folder in seen:
            return (
                f"two intervals share its folder ({folder}: {seen[folder]:%Y-%m-%dT%H:%M} and {start:%Y-%m-%dT%H:%M}), "
                "so a marker there names no one partition: template it down to the schedule's interval, date "
                "included (e.g. dt={{ data_interval_start | ds }}/hour={{ data_interval_start.strftime('%H') }} for "
                "@hourly)"
            )
        seen[folder] = start
    return None
