"""The Airflow layer: the DAG factory, operators, triggers and the on-call page. Thin: policy lives below.

By role, as in Airflow's Amazon provider; each subpackage's docstring names its modules:

- :mod:`.dag_factory`: one DAG per pipeline spec (plan, then the watch, for each step; then a report), from a
  two-line DAG file.
- :mod:`.operators`: the tasks: plan, the watch task (which submits and watches), report; failing fast on a
  permanent error; their messages.
- :mod:`.triggers`: all polling, on JSON values only.
- :mod:`.ui`: the on-call page plugin, which also lists the deadline reference and the arrival timetable.
- :mod:`.arrivals`: the ``<pipeline>__arrivals`` DAG of a pipeline started on arrival: its watched asset, fed by
  ``triggers/arrival.ReadyMarkerTrigger``, and its tasks.
- :mod:`.timetables`: ``ArrivalTimetable``, a schedule that names intervals and starts none.
- :mod:`.deadlines`: a spec's ``deadline`` as a Deadline Alert: ``PartitionDue``, the reference, and
  ``deadline_missed``, the callback.
- :mod:`.lineage`: the watch task's OpenLineage datasets, rows and ``shardline`` run facet, loaded only by the
  provider.
"""
