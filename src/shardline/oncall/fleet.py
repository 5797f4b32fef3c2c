"""``shardline fleet sync``: the Airflow pools that admit steps within the account's quotas (``dags/fleet.yaml``).

One pool per instance type with a quota, named ``sagemaker-<type>``, its slots the quota, deferred tasks counted
(a watch task waits deferred for its whole job). Pools the file no longer names are left alone: a step may still
be in one.
"""

from __future__ import annotations

import dataclasses
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
