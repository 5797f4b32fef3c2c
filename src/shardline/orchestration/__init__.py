"""What the Airflow tasks, the CLI and the page call to run a pipeline, over the layers below.

:mod:`.step` owns a step's life, from its plan to its end; :mod:`.run` holds a run's own records (how it ended, the
DAG's failure callback); :mod:`.partitions` the holds on output prefixes; :mod:`.services` builds the clients a
pipeline uses; :mod:`.deadlines` and :mod:`.model_check` are the plan task's checks before anything is submitted.
"""
