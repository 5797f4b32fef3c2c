"""What the pipelines under a DAGs folder need to exist: their ledger tables and S3 buckets.

Derived from the specs, never listed by hand. Used by `shardline local up` (the embedded
endpoint) and by the compose stack's init service (MinIO and DynamoDB Local). Idempotent:
what exists is kept.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path

S3_URI = re.compile(r"^s3://([^/]*)")
# S3's bucket naming rules, simplified: 3-63 lowercase letters, digits, dots and hyphens.
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclasses.dataclass(frozen=True)
class Plan:
    tables: tuple[str, ...]
    buckets: tuple[str, ...]
    problems: tuple[str, ...] = ()  # specs or names that were skipped, and why


def s3_buckets(value: object) -> set[str]:
    """Every bucket named by an ``s3://`` URI anywhere in ``value`` (a spec as plain data).

    A bucket that is itself templated (``s3://{{ var.value.bucket }}/...``) cannot be known
    before a run and is left out; templated prefixes after a static bucket are fine.
    """
    found: set[str] = set()
    if isinstance(value, str):
        match = S3_URI.match(value.strip())
        if match and match.group(1) and "{" not in match.group(1):
            found.add(match.group(1))
    elif isinstance(value, dict):
        for item in value.values():
            found |= s3_buckets(item)
    elif isinstance(value, list | tuple):
        for item in value:
            found |= s3_buckets(item)
    return found


def make_plan(pipelines_dir: Path, extra_buckets: Iterable[str] = ()) -> Plan:
    """The tables and buckets the specs in ``pipelines_dir`` need. A spec that does not load is skipped
    (Airflow shows it as an import error); it must not keep the rest of the stack from starting."""
    from shardline.spec import PipelineSpec, SpecError, load_spec

    tables: set[str] = set()
    buckets: set[str] = set(extra_buckets)
    problems: list[str] = []
    specs = sorted([*pipelines_dir.glob("*.yaml"), *pipelines_dir.glob("*.yml")])
    for path in specs:
        try:
            spec = load_spec(path)
        except SpecError as err:
            problems.append(f"skipped {path.name}: {err}")
            continue
        tables.add(spec.ledger_table)
        buckets |= s3_buckets(spec.model_dump(mode="json"))
    if not tables:  # no valid spec yet: the table a new spec gets by default
        tables.add(PipelineSpec.model_fields["ledger_table"].default)
    for name in sorted(buckets):
        if not BUCKET_NAME.match(name):
            problems.append(f"skipped bucket {name!r}: not a valid S3 bucket name")
            buckets.discard(name)
    return Plan(tables=tuple(sorted(tables)), buckets=tuple(sorted(buckets)), problems=tuple(problems))


def ensure_bucket(s3, name: str, region: str) -> str:
    from botocore.exceptions import ClientError

    try:
        s3.head_bucket(Bucket=name)
        return "exists"
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in {"404", "NoSuchBucket", "NotFound"}:
            raise
    kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    s3.create_bucket(Bucket=name, **kwargs)
    return "created"


def ensure_table(name: str) -> str:
    """Create the ledger table with the project's own function (its schema is the one in code)."""
    from shardline.ledger.table import bind_ledger, create_ledger_table

    existed = bind_ledger(name).exists()
    create_ledger_table(name)  # safe on an existing table: TTL is only enabled when it is not yet
    return "exists" if existed else "created"


def apply(plan: Plan) -> list[str]:
    """Create what the plan names; one line per table and bucket saying what happened."""
    import boto3

    from shardline.ledger.table import region_from_env

    s3 = boto3.client("s3")
    region = region_from_env()
    done = [f"ledger table {table}: {ensure_table(table)}" for table in plan.tables]
    return done + [f"bucket s3://{bucket}: {ensure_bucket(s3, bucket, region)}" for bucket in plan.buckets]
