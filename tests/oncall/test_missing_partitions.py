"""No partition is ever skipped silently: the intervals a schedule owes that no run scores are MISSING rows of
`shardline runs` (and the page), each with the command that scores it; a manual run names its partition by the
interval's start, so it never takes another interval's logical date."""

from __future__ import annotations

import datetime as dt

import pytest

from shardline.oncall.values import RunRow
from shardline.oncall.views import MISSING, MISSING_GRACE_SECONDS, missing_rows
from shardline.spec import SpecError, data_interval, interval_starts, parse_spec, partition_interval

U = dt.UTC


def spec(schedule: str | None = "@hourly", settle: int = 300):
    return parse_spec(
        {
            "pipeline": "hourly",
            "schedule": schedule,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": "s3://m/model.tar.gz", "sha256": "0" * 64},
                    "input": {"prefix": "s3://in/{{ ds }}/", "settle_seconds": settle},
                    "output": {"prefix": "s3://out/{{ ds }}/"},
                }
            ],
        },
        "hourly.yaml",
    )


def row(partition: str, run_id: str = "scheduled__x") -> RunRow:
    """A run of the listing: a scheduled one unless ``run_id`` says otherwise."""
    return RunRow("hourly", run_id, "SUCCEEDED", None, None, partition=partition)


def test_an_interval_with_no_run_is_missing_with_the_command_that_scores_it():
    now = dt.datetime(2026, 11, 22, 14, 0, tzinfo=U) + dt.timedelta(seconds=300 + MISSING_GRACE_SECONDS)
    rows = [row("2026-11-22T10:00:00"), row("2026-11-22T11:00:00"), row("2026-11-22T13:00:00")]
    missing = missing_rows(spec(), rows, now)
    assert [(m.status, m.partition) for m in missing] == [(MISSING, "2026-11-22T12:00:00")]
    assert "shardline trigger hourly --partition 2026-11-22T12:00" in missing[0].message


def test_a_pipeline_started_on_arrival_owes_the_intervals_between_its_arrival_runs():
    # A marker whose message was lost starts nothing: its interval is listed as any scheduled pipeline's would be.
    now = dt.datetime(2026, 11, 22, 14, 0, tzinfo=U) + dt.timedelta(seconds=300 + MISSING_GRACE_SECONDS)
    rows = [row("2026-11-22T10:00:00", "arrival__2026-11-22T10:00:00"), row("2026-11-22T13:00:00", "arrival__x")]
    missing = missing_rows(spec(), rows, now)
    assert [m.partition for m in missing] == ["2026-11-22T12:00:00", "2026-11-22T11:00:00"]


def test_a_long_gap_lists_the_newest_missing_intervals_and_says_how_many_more():
    now = dt.datetime(2026, 11, 23, 10, 30, tzinfo=U)
    missing = missing_rows(spec(settle=0), [row("2026-11-22T10:00:00")], now, limit=3)
    assert [m.partition for m in missing] == ["2026-11-23T09:00:00", "2026-11-23T08:00:00", "2026-11-23T07:00:00"]
    assert "(20 more interval(s) before it are missing too)" in missing[-1].message


def test_a_manual_run_of_an_old_partition_does_not_stretch_the_span():
    # A rerun of the partition three days back is among the newest runs: the hours between it and the
    # scheduled runs are not owed by this listing (their runs are further down it).
    now = dt.datetime(2026, 11, 22, 13, 0, tzinfo=U) + dt.timedelta(seconds=300 + MISSING_GRACE_SECONDS)
    rows = [row("2026-11-19T10:00:00", "manual__rerun"), row("2026-11-22T11:00:00"), row("2026-11-22T12:00:00")]
    assert missing_rows(spec(), rows, now) == []


def test_an_interval_still_settling_or_just_queued_is_not_missing():
    # 13:00-14:00 ended at 14:00: its run may still be waiting for its settle time and the grace.
    now = dt.datetime(2026, 11, 22, 14, 5, tzinfo=U)
    assert missing_rows(spec(), [row("2026-11-22T12:00:00")], now) == []


def test_an_unscheduled_pipeline_owes_no_interval():
    now = dt.datetime(2026, 11, 23, tzinfo=U)
    assert missing_rows(spec(None), [row("2026-11-22T10:00:00")], now) == []


def test_a_partition_is_named_by_its_start_and_never_takes_the_next_intervals_logical_date():
    begin, end = partition_interval("@hourly", dt.datetime(2026, 11, 22, 10, tzinfo=U))
    assert (begin, end) == (dt.datetime(2026, 11, 22, 10, tzinfo=U), dt.datetime(2026, 11, 22, 11, tzinfo=U))
    # Airflow's own inference for a manual run at 11:00 scores the same hour, but holds the logical date 11:00,
    # which is the scheduled run's of 11:00-12:00: what `shardline trigger` avoids.
    assert data_interval("@hourly", dt.datetime(2026, 11, 22, 11, tzinfo=U)) == (begin, end)
    with pytest.raises(SpecError, match="starts at 2026-11-22T10:00:00Z"):
        partition_interval("@hourly", dt.datetime(2026, 11, 22, 10, 30, tzinfo=U))
    with pytest.raises(SpecError, match="no schedule"):
        partition_interval(None, begin)


def test_interval_starts_keeps_the_newest_when_the_span_is_long():
    starts = interval_starts(
        "* * * * *", dt.datetime(2025, 1, 1, tzinfo=U), dt.datetime(2026, 11, 22, 10, 0, tzinfo=U), max_count=3
    )
    assert [s.minute for s in starts] == [57, 58, 59] and starts[-1].hour == 9


def test_interval_starts_lists_whole_intervals_only():
    starts = interval_starts(
        "*/10 * * * *", dt.datetime(2026, 11, 22, 9, 5, tzinfo=U), dt.datetime(2026, 11, 22, 9, 45, tzinfo=U)
    )
    assert [s.minute for s in starts] == [10, 20, 30]


def test_runs_lists_the_missing_intervals_of_every_pipeline_not_only_the_busiest(ledger_table):
    """Two hourly pipelines on one ledger table: the quiet one missed 11:00, and the busy one's runs since fill the
    listing. The quiet one's MISSING row is there all the same, read from its own runs."""
    from shardline.ledger.states import StepStatus
    from shardline.ledger.step_writes import ensure_run, set_run_status
    from shardline.ledger.table import bind_ledger
    from shardline.oncall.service import OnCall

    def pipeline(name: str):
        found = spec(settle=0).model_dump()
        return parse_spec({**found, "pipeline": name, "ledger_table": ledger_table}, f"{name}.yaml")

    model = bind_ledger(ledger_table)
    for name, hours in (("quiet", (10, 12)), ("busy", (10, 11, 12, 13))):
        for hour in hours:
            run_id = f"scheduled__2026-11-22T{hour}:00:00+00:00"
            ensure_run(model, name, run_id, f"2026-11-22T{hour}:00:00")
            set_run_status(model, name, run_id, StepStatus.SUCCEEDED)
    now = dt.datetime(2026, 11, 22, 14, 0, tzinfo=U) + dt.timedelta(seconds=MISSING_GRACE_SECONDS + 1)
    oncall = OnCall({"quiet": pipeline("quiet"), "busy": pipeline("busy")}, now=lambda: now)
    rows = oncall.runs(limit=3)
    listed = [(r.pipeline, r.partition) for r in rows if r.status != MISSING]
    assert {p for p, _ in listed} == {"busy"}  # the newest 3 runs are the busy pipeline's
    missing = {(r.pipeline, r.partition) for r in rows if r.status == MISSING}
    assert ("quiet", "2026-11-22T11:00:00") in missing
    assert ("quiet", "2026-11-22T13:00:00") in missing
    assert not any(p == "busy" and part < "2026-11-22T14:00:00" for p, part in missing)
    assert [(r.pipeline, r.partition) for r in oncall.runs("quiet") if r.status == MISSING] == [
        ("quiet", "2026-11-22T13:00:00"),
        ("quiet", "2026-11-22T11:00:00"),
    ]
