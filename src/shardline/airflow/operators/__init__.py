"""The tasks of a pipeline step that ``dag_from_spec`` creates: plan, and watch (a deferrable operator that submits
the step's jobs and whose trigger polls them), and the run's report.

- :mod:`.plan`: the plan task: check the run's conf and model, wait for the partition or its input, plan attempt 1
  (or, with ``dry_run``, preview the step).
- :mod:`.step`: the watch task, which submits the planned attempt, defers to ``StepTrigger`` and acts on the
  decision it brings back; and the DAG's failure callback.
- :mod:`.report`: the report task: reconcile rows in against rows out, record how the run ended, and tell
  downstream DAGs through the Asset event.
- :mod:`.base`: what the operators share: the spec a task reads once, and failing fast on a permanent error.
- :mod:`.messages`: what the operators say when a task fails, skips or warns.
"""
