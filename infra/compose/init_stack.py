"""Create what the local stack's pipelines need: their ledger table(s) and their S3 buckets.

Run once per ``docker compose up`` by the ``shardline-init`` service, against MinIO and DynamoDB
Local (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL_DYNAMODB``). Idempotent: what exists is kept.

Nothing is listed here by hand. The tables are the ``ledger_table`` of every pipeline spec in
``dags/pipelines`` (its default when a spec leaves it out), created with the project's own
``shardline_ledger.table.create_ledger_table``, so the schema is the one in code. The buckets are
the demo's (``shardline.demo.BUCKET``) plus every bucket an ``s3://`` URI in a spec names.

    python infra/compose/init_stack.py --pipelines-dir dags/pipelines [--bucket extra] [--dry-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

DEFAULT_PIPELINES_DIR = Path("/opt/airflow/dags/pipelines")
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
    from shardline.demo import BUCKET as DEMO_BUCKET
    from shardline.spec import PipelineSpec, SpecError, load_spec

    tables: set[str] = set()
    buckets: set[str] = {DEMO_BUCKET, *extra_buckets}
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


def wait_for_endpoints(timeout: float) -> None:
    """Retry until S3 and DynamoDB answer: compose's healthchecks say up, but a restart can race."""
    import boto3
    from botocore.exceptions import BotoCoreError

    s3, dynamodb = boto3.client("s3"), boto3.client("dynamodb")
    deadline = time.monotonic() + timeout
    while True:
        try:
            s3.list_buckets()
            dynamodb.list_tables(Limit=1)
            return
        except BotoCoreError as err:  # connection refused / reset while a service starts
            if time.monotonic() > deadline:
                raise SystemExit(f"S3 or DynamoDB did not answer within {timeout:.0f}s: {err}") from err
            time.sleep(1)


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
    """Create the ledger table with the project's own function, once.

    ``create_ledger_table`` also enables TTL, which DynamoDB refuses to enable twice, so an
    existing table is left alone rather than passed through it again.
    """
    from pynamodb.exceptions import PynamoDBException
    from shardline_ledger.table import bind_ledger, create_ledger_table

    if bind_ledger(name).exists():
        return "exists"
    try:
        create_ledger_table(name)
    except PynamoDBException as err:
        if not bind_ledger(name).exists():
            raise
        return f"created, but TTL was not enabled ({err})"
    return "created"


def apply(plan: Plan) -> None:
    import boto3
    from shardline_ledger.table import region_from_env

    s3 = boto3.client("s3")
    region = region_from_env()
    for table in plan.tables:
        print(f"ledger table {table}: {ensure_table(table)}", flush=True)
    for bucket in plan.buckets:
        print(f"bucket s3://{bucket}: {ensure_bucket(s3, bucket, region)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines-dir", type=Path,
                        default=Path(os.environ.get("SHARDLINE_PIPELINES_DIR", DEFAULT_PIPELINES_DIR)))
    parser.add_argument("--bucket", action="append", default=[], help="another bucket to create (repeatable)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the endpoints")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; create nothing")
    args = parser.parse_args(argv)

    if not args.pipelines_dir.is_dir():
        print(f"error: pipelines directory {args.pipelines_dir} does not exist (is dags/ mounted?)", file=sys.stderr)
        return 1
    plan = make_plan(args.pipelines_dir, args.bucket)
    for problem in plan.problems:
        print(f"warning: {problem}", file=sys.stderr)
    print(f"tables: {', '.join(plan.tables)}\nbuckets: {', '.join(plan.buckets)}", flush=True)
    if args.dry_run:
        return 0
    print(f"S3 at {os.environ.get('AWS_ENDPOINT_URL_S3') or os.environ.get('AWS_ENDPOINT_URL') or 'AWS'}, "
          f"DynamoDB at {os.environ.get('AWS_ENDPOINT_URL_DYNAMODB') or os.environ.get('AWS_ENDPOINT_URL') or 'AWS'}",
          flush=True)
    wait_for_endpoints(args.timeout)
    apply(plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
