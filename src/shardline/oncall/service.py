"""What an on-call engineer does to a run: the IO. The CLI and the UI page call :class:`OnCall`.

It is made of the on-call services by role: :mod:`~shardline.oncall.reads` (runs, status, failed),
:mod:`~shardline.oncall.run_reports` (a step's run report), :mod:`~shardline.oncall.resubmission` (resubmit)
and :mod:`~shardline.oncall.run_actions` (rerun, cancel). What is shown is built in
:mod:`shardline.oncall.views`, what is said in :mod:`shardline.oncall.messages`, and what a resubmission does
is decided in :mod:`shardline.decision.resubmit`.
"""

from __future__ import annotations

from shardline.oncall.resubmission import Resubmission
from shardline.oncall.run_actions import RunActions
from shardline.oncall.run_reports import RunReports


class OnCall(RunReports, Resubmission, RunActions):
    """On-call reads and actions over the pipelines in one DAGs folder (``OnCall.from_folder``)."""
