"""When a run's input partition is complete enough to plan: pure, the clock passed in.

A scheduled run scores its data interval (``data_interval_start`` to ``data_interval_end``), and
Airflow starts it the moment the interval ends, while the interval's last files may still be
being written. So a scheduled run plans only once ``input.settle_seconds`` have passed since the
interval ended, or, when the spec names ``input.ready_marker``, once that marker is there (the
marker is the writer's own word that the partition is complete, so no time is waited for it).

A manual or backfill run names a partition that a person chose: it plans at once, as it finds
the input (a spec that needs a guarantee names ``input.ready_marker``, which every run waits for).
"""

from __future__ import annotations

import datetime as dt

SCHEDULED = "scheduled"


def ready_at(
    *, run_type: str, interval_end: dt.datetime | None, settle_seconds: int, ready_marker: str | None
) -> dt.datetime | None:
    """The moment before which the run must not plan, or None when no time has to pass first."""
    if ready_marker or run_type != SCHEDULED or interval_end is None:
        return None
    return interval_end + dt.timedelta(seconds=settle_seconds)


def not_ready_reason(interval_end: dt.datetime, ready: dt.datetime) -> str:
    """Why a scheduled run does not plan yet: which interval, and the spec field that sets the wait."""
    settle = int((ready - interval_end).total_seconds())
    return (
        f"the partition's data interval ended at {interval_end:%Y-%m-%d %H:%M:%S} UTC and files may still be "
        f"landing: it is planned from {ready:%H:%M:%S} UTC, {settle}s later (input.settle_seconds; or name "
        "input.ready_marker, the object the writer puts last)"
    )
