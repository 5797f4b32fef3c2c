"""On call: the service behind the `shardline` CLI and the page, the CLI itself, and Airflow's REST client.

The service, its IO:

- :mod:`.service`: ``OnCall``, the on-call requests: the parts below in one object.
- :mod:`.reads`: runs, status, failed: the ledger reads (``OnCallReads``, which each part below extends).
- :mod:`.run_reports`: a step's run report, found from its plan, rendered here from its report.json.
- :mod:`.resubmission` and :mod:`.run_actions`: resubmit, and a whole run's trigger, rerun and cancel.
- :mod:`.approvals`: ``checks`` (a run's output checks against the last partitions') and ``approve`` (outputs its
  blocking checks held back, accepted, and the DAG run's watch task cleared).

What it decides and shows, pure:

- :mod:`.values`: ``RunRef`` and the view types, built from the ledger's records.
- :mod:`.views`: what runs, status and failed show.
- :mod:`.messages`: every message.
- :mod:`.selection`: which files ``--all-failed``, ``--instance`` or ``--file`` take.
- :mod:`.errors`: ``NotFound``, ``Conflict``, ``BadRequest``, ``Refused``, ``Unavailable``, each with its HTTP
  status and exit code.

The `shardline` commands (click):

- :mod:`.cli` (a run's commands) and :mod:`.cli_tools` (before launch, and the machine), on :mod:`.cli_group` (the
  group, and the one place a reply is printed) and :mod:`.cli_base` (the click plumbing).
- :mod:`.printing`: how replies print.
- :mod:`.local_stack`: ``shardline local``, the embedded AWS stack.

And beside them:

- :mod:`.airflow_client`: Airflow's REST API.
- :mod:`.tune`: ``shardline tune``: fetches a step's model and a sample of its inputs, and runs the worker's
  ``--tune``.
- :mod:`.fleet`: ``shardline fleet`` and the page's Fleet panel: per quota, its pool's instances in use, the steps
  running and waiting, and today's jobs from the ledger; ``sync`` keeps an Airflow pool per quota.
"""
