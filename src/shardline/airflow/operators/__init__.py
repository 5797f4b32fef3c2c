"""The tasks of a pipeline step that ``dag_from_spec`` creates: plan, submit, watch (a deferrable operator whose
trigger polls), and the run's report."""
