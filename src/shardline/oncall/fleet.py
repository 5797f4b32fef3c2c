"""``shardline fleet``: the Airflow pools that admit steps within the account's quotas (``dags/fleet.yaml``): what
they hold and who waits (:func:`fleet_view`), and keeping them in step with the file (:func:`sync_pools`).

One pool per instance type with a quota, named ``sagemaker-<type>``, its slots the quota, deferred tasks counted
(a watch task waits deferred for its whole job). Pools the file no longer names are left alone: a step may still
be in one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

from shardline.decision.fleet import pool_name
from shardline.ledger.records import StepRecord
from shardline.ledger.states import StepStatus
from shardline.oncall.airflow_client import AirflowApiError
from shardline.oncall.errors import Refused, Unavailable
from shardline.spec.fleet import FLEET_FILE, load_fleet


@dataclasses.dataclass(frozen=True)
class PoolChange:
    pool: str
    instance_type: str
    slots: int
    action: str  # created, updated, unchanged (or, in a dry run, would be created or updated)
    was: int | None = None  # the slots it had


def sync_pools(dags_folder: Path, client, *, dry_run: bool = False) -> list[PoolChange]:
    """Create or update a pool per quota of ``dags_folder/fleet.yaml`` through Airflow's REST API (``client``:
    an :class:`~shardline.oncall.airflow_client.AirflowClient`)."""
    changes = []
    for instance_type, quota in sorted(load_fleet(dags_folder).quotas.items()):
        name = pool_name(instance_type)
        found = client.pool(name)
        description = f"Shardline: {instance_type} instances in use, at most the account's quota ({FLEET_FILE})"
        if found is not None and found.get("slots") == quota and found.get("include_deferred"):
            changes.append(PoolChange(name, instance_type, quota, "unchanged"))
            continue
        action = "created" if found is None else "updated"
        if not dry_run:
            client.put_pool(name, quota, description, create=found is None)
        changes.append(
            PoolChange(
                name,
                instance_type,
                quota,
                f"would be {action}" if dry_run else action,
                None if found is None else found.get("slots"),
            )
        )
    return changes


# A step holds its pool's slots in these task states (queued ones count against the pool already), or waits for
# them (scheduled: the scheduler has not found room).
HOLDING = ("queued", "running", "deferred")
WAITING = ("scheduled",)


@dataclasses.dataclass(frozen=True)
class StepInPool:
    step: str  # PIPELINE/RUN_ID task
    instances: int  # the slots it holds or waits for
    seconds: float | None  # since it started holding them, or since it began to wait


@dataclasses.dataclass(frozen=True)
class JobsToday:
    """A type's jobs of the runs started today (UTC), from the ledger: the steps that ended with their last job on
    it, by how they ended, and the jobs SageMaker could not provision there, each of which went again. A step
    still going is not counted here: the pool's running steps are (its STEP item says PLANNED until it ends)."""

    succeeded: int = 0  # the step succeeded (or ended partial, within its tolerance)
    resubmitted_for_capacity: int = 0
    failed: int = 0  # the step failed (or was cancelled)


_ENDED_WELL = (StepStatus.SUCCEEDED, StepStatus.PARTIAL)
_ENDED_BADLY = (StepStatus.FAILED, StepStatus.CANCELLED)


def jobs_by_type(steps: Iterable[StepRecord]) -> dict[str, JobsToday]:
    """Count :class:`JobsToday` per instance type from the steps' STEP records. Pure."""
    counts: dict[str, dict[str, int]] = {}
    for step in steps:
        for instance_type, failures in step.capacity_failures.items():
            of_type = counts.setdefault(instance_type, {})
            of_type["resubmitted_for_capacity"] = of_type.get("resubmitted_for_capacity", 0) + failures
        ended = "succeeded" if step.status in _ENDED_WELL else "failed" if step.status in _ENDED_BADLY else None
        if step.instance_type is None or ended is None:
            continue  # not ended (planned, waiting or running), no job at all (an empty input), or no type
        of_type = counts.setdefault(step.instance_type, {})
        of_type[ended] = of_type.get(ended, 0) + 1
    return {instance_type: JobsToday(**c) for instance_type, c in counts.items()}


@dataclasses.dataclass(frozen=True)
class TypeView:
    instance_type: str
    pool: str
    quota: int
    in_use: int  # the slots held now: the instances of the steps submitted and watched
    running: list[StepInPool]
    waiting: list[StepInPool]  # the longest waiting first
    today: JobsToday | None = JobsToday()  # None: the ledger could not be read (``today_error`` says why)
    today_error: str | None = None
    # Why the pool does not admit as fleet.yaml says (None: it does): it does not exist (a step assigned to it
    # waits forever), or it has other slots, or does not count deferred tasks. `shardline fleet sync` mends it.
    out_of_step: str | None = None

    @property
    def oldest_wait_seconds(self) -> float | None:
        return self.waiting[0].seconds if self.waiting else None


def _since(text: str | None, now: dt.datetime) -> float | None:
    return (now - dt.datetime.fromisoformat(text)).total_seconds() if text else None


def fleet_view(
    dags_folder: Path,
    client,
    now: dt.datetime,
    today: Mapping[str, JobsToday] | None = None,
    today_error: str | None = None,
) -> list[TypeView]:
    """Per instance type with a quota: its pool's slots in use, the steps holding and waiting for them, and
    ``today``'s jobs (:func:`jobs_by_type`; ``today_error``: why they could not be read)."""
    views = []
    for instance_type, quota in sorted(load_fleet(dags_folder).quotas.items()):
        name = pool_name(instance_type)
        found = client.pool(name) or {}
        tis = client.pool_task_instances(name, [*HOLDING, *WAITING]) if found else []

        def step(ti: dict, since: str | None) -> StepInPool:
            return StepInPool(f"{ti['dag_id']}/{ti['dag_run_id']} {ti['task_id']}", ti.get("pool_slots") or 1, since)

        running = [step(t, _since(t.get("start_date"), now)) for t in tis if t["state"] in HOLDING]
        waiting = [step(t, _since(t.get("scheduled_when"), now)) for t in tis if t["state"] in WAITING]
        waiting.sort(key=lambda s: -(s.seconds or 0))
        in_use = int(found.get("occupied_slots") or 0)
        jobs = None if today_error else (today or {}).get(instance_type, JobsToday())
        views.append(
            TypeView(
                instance_type, name, quota, in_use, running, waiting, jobs, today_error, _out_of_step(found, quota)
            )
        )
    return views


def _out_of_step(pool: dict, quota: int) -> str | None:
    """Why a pool does not admit as fleet.yaml says (``pool``: Airflow's answer, empty when there is none)."""
    if not pool:
        return "it does not exist in Airflow, so a step on this type waits for it forever"
    if pool.get("slots") != quota:
        return f"it has {pool.get('slots')} slot(s), not the quota of {quota}"
    if not pool.get("include_deferred"):
        return "it does not count deferred tasks, so watched jobs hold no slot and the quota is not kept"
    return None


def fleet_lines(views: list[TypeView]) -> list[str]:
    """What `shardline fleet` prints: a line per instance type, then its running and waiting steps."""
    lines = []
    for view in views:
        oldest = view.oldest_wait_seconds
        lines.append(
            f"{view.instance_type}: {view.in_use} of {view.quota} in use (pool {view.pool}); "
            f"{len(view.running)} step task(s) running, {len(view.waiting)} waiting"
            + (f", the oldest for {oldest:.0f}s" if oldest is not None else "")
        )
        if view.out_of_step:
            lines.append(f"  ! pool {view.pool}: {view.out_of_step}; `shardline fleet sync` mends it")
        jobs = view.today
        lines.append(
            f"  today    {jobs.succeeded} succeeded, {jobs.resubmitted_for_capacity} resubmitted for capacity, "
            f"{jobs.failed} failed"
            if jobs is not None
            else f"  today    unknown: {view.today_error}"
        )
        lines += [f"  running  {s.step} ({s.instances} instance(s))" for s in view.running]
        lines += [
            f"  waiting  {s.step} ({s.instances} instance(s))" + (f" for {s.seconds:.0f}s" if s.seconds else "")
            for s in view.waiting
        ]
    return lines


def fleet_report(
    dags_folder: Path, client, reads, now: dt.datetime, pipelines: Collection[str] | None = None
) -> list[TypeView]:
    """What `shardline fleet` and the on-call page's fleet panel show: :func:`fleet_view`, with the jobs of the
    runs started today (UTC) read from the ledger (``reads``: :class:`~shardline.oncall.reads.OnCallReads`; only
    ``pipelines``' runs, when given: the page's reader's). The pools still show when the ledger cannot be read."""
    from botocore.exceptions import BotoCoreError, ClientError
    from pynamodb.exceptions import PynamoDBException

    midnight = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    try:
        today, error = jobs_by_type(reads.steps_started_since(midnight, pipelines)), None
    except (PynamoDBException, BotoCoreError, ClientError) as err:
        today, error = None, f"the ledger could not be read ({type(err).__name__}); the pools above are Airflow's"
    try:
        return fleet_view(dags_folder, client, now, today, error)
    except AirflowApiError as err:
        if err.status in (401, 403):
            raise Refused(f"Airflow would not show its pools to this user ({err}): it needs Pool read access") from err
        raise Unavailable(f"Airflow's pools could not be read ({err})") from err


def view_json(view: TypeView) -> dict:
    """A type's view as `--json` and the page get it."""
    return {**dataclasses.asdict(view), "oldest_wait_seconds": view.oldest_wait_seconds}
