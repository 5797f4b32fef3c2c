"""The timetable of a pipeline started on arrival (``trigger:``). Every Airflow process loads Shardline's plugin, which
registers it, so this module imports Airflow only."""

from __future__ import annotations

from airflow.timetables.interval import CronDataIntervalTimetable


class ArrivalTimetable(CronDataIntervalTimetable):
    """A cron schedule that only names intervals: a run of the interval that ends at ``run_after`` gets it as its
    data interval, and the scheduler creates no run itself (the arrivals DAG starts them). Registered through
    Shardline's plugin, as Airflow requires of a timetable of its own."""

    def next_dagrun_info(self, *, last_automated_data_interval, restriction):
        return None

    @property
    def summary(self) -> str:
        return f"{self._expression}, started on arrival"
