"""What an on-call engineer does to a whole run: ``trigger`` (a manual run of one interval, named by its start),
``rerun`` (its partition again, through Airflow) and ``cancel`` (stop its jobs, mark it CANCELLED, fail its DAG
run).
"""

from __future__ import annotations

import datetime as dt
import json

from shardline.ledger.keys import StepRef
from shardline.ledger.states import RUN_TERMINAL, RunStatus
from shardline.ledger.step_reads import read_run
from shardline.ledger.step_writes import set_run_status
from shardline.oncall.airflow_client import HOW_TO_CONFIGURE, AirflowApiError
from shardline.oncall.errors import BadRequest, Conflict, Unavailable
from shardline.oncall.messages import CANCEL_LINES, rerun_conf_text, rerun_not_finished_text
from shardline.oncall.reads import OnCallReads
from shardline.oncall.values import RunRef
from shardline.oncall.views import FINISHED_RUN_STATES, FINISHED_TASK_STATES
from shardline.orchestration import services
from shardline.orchestration.partitions import release_run
from shardline.orchestration.step import jobs
from shardline.planning import naming
from shardline.spec import PipelineSpec, SpecError, partition_interval
from shardline.spec.conf import conf_problem as spec_conf_problem
from shardline.spec.fleet import FleetSpec, admitted_instances
from shardline.spec.templates import default_params, render_uri


def conf_problem(
    spec: PipelineSpec,
    conf: dict | None,
    fleet: FleetSpec | None,
    interval: tuple[str | None, str | None] = (None, None),
    logical_date: str | None = None,
) -> str | None:
    """Why a run with this conf would be refused by the trigger form's Params or fail at its plan task: the plan
    task's own check (:func:`shardline.spec.conf.conf_problem`), over every step, with the partition of the run's
    ``interval`` (ISO 8601 start and end, when known; the run's ``logical_date`` renders its prefix as its plan task
    will, the interval's start when not given) and the instances each step's watch is admitted by."""
    start, end = (_instant(at) for at in interval)
    run_prefix = None
    if start is not None and end is not None:
        version = str((conf or {}).get("model_version") or "").strip() or spec.steps[0].model.version
        run_prefix = render_uri(
            spec.steps[0].input.prefix or "",
            logical_date=_instant(logical_date) or start,
            start=start,
            end=end,
            params=default_params(version),
        )
    admitted = {step.name: admitted_instances(step, fleet) for step in spec.steps}
    return spec_conf_problem(spec, conf, run_prefix=run_prefix, admitted=admitted)


# A trigger waits this many seconds for the run the scheduler is creating of the same partition (_scheduler_run).
SCHEDULER_WAIT_SECONDS = 60
SCHEDULER_DUE_SLACK = dt.timedelta(seconds=5)


def _instant(text: str | None) -> dt.datetime | None:
    """An ISO-8601 time as Airflow gives it ("Z" or "+00:00"), or None when there is none or it is no time."""
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _same_instant(a: str, b: str) -> bool:
    """Whether two ISO-8601 times Airflow gave name the same instant ("Z" or "+00:00" alike)."""
    first = _instant(a)
    return first is not None and first == _instant(b)


class RunActions(OnCallReads):
    """``trigger``, ``rerun`` and ``cancel``: a whole run, through Airflow and the ledger."""

    def trigger(self, pipeline: str, start: dt.datetime, conf: dict, *, dry_run: bool = False) -> list[str]:
        """A manual run of the interval that starts at ``start``: logical date ``start``, data interval that
        interval, as the interval's scheduled run would have. So it takes no other interval's logical date, and
        the scheduler, finding the interval's run there, moves on to the next; a partition that has a run
        already is refused (Airflow answers 409), naming ``shardline rerun``."""
        spec = self.spec(pipeline)
        try:
            begin, end = partition_interval(spec.schedule, start)
        except SpecError as err:
            raise BadRequest(f"nothing was triggered: {err}") from err
        if problem := conf_problem(spec, conf, self.fleet, (begin.isoformat(), end.isoformat())):
            raise BadRequest(f"nothing was triggered: {problem}")
        if self.airflow is None:
            raise Unavailable(f"Airflow is not configured, so nothing was triggered: {HOW_TO_CONFIGURE}")
        interval = (begin.isoformat(), end.isoformat())
        what = f"{pipeline} for {begin:%Y-%m-%d %H:%M}-{end:%Y-%m-%d %H:%M} UTC (logical date {interval[0]})"
        if dry_run:
            return [f"dry run, nothing was changed: for real, it would trigger {what} with conf {json.dumps(conf)}"]
        scheduled = self._scheduler_run(pipeline, begin)
        if scheduled is not None:
            run_id = scheduled["dag_run_id"]
            if conf:
                raise Conflict(
                    f"nothing was triggered: {pipeline}'s scheduler started the partition's own run itself, {run_id} "
                    f"(logical date {interval[0]}), with the spec's defaults; to score it with conf "
                    f"{json.dumps(conf)}, `shardline rerun {pipeline}/{run_id} --conf '{json.dumps(conf)}'` once it "
                    "has ended"
                )
            return [
                f"{pipeline}'s scheduler started the run of {what} itself, as {run_id}, so nothing was triggered "
                f"beside it; follow it with `shardline status {pipeline}/{run_id}`"
            ]
        try:
            run = self.airflow.trigger(pipeline, conf, logical_date=interval[0], data_interval=interval)
        except AirflowApiError as err:
            if err.status == 409:
                raise Conflict(self._taken_text(pipeline, interval, begin)) from err
            if err.status is not None and err.status >= 500:  # asked again already (the client's retries)
                raise Unavailable(
                    f"Airflow did not confirm the trigger of {what}: {err}; then run the same command again (should "
                    "the run have been made after all, it is refused, naming it)"
                ) from err
            raise
        return [
            f"triggered {what} as {run['dag_run_id']}; follow it with `shardline status {pipeline}/{run['dag_run_id']}`"
        ]

    def _taken_text(self, pipeline: str, interval: tuple[str, str], begin: dt.datetime) -> str:
        """Why a trigger of the interval starting ``begin`` was refused (409), naming the run that holds its logical
        date and the exact commands that score the interval: that run is the partition's own (rerun it), or a
        manual run of the interval before it, triggered at this logical date with Airflow's own inference (its
        `rerun --conf` moves it to its own interval's start, which frees this one)."""
        taken = f"nothing was triggered: a run of {pipeline} has the logical date {interval[0]} already"
        try:
            holders = self.airflow.runs_at(pipeline, interval[0])
        except AirflowApiError:
            holders = []
        if not holders:
            return f"{taken} (`shardline runs --pipeline {pipeline}` lists it)"
        run = holders[0]
        ref = RunRef(pipeline, run["dag_run_id"])
        state = run.get("state")
        if _same_instant(run.get("data_interval_start") or "", interval[0]):  # the partition's own run
            return f"{taken}: {ref} scores this partition; to score it again: `shardline rerun {ref}`"
        conf = json.dumps(run.get("conf") or {}, sort_keys=True)
        move = f"`shardline rerun {ref} --conf '{conf}'` (it keeps its conf and scores its own interval again)"
        then = f"`shardline trigger {pipeline} --partition {begin:%Y-%m-%dT%H:%M}`"
        if state not in ("success", "failed"):
            return (
                f"{taken}: {ref}, a manual run of the interval before, triggered at this interval's logical date "
                f"(it is {state}). Once it has ended, move it to its own interval's start with {move}, then {then}"
            )
        return (
            f"{taken}: {ref}, a manual run of the interval before, triggered at this interval's logical date. Move "
            f"it to its own interval's start with {move}, then {then}"
        )

    def _scheduler_run(self, pipeline: str, begin: dt.datetime) -> dict | None:
        """The partition's own run, when the scheduler is creating it now; else None (trigger as asked).

        Once a run holding the partition's logical date is deleted (as ``trigger``'s refusal says to do), the
        scheduler creates the partition's run on its next loop. A trigger then races it for the logical date, and
        Airflow's scheduler does not survive losing that race: the unique key fails its insert and its loop ends.
        So when the DAG's next run is this partition, due, and no run holds its logical date, the trigger waits
        for the scheduler's run instead of making one. Anything unclear, or no run within a minute: trigger."""
        airflow = self.airflow
        try:
            dag = airflow.dag(pipeline)
            next_date, due = _instant(dag.get("next_dagrun_logical_date")), _instant(dag.get("next_dagrun_run_after"))
            if dag.get("is_paused") or next_date != begin or due is None:
                return None
            if due > self.now() + SCHEDULER_DUE_SLACK or airflow.runs_at(pipeline, begin.isoformat()):
                return None  # not yet due (a trigger now comes first); or a run holds the date: trigger says so
            for _ in range(SCHEDULER_WAIT_SECONDS):
                self.sleep(1)
                if runs := airflow.runs_at(pipeline, begin.isoformat()):
                    # the scheduler's run has the partition's interval; another (someone's trigger) is refused below
                    return runs[0] if _instant(runs[0].get("data_interval_start")) == begin else None
        except AirflowApiError:
            return None
        return None

    def rerun(self, ref: RunRef, conf: dict | None = None, *, dry_run: bool = False) -> list[str]:
        """Run a finished DAG run's partition again, as Airflow 3.3 allows it.

        Without ``conf``: the run plans again from its first failed step (that step's plan task and everything
        after it are cleared), with its own conf: after input that landed late, a model uploaded since, or a
        setup error fixed. With ``conf``: a run's conf cannot change, and Airflow refuses a second run at the
        same logical date (409), so the run is deleted and triggered again at the same logical date and data
        interval with the new conf, under a new run id; if that trigger fails, the old conf is put back.
        The conf is checked first as the trigger form and the plan task check it, and no job of the run may
        still be running (its outputs would mix with the new run's).
        """
        spec = self.spec(ref.pipeline)
        if self.airflow is None:
            raise Unavailable(
                f"Airflow is not configured, so nothing was rerun: {HOW_TO_CONFIGURE}; then run the same command again"
            )
        run = self.airflow.dag_run(ref.pipeline, ref.run_id)
        state = run.get("state")
        if state not in ("failed", "success"):
            raise Conflict(rerun_not_finished_text(ref, state))
        interval = (run.get("data_interval_start"), run.get("data_interval_end"))
        # A manual run that Airflow's inference gave the interval ending at its logical date holds the next
        # interval's logical date: a rerun with a new conf takes the interval's start instead, as `shardline trigger`
        # does (one cleared in place keeps its own).
        logical_date = run.get("logical_date")
        if conf is not None and all(interval) and logical_date and _same_instant(logical_date, interval[1]):
            logical_date = interval[0]
        problem = conf_problem(spec, run.get("conf") if conf is None else conf, self.fleet, interval, logical_date)
        if problem:
            raise BadRequest(rerun_conf_text(ref, problem, given=conf is not None))
        running = self._running_jobs(spec, ref)
        if running:
            raise Conflict(
                f"job(s) {', '.join(running)} of {ref} still run, so nothing was rerun (a new run's outputs "
                f"would mix with theirs): stop them with `shardline cancel {ref}`, then run this again"
            )
        if conf is None:
            return self._rerun_in_place(spec, ref, state, dry_run=dry_run)
        old = (
            f"DAG run {ref.run_id} (logical date {run.get('logical_date')}, data interval {interval[0]} to "
            f"{interval[1]}, conf {json.dumps(run.get('conf') or {}, sort_keys=True)})"
        )
        if dry_run:
            return [
                f"dry run, nothing was changed: for real, it would delete {old} and trigger that partition "
                f"again with conf {json.dumps(conf, sort_keys=True)}"
            ]
        self.airflow.delete_run(ref.pipeline, ref.run_id)

        def trigger(with_conf: dict, note: str, at: str | None) -> dict:
            return self.airflow.trigger(
                ref.pipeline, with_conf, logical_date=at, data_interval=interval if all(interval) else None, note=note
            )

        try:
            new = trigger(conf, f"rerun of {ref.run_id} with a new conf (shardline rerun)", logical_date)
        except AirflowApiError as err:
            try:  # the partition must not be left without a run: put the old one's conf back
                # At its own logical date: the interval's start may be another run's (its scheduled run's).
                back = trigger(
                    run.get("conf") or {}, f"{ref.run_id} put back: a rerun's trigger failed", run.get("logical_date")
                )
            except AirflowApiError as again:
                raise Unavailable(
                    f"deleted {old}, but Airflow refused the new run ({err}) and the old conf too "
                    f"({again}): trigger that logical date and data interval by hand"
                ) from again
            raise BadRequest(
                f"Airflow refused the new run ({err}); {old} was put back as {back['dag_run_id']} with its own conf"
            ) from err
        new_ref = RunRef(ref.pipeline, new["dag_run_id"])
        return [
            f"deleted {old} and triggered it again as {new['dag_run_id']} with conf "
            f"{json.dumps(conf, sort_keys=True)}; follow it with `shardline status {new_ref}`"
        ]

    def _rerun_in_place(self, spec: PipelineSpec, ref: RunRef, state: str, *, dry_run: bool) -> list[str]:
        """Clear the plan task of the run's first failed step and everything after it."""
        assert self.airflow is not None
        failed = {
            t["task_id"]
            for t in self.airflow.task_instances(ref.pipeline, ref.run_id)
            if t.get("state") in ("failed", "upstream_failed")
        }
        step = next((s.name for s in spec.steps if failed & {f"plan_{s.name}", f"watch_{s.name}"}), None)
        start = f"plan_{step}" if step else ("report" if "report" in failed else None)
        if start is None:
            raise Conflict(
                f"DAG run {ref.run_id} has no failed task to run again (it is {state}); to score its "
                f"partition again with another conf: `shardline rerun {ref} --conf '{{...}}'`"
            )
        cleared = self.airflow.clear_tasks(ref.pipeline, ref.run_id, [start], include_downstream=True, dry_run=dry_run)
        names = ", ".join(sorted({t["task_id"] for t in cleared}))
        if dry_run:
            return [f"dry run, nothing was changed: for real, it would clear {names} of DAG run {ref.run_id}"]
        return [
            f"cleared {names} of DAG run {ref.run_id}: it plans again from {start} with its own conf (the files "
            f"that succeeded are kept); follow it with `shardline status {ref}`"
        ]

    def _running_jobs(self, spec: PipelineSpec, ref: RunRef) -> list[str]:
        """The jobs of the run's steps that have not ended."""
        records = read_run(services.ledger_model(spec), ref.pipeline, ref.run_id)
        names = [
            naming.job_name(ref.pipeline, ref.run_id, item.step, item.attempt)
            for item in records.steps
            if item.attempt and item.step
        ]
        return [name for name in names if jobs.is_running(spec, name)]

    def cancel(self, ref: RunRef, reason: str = "cancelled by on-call") -> list[str]:
        """Mark every step CANCELLED (so no watch task resubmits), stop their jobs, fail the DAG run."""
        spec, records = self._run_records(ref, without_it=", so there is nothing to cancel")
        if records.run.status in RUN_TERMINAL:
            raise Conflict(
                f"run {ref} already ended {records.run.status}, so there is nothing to cancel; "
                f"`shardline status {ref}` shows how it ended"
            )
        done = []
        for item in records.steps:
            step = item.step
            did = jobs.cancel(spec, StepRef(ref.pipeline, ref.run_id, step), item, reason)
            done += [CANCEL_LINES["stopped"].format(step=step, job=name) for name in did.stopped]
            done.append(CANCEL_LINES[did.result].format(step=step, status=did.status, ref=ref))
        set_run_status(services.ledger_model(spec), ref.pipeline, ref.run_id, RunStatus.CANCELLED, reason)
        release_run(spec, ref.pipeline, ref.run_id)  # the next run of the partition may write its prefixes now
        if self.airflow is not None:
            try:
                state = self.airflow.dag_run(ref.pipeline, ref.run_id).get("state")
                if state not in FINISHED_RUN_STATES:
                    # Every task instance not ended first: marking the run alone skips the ones not started (the
                    # report task, the run's one leaf), and a scheduler that reads the run at that moment finds its
                    # leaf skipped and marks the cancelled run green.
                    for ti in self.airflow.task_instances(ref.pipeline, ref.run_id):
                        if ti.get("state") not in FINISHED_TASK_STATES:
                            self.airflow.set_task_state(ref.pipeline, ref.run_id, ti["task_id"], "failed", note=reason)
                    self.airflow.set_run_state(ref.pipeline, ref.run_id, "failed", note=reason)
                    done.append(CANCEL_LINES["dag_run_failed"].format(run_id=ref.run_id))
            except AirflowApiError as err:
                done.append(CANCEL_LINES["airflow_error"].format(run_id=ref.run_id, err=err))
        return done
