"""Shardline's on-call page inside Airflow 3: pipelines, runs, steps, shards and files, and "resubmit failed".

``plugin`` registers it with Airflow (a FastAPI app mounted at ``/shardline`` and an external
view in the navigation); ``api`` is that app, over ``shardline.oncall.service``; ``root`` is the path
Airflow is served under, which both read. Nothing is imported here: every Airflow process loads
plugins, and only the API server needs the app.
"""
