"""A step's hold on its output prefix through its life (:mod:`shardline.ledger.partitions` keeps the lock item).

- A run's plan (attempt 1, or a rerun) and an on-call resubmission take it, before anything is written; held by
  another run that has not ended, the plan task waits for it (the ``PartitionTrigger``)
  and the resubmission is refused, each naming that run. The fence taken is recorded on the STEP item: once another
  run has taken the prefix since, the step never takes it again.
- The watch's own resubmissions, a submit and each deferral only renew it (strictly): a step that lost it stops.
  Each renewal renews every prefix the run holds, so an earlier step's outputs stay held while a later step runs.
- The step's end checks it just before ``_SUCCESS``: a step that lost it fails, and vouches for nothing.
- The run's end (the report task, the DAG's failure callback, `shardline cancel`) releases every prefix it holds.

The lease is how long a hold stands with nobody renewing it: long enough for a pool's queue and the watch's longest
wait, so only a run whose Airflow side is gone loses it; a run that ended is not waited for at all.
"""

from __future__ import annotations

import datetime as dt
import logging
import os

from shardline.backends import JobNotFound
from shardline.errors import LedgerRecordMissing
from shardline.ledger.keys import StepRef
from shardline.ledger.partitions import (
    PartitionHeld,
    PartitionHolder,
    PartitionLost,
    PartitionMovedOn,
    RunningJob,
    record_step_fence,
    release,
    release_after_life,
    renew,
    take,
)
from shardline.ledger.record_gaps import record_gap
from shardline.ledger.records import RunRecord, StepRecord
from shardline.ledger.states import RunStatus
from shardline.ledger.step_reads import read_run_item, read_step_item
from shardline.ledger.step_writes import set_run_status
from shardline.orchestration import services
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)

__all__ = [
    "PartitionHeld",
    "PartitionLost",
    "PartitionMovedOn",
    "hold",
    "hold_for_attempt",
    "keep",
    "lost",
    "record_fence",
    "release_run",
    "withdraw_success_marker",
]

# A hold stands this long past the end of the longest wait its holder announced (the watch's deadline, a backoff)
# with nobody renewing it; then another run of the partition may take it over. Six hours: a watch task may queue
# that long for its pool's slots (a backfill ahead of it), and it renews only once admitted. The tests shorten it.
LEASE_ENV = "SHARDLINE_PARTITION_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 6 * 3600.0


def lease_until(wait_until: float | None = None) -> dt.datetime:
    """The lease for a hold whose holder next shows itself by ``wait_until`` (epoch seconds; None: now)."""
    seconds = float(os.environ.get(LEASE_ENV) or DEFAULT_LEASE_SECONDS)
    start = max(wait_until or 0.0, dt.datetime.now(dt.UTC).timestamp())
    return dt.datetime.fromtimestamp(start + seconds, dt.UTC)


def hold(spec: PipelineSpec, ref: StepRef, output_prefix: str, *, may_take: bool = True) -> int:
    """``ref``'s hold on ``output_prefix``, taken (``may_take``: a plan, an on-call resubmission) or only renewed
    (the watch's own resubmissions). Returns its fence, for :func:`record_fence`.

    Raises :class:`PartitionHeld` naming the run that holds it, :class:`PartitionMovedOn` when another run took it
    after this step last did, and (not ``may_take``) :class:`PartitionLost` when this step no longer holds it."""
    model = services.ledger_model(spec)
    if not may_take:
        _renew_run(spec, model, ref, output_prefix, lease_until())
        return _step_fence(model, ref) or 0
    fence = _step_fence(model, ref)
    return take(model, output_prefix, ref, lease_until(), known_fence=fence, running=running_job_of(spec)).fence


def running_job_of(source: services.Source) -> RunningJob:
    """What says whether a prefix's last holder still has a job running (its step's newest attempt's, as the backend
    describes it): a hold is released by its jobs' confirmed end, not by whatever ended its run (a failure callback,
    a task marked failed, a deleted DAG run, a lease run out)."""

    def running(holder: PartitionHolder) -> str | None:
        ref = StepRef(holder.pipeline, holder.run_id, holder.step)
        step = read_step_item(services.ledger_model(source), ref)
        if step is None:
            return None  # never planned an attempt: no job
        return next((name for _, name, _ in running_jobs(source, ref, step)), None)

    return running


def running_jobs(source: services.Source, ref: StepRef, step: StepRecord, before: int | None = None):
    """The jobs of the step's attempts that may still run, and have not ended, oldest first: (attempt, name, state).

    Earlier attempts' jobs were stopped and waited for before the newest was planned (jobs.stop_and_wait), except
    those still running beside it (``live_from`` on the STEP item: a lost instance's files went on ahead).
    ``before``: only the attempts before this one."""
    live = step.live_attempts
    for number in live if before is None else range(live.start, before):
        name = naming.job_name(ref.pipeline, ref.run_id, ref.step, number)
        try:
            state = services.backend_for(source).describe(name)
        except JobNotFound:
            continue
        if not state.status.is_terminal:
            yield number, name, state


def hold_for_attempt(
    spec: PipelineSpec, ref: StepRef, output_prefix: str, *, number: int, may_take: bool, taken_up: bool = False
) -> int:
    """:func:`hold` for attempt ``number``. A later attempt reopens its RUN item (RUNNING) first, so a run looking
    at this one's hold never finds it ended while it writes again; a hold refused puts the run's status back."""
    if number == 1 and not taken_up:  # the plan set the run RUNNING already
        return hold(spec, ref, output_prefix, may_take=may_take)
    model = services.ledger_model(spec)
    before = read_run_item(model, ref.pipeline, ref.run_id) or RunRecord(None)
    # ``taken_up``: an on-call engineer takes up a run whose watch task has ended (it is cleared next), so the Airflow
    # life it failed in is over: that life's failure callback, however late it runs, neither marks it failed nor
    # releases what it holds now. In the same write as RUNNING: a callback between the two would end the new attempt.
    set_run_status(model, ref.pipeline, ref.run_id, RunStatus.RUNNING, taken_up=taken_up)
    try:
        return hold(spec, ref, output_prefix, may_take=may_take)
    except (PartitionHeld, PartitionMovedOn, PartitionLost):
        if before.status and before.status != RunStatus.RUNNING:
            set_run_status(model, ref.pipeline, ref.run_id, RunStatus(before.status), before.message or "")
        raise


def record_fence(spec: PipelineSpec, ref: StepRef, fence: int) -> None:
    """Remember on the STEP item which take of its prefix the step holds (after the STEP item is written)."""
    record_step_fence(services.ledger_model(spec), ref, fence)


def keep(spec: PipelineSpec, attempt: Attempt, wait_until: float | None = None) -> None:
    """Renew the attempt's hold past ``wait_until``, and the run's other holds with it. Raises
    :class:`PartitionLost` when another run took the attempt's prefix."""
    model = services.ledger_model(spec)
    _renew_run(spec, model, attempt.ref, attempt.output_prefix, lease_until(wait_until))


def lost(spec: PipelineSpec, attempt: Attempt, wait_until: float | None = None) -> str | None:
    """Why the step must not write its prefix any more, nor mark it complete (it no longer holds it: another run took
    it, or it was released), or None while it holds it (renewed past ``wait_until``). A step planned before holds
    existed (no fence recorded) takes one now."""
    model = services.ledger_model(spec)
    try:
        if _step_fence(model, attempt.ref, must_exist=True) is None:
            record_fence(spec, attempt.ref, hold(spec, attempt.ref, attempt.output_prefix))
            return None
        keep(spec, attempt, wait_until)
    except (PartitionHeld, PartitionLost, PartitionMovedOn) as err:
        return f"{err}: this run's outputs there may be another run's by now, so it marks nothing complete"
    return None


def _renew_run(spec: PipelineSpec, model, ref: StepRef, output_prefix: str, until: dt.datetime) -> None:
    """Renew ``output_prefix`` strictly, and every other prefix the run's steps hold, so none runs out while a later
    step of the run goes on."""
    renew(model, output_prefix, ref, until)
    for step, prefix in _held_prefixes(spec, model, ref):
        if prefix != output_prefix:
            renew(model, prefix, StepRef(ref.pipeline, ref.run_id, step), until, strict=False)


def _held_prefixes(spec: PipelineSpec, model, ref: StepRef) -> list[tuple[str, str]]:
    """(step, output prefix) of each step of the run that took its prefix (a fence recorded)."""
    found = []
    for step in spec.steps:
        step_ref = StepRef(ref.pipeline, ref.run_id, step.name)
        item = read_step_item(model, step_ref)
        if item is not None and item.fence is not None and item.plan_json:
            found.append((step.name, Attempt.from_plan(item.plan_json, 1, 0, **step_ref._asdict()).output_prefix))
    return found


def _step_fence(model, ref: StepRef, *, must_exist: bool = False) -> int | None:
    """The fence the STEP item records (None before one is). ``must_exist``: a STEP item that is gone raises
    :class:`~shardline.errors.LedgerRecordMissing` (a step's hold is never taken again for a record that was lost)."""
    item = read_step_item(model, ref)
    if item is None:
        if must_exist:
            raise LedgerRecordMissing(record_gap(None, ref, 1))
        return None
    return item.fence


def held_text(err: PartitionHeld, ref: StepRef) -> str:
    """What a run that waits for the prefix says (the plan task's log, `shardline runs`, the page)."""
    holder = err.holder
    return (
        f"step {ref.step}: waiting: {err}; two runs never write one prefix at once, so this run starts when that run "
        f"ends (`shardline status {holder.pipeline}/{holder.run_id}`; `shardline cancel "
        f"{holder.pipeline}/{holder.run_id}` ends it sooner)"
    )


def refused_text(err: PartitionHeld | PartitionMovedOn, ref: StepRef) -> str:
    """Why an on-call resubmission of an older run is refused while (or since) a newer run writes its prefix."""
    holder = err.holder if isinstance(err, PartitionHeld) else err.last
    other = f"{holder.pipeline}/{holder.run_id}" if holder else "the newer run"
    return (
        f"not resubmitted: {err}. Two runs never write one prefix at once, and that run's outputs would be mixed with "
        f"this one's. Wait for it to end (`shardline status {other}`): the partition's outputs are then that run's. "
        f"To score the partition again after that, rerun that run: `shardline rerun {other} --conf '{{...}}'` scores "
        f"it whole with that conf; {naming.resubmit_command(ref.pipeline, ref.run_id, ref.step)} is for this run's "
        "files while it holds the prefix"
    )


def release_run(spec: PipelineSpec, pipeline: str, run_id: str) -> None:
    """Let go of every prefix the run's steps hold (the run ended). A prefix another run holds is left alone."""
    model = services.ledger_model(spec)
    for step, prefix in _held_prefixes(spec, model, StepRef(pipeline, run_id, spec.steps[0].name)):
        if release(model, prefix, StepRef(pipeline, run_id, step)):
            log.info("step %s: released %s", step, prefix)


def end_run_gone_from_airflow(spec: PipelineSpec, holder: PartitionHolder) -> str:
    """The run that holds a prefix is gone from Airflow (its DAG run deleted): end it in the ledger (FAILED, saying
    why), so its hold is free for the run that waits once no job of it runs; says what it did."""
    model = services.ledger_model(spec)
    why = f"its DAG run no longer exists in Airflow (deleted): {holder} is ended"
    if set_run_status(model, holder.pipeline, holder.run_id, RunStatus.FAILED, why, only_if_running=True):
        return why
    return f"{holder} had ended already"


def release_ended_life(spec: PipelineSpec, pipeline: str, run_id: str, life: int) -> None:
    """:func:`release_run` for a run its failure callback ended at Airflow life ``life``: each release is checked, in
    one transaction, against the RUN item still saying so (an on-call engineer who took the run up again since keeps
    its holds)."""
    model = services.ledger_model(spec)
    for step, prefix in _held_prefixes(spec, model, StepRef(pipeline, run_id, spec.steps[0].name)):
        if release_after_life(model, prefix, StepRef(pipeline, run_id, step), life):
            log.info("step %s: released %s", step, prefix)


def withdraw_success_marker(spec: PipelineSpec, output_prefix: str) -> None:
    """A step about to write its prefix again is not complete: remove an earlier run's marker first."""
    bucket, key = parse_s3_uri(naming.success_marker_key(output_prefix))
    services.s3_client(spec).delete_object(Bucket=bucket, Key=key)  # idempotent: no error when absent
