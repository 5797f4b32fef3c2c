"""Shardline's job-metadata ledger: one DynamoDB table, shared by the worker and Airflow.

This package is the single source of truth for the table's schema, its key layout and
its states. It imports neither Airflow nor the worker, so both sides can depend on it.
Import each name from its module (``ledger.states``, ``ledger.keys``, ``ledger.table``...): the package itself
loads nothing, so importing the states or keys never loads pynamodb.

- :mod:`.table`: the schema, the pynamodb models, and binding them to a real table.
- :mod:`.keys`: the key layout, pure string builders.
- :mod:`.states`: every state a record can hold.
- :mod:`.context`: an instance's identity (table, run, step, attempt), read from its environment.
- :mod:`.records`: the one read model. A ``FileRecord``, ``ShardRecord``, ``StepRecord`` and ``RunRecord`` per
  item, each with its ``error_line()``; the decision, the run report, on-call's views and the page all read these.
- :mod:`.step_writes`: what plans, watches and on-call write, fenced on the attempt.
- :mod:`.step_reads`: how every reader reads a run and its steps (Queries, never Scans).
- :mod:`.job_writes`: what an instance writes: its files' claims and ends, and its heartbeat.
- :mod:`.partitions`: one lock item per output prefix, saying which run writes it now. It is taken with a fenced
  conditional write and held as a lease; it is free only once the backend confirms its last holder's job ended,
  whatever ended that run.
- :mod:`.baselines`: a step's reference profile for its output checks (``shardline checks baseline``): one item per
  step, never expiring, written whole.
- :mod:`.requests`: the AWS requests a job makes, by billing kind: counted by the worker's clients (recorded with
  its heartbeats) and, on the local backend, by its grant proxy from the wire.
- :mod:`.budgets`: a run's budget as on-call raised it (``resubmit --budget-usd``), on its RUN item.
- :mod:`.record_gaps`: when the ledger cannot vouch for a step: its STEP item gone or older than the attempt
  planned, or the table gone. Absence is never success, and never a newer attempt.
"""
