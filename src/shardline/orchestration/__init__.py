"""What the Airflow tasks, the CLI and the page call to run a pipeline, over the layers below.

Plain functions; only :mod:`.services` reaches Airflow, for the Amazon provider's AWS connection on SageMaker.

- :mod:`.step`: one owner for a step's life, from its plan to its end; its own docstring names its modules.
- :mod:`.run`: a run's own records, above its steps: how it ended (``finish_run``), a run that ends or waits before
  anything was planned (``record_run_status``), and the DAG's failure callback, which stops the jobs of the life
  that failed before it releases their holds (``end_failed_life``).
- :mod:`.partitions`: a step's hold on its output prefix through its life: taken at plan, renewed by the watch for
  every prefix the run holds, checked before ``_SUCCESS``, released at the run's end.
- :mod:`.services`: which clients and backend a spec (or its ``AwsSettings``) uses; the only place that knows.
- :mod:`.model_check`: the plan task's check that the model is where the spec says, before anything is planned.
- :mod:`.tables`: a step's output table: its catalog (pyiceberg, on Airflow's side only) and the one commit per run
  that makes a partition's outputs the table's, before ``_SUCCESS``; its history and a scan back.
- :mod:`.quote`: a quote before launch: each partition's inputs listed, its steps' rates from their earlier runs
  (or a sample run the CLI gives), priced; what ``shardline quote`` prints and the plan task logs.
- :mod:`.budget`: a run's budget and what it has spent, from the ledger: what a step's watch holds the run to, what
  the pipeline's runs of a day have spent; the prices a spec's steps are priced at.
- :mod:`.admission`: before each submit, whether the job's quote fits what is left of its run's and its day's budget
  (a refusal fails the step naming the budget, or waits for the next UTC day with ``budget.on_exceed: wait``).
- :mod:`.footers`: parquet footers read from S3 without the data (a commit's data files, a quote's rows).
- :mod:`.deadlines`: a missed deadline, recorded on the run's RUN item (the Deadline Alert's callback calls it).
"""
