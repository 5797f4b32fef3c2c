"""A step's hold on its output prefix through its life (:mod:`shardline.ledger.partitions` keeps the lock item).

- The plan takes it before it withdraws the prefix's ``_SUCCESS``; held by another run that has not ended, the
  plan task waits for it (:class:`~shardline.airflow.triggers.step.PartitionTrigger`), saying which run holds it.
- Every resubmission takes it again (the step's own hold is renewed; a newer run's hold refuses an on-call
  resubmission of an older run, naming it), and the watch renews the lease each time it defers.
- The step's end checks it just before ``_SUCCESS``: a step that lost it fails, and vouches for nothing.
- The run's end (the report task, or the DAG's failure callback) releases every prefix the run holds.

The lease is how long the hold stands with nobody renewing it: long enough for a watch's longest wait, so only a
run whose Airflow side is gone loses it, and a run that ended is never waited for at all.
"""

from __future__ import annotations

import datetime as dt
import logging
import os

from shardline.ledger.keys import StepRef, run_pk, step_sk
from shardline.ledger.partitions import PartitionHeld, PartitionLost, read_holder, release, renew, take
from shardline.orchestration import services
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import parse_s3_uri
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)

__all__ = ["PartitionHeld", "PartitionLost", "hold", "keep", "lost", "release_run", "withdraw_success_marker"]

# A hold stands this long past the end of the longest wait its holder announced (the watch's deadline, a backoff)
# with nobody renewing it; then another run of the partition may take it over. The tests shorten it.
LEASE_ENV = "SHARDLINE_PARTITION_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 3600.0


def lease_until(wait_until: float | None = None) -> dt.datetime:
    """The lease for a hold whose holder next shows itself by ``wait_until`` (epoch seconds; None: now)."""
    seconds = float(os.environ.get(LEASE_ENV) or DEFAULT_LEASE_SECONDS)
    start = max(wait_until or 0.0, dt.datetime.now(dt.UTC).timestamp())
    return dt.datetime.fromtimestamp(start + seconds, dt.UTC)


def hold(spec: PipelineSpec, ref: StepRef, output_prefix: str) -> None:
    """Take (or renew) ``ref``'s hold on ``output_prefix``. Raises :class:`PartitionHeld` naming the holder."""
    take(services.ledger_model(spec), output_prefix, ref, lease_until())


def keep(spec: PipelineSpec, attempt: Attempt, wait_until: float | None = None) -> None:
    """Renew the attempt's hold past ``wait_until``. Raises :class:`PartitionLost` when another run took it."""
    renew(services.ledger_model(spec), attempt.output_prefix, attempt.ref, lease_until(wait_until))


def lost(spec: PipelineSpec, attempt: Attempt) -> str | None:
    """Why the step must not mark its prefix complete (another run holds it now), or None while it holds it.

    A step planned before holds existed has none: it takes one now, unless another run writes there."""
    try:
        hold(spec, attempt.ref, attempt.output_prefix)
    except PartitionHeld as err:
        return f"{err}: this run's outputs there may be replaced by that run's, so it marks nothing complete"
    return None


def held_text(err: PartitionHeld, ref: StepRef) -> str:
    """What a run that waits for the prefix says (the plan task's log, `shardline runs`, the page)."""
    holder = err.holder
    return (
        f"step {ref.step}: waiting: {err}; two runs never write one prefix at once, so this run starts when that run "
        f"ends (`shardline status {holder.pipeline}/{holder.run_id}`; `shardline cancel "
        f"{holder.pipeline}/{holder.run_id}` ends it sooner)"
    )


def refused_text(err: PartitionHeld, ref: StepRef) -> str:
    """Why an on-call resubmission of an older run is refused while a newer run writes its prefix."""
    holder = err.holder
    return (
        f"not resubmitted: {err}. Two runs never write one prefix at once, and that run's outputs would be mixed with "
        f"this one's. Wait for it to end (`shardline status {holder.pipeline}/{holder.run_id}`), or score the "
        f"partition again in a new run (`shardline rerun {holder.pipeline}/{holder.run_id}` once it has ended); "
        f"then, if this run's files are still wanted: {naming.resubmit_command(ref.pipeline, ref.run_id, ref.step)}"
    )


def release_run(spec: PipelineSpec, pipeline: str, run_id: str) -> None:
    """Let go of every prefix the run's steps hold (the run ended). A prefix another run holds is left alone."""
    model = services.ledger_model(spec)
    control = model.Control
    for step in spec.steps:
        try:
            item = control.get(run_pk(pipeline, run_id), step_sk(step.name), consistent_read=True)
        except control.DoesNotExist:
            continue
        ref = StepRef(pipeline, run_id, step.name)
        prefix = Attempt.from_plan(item.plan_json, 1, 0, **ref._asdict()).output_prefix if item.plan_json else None
        if prefix and release(model, prefix, ref):
            log.info("step %s: released %s", step.name, prefix)


def holder_of(spec: PipelineSpec, output_prefix: str):
    """Who holds ``output_prefix`` now, or None (for the partition trigger and `shardline status`)."""
    return read_holder(services.ledger_model(spec), output_prefix)


def withdraw_success_marker(spec: PipelineSpec, output_prefix: str) -> None:
    """A step about to write its prefix again is not complete: remove an earlier run's marker first."""
    bucket, key = parse_s3_uri(naming.success_marker_key(output_prefix))
    services.s3_client(spec).delete_object(Bucket=bucket, Key=key)  # idempotent: no error when absent
