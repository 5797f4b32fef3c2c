"""Shardline's Airflow side: pipeline specs, planning, backends, the watch task and the DAG factory.

Modules that hold policy (``spec``, ``naming``) are pure and import no Airflow, so
they can be unit-tested with plain data. Operators and triggers stay thin.
"""

__version__ = "0.1.0"
