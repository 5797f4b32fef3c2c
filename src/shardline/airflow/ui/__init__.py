"""Shardline's on-call page inside Airflow 3: pipelines, runs, steps, instances and files, and "resubmit failed".

:mod:`.plugin` registers it with Airflow (a FastAPI app mounted at ``/shardline`` and an external
view in the navigation), with the deadline reference and the arrival timetable; :mod:`.api` is that app, over
:mod:`shardline.oncall.service`; :mod:`.root` is the path Airflow is served under, which both read. Nothing is
imported here: every Airflow process loads plugins, and only the API server needs the app.
"""
