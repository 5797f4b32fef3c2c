"""The task that runs a pipeline step's jobs, and the DAG's failure callback.

It calls into :mod:`shardline.orchestration` (plain functions) and holds no policy of its own: it submits the
planned attempt, defers to :class:`~shardline.airflow.triggers.step.StepTrigger` and acts on the decision it
brings back.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from shardline.airflow.operators.base import SpecMixin, TaskRun, fails_fast, note_life
from shardline.airflow.operators.messages import partial_text, run_failed_text, step_failed_text
from shardline.airflow.triggers.step import BackoffTrigger, StepTrigger, settle_until
from shardline.decision.policy import Action, attempt_deadline
from shardline.errors import OverBudgetRefused
from shardline.planning.attempt import Attempt
from shardline.planning.naming import resubmit_command
from shardline.spec import load_spec


class WatchStepOperator(SpecMixin, BaseOperator):
    """A step's jobs, from the planned attempt's submit to the step's end, as one deferrable task: it submits
    the attempt (a retried try adopts the job an earlier try started), defers to :class:`StepTrigger` (all
    polling happens there) and acts on its decision: advance, resubmit, or fail. AWS's "not now" at a submit (a
    quota in use, a throttle) is waited out in a deferral: no attempt, no task failure.

    One task, so that under a fleet quota it holds its pool's slots from the submit until the step ends, with no
    gap between a submit and its watch in which another step could take the instances its job is using."""

    def __init__(
        self, *, spec_path: str, plan_task_id: str, poll_interval: float = 15.0, admission: dict | None = None, **kwargs
    ):
        super().__init__(**kwargs)
        self.spec_path, self.plan_task_id, self.poll_interval = spec_path, plan_task_id, poll_interval
        self.admission = admission  # decision.fleet.Admission as JSON: the plan noted the wait; this task clears it
        self._attempt: Attempt | None = None  # the attempt watched: the one on_kill stops
        self._planned: Attempt | None = None  # the plan's, before any is watched (the lineage of an early failure)
        self._ended = None  # the step's StepSummary (its outcome set), once it is done

    @fails_fast
    def execute(self, context):
        # First: a late failure callback of the run's earlier life must not end this one.
        note_life(self.spec, TaskRun.of(context))
        planned = self._planned = Attempt.from_xcom(context["ti"].xcom_pull(task_ids=self.plan_task_id))
        if self.admission:  # admitted by its pool: the plan's "waiting for N instances" is stale
            from shardline.orchestration.step.capacity import note_waiting

            note_waiting(self.spec, planned, None)
        # A retried task picks up the step's newest attempt; the planned one is submitted, or its job adopted.
        return self._resume(context, planned, submit_it=True)

    def _resume(self, context, attempt: Attempt, *, submit_it: bool = False):
        """Watch the step's newest attempt; one planned but never submitted is submitted (or waited for), and so
        is ``attempt`` itself when ``submit_it`` and the step is still at it."""
        from shardline.orchestration.step import jobs

        newest = jobs.resume(self.spec, attempt)
        if isinstance(newest, jobs.MustWait):
            self._wait_to_submit(newest)
        if submit_it and newest.number == attempt.number:
            try:
                return self._started(context, jobs.submit(self.spec, attempt))
            except OverBudgetRefused as refused:
                self._refused(attempt, refused)
        return self._watch(context, newest)

    def _refused(self, attempt: Attempt, refused: Exception) -> NoReturn:
        """A job its budget did not admit: the step's newest attempt fails naming the budget, and so does the task."""
        from shardline.orchestration.step import end
        from shardline.orchestration.step.files import latest_attempt

        end.finish(self.spec, latest_attempt(self.spec, attempt.ref) or attempt, Action.FAIL, str(refused))
        raise AirflowFailException(str(refused)) from refused

    def _started(self, context, started):
        """A submit's answer (:class:`~shardline.orchestration.step.jobs.Submitted` or ``MustWait``): watch the job,
        or wait out AWS's "not now"."""
        from shardline.orchestration.step import jobs

        if isinstance(started, jobs.MustWait):
            self._wait_to_submit(started)
        nxt = started.attempt
        self.log.info("attempt %d submitted as %s with %d file(s)", nxt.number, nxt.job_name, nxt.file_count)
        return self._watch(context, nxt)

    def _wait_to_submit(self, waiting) -> None:
        """Defer until AWS's "not now" to a submit is waited out (a deferral holds no worker slot; the wait is on the
        page too), then :meth:`submit_planned`."""
        self.log.warning("%s", waiting.note)
        self.keep_partition(waiting.attempt, waiting.retry_at)
        trigger = BackoffTrigger(waiting.delay_seconds, waiting.again(), not_before=settle_until())
        self.defer(trigger=trigger, method_name="submit_planned")

    def _watch(self, context, attempt: Attempt):
        from shardline.orchestration.step.watch import StepEvent, StepWatch, decide_now

        self._attempt = attempt
        # The attempt is watched with the policy the spec sets now; the trigger carries it, so an edit of the
        # spec while the attempt runs does not change it.
        watch = StepWatch.of(self.spec, attempt.step, attempt)  # and the run's budget, as the ledger has it now
        # A step that has already ended (a retried watch, a job quicker than the hand-over) is acted on
        # here: deferring would only bring the answer straight back.
        decision = decide_now(watch, attempt)
        if decision.action is not Action.WAIT:
            return self.execute_complete(context, StepEvent.of(decision, attempt, watch.policy).to_event())
        deadline = attempt_deadline(watch.policy, time.time())
        self.keep_partition(attempt, deadline)
        self.defer(
            trigger=StepTrigger(
                attempt.to_xcom(), watch.to_json(), self.poll_interval, deadline, not_before=settle_until()
            ),
            method_name="execute_complete",
        )

    def keep_partition(self, attempt: Attempt, wait_until: float | None) -> None:
        """Renew the step's hold on its output prefix past the wait it starts now. A step whose hold another run took
        over (its lease ran out) stops its job, if it has one, and fails: that run writes the prefix now."""
        from shardline.orchestration.partitions import lost
        from shardline.orchestration.step import end, jobs

        why = lost(self.spec, attempt, wait_until)
        if why is None:
            return
        jobs.stop(self.spec, attempt)  # nothing to stop for a submit still waiting for AWS: it has no job yet
        end.finish(self.spec, attempt, Action.FAIL, why)
        raise AirflowFailException(why)

    @fails_fast
    def execute_complete(self, context, event: dict):
        """The trigger's decision, acted on by :func:`~shardline.orchestration.step.end.conclude`: the step's
        summary is returned, its next attempt waited for and submitted, or the task fails saying what to do."""
        from shardline.orchestration.step import end
        from shardline.orchestration.step.watch import StepEvent

        step_event = StepEvent.from_event(event)
        attempt = self._attempt = step_event.attempt
        concluded = end.conclude(self.spec, step_event)
        if concluded.moved_on:  # an on-call engineer's newer attempt owns the step (its STEP item says so): follow it
            self.log.warning("%s; following the step where it is now", concluded.reason)
            return self._resume(context, attempt)
        if concluded.message is not None:  # the step's end check (drift.action: fail) failed it: its message says why
            raise AirflowFailException(concluded.message)
        failed = list(concluded.failed_files)
        if concluded.action.is_done:
            if concluded.action is Action.PARTIAL:
                fix = resubmit_command(attempt.pipeline, attempt.run_id, attempt.step)
                self.log.warning("%s", partial_text(attempt.step, concluded.reason, failed, fix))
            else:
                self.log.info("step %s succeeded: %s", attempt.step, concluded.reason)
            summary = concluded.summary.ended(concluded.action)
            self._ended = summary
            return summary.to_xcom()
        if concluded.retry is None:
            raise AirflowFailException(step_failed_text(attempt, concluded.action, concluded.reason, failed))
        delay = concluded.retry.delay_seconds
        self.log.warning("step %s: %s; resubmitting in %.0fs", attempt.step, concluded.reason, delay)
        payload = concluded.retry.to_json(attempt)
        if delay > 0:
            self.keep_partition(attempt, time.time() + delay)
            # The state rides in the trigger's event, not in defer kwargs, which dag.test() drops.
            self.defer(trigger=BackoffTrigger(delay, payload, not_before=settle_until()), method_name="resubmit")
        return self.resubmit(context, payload)

    @fails_fast
    def resubmit(self, context, event: dict):
        from shardline.ledger.context import StaleAttemptError
        from shardline.orchestration.partitions import PartitionLost
        from shardline.orchestration.step import end, jobs

        attempt = Attempt.from_xcom(event["attempt"])
        try:
            started = jobs.resubmit(
                self.spec,
                attempt,
                event["retry_files"],
                sizes=event.get("retry_sizes"),
                capacity=bool(event.get("capacity")),
                beside=bool(event.get("beside")),
            )
        except StaleAttemptError as err:
            # An on-call engineer resubmitted (or cancelled) first: follow the step where it is now.
            self.log.warning("%s; following the step where it is now", err)
            return self._resume(context, attempt)
        except PartitionLost as lost:  # another run took the output prefix while this one waited to resubmit
            end.finish(self.spec, attempt, Action.FAIL, str(lost))
            raise AirflowFailException(str(lost)) from lost
        except OverBudgetRefused as refused:  # the retry's quote would pass what is left of a budget
            self._refused(attempt, refused)
        return self._started(context, started)

    @fails_fast
    def submit_planned(self, context, event: dict):
        """A planned attempt whose submit AWS refused, tried again after the wait; then watched."""
        from shardline.ledger.context import StaleAttemptError
        from shardline.orchestration.step import jobs

        try:
            started = jobs.submit_again(self.spec, event)
        except StaleAttemptError as moved:  # an on-call engineer resubmitted or cancelled the step meanwhile
            self.log.warning("%s; following the step where it is now", moved)
            return self._resume(context, Attempt.from_xcom(event["attempt"]))
        except OverBudgetRefused as refused:  # a day's wait, and still over the day's budget
            self._refused(Attempt.from_xcom(event["attempt"]), refused)
        return self._started(context, started)

    def get_openlineage_facets_on_complete(self, task_instance):
        """For Airflow's OpenLineage provider: the step's S3 datasets, rows in and out, and model
        (:mod:`shardline.airflow.lineage`)."""
        from shardline.airflow.lineage import step_lineage

        summary = self._ended or self._summary(self._attempt)
        status = summary.status.value if summary is not None else "SUCCEEDED"
        return step_lineage(self.spec, self._attempt, summary, status, self._quality(self._attempt))

    def get_openlineage_facets_on_failure(self, task_instance):
        """As on complete, for a step that failed: what it had scored, and FAILED."""
        from shardline.airflow.lineage import step_lineage

        # The provider asks in a fork of this process, with a time limit: everything it needs is on self already
        # (the planned attempt from execute, or the watched one), and the ledger read is the step's one query.
        attempt = self._attempt or self._planned
        return step_lineage(self.spec, attempt, self._summary(attempt), "FAILED", self._quality(attempt))

    def _summary(self, attempt: Attempt | None):
        """The step's rows as the ledger has them, or None when it cannot be read (the lineage still names the
        datasets)."""
        from shardline.orchestration.step import end

        if attempt is None:
            return None
        try:
            return end.summarize(self.spec, attempt.ref)
        except Exception:  # lineage must never fail the task: it goes out without rows
            self.log.warning("lineage: the step's rows could not be read from the ledger", exc_info=True)
            return None

    def _quality(self, attempt: Attempt | None) -> dict | None:
        """What the step's output checks read and found, from its run report (None: no report to read)."""
        from shardline.orchestration.step.run_report import quality_facts

        return quality_facts(self.spec, attempt) if attempt is not None else None

    def on_kill(self):
        if self._attempt is not None:
            from shardline.orchestration.step import jobs

            jobs.stop(self.spec, self._attempt)


def mark_run_failed(spec_path: str, context) -> None:
    """DAG ``on_failure_callback``: the run shows as FAILED in `shardline runs` and the page (a step's own message
    kept), its jobs still running are stopped and waited for, and then its output prefixes are released. Airflow runs
    it a while after the run failed; a resubmission or rerun that took the run up again meanwhile stands, whenever it
    landed (:func:`~shardline.orchestration.run.end_failed_life` compares Airflow's lives of the run)."""
    from shardline.orchestration.run import end_failed_life

    spec = load_spec(Path(spec_path))
    run = context.get("dag_run")
    # Airflow builds a callback's context without the DAG run when no task of it ran: its first life.
    life = int(getattr(run, "clear_number", 0) or 0)
    run_id = getattr(run, "run_id", None) or context["run_id"]
    done = end_failed_life(spec, run_id, life, run_failed_text(context.get("reason")))
    logging.getLogger(__name__).info("%s", done)
