"""Orchestration benchmark (`make bench` runs it after the worker benchmark).

Against the embedded endpoint (moto_server over HTTP, started here):
  - the DynamoDB cost of one sensor poke on a step of 10,000 files (target <= 5 requests);
  - planning a step of 100,000 input keys: listing, manifest, ledger records (target < 60 s);
  - sharding skewed file sizes by key and by size: bytes on the busiest instance;
  - `make demo`'s orchestration overhead: DAG-run wall time beyond the jobs' own time (target <= 20%).

    python tests/bench/bench_orchestration.py [--keys 100000] [--files 10000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args()
    from shardline.local.embedded_aws import apply_env, embedded_aws

    results = {}
    with tempfile.TemporaryDirectory() as tmp, embedded_aws(Path(tmp) / "moto.log") as env:
        apply_env(env)
        results["poke"] = poke_cost(args.files)
        results["planning"] = planning_time(args.keys)
    results["sharding"] = sharding_skew()
    results["demo"] = demo_overhead()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_orchestration.json").write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out / 'bench_orchestration.json'}")
    return 0


def poke_cost(files: int) -> dict:
    from shardline.ledger.orchestrator import read_step, start_attempt
    from shardline.ledger.table import bind_ledger, create_ledger_table

    create_ledger_table("bench-ledger")
    model = bind_ledger("bench-ledger")
    keys = [(f"s3://raw/events/dt=2026-11-22/hour=10/part-{i:06d}.parquet", 48_000_000) for i in range(files)]
    start_attempt(model, "bench", "run-1", "score", 1, keys)
    # Give every item the attributes a finished file carries, so pages are as full as in production.
    now = dt.datetime.now(dt.UTC)
    with model.batch_write() as batch:
        for key, size in keys:
            batch.save(model(
                "RUN#bench#run-1", f"FILE#score#{key}", status="SUCCEEDED", attempt=1,
                input_key=key, output_key=key.replace("raw/", "scores/"),
                rows_in=250_000, rows_out=250_000, bytes_in=size, bytes_out=size // 8, seconds=12.345,
                host="algo-12", started_at=now, finished_at=now))
    started = time.perf_counter()
    records = read_step(model, "bench", "run-1", "score")
    seconds = time.perf_counter() - started
    print(f"sensor poke on a step of {files:,} files: {records.requests} DynamoDB request(s) "
          f"({len(records.files):,} file items read in {seconds:.2f}s; target <= 5)")
    return {"files": files, "requests": records.requests, "seconds": round(seconds, 3)}


def planning_time(keys: int) -> dict:
    import boto3

    from shardline.ledger.table import create_ledger_table
    from shardline.orchestration import steps
    from shardline.spec import parse_spec

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bench-raw")
    print(f"uploading {keys:,} small objects to moto_server (setup, not timed) ...", flush=True)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket="bench-raw", Key=f"in/part-{i:07d}.parquet", Body=b"x"),
                      range(keys)))
    create_ledger_table("bench-plan")
    spec = parse_spec({
        "pipeline": "bench_plan", "ledger_table": "bench-plan",
        "steps": [{"name": "score", "model": {"uri": "s3://bench-raw/model.tar.gz"},
                   "input": {"prefix": "s3://bench-raw/in/"}, "output": {"prefix": "s3://bench-raw/out/"},
                   "resources": {"instance_count": 20}}],
    }, "bench.yaml")
    started = time.perf_counter()
    attempt = steps.plan(spec, "score", "run-1", input_prefix="s3://bench-raw/in/",
                         output_prefix="s3://bench-raw/out/", model_uri="s3://bench-raw/model.tar.gz",
                         instance_count=20)
    seconds = time.perf_counter() - started
    listing, records = attempt.planning["list_seconds"], attempt.planning["record_seconds"]
    pages = -(-keys // 1000)
    # What one ListObjectsV2 page costs on this endpoint, with a bucket of 1,000 keys and of `keys` keys.
    s3.create_bucket(Bucket="bench-small")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket="bench-small", Key=f"in/part-{i:07d}.parquet", Body=b"x"),
                      range(1000)))
    small = _page_seconds(s3, "bench-small")
    large = _page_seconds(s3, "bench-raw")
    print(f"planning {attempt.file_count:,} keys: {seconds:.1f}s (target < 60 s): listing {listing:.1f}s "
          f"({pages} pages), manifest + ledger records {records:.1f}s")
    print(f"  one ListObjectsV2 page on the embedded endpoint: {small * 1000:.0f} ms in a bucket of 1,000 keys, "
          f"{large * 1000:.0f} ms in one of {keys:,} (moto sorts the whole bucket for every page; S3 does not)")
    return {"keys": attempt.file_count, "seconds": round(seconds, 2), "list_seconds": listing,
            "record_seconds": records, "page_ms_small_bucket": round(small * 1000, 1),
            "page_ms_large_bucket": round(large * 1000, 1)}


def _page_seconds(s3, bucket: str, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        s3.list_objects_v2(Bucket=bucket, Prefix="in/", MaxKeys=1000)
        best = min(best, time.perf_counter() - started)
    return best


def demo_overhead() -> dict:
    import re
    import subprocess
    import sys

    print("running the demo pipeline (python -m examples.airflow_demo) ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run([sys.executable, "-m", "examples.airflow_demo", "--workdir", tmp], capture_output=True,
                                text=True, check=False, timeout=900)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
        return {"exit_code": result.returncode}
    wall = float(re.search(r"wall time\s+([\d.]+)s", result.stdout).group(1))
    startup = float(re.search(r"([\d.]+)s of dag.test\(\) start-up", result.stdout).group(1))
    tasks = float(re.search(r"then ([\d.]+)s from the plan task", result.stdout).group(1))
    jobs = float(re.search(r"over ([\d.]+)s of job time", result.stdout).group(1))
    rows = re.search(r"rows in / out\s+([\d,]+)", result.stdout).group(1)
    print(f"demo ({rows} rows, one instance killed): DAG run {wall:.1f}s = {startup:.1f}s dag.test() start-up + "
          f"{tasks:.1f}s of tasks; jobs {jobs:.1f}s; orchestration {tasks - jobs:.1f}s = "
          f"{(tasks - jobs) / jobs:.0%} of job time (target <= 20%); with the start-up counted too: "
          f"{(wall - jobs) / jobs:.0%}")
    return {"exit_code": result.returncode, "wall_seconds": wall, "dag_test_startup_seconds": startup,
            "task_span_seconds": tasks, "job_seconds": jobs, "overhead_ratio": round((tasks - jobs) / jobs, 3),
            "overhead_ratio_with_startup": round((wall - jobs) / jobs, 3)}


def sharding_skew() -> dict:
    from shardline.contract import deal as dealt
    from shardline.planning.inputs import S3Object, makespan, manifest_order

    rng = random.Random(1)
    # Skewed partition sizes: mostly small files and a few very large ones (lognormal), 200 files.
    objects = [S3Object(f"part-{i:04d}.parquet", int(rng.lognormvariate(17, 1.2))) for i in range(200)]
    total = sum(o.size for o in objects)
    rows = {}
    for instances in (4, 8, 16):
        by_key = makespan(dealt(manifest_order(objects, instances, "by_key"), instances))
        by_size = makespan(dealt(manifest_order(objects, instances, "by_size"), instances))
        ideal = total / instances
        rows[instances] = {"by_key_vs_ideal": round(by_key / ideal, 3), "by_size_vs_ideal": round(by_size / ideal, 3)}
        print(f"skewed files over {instances:2d} instances: busiest instance holds {by_key / ideal:.2f}x the "
              f"mean by key, {by_size / ideal:.2f}x by size")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
