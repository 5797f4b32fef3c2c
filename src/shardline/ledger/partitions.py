"""Which run writes an output prefix now: one lock item per prefix, so two runs of one partition never write it at
the same time (their outputs would mix, and one run's check could vouch for the other's objects).

A step takes its prefix's lock when it plans, before it withdraws the prefix's ``_SUCCESS``; renews the lease as
its watch goes on; checks it just before writing ``_SUCCESS``; and releases it when the run ends. Another run that
finds it held waits for it (a run's plan task) or is refused (on-call's resubmit of an older run), and either way
is told which run holds it.

The lock is free when it was released, when its holder's run has ended (its RUN item is no longer RUNNING: the
run failed or was cancelled without releasing), or when the holder's lease ran out with nobody renewing it (its
Airflow run is gone). Taking it raises the fence with a write conditional on the fence and the lease the taker
read, so of two takers exactly one wins, and a holder renewing meanwhile wins over both. A step records the fence
it took (on its STEP item): once another run has taken the prefix since, the step never takes it again
(:class:`PartitionMovedOn`), and its renewals and its check before ``_SUCCESS`` find another holder, or none, and
stop. A renewal never shortens a lease. Only the orchestrator's role reaches these items: a job's grant covers
``RUN#{pipeline}#*`` alone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

from pynamodb.connection import Connection
from pynamodb.exceptions import DoesNotExist, TransactWriteError, UpdateError
from pynamodb.transactions import TransactWrite

from shardline.errors import LedgerRecordMissing, PermanentError, ShardlineError
from shardline.ledger.keys import PARTITION_LOCK_SK, RUN_SK, StepRef, partition_lock_pk, run_pk, step_sk
from shardline.ledger.record_gaps import record_gap
from shardline.ledger.states import STEP_TERMINAL, StepStatus
from shardline.ledger.table import CLIENT_SETTINGS, LedgerItem, condition_failed, update_if

log = logging.getLogger(__name__)

TAKE_TRIES = 3  # a lost race re-reads the lock; three losses in a row mean others hold it
HELD, RELEASED = "HELD", "RELEASED"  # the lock item's status; a released item keeps who held it last


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionHolder:
    """The run step that holds an output prefix's lock, and its fence (raised by every change of holder)."""

    pipeline: str
    run_id: str
    step: str
    fence: int
    lease_until: dt.datetime | None = None
    taken_at: dt.datetime | None = None
    released: bool = False  # it let go: the fields say who held the prefix last

    def holds(self, ref: StepRef) -> bool:
        """Whether ``ref`` holds the prefix now."""
        return not self.released and self.is_(ref)

    def is_(self, ref: StepRef) -> bool:
        return (self.pipeline, self.run_id, self.step) == tuple(ref)

    def __str__(self) -> str:
        return f"run {self.pipeline}/{self.run_id} (step {self.step})"


class PartitionHeld(ShardlineError):
    """Another run that has not ended writes this output prefix now, or a run that ended still has a job running
    (``running_job``): its hold stands until the backend confirms that job's end."""

    def __init__(self, output_prefix: str, holder: PartitionHolder, running_job: str | None = None):
        self.output_prefix, self.holder, self.running_job = output_prefix, holder, running_job
        if running_job:
            super().__init__(
                f"{output_prefix} is still being written by job {running_job} of {holder}, which ended without it "
                "(the job is being stopped, or nobody stopped it): it is free once that job has ended"
            )
            return
        lease = f", its lease runs to {holder.lease_until:%Y-%m-%d %H:%M:%S} UTC" if holder.lease_until else ""
        super().__init__(f"{output_prefix} is being written by {holder}{lease}")


# Given the run step that held a prefix last, the name of its job that still runs (None when none does): a hold is
# free only once the backend confirms its holder's jobs ended, whatever ended the run (the orchestrator asks it).
RunningJob = Callable[[PartitionHolder], str | None]


class PartitionMovedOn(PermanentError):
    """Another run took the prefix since this step last held it: its outputs there may be that run's now, so the
    step never takes it again (its outputs would be mixed with the other's)."""

    def __init__(self, output_prefix: str, last: PartitionHolder | None, ref: StepRef):
        self.output_prefix, self.last = output_prefix, last
        super().__init__(
            f"{output_prefix} was written by {last or 'another run'} after {ref} last wrote it, so {ref} does not "
            "write it again (its outputs would be mixed with that run's)"
        )


class PartitionLost(PermanentError):
    """The lock moved to another run while this one held it (its lease ran out): this run must not vouch for the
    prefix, since the other run writes there now."""


def free_reason(holder: PartitionHolder | None, holder_run_status: str | None, now: dt.datetime) -> str | None:
    """Why the lock may be taken from ``holder`` now, or None while it holds it. Pure.

    ``holder_run_status``: the status on the holder's RUN item (None when there is none yet: a run planning now)."""
    if holder is None:
        return "nobody holds it"
    if holder.released:
        return f"{holder} released it"
    if holder_run_status in STEP_TERMINAL:
        return f"{holder} ended ({holder_run_status}) without releasing it"
    if holder.lease_until is not None and holder.lease_until < now:
        return f"the lease of {holder} ran out at {holder.lease_until:%Y-%m-%d %H:%M:%S} UTC with nobody renewing it"
    return None


def read_holder(model: type[LedgerItem], output_prefix: str) -> PartitionHolder | None:
    """Who holds the prefix's lock now (a consistent read), or None."""
    item = _item(model, output_prefix)
    return _holder(item) if item is not None else None


def standing(
    model: type[LedgerItem], output_prefix: str, ref: StepRef, running: RunningJob | None = None
) -> tuple[PartitionHolder | None, str | None]:
    """Who holds the prefix now, and why ``ref`` may take it (None while another run holds it, or while a job of the
    run that held it last still runs: ``running``)."""
    holder = read_holder(model, output_prefix)
    if holder is not None and holder.holds(ref):
        return holder, f"{ref} holds it"
    why = free_reason(holder, _run_status(model, holder), _now())
    if why is not None and _still_writing(holder, ref, running):
        return holder, None
    return holder, why


def _still_writing(holder: PartitionHolder | None, ref: StepRef, running: RunningJob | None) -> str | None:
    """The job of another run that held the prefix last and still runs, or None. The step's own jobs are not asked
    about: its attempts are fenced one at a time (a plan adopts a running attempt, a resubmission stops it first)."""
    if holder is None or running is None or holder.is_(ref):
        return None
    return running(holder)


def take(
    model: type[LedgerItem],
    output_prefix: str,
    ref: StepRef,
    lease_until: dt.datetime,
    *,
    known_fence: int | None = None,
    running: RunningJob | None = None,
) -> PartitionHolder:
    """Hold ``output_prefix`` for ``ref`` until ``lease_until`` (renewed if ``ref`` holds it already).

    ``known_fence``: the fence ``ref`` took the prefix with last time (None: it never held it). ``running``: the job
    of the run that held it last that still runs, as the backend says (the lock is not free while one does). Raises
    :class:`PartitionHeld` while another run that has not ended holds it, and :class:`PartitionMovedOn` when
    another run took it after ``ref`` last did."""
    c = model.Control
    for _ in range(TAKE_TRIES):
        item = _item(model, output_prefix)
        holder = _holder(item) if item is not None else None
        if holder is not None and holder.holds(ref):
            if renew(model, output_prefix, ref, lease_until, strict=False):
                return read_holder(model, output_prefix)  # type: ignore[return-value]
            continue  # released or taken over just now: look again
        seen_fence = int(item.fence or 0) if item is not None else 0
        if known_fence is not None and seen_fence != known_fence:  # whether or not that run still holds it
            raise PartitionMovedOn(output_prefix, holder, ref)
        why = free_reason(holder, _run_status(model, holder), _now())
        if why is None:
            raise PartitionHeld(output_prefix, holder)  # type: ignore[arg-type]
        if job := _still_writing(holder, ref, running):
            raise PartitionHeld(output_prefix, holder, running_job=job)  # type: ignore[arg-type]
        if holder is not None and not holder.is_(ref):
            log.warning("%s: taking the lock for %s: %s", output_prefix, ref, why)
        try:
            _lock_item(model, output_prefix).update(
                actions=[
                    c.status.set(HELD),
                    c.pipeline.set(ref.pipeline),
                    c.run_id.set(ref.run_id),
                    c.step.set(ref.step),
                    c.fence.set(seen_fence + 1),
                    c.lease_until.set(lease_until),
                    c.started_at.set(_now()),
                    c.expires_at.set(c.expiry()),
                ],
                condition=_unchanged(c, item),
            )
        except UpdateError as err:
            if not condition_failed(err):
                raise
            continue  # another taker, or the holder's renewal, came first: look again
        return PartitionHolder(ref.pipeline, ref.run_id, ref.step, seen_fence + 1, lease_until, _now())
    holder = read_holder(model, output_prefix)
    raise PartitionHeld(output_prefix, holder or PartitionHolder("?", "?", "?", 0))


def _unchanged(c, item):
    """The lock item is as the taker read it: no other take, renewal or release since (or still no item)."""
    if item is None:
        return c.pk.does_not_exist()
    fence = c.fence == item.fence if item.fence is not None else c.fence.does_not_exist()
    lease = c.lease_until == item.lease_until if item.lease_until is not None else c.lease_until.does_not_exist()
    status = c.status == item.status if item.status is not None else c.status.does_not_exist()
    renewed = c.renewed_at == item.renewed_at if item.renewed_at is not None else c.renewed_at.does_not_exist()
    return fence & lease & status & renewed


def renew(
    model: type[LedgerItem], output_prefix: str, ref: StepRef, lease_until: dt.datetime, *, strict: bool = True
) -> bool:
    """Extend ``ref``'s lease on the prefix to ``lease_until`` (a lease already later is kept). When ``ref`` does not
    hold it (another run took it over, or it was released): :class:`PartitionLost` if ``strict``, else False."""
    c = model.Control
    mine = _held_by(c, ref)
    try:
        # Always a change, even when the lease runs later already: a taker that read the item before it fails.
        _lock_item(model, output_prefix).update(
            actions=[c.renewed_at.set(_now()), c.expires_at.set(c.expiry())], condition=mine
        )
    except UpdateError as err:
        if not condition_failed(err):
            raise
        if not strict:
            return False
        holder = read_holder(model, output_prefix)
        now_held = f"{holder} holds it now" if holder and not holder.released else "nobody holds it now"
        raise PartitionLost(
            f"{ref} no longer holds the lock of {output_prefix} ({now_held}): it stops here and does not mark the "
            "prefix complete"
        ) from err
    try:  # a lease is never shortened
        _lock_item(model, output_prefix).update(
            actions=[c.lease_until.set(lease_until)],
            condition=mine & (c.lease_until.does_not_exist() | (c.lease_until < lease_until)),
        )
    except UpdateError as err:
        if not condition_failed(err):
            raise
    return True


def release(model: type[LedgerItem], output_prefix: str, ref: StepRef) -> bool:
    """Let go of the prefix if ``ref`` holds it (a run's end); False when it does not (nothing to do)."""
    c = model.Control
    return update_if(_lock_item(model, output_prefix), _released(c), _held_by(c, ref))


def release_after_life(model: type[LedgerItem], output_prefix: str, ref: StepRef, life: int) -> bool:
    """:func:`release` for a run whose Airflow life ``life`` was ended by its failure callback: in one transaction
    with a check that the RUN item still says so (FAILED, that life over), so an on-call engineer who took the run
    up again a moment ago keeps the hold. False when it does not hold the prefix, or was taken up again."""
    c = model.Control
    connection = Connection(region=model.Meta.region, host=model.Meta.host, **CLIENT_SETTINGS)
    try:
        with TransactWrite(connection=connection) as transaction:
            transaction.condition_check(
                c,
                run_pk(ref.pipeline, ref.run_id),
                RUN_SK,
                condition=(c.status == StepStatus.FAILED.value) & (c.ended_life == life),
            )
            transaction.update(_lock_item(model, output_prefix), actions=_released(c), condition=_held_by(c, ref))
    except TransactWriteError as err:
        if condition_failed(err):
            return False
        raise
    return True


def _held_by(c, ref: StepRef):
    """The lock item's condition: ``ref`` holds it now."""
    return (c.status == HELD) & (c.pipeline == ref.pipeline) & (c.run_id == ref.run_id) & (c.step == ref.step)


def _released(c) -> list:
    """What letting go of a prefix writes (the item keeps who held it last)."""
    return [c.status.set(RELEASED), c.lease_until.set(_now()), c.expires_at.set(c.expiry())]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _lock_item(model: type[LedgerItem], output_prefix: str):
    return model.Control(partition_lock_pk(output_prefix), PARTITION_LOCK_SK)


def _item(model: type[LedgerItem], output_prefix: str):
    try:
        return model.Control.get(partition_lock_pk(output_prefix), PARTITION_LOCK_SK, consistent_read=True)
    except DoesNotExist:
        return None


def _holder(item) -> PartitionHolder | None:
    if not item.run_id:
        return None
    return PartitionHolder(
        item.pipeline,
        item.run_id,
        item.step,
        int(item.fence or 0),
        item.lease_until,
        item.started_at,
        released=item.status == RELEASED,
    )


def _run_status(model: type[LedgerItem], holder: PartitionHolder | None) -> str | None:
    if holder is None:
        return None
    try:
        run = model.Control.get(run_pk(holder.pipeline, holder.run_id), RUN_SK, consistent_read=True)
    except DoesNotExist:
        return None
    return run.status


def record_step_fence(model: type[LedgerItem], ref: StepRef, fence: int) -> None:
    """Remember on the STEP item which take of its output prefix the step holds. Never creates one: a STEP item that
    is gone raises :class:`~shardline.errors.LedgerRecordMissing`."""
    c = model.Control
    try:
        c(run_pk(ref.pipeline, ref.run_id), step_sk(ref.step)).update(
            actions=[c.fence.set(fence)], condition=c.attempt.exists()
        )
    except UpdateError as err:
        if not condition_failed(err):
            raise
        raise LedgerRecordMissing(record_gap(None, ref, 1)) from err
