"""Resubmitting a step: a new fenced attempt with exactly the chosen files and, when the DAG run had already
finished, its watch task cleared through Airflow's REST API so the run's state follows the resubmission.

What it does is decided first by :func:`shardline.decision.resubmit.choose_next`, and which files it takes by
:mod:`shardline.oncall.selection`; this module reads, asks them, and acts on the answer.
"""

from __future__ import annotations

import dataclasses
import json

from shardline.backends import JobNotFound, JobStatus
from shardline.decision.resubmit import FINISHED_TASK_STATES, Next, NextStep, choose_next
from shardline.errors import OverBudgetRefused
from shardline.ledger.budgets import set_run_budget
from shardline.ledger.context import StaleAttemptError
from shardline.ledger.keys import StepRef
from shardline.ledger.records import sources_with_rejects
from shardline.ledger.states import RunStatus
from shardline.ledger.step_reads import StepRecords
from shardline.ledger.step_writes import set_run_status
from shardline.oncall import selection
from shardline.oncall.airflow_client import HOW_TO_CONFIGURE, INVALID_TOKEN, AirflowApiError
from shardline.oncall.errors import Conflict, NotFound, OnCallError, Refused, Unavailable
from shardline.oncall.messages import (
    cleared_text,
    dry_run_text,
    followed_text,
    half_done_text,
    local_root_mismatch,
    not_finished_text,
    repeat_resubmit_command,
)
from shardline.oncall.reads import OnCallReads, known_step, read_step_records
from shardline.oncall.values import FileChoice, ResubmitPlan, ResubmitResult, RunRef
from shardline.oncall.views import file_view
from shardline.orchestration import services
from shardline.orchestration.partitions import PartitionHeld, PartitionMovedOn, refused_text
from shardline.orchestration.step import jobs
from shardline.orchestration.step.files import attempt_of
from shardline.orchestration.step.plan import SIZED_FILE_ATTRIBUTES
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec
from shardline.waiting import wait_for

# How long a resubmission waits for a watch task that is about to end before it clears it, and how often
# it asks Airflow meanwhile.
WATCH_WAIT_SECONDS = 60.0
WATCH_POLL_SECONDS = 1.0


class Resubmission(OnCallReads):
    """``resubmit``: which files, what to do (decided before anything changes), then doing it."""

    def plan_resubmission(self, ref: RunRef, step: str, choice: FileChoice) -> ResubmitPlan:
        """Which files a resubmission would take (:func:`selection.choose_files`). Succeeded files are never
        taken again; with ``rejects``, the rows succeeded files rejected are (:mod:`~shardline.orchestration.step.
        rejects`)."""
        return self._read_and_choose(self.spec(ref.pipeline), ref, step, choice)[1]

    def _read_and_choose(
        self, spec: PipelineSpec, ref: RunRef, step: str, choice: FileChoice
    ) -> tuple[StepRecords, ResubmitPlan]:
        """The step's items, read once, and the files ``choice`` takes. An unknown step is a NotFound before a
        bad choice is a BadRequest, and both come before anything is read."""
        known_step(spec, step)
        choice.check()
        records = _read_step(spec, ref, step)  # the one read of the step's items a command makes
        if choice.rejects:
            return records, _rejects_plan(spec, ref, step, records)
        latest = records.step.attempt
        # A rejects part that failed is taken again by --rejects, with the rows it had.
        views = [file_view(step, f) for f in records.settled if not f.part_of]
        dealt = None
        if choice.instance and selection.needs_deal(views, latest):
            dealt = _dealt_hosts(spec, _latest(records, ref, step).model_copy(update={"number": latest}))
        return records, selection.choose_files(str(ref), step, latest, views, choice, dealt)

    def resubmit(
        self,
        ref: RunRef,
        step: str,
        choice: FileChoice,
        *,
        dry_run: bool = False,
        force: bool = False,
        ledger_only: bool = False,
        budget_usd: float | None = None,
    ) -> ResubmitResult:
        """Start a new attempt of ``step`` with only the chosen files, and let the DAG run follow it.

        All or nothing: Airflow is asked first (the watch task's state, and whether this caller may clear it), and
        if it cannot be asked or would refuse, nothing is submitted. Safe to repeat: the same call again finds the
        attempt running, or completes a resubmission whose clear failed, or finds nothing left. ``force``: while
        the watch task is still in charge (it follows the new attempt). ``ledger_only``: Airflow left out (no DAG
        run follows). ``budget_usd``: the run's budget from now on (after a budget stop), recorded first."""
        spec = self.spec(ref.pipeline)
        records, plan = self._read_and_choose(spec, ref, step, choice)
        again, latest = repeat_resubmit_command(ref, step, choice, force=force), _latest(records, ref, step)
        job = self._latest_job(spec, latest, records.shards)
        watch = f"watch_{step}"
        watch_state = None if ledger_only else self._watch_state(ref, watch)
        next_step = choose_next(
            attempt=latest.number,
            job=latest.job_name,
            job_running=job is not None and not job.is_terminal,
            step_status=records.step.status if records.step else None,
            watch_state=watch_state,
            files=len(plan.files),
            force=force,
            watch=watch,
        )
        if next_step.next is Next.SUBMIT:  # otherwise the reason is what the result says: printed once, not twice
            plan = dataclasses.replace(plan, reason=f"{plan.reason}; {next_step.reason}")
        if next_step.next is Next.REFUSE:
            raise Conflict(f"step {step} of {ref}: {next_step.reason}")
        if next_step.clear_watch:
            self._may_clear(ref, watch)
        if next_step.next is Next.NOTHING:
            return ResubmitResult(plan, None, None, next_step.reason, action=next_step.next.value)
        if dry_run:
            return _dry_run_result(plan, next_step, ref, step, latest.number, watch_state)
        attempt = job_name = waiting = None
        _raise_budget(spec, ref, budget_usd)
        if next_step.next is Next.SUBMIT:
            started = _submit(
                spec,
                ref,
                step,
                latest,
                plan.files,
                rejects=choice.rejects,
                records=records,
                taken_up=next_step.clear_watch,
            )
            attempt, job_name = started.attempt.number, started.attempt.job_name
            waiting = started.note if isinstance(started, jobs.MustWait) else None  # the watch task submits it later
        elif next_step.clear_watch:
            # Taken up as it stands (its job still runs, or every file is done): the life whose watch ended is over,
            # recorded before the clear, so that life's failure callback, however late, stops and releases nothing.
            take_up(spec, ref)
        if not next_step.clear_watch:
            return ResubmitResult(
                plan, attempt, job_name, followed_text(watch, watch_state), action=next_step.next.value, waiting=waiting
            )
        try:
            said = self._rerun_watch(ref, watch)
        except (AirflowApiError, OnCallError) as err:
            return ResubmitResult(
                plan,
                attempt,
                job_name,
                half_done_text(attempt, job_name, watch, err, again),
                complete=False,
                action=next_step.next.value,
                waiting=waiting,
            )
        return ResubmitResult(plan, attempt, job_name, said, action=next_step.next.value, waiting=waiting)

    @staticmethod
    def _latest_job(spec: PipelineSpec, latest: Attempt, shards) -> JobStatus | None:
        """The latest attempt's job as the backend sees it (None: it knows no such job). A local job it does not
        know, whose instances reported, ran under another local root: a Conflict, as a job started here would
        run beside Airflow's."""
        try:
            return services.backend_for(spec).describe(latest.job_name).status
        except JobNotFound:
            if spec.backend == "local" and any(s.attempt == latest.number for s in shards):
                raise Conflict(local_root_mismatch(latest.job_name, latest.number, services.local_root())) from None
            return None

    def _watch_state(self, ref: RunRef, watch: str) -> str:
        """The watch task's state in Airflow; raises OnCallError, before anything changed, if Airflow
        cannot be asked (a resubmission must be able to let the DAG run follow it)."""
        nothing = "nothing was submitted"
        if self.airflow is None:
            raise Unavailable(
                f"Airflow is not configured, so {nothing}: after a resubmission the DAG run's "
                f"{watch} task must be cleared so the run follows it. To give the CLI access, "
                f"{HOW_TO_CONFIGURE}; then run the same command again. (For a step not run by "
                "Airflow, pass --ledger-only.)"
            )
        try:
            answer = self.airflow.task_instance(ref.pipeline, ref.run_id, watch)
        except AirflowApiError as err:
            if err.status == 404:
                raise NotFound(
                    f"Airflow at {self.airflow.base_url} has no task {watch} in DAG run {ref.run_id} "
                    f"of {ref.pipeline}, so {nothing}. Check that it is the Airflow that runs this "
                    f"pipeline (the URL came from {self.airflow.source}; --airflow-url picks another); "
                    "for a step not run by Airflow, pass --ledger-only."
                ) from err
            if err.status in (401, 403):  # the token: the error says which fix (missing, expired, unreadable, role)
                raise Refused(f"Airflow would not answer about DAG run {ref.run_id}, so {nothing}: {err}") from err
            raise Unavailable(
                f"cannot ask Airflow about DAG run {ref.run_id}, so {nothing}: {err}. Run the same "
                "command again once Airflow answers."
            ) from err
        return answer.get("state") or "none"

    def _may_clear(self, ref: RunRef, watch: str) -> None:
        """Ask Airflow to clear the watch task as a dry run: the same permission check, no change."""
        assert self.airflow is not None
        try:
            self.airflow.clear_tasks(ref.pipeline, ref.run_id, [watch], include_downstream=True, dry_run=True)
        except AirflowApiError as err:
            hint = (
                ""
                if err.status == 401 or INVALID_TOKEN in str(err)  # the token itself: the error says
                else f" (clearing task instances of DAG {ref.pipeline} takes Airflow's Op role, or an admin)"
                if err.status == 403
                else ". Run the same command again once Airflow answers"
            )
            raise Refused(
                f"Airflow would not let this caller clear {watch} of DAG run {ref.run_id}, so nothing "
                f"was submitted: {err}{hint}"
            ) from err

    def _rerun_watch(self, ref: RunRef, watch: str, wait_seconds: float = WATCH_WAIT_SECONDS) -> str:
        """Let the DAG run follow the step again: clear its watch task once it has finished.

        The watch task records the step's outcome a moment before its task ends, so a watch task
        still running here is about to end: wait for it, then clear it (and what follows it).
        Raises AirflowApiError or OnCallError if it cannot.
        """
        assert self.airflow is not None
        airflow = self.airflow
        state = wait_for(
            lambda: airflow.task_instance(ref.pipeline, ref.run_id, watch).get("state"),
            lambda answer: answer in FINISHED_TASK_STATES,
            timeout=wait_seconds,
            interval=WATCH_POLL_SECONDS,
            sleep=self.sleep,
        )
        if state not in FINISHED_TASK_STATES:
            raise Conflict(not_finished_text(watch, wait_seconds, state))
        cleared = airflow.clear_tasks(ref.pipeline, ref.run_id, [watch], include_downstream=True)
        return cleared_text(watch, state, len(cleared))


def _read_step(spec: PipelineSpec, ref: RunRef, step: str) -> StepRecords:
    """The step's STEP, SHARD and FILE items (with the sizes a next attempt deals by): a Conflict if it was never
    planned."""
    records = read_step_records(spec, StepRef(ref.pipeline, ref.run_id, step), file_attributes=SIZED_FILE_ATTRIBUTES)
    if records.step is None:
        raise Conflict(
            f"step {step} of {ref} was never planned, so there is nothing to resubmit: it starts "
            f"when the DAG run reaches its plan_{step} task; `shardline status {ref}` shows where "
            "the run is"
        )
    return records


def _latest(records: StepRecords, ref: RunRef, step: str) -> Attempt:
    """The step's newest attempt, from its records: a Conflict if its plan cannot be rebuilt."""
    try:
        attempt = attempt_of(records, StepRef(ref.pipeline, ref.run_id, step))
    except ValueError as err:
        raise Conflict(
            f"{err}, so it cannot be resubmitted from here; clear its plan_{step} task in Airflow instead"
        ) from err
    if attempt is None:
        raise Conflict(
            f"step {step} of {ref} has no recorded plan (was it planned by an older Shardline?), "
            f"so it cannot be resubmitted from here; clear its plan_{step} task in Airflow instead"
        )
    return attempt


def _dealt_hosts(spec: PipelineSpec, then: Attempt) -> dict[str, str]:
    """Which instance each entry of attempt ``then``'s manifest went to: the manifest, read from S3."""
    bucket, key = parse_s3_uri(then.manifest_uri)
    return selection.dealt_hosts(
        json.loads(services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"].read()), then
    )


def _dry_run_result(
    plan: ResubmitPlan, choice: NextStep, ref: RunRef, step: str, latest: int, watch_state: str | None
) -> ResubmitResult:
    """What a dry run says it would do: take the step up, or submit attempt ``latest + 1``."""
    watch = f"watch_{step}"
    if choice.next is Next.TAKE_UP:
        return ResubmitResult(
            plan, None, None, dry_run_text(choice, watch, ref.run_id, None, watch_state), action=choice.next.value
        )
    nxt = latest + 1
    return ResubmitResult(
        plan,
        nxt,
        naming.job_name(ref.pipeline, ref.run_id, step, nxt),
        dry_run_text(choice, watch, ref.run_id, nxt, watch_state),
    )


def _rejects_plan(spec: PipelineSpec, ref: RunRef, step: str, records: StepRecords) -> ResubmitPlan:
    """What ``--rejects`` takes: every file of the step that still has rows rejected, each checked to be one the
    step planned (a Conflict naming those that are not, before Airflow is asked or anything changes)."""
    from shardline.orchestration.step.rejects import RejectsPartError, check_sources

    sources = sources_with_rejects(records.files)
    if sources:
        try:
            check_sources(spec, _latest(records, ref, step), records, sources)
        except RejectsPartError as err:
            raise Conflict(f"step {step} of {ref}: nothing was submitted: {err}") from err
    rows = sum(f.rows_rejected or 0 for f in sources)
    reason = (
        f"{rows:,} rejected row(s) of {len(sources)} file(s), picked from their sources as they are now"
        if sources
        else f"no file of step {step} has rows rejected"
    )
    return ResubmitPlan(str(ref), step, [f.input_key for f in sources], reason)


def take_up(spec: PipelineSpec, ref: RunRef) -> None:
    """The run is RUNNING again, and the Airflow life its watch task ended in is over (``ledger.step_writes``)."""
    set_run_status(services.ledger_model(spec), ref.pipeline, ref.run_id, RunStatus.RUNNING, taken_up=True)


def _submit(
    spec: PipelineSpec,
    ref: RunRef,
    step: str,
    latest: Attempt,
    files: list[str],
    *,
    rejects: bool = False,
    records: StepRecords | None = None,
    taken_up: bool = False,
) -> jobs.Submitted | jobs.MustWait:
    """Start the attempt after ``latest`` with ``files`` (with ``rejects``: their rejected rows), fenced: a Conflict
    if someone moved the step on. ``records``: the step's items as this command read them. ``taken_up``: the step's
    watch task has ended and is cleared next (a new Airflow life of the run)."""
    # Here, not at the top: step.rejects reads rejects lists through the run report's module, which loads the
    # report libraries (an optional extra); only a --rejects resubmission needs them.
    from shardline.orchestration.step import rejects as step_rejects

    try:
        if rejects:
            return step_rejects.resubmit_rejects(spec, latest, files, taken_up=taken_up)
        return jobs.resubmit(spec, latest, files, by_oncall=True, records=records, taken_up=taken_up)
    except step_rejects.RejectsPartError as err:
        raise Conflict(f"step {step} of {ref}: nothing was submitted: {err}") from err
    except OverBudgetRefused as err:  # its quote would pass what is left of the run's (or the day's) budget
        raise Refused(f"step {step} of {ref}: nothing was submitted: {err}") from err
    except (PartitionHeld, PartitionMovedOn) as err:  # a newer run of the partition writes (or wrote) the prefix
        raise Conflict(refused_text(err, StepRef(ref.pipeline, ref.run_id, step))) from err
    except StaleAttemptError as err:
        raise Conflict(
            f"someone else (the watch task, or another on-call engineer) moved step {step} of {ref} past "
            f"attempt {latest.number} meanwhile, so nothing was submitted; `shardline "
            f"status {ref}` shows where it is now"
        ) from err


def _raise_budget(spec: PipelineSpec, ref: RunRef, budget_usd: float | None) -> None:
    """Record the run's raised budget (``--budget-usd``) before anything is submitted: the new attempt's watch holds
    the run to it."""
    if budget_usd is not None:
        set_run_budget(services.ledger_model(spec), ref.pipeline, ref.run_id, budget_usd)
