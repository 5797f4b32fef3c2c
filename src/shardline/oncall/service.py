"""What an on-call engineer does to a run: the IO. The CLI and the UI page call :class:`OnCall`.

:class:`OnCall` is the on-call roles together, each a part of one object over the pipelines of a DAGs folder and
their Airflow: :class:`~shardline.oncall.reads.OnCallReads` (runs, status, failed),
:class:`~shardline.oncall.run_reports.RunReports` (a step's run report),
:class:`~shardline.oncall.resubmission.Resubmission` (resubmit), :class:`~shardline.oncall.approvals.Approvals` (a run's
output checks, and approving what they held back) and :class:`~shardline.oncall.run_actions.RunActions` (trigger,
rerun, cancel). Each request is a method of the role that owns it, so "go to definition" finds it.
What is shown is built in :mod:`shardline.oncall.views`, what is said in :mod:`shardline.oncall.messages`, and what a
resubmission does is decided in :mod:`shardline.decision.resubmit`.
"""

from __future__ import annotations

from shardline.oncall.approvals import Approvals
from shardline.oncall.run_actions import RunActions


class OnCall(Approvals, RunActions):
    """On-call reads and actions over the pipelines in one DAGs folder (``OnCall.from_folder``)."""
