"""What a step's table commit costs at its end on the embedded stack: 1,000 outputs (parquet, as the worker writes
them, the partition columns in every row) made one partition of an Iceberg table in the stack's own catalog (SQL in
SQLite, the warehouse on moto_server's S3), then the partition replaced by a second run's 1,000. docs/benchmarks.md
quotes the figures; the target is under 5 s for 1,000 files.

    .venv/bin/python bench/bench_table.py [--files 1000] [--rows 2000] [--rounds 3]

Each round commits to a table of its own (first run: the table is made; second run: one overwrite snapshot that
removes the first run's 1,000 files and adds 1,000). Timed: ``orchestration.tables.commit_partition``, as the step's
end calls it, parquet footers read over HTTP included.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `examples` and `src` from a checkout

PARTITION = {"dt": "2026-12-07", "hour": "05"}


def _spec_and_attempt(bucket: str, table: str, run_id: str):
    from shardline.planning.attempt import Attempt
    from shardline.spec import parse_spec

    spec = parse_spec(
        {
            "pipeline": "bench_table",
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{bucket}/m/model.tar.gz", "sha256": "0" * 64},
                    "input": {"prefix": f"s3://{bucket}/in/"},
                    "output": {"prefix": f"s3://{bucket}/out/", "table": {"namespace": "bench", "name": table}},
                }
            ],
        },
        "bench_table.yaml",
    )
    attempt = Attempt(
        pipeline="bench_table",
        run_id=run_id,
        step="score",
        number=1,
        input_prefix=f"s3://{bucket}/in/",
        output_prefix=f"s3://{bucket}/out/",
        model_uri=f"s3://{bucket}/m/model.tar.gz",
        table_partition=dict(PARTITION),
    )
    return spec, attempt


def _outputs(s3, bucket: str, prefix: str, files: int, rows: int) -> list[dict]:
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "prediction": pa.array([0.25] * rows, pa.float32()),
            **{name: pa.array([value] * rows) for name, value in PARTITION.items()},
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy", use_dictionary=False)
    body = buf.getvalue()

    def put(i: int) -> dict:
        key = f"{prefix}part-{i:05d}.parquet"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        return {"output": f"s3://{bucket}/{key}", "rows_out": rows}

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(put, range(files)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=2000, help="rows per file")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import boto3

    from shardline.local.embedded_aws import apply_env, embedded_aws
    from shardline.orchestration import tables

    work = Path(tempfile.mkdtemp(prefix="bench-table-"))
    os.environ["SHARDLINE_LOCAL_ROOT"] = str(work / "local")
    with embedded_aws(work / "moto.log") as env:
        apply_env(env)
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        s3 = boto3.client("s3")
        bucket = "bench-table"
        s3.create_bucket(Bucket=bucket)
        first, second = [], []
        for round_number in range(args.rounds):
            name = f"scores_{round_number}"
            spec, run_1 = _spec_and_attempt(bucket, name, "run-1")
            _, run_2 = _spec_and_attempt(bucket, name, "run-2")
            outputs_1 = _outputs(s3, bucket, f"out/{name}/r1/", args.files, args.rows)
            outputs_2 = _outputs(s3, bucket, f"out/{name}/r2/", args.files, args.rows)
            started = time.perf_counter()
            made = tables.commit_partition(spec, run_1, outputs_1)
            first.append(time.perf_counter() - started)
            started = time.perf_counter()
            replaced = tables.commit_partition(spec, run_2, outputs_2)
            second.append(time.perf_counter() - started)
            scanned = tables.scanned_rows(spec, "score", PARTITION)
            assert made.files_added == args.files and replaced.files_removed == args.files, (made, replaced)
            assert scanned == args.files * args.rows, scanned
            print(
                f"round {round_number + 1}: first commit (table made) {first[-1]:.2f}s, "
                f"replacing commit {second[-1]:.2f}s; {scanned:,} rows scanned back",
                flush=True,
            )
    print(
        f"table commit: {args.files:,} files, median of {args.rounds}: first {statistics.median(first):.2f}s, "
        f"replacing the partition {statistics.median(second):.2f}s (target 5 s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
