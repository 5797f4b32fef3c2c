"""The report task: reconcile every step's rows in against rows out, record how the run ended (decided by
:func:`shardline.decision.run_end.run_end`), and tell downstream DAGs through the Asset event."""

from __future__ import annotations

import dataclasses

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from shardline.airflow.operators.base import SpecMixin, TaskRun, fails_fast
from shardline.decision.policy import Action  # pure, as the line below
from shardline.decision.run_end import run_end  # pure, as the line above
from shardline.decision.summary import StepSummary  # pure
from shardline.ledger.keys import StepRef
from shardline.ledger.states import RunStatus  # pure: no AWS client library at DAG parse


class ReportOperator(SpecMixin, BaseOperator):
    """Reconcile every step's rows in against rows out; the summary goes to the log and XCom."""

    def __init__(self, *, spec_path: str, watch_task_ids: list[str], **kwargs):
        # A failed step leaves this task upstream_failed, so the DAG run fails; a step skipped
        # for empty input still lets the others be reported.
        kwargs.setdefault("trigger_rule", "none_failed")
        super().__init__(**kwargs)
        self.spec_path, self.watch_task_ids = spec_path, watch_task_ids

    @fails_fast
    def execute(self, context):
        returned = [context["ti"].xcom_pull(task_ids=t) for t in self.watch_task_ids]
        results = [StepSummary.from_xcom(r) if r else None for r in returned]  # None: a step skipped for no input
        summaries = [s for s in results if s is not None]
        for s in summaries:
            self.log.info(
                "step %s: %d/%d files succeeded, %d failed, rows in %d, rows out %d, rows rejected %d, attempts %d",
                s.step,
                s.succeeded,
                s.files,
                s.failed,
                s.rows_in,
                s.rows_out,
                s.rows_rejected,
                s.attempts,
            )
            if s.report:
                from shardline.planning.naming import report_command

                self.log.info(
                    "step %s: run report %s (%s)",
                    s.step,
                    s.report,
                    report_command(self.spec.pipeline, context["run_id"], s.step),
                )
        ended = run_end(results)
        if ended.status is not RunStatus.FAILED and (gaps := self._gaps(context, summaries)):
            # What the watch tasks returned no longer stands (the ledger or the outputs lost, or changed): never green.
            ended = dataclasses.replace(ended, status=RunStatus.FAILED, message="; ".join(gaps))
            self.log.error("%s", ended.message)
        if ended.status is RunStatus.FAILED:
            self._finish_run(context, ended.status, ended.message)
            raise AirflowFailException(ended.message)
        if ended.steps_skipped:
            self.log.info("%d step(s) skipped (no input)", ended.steps_skipped)
        if ended.status is None:
            raise AirflowSkipException(ended.message)
        self._finish_run(context, ended.status, ended.message)
        status = ended.status.value
        self._tell_downstream(context, status, summaries)
        return {"steps": [s.to_xcom() for s in summaries]}

    def _tell_downstream(self, context, status: str, summaries: list[StepSummary]) -> None:
        """The Asset event carries what the output prefix's own markers say: per step, whether it
        SUCCEEDED (and so wrote ``_SUCCESS``), its rows, and where its outputs manifest is; and the run's partition,
        in its extra, and with ``partitioned_asset`` as its partition key too."""
        from shardline.orchestration.step.files import latest_attempt
        from shardline.planning import naming

        steps = []
        for s in summaries:
            attempt = latest_attempt(self.spec, StepRef(self.spec.pipeline, context["run_id"], s.step))
            prefix = attempt.output_prefix if attempt else None
            manifest = (
                naming.outputs_manifest_key(prefix, context["run_id"], s.step, attempt.metadata_prefix)
                if prefix
                else None
            )
            steps.append(
                {
                    "step": s.step,
                    "outcome": s.outcome.value if s.outcome else None,
                    "files": s.files,
                    "succeeded": s.succeeded,
                    "failed": s.failed,
                    "rows_out": s.rows_out,
                    "rows_rejected": s.rows_rejected,
                    "attempts": s.attempts,
                    "output_prefix": prefix,
                    "outputs_manifest": manifest,
                    "success_marker": naming.success_marker_key(prefix)
                    if prefix and s.outcome is Action.ADVANCE
                    else None,
                    "approval": s.approval,  # outputs its checks held back, accepted by on-call: who, when, why
                    # its commit to `output.table`: table, partition, snapshot_id, files and rows (None without one)
                    "table": s.table,
                }
            )
        partition = TaskRun.of(context).partition
        for outlet in self.outlets:
            event = context["outlet_events"][outlet]
            event.extra = {"run_id": context["run_id"], "partition": partition, "status": status, "steps": steps}
            if self.spec.partitioned_asset and partition:
                event.add_partitions(partition)  # for PartitionedAssetTimetable DAGs (plain ones start no more)

    def _gaps(self, context, summaries: list[StepSummary]) -> list[str]:
        """Why each step's summary no longer stands (:func:`~shardline.orchestration.step.end.confirm_ended`)."""
        from shardline.orchestration.step.end import confirm_ended

        found = (confirm_ended(self.spec, StepRef(self.spec.pipeline, context["run_id"], s.step), s) for s in summaries)
        return [gap for gap in found if gap]

    def _finish_run(self, context, status: RunStatus, message: str) -> None:
        from shardline.orchestration.run import finish_run

        finish_run(self.spec, self.spec.pipeline, context["run_id"], status, message)
