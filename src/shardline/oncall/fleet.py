"""``shardline fleet``: the Airflow pools that admit steps within the account's quotas (``dags/fleet.yaml``): what
they hold and who waits (:func:`fleet_view`), and keeping them in step with the file (:func:`sync_pools`).

One pool per instance type with a quota, named ``sagemaker-<type>``, its slots the quota, deferred tasks counted
(a watch task waits deferred for its whole job). Pools the file no longer names are left alone: a step may still
be in one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from shardline.decision.fleet import pool_name
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
class TypeView:
    instance_type: str
    pool: str
    quota: int
    in_use: int  # the slots held now: the instances of the steps submitted and watched
    running: list[StepInPool]
    waiting: list[StepInPool]  # the longest waiting first

    @property
    def oldest_wait_seconds(self) -> float | None:
        return self.waiting[0].seconds if self.waiting else None


def _since(text: str | None, now: dt.datetime) -> float | None:
    return (now - dt.datetime.fromisoformat(text)).total_seconds() if text else None


def fleet_view(dags_folder: Path, client, now: dt.datetime) -> list[TypeView]:
    """Per instance type with a quota: its pool's slots in use, and the steps holding and waiting for them."""
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
        views.append(TypeView(instance_type, name, quota, int(found.get("occupied_slots") or 0), running, waiting))
    return views


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
        lines += [f"  running  {s.step} ({s.instances} instance(s))" for s in view.running]
        lines += [
            f"  waiting  {s.step} ({s.instances} instance(s))" + (f" for {s.seconds:.0f}s" if s.seconds else "")
            for s in view.waiting
        ]
    return lines
