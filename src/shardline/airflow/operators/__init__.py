"""The tasks of a pipeline step that ``dag_from_spec`` creates: plan, and watch (a deferrable operator that submits
the step's jobs and whose trigger polls them), and the run's report."""
