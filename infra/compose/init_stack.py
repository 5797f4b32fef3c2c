"""Create what the local stack's pipelines need: their ledger table(s) and their S3 buckets.

Run once per ``docker compose up`` by the ``shardline-init`` service, against the stack's ``aws`` service
(``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL_DYNAMODB``). Idempotent: what exists is kept.

Nothing is listed here by hand. The tables are the ``ledger_table`` of every pipeline spec in
``dags/pipelines`` (its default when a spec leaves it out), created with the project's own
``shardline.ledger.table.create_ledger_table``, so the schema is the one in code. The buckets are
every bucket an ``s3://`` URI in a spec names, plus any ``--bucket``.

    python infra/compose/init_stack.py --pipelines-dir dags/pipelines [--bucket extra] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from shardline.local.provision import Plan, apply, make_plan, s3_buckets

__all__ = ["Plan", "apply", "main", "make_plan", "s3_buckets", "wait_for_endpoints"]

DEFAULT_PIPELINES_DIR = Path("/opt/airflow/dags/pipelines")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pipelines-dir", type=Path, default=Path(os.environ.get("SHARDLINE_PIPELINES_DIR", DEFAULT_PIPELINES_DIR))
    )
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
    print(
        f"S3 at {os.environ.get('AWS_ENDPOINT_URL_S3') or os.environ.get('AWS_ENDPOINT_URL') or 'AWS'}, "
        f"DynamoDB at {os.environ.get('AWS_ENDPOINT_URL_DYNAMODB') or os.environ.get('AWS_ENDPOINT_URL') or 'AWS'}",
        flush=True,
    )
    wait_for_endpoints(args.timeout)
    for line in apply(plan):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
