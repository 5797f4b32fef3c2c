"""Shardline's on-call page inside Airflow 3: pipelines, runs, steps, shards and files, and "resubmit failed".

``airflow_plugin`` registers it with Airflow (a FastAPI app mounted at ``/shardline`` and an
external view in the navigation); ``oncall_api`` is that app, over ``shardline.oncall``.
Nothing is imported here, so a process that only scans the plugins folder stays light.
"""
