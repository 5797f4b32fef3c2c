"""What happens next to a step, decided from a snapshot of the ledger and the backend (pure, no IO).

Every rule here is a pure function, with the clock passed in, so each is table-tested with plain data:

- :mod:`.readiness`: when a scheduled run's partition is complete (its data interval's end plus
  ``input.settle_seconds``, or its ready marker), and when it is due (``due_at``, what a ``deadline`` counts from).
- :mod:`.policy`: ``Action``, the one outcome vocabulary (WAIT, ADVANCE, PARTIAL, RESUBMIT, FAIL, TIMEOUT,
  UNREACHABLE), and ``decide()``, the watch's state machine over a snapshot of the ledger and the job's
  ``JobStatus``. An instance's recorded setup error fails the step at once. ``for_late_inputs`` decides for inputs
  that landed after planning. ``needs_files()`` says whether a decision depends on the step's files: not while the
  job runs with every instance heard from, so such a poll reads only the STEP and SHARD items.
- :mod:`.resubmit`: ``choose_next``, what an on-call resubmission does given the step and its Airflow task
  (``Next``, ``NextStep``).
- :mod:`.fleet`: AWS's ordinary refusals as decisions. A refused submit waits, jittered (``submit_wait``); a
  capacity failure picks the next instance type and count (``capacity_choice``); one pool per instance type, and the
  priority weights.
- :mod:`.step_end`: how a done step ends, from the checks of its outputs (its prefix still its own, every output
  vouched for, rejects within ``tolerance.rows``, drift), the first failing check first.
- :mod:`.summary`: ``StepSummary``, a step's rows in and out as one typed value (what its watch task returns, the
  report task, the lineage and the Asset event read), and ``status_of``, the one mapping from a watch's outcome to
  the status a step records.
- :mod:`.run_end`: how a run ends, from its steps' summaries.
- :mod:`.budget`: what a run has spent (each instance from its start to its last heartbeat, or now), and whether it
  is past its budget (``over_budget``): ``decide()`` then stops the step (a FAIL naming the spend and the budget).
"""
