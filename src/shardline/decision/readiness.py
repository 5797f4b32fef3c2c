"""When a run's input partition is complete enough to plan: pure, the clock passed in.

A scheduled run scores its data interval (``data_interval_start`` to ``data_interval_end``), and
Airflow starts it the moment the interval ends, while the interval's last files may still be
being written. So a scheduled run plans only once ``input.settle_seconds`` have passed since the
interval ended, or, when the spec names ``input.ready_marker``, once that marker is there (the
marker is the writer's own word that the partition is complete, so no time is waited for it).

A manual or backfill run of a scheduled pipeline waits the same way when its interval has not settled yet (a
partition a person names is as incomplete as a scheduled one until then), and plans at once for an interval
that has. Every run waits for ``input.ready_marker``. A run of an unscheduled pipeline plans at once.
"""

from __future__ import annotations

import datetime as dt

SCHEDULED = "scheduled"


def ready_at(
    *,
    run_type: str,
    interval_end: dt.datetime | None,
    settle_seconds: int,
    ready_marker: str | None,
    scheduled_pipeline: bool = True,
) -> dt.datetime | None:
    """The moment before which the run must not plan, or None when no time has to pass first."""
    if ready_marker or interval_end is None or (run_type != SCHEDULED and not scheduled_pipeline):
        return None
    return interval_end + dt.timedelta(seconds=settle_seconds)


def blocks_the_next_interval(
    *, run_type: str, scheduled_pipeline: bool, logical_date: dt.datetime | None, interval_end: dt.datetime | None
) -> bool:
    """Whether a manual run holds the logical date of the next interval's scheduled run: Airflow's own inference
    gives a manual run at an interval boundary L the interval that ends at L, while the scheduled run of the
    interval that starts at L has the logical date L too. The scheduler then never creates that run (it logs
    "run already exists" and keeps trying), and the interval is never scored."""
    return (
        run_type == "manual"
        and scheduled_pipeline
        and logical_date is not None
        and interval_end is not None
        and logical_date == interval_end
    )


def blocks_text(pipeline: str, run_id: str, logical_date: dt.datetime, start: dt.datetime) -> str:
    """What such a run does to the next interval, and how to trigger a partition instead."""
    return (
        f"manual run {run_id} has the logical date {logical_date:%Y-%m-%dT%H:%M}Z and scores the interval that ends "
        f"then, so it holds the logical date of the scheduled run of the interval that starts at "
        f"{logical_date:%H:%M}, which Airflow does not create while this run exists (`shardline runs` shows that "
        f"interval MISSING once it is due). Once this run has ended, delete it (the Airflow UI, or DELETE "
        f"/api/v2/dags/{pipeline}/dagRuns/{run_id}) so the scheduler goes on. Trigger a partition by its start "
        f"instead: `shardline trigger {pipeline} --partition {start:%Y-%m-%dT%H:%M}` (logical date {start:%H:%M}, "
        "that data interval), as its scheduled run would be"
    )


def not_ready_reason(ready: dt.datetime, settle_seconds: int) -> str:
    """Why a scheduled run does not plan until ``ready`` (its interval's end plus ``settle_seconds``, as
    :func:`ready_at` says): which interval, and the spec field that sets the wait."""
    interval_end, settle = ready - dt.timedelta(seconds=settle_seconds), settle_seconds
    return (
        f"the partition's data interval ended at {interval_end:%Y-%m-%d %H:%M:%S} UTC and files may still be "
        f"landing: it is planned from {ready:%H:%M:%S} UTC, {settle}s later (input.settle_seconds; or name "
        "input.ready_marker, the object the writer puts last)"
    )


BACKFILL = "backfill"


def due_at(*, run_type: str, interval_end: dt.datetime | None, triggered_at: dt.datetime | None) -> dt.datetime | None:
    """When a run's partition is due, the moment its deadline (``deadline.after``) counts from: a scheduled run's
    data interval's end (a catch-up run of an old interval is late at once: its partition was owed long ago); a
    manual run's (`shardline trigger --partition`, a rerun with a new conf, the UI's form), the later of that and
    the moment it was triggered, so a manual run of an old partition is not late the moment it starts. A backfill
    has none (None): Airflow creates all its runs at once and runs a few at a time, by choice. None, too, when
    neither time is known."""
    if run_type == BACKFILL:
        return None
    if run_type == SCHEDULED and interval_end is not None:
        return interval_end
    known = [when for when in (interval_end, triggered_at) if when is not None]
    return max(known) if known else None
