"""Operators and the watch sensor of a pipeline step (the tasks ``dag_from_spec`` creates)."""
