"""Orchestration benchmark (`make bench` runs it after the worker benchmark).

Against the embedded endpoint (moto_server over HTTP, started here):
  - the DynamoDB requests of a watch poll on a step of 10,000 files: while its job runs (target <= 5),
    and once it has ended;
  - planning a step of 100,000 input keys: listing, plan file, manifest, STEP item (target < 60 s), with the
    keys in date/hour partitions (sub-prefixes listed in parallel) and flat (one listing);
  - the ledger's DynamoDB requests per 1M files and their on-demand cost (arithmetic, printed);
  - sharding skewed file sizes by key and by size: bytes on the busiest instance;
  - `make demo`'s orchestration overhead: DAG-run wall time beyond the jobs' own time (target <= 15%).

    python bench/bench_orchestration.py [--keys 100000] [--files 10000] [--layout both]
        [--only poke,planning,cost,sharding,demo]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shardline.ledger.keys import StepRef

PARTS = ("poke", "planning", "cost", "sharding", "demo")
# A realistic input layout: hourly partitions of a day, 1,000 files an hour (100,000 keys span 4 days and 4
# hours); `flat` puts every key right under the prefix, where listing stays one chain of pages.
FILES_PER_HOUR = 1000
# DynamoDB on-demand prices in us-east-1 (AWS's on-demand pricing page, since the November 2024 cut), per
# million request units. A write request unit writes 1 KB of item; a strongly consistent read unit reads 4 KB.
USD_PER_MILLION_WRU = 0.625
USD_PER_MILLION_RRU = 0.125
POLL_SECONDS = 15  # the watch's default poll_interval_seconds
POKE_INSTANCES_PER_1M = 100  # the heartbeats a 1M-file step's poll reads: 10,000 files an instance


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--layout", choices=("partitioned", "flat", "both"), default="both")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args()
    parts = set(args.only.split(","))
    if parts - set(PARTS):
        parser.error(f"unknown part(s) {sorted(parts - set(PARTS))}; choose from {PARTS}")
    from shardline.local.embedded_aws import apply_env, embedded_aws

    results = {}
    if parts & {"poke", "planning", "cost"}:
        with tempfile.TemporaryDirectory() as tmp, embedded_aws(Path(tmp) / "moto.log") as env:
            apply_env(env)
            if "poke" in parts or "cost" in parts:
                results["poke"] = poke_cost(args.files)
            if "planning" in parts:
                layouts = ("partitioned", "flat") if args.layout == "both" else (args.layout,)
                results["planning"] = {layout: planning_time(args.keys, layout) for layout in layouts}
    if "cost" in parts:
        results["ledger_cost"] = ledger_cost(results["poke"])
    if "sharding" in parts:
        results["sharding"] = sharding_skew()
    if "demo" in parts:
        results["demo"] = demo_overhead()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_orchestration.json").write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out / 'bench_orchestration.json'}")
    return 0


def poke_cost(files: int, instances: int = 16) -> dict:
    """A poll of a running step (STEP and SHARD items, what ``watch.snapshot`` reads while the job runs and every
    instance is heard from) and the read once the job has ended (every FILE item too), on a step of ``files``."""
    from shardline.ledger.keys import shard_sk
    from shardline.ledger.step_reads import read_step
    from shardline.ledger.step_writes import start_attempt
    from shardline.ledger.table import bind_ledger, create_ledger_table

    create_ledger_table("bench-ledger")
    model = bind_ledger("bench-ledger")
    keys = [(f"s3://raw/events/dt=2026-11-22/hour=10/part-{i:06d}.parquet", 48_000_000) for i in range(files)]
    start_attempt(model, StepRef("bench", "run-1", "score"), 1)
    # Give every item the attributes a finished file (and a heartbeat) carries, so pages are as full as in
    # production.
    now = dt.datetime.now(dt.UTC)
    with model.batch_write() as batch:
        for key, size in keys:
            batch.save(
                model(
                    "RUN#bench#run-1",
                    f"FILE#score#{key}",
                    status="SUCCEEDED",
                    attempt=1,
                    input_key=key,
                    output_key=key.replace("raw/", "scores/"),
                    rows_in=250_000,
                    rows_out=250_000,
                    bytes_in=size,
                    bytes_out=size // 8,
                    seconds=12.345,
                    host="algo-12",
                    started_at=now,
                    finished_at=now,
                )
            )
        for n in range(1, instances + 1):
            batch.save(
                model(
                    "RUN#bench#run-1",
                    shard_sk("score", 1, f"algo-{n}"),
                    status="RUNNING",
                    attempt=1,
                    pipeline="bench",
                    run_id="run-1",
                    step="score",
                    host=f"algo-{n}",
                    heartbeat_at=now,
                    files_assigned=files // instances,
                    files_done=files // instances // 2,
                    files_failed=0,
                    rows_done=123_456_789,
                )
            )
    started = time.perf_counter()
    running = read_step(model, StepRef("bench", "run-1", "score"), files=False)
    running_seconds = time.perf_counter() - started
    started = time.perf_counter()
    ended = read_step(model, StepRef("bench", "run-1", "score"))
    ended_seconds = time.perf_counter() - started
    print(
        f"watch poll on a step of {files:,} files, {instances} instances: while the job runs, "
        f"{running.requests} DynamoDB request(s) ({len(running.shards)} heartbeats read in {running_seconds:.2f}s, "
        f"no FILE item; target <= 5); once it has ended, {ended.requests} request(s), once "
        f"({len(ended.files):,} file items read in {ended_seconds:.2f}s)"
    )
    # What DynamoDB bills a read by: the whole stored item (a projection does not make it cheaper).
    finished = model.get("RUN#bench#run-1", f"FILE#score#{keys[0][0]}", consistent_read=True)
    heartbeat = model.get("RUN#bench#run-1", shard_sk("score", 1, "algo-1"), consistent_read=True)
    return {
        "files": files,
        "instances": instances,
        "running_requests": running.requests,
        "running_seconds": round(running_seconds, 3),
        "ended_requests": ended.requests,
        "ended_seconds": round(ended_seconds, 3),
        "finished_item_bytes": item_bytes(finished.serialize()),
        "heartbeat_item_bytes": item_bytes(heartbeat.serialize()),
    }


def item_bytes(item: dict) -> int:
    """An item's size as DynamoDB counts it: attribute names plus values (a number: 1 byte per 2 digits, + 1)."""
    size = 0
    for name, value in item.items():
        ((kind, raw),) = value.items()
        size += len(name.encode()) + (len(raw.encode()) if kind == "S" else math.ceil(len(raw.strip("-")) / 2) + 1)
    return size


def input_key(i: int, layout: str) -> str:
    if layout == "flat":
        return f"in/part-{i:07d}.parquet"
    hour, n = divmod(i, FILES_PER_HOUR)
    return f"in/dt=2026-11-{1 + hour // 24:02d}/hour={hour % 24:02d}/part-{n:05d}.parquet"


def planning_time(keys: int, layout: str) -> dict:
    import boto3

    from shardline.ledger.table import create_ledger_table
    from shardline.orchestration import services
    from shardline.orchestration.step import plan as step_plan
    from shardline.planning.inputs import list_inputs_and_refusals
    from shardline.spec import parse_spec

    bucket, table = f"bench-{layout}", f"bench-plan-{layout}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    print(
        f"uploading {keys:,} small objects ({layout} keys, e.g. {input_key(keys - 1, layout)}) to moto_server "
        "(setup, not timed) ...",
        flush=True,
    )
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=input_key(i, layout), Body=b"x"), range(keys)))
    create_ledger_table(table)
    spec = parse_spec(
        {
            "pipeline": f"bench_plan_{layout}",
            "ledger_table": table,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{bucket}/model.tar.gz", "sha256": "0" * 64},
                    "input": {"prefix": f"s3://{bucket}/in/"},
                    "output": {"prefix": f"s3://{bucket}/out/"},
                    "resources": {"instance_count": 20},
                }
            ],
        },
        "bench.yaml",
    )
    calls = {"ListObjectsV2": 0}

    def count(**_):
        calls["ListObjectsV2"] += 1

    services.s3_listing_client(spec).meta.events.register("before-call.s3.ListObjectsV2", count)
    started = time.perf_counter()
    attempt = step_plan.plan(
        spec,
        "score",
        step_plan.PlanRequest(
            "run-1",
            input_prefix=f"s3://{bucket}/in/",
            output_prefix=f"s3://{bucket}/out/",
            model_uri=f"s3://{bucket}/model.tar.gz",
            instance_count=20,
        ),
    )
    seconds = time.perf_counter() - started
    listing, records = attempt.planning["list_seconds"], attempt.planning["record_seconds"]
    model = services.ledger_model(spec)
    file_items = sum(1 for _ in model.query(f"RUN#{spec.pipeline}#run-1", model.sk.startswith("FILE#score#")))
    print(
        f"planning {attempt.file_count:,} keys ({layout}): {seconds:.1f}s (target < 60 s): listing {listing:.1f}s "
        f"({calls['ListObjectsV2']} ListObjectsV2 calls), ordering + plan file + manifest + STEP item "
        f"{records:.1f}s ({file_items:,} FILE items written: an instance's claim writes each one)"
    )
    result = {
        "keys": attempt.file_count,
        "seconds": round(seconds, 2),
        "list_seconds": listing,
        "list_calls": calls["ListObjectsV2"],
        "record_seconds": records,
        "file_items_written": file_items,
    }
    if layout == "partitioned":  # the same keys listed as before this change: one chain of pages
        started = time.perf_counter()
        sequential, _ = list_inputs_and_refusals(s3, f"s3://{bucket}/in/", threads=1)
        result["sequential_list_seconds"] = round(time.perf_counter() - started, 2)
        print(
            f"  the same {len(sequential):,} keys listed sequentially (one ListObjectsV2 chain, as before): "
            f"{result['sequential_list_seconds']:.1f}s"
        )
    else:  # What one ListObjectsV2 page costs on this endpoint, with a bucket of 1,000 keys and of `keys` keys.
        s3.create_bucket(Bucket="bench-small")
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda i: s3.put_object(Bucket="bench-small", Key=f"in/part-{i:07d}.parquet", Body=b"x"),
                    range(1000),
                )
            )
        small, large = _page_seconds(s3, "bench-small"), _page_seconds(s3, bucket)
        print(
            f"  one ListObjectsV2 page on the embedded endpoint: {small * 1000:.0f} ms in a bucket of 1,000 keys, "
            f"{large * 1000:.0f} ms in one of {keys:,}: moto walks every key of the bucket and sorts every key "
            "under the prefix for every page (S3 does neither), so flat keys are split into key ranges (one "
            "probe each) that list side by side: a range's pages sort fewer keys, but each still walks the bucket"
        )
        result.update(page_ms_small_bucket=round(small * 1000, 1), page_ms_large_bucket=round(large * 1000, 1))
    return result


def ledger_cost(poke: dict, files: int = 1_000_000) -> dict:
    """The ledger's DynamoDB requests and on-demand cost for a step of ``files`` files, as arithmetic."""
    item = poke["finished_item_bytes"]
    wru_per_item = math.ceil(item / 1024)  # a write is billed per started KB of the larger of before and after
    plan_calls = 3  # the RUN put, the run-index batch, the STEP update: attempt 1 writes no FILE item
    plan_wru = 4  # RUN, 2 run-index entries, STEP
    worker_calls = 2 * files  # job_writes: claim_file (UpdateItem: creates the item, RUNNING) and finish_file
    worker_wru = 2 * files * wru_per_item
    # The watch's poll while the job runs: one Query of the STEP and SHARD items (strongly consistent, billed
    # on the summed item size rounded up to 4 KB), whatever the step's size. Once the job has ended (or an
    # instance went silent) it reads every FILE item, once: 1 MB a page. A plan file (one S3 GET) is read then,
    # and kept in the trigger's memory (up to 1M keys in all).
    beat = poke["heartbeat_item_bytes"]
    instances = POKE_INSTANCES_PER_1M
    running_rru = math.ceil((instances * beat + 200) / 4096)
    end_pages = 1 + math.ceil(files * item / 2**20)
    end_rru = math.ceil(files * item / 4096) + running_rru
    wru = plan_wru + worker_wru
    cost_write = wru / 1e6 * USD_PER_MILLION_WRU
    cost_running = running_rru / 1e6 * USD_PER_MILLION_RRU
    cost_end = end_rru / 1e6 * USD_PER_MILLION_RRU
    polls = 3600 // POLL_SECONDS
    print(
        f"\nledger cost per {files:,} files (DynamoDB on-demand, us-east-1: ${USD_PER_MILLION_WRU}/M WRU, "
        f"${USD_PER_MILLION_RRU}/M RRU; a finished FILE item is {item} bytes here -> {wru_per_item} WRU a write):"
    )
    print(
        f"  plan:    {plan_calls} requests (RUN put, run-index batch, STEP update) = {plan_wru} WRU; the inputs go "
        "to the plan file in S3 (one PUT), not to the ledger"
    )
    print(
        f"  workers: {worker_calls:,} requests = 2 UpdateItem per file (claim creates the item, finish); "
        f"{worker_wru:,} WRU (a FAILED file's error text, up to 2,000 chars, can make its finish 2-3 WRU)"
    )
    print("  retries: 1 WRU more per file a retry takes (its PENDING fence item), within BatchWriteItem calls of 25")
    print(f"  writes:  {wru:,} WRU x ${USD_PER_MILLION_WRU}/M = ${cost_write:.2f} per {files:,} files")
    print(
        f"  polls:   while the job runs, 1 Query of the STEP item and {instances} heartbeats ({beat} B each): "
        f"{running_rru} RRU -> ${cost_running:.7f} a poll; every {POLL_SECONDS} s for an hour: "
        f"{polls * running_rru:,} RRU = ${polls * cost_running:.4f}"
    )
    print(
        f"  end:     once, when the job has ended: {end_pages:,} Query pages = 1 (STEP, SHARDs) + {files:,} x "
        f"{item} B / 1 MB; {end_rru:,} RRU -> ${cost_end:.4f}"
    )
    return {
        "files": files,
        "item_bytes": item,
        "plan_requests": plan_calls,
        "plan_wru": plan_wru,
        "worker_requests": worker_calls,
        "worker_wru": worker_wru,
        "write_usd": round(cost_write, 4),
        "poll_requests_running": 1,
        "poll_rru_running": running_rru,
        "poll_hour_usd_running": round(polls * cost_running, 6),
        "end_requests": end_pages,
        "end_rru": end_rru,
        "end_usd": round(cost_end, 5),
    }


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
        result = subprocess.run(
            [sys.executable, "-m", "examples.airflow_demo", "--workdir", tmp],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
        return {"exit_code": result.returncode}
    wall = float(re.search(r"wall time\s+([\d.]+)s", result.stdout).group(1))
    startup = float(re.search(r"([\d.]+)s of dag.test\(\) start-up", result.stdout).group(1))
    tasks = float(re.search(r"then ([\d.]+)s from the plan task", result.stdout).group(1))
    jobs = float(re.search(r"over ([\d.]+)s of job time", result.stdout).group(1))
    rows = re.search(r"rows in / out\s+([\d,]+)", result.stdout).group(1)
    print(
        f"demo ({rows} rows, one instance killed): DAG run {wall:.1f}s = {startup:.1f}s dag.test() start-up + "
        f"{tasks:.1f}s of tasks; jobs {jobs:.1f}s; orchestration {tasks - jobs:.1f}s = "
        f"{(tasks - jobs) / jobs:.0%} of job time (target <= 15%); with the start-up counted too: "
        f"{(wall - jobs) / jobs:.0%}"
    )
    return {
        "exit_code": result.returncode,
        "wall_seconds": wall,
        "dag_test_startup_seconds": startup,
        "task_span_seconds": tasks,
        "job_seconds": jobs,
        "overhead_ratio": round((tasks - jobs) / jobs, 3),
        "overhead_ratio_with_startup": round((wall - jobs) / jobs, 3),
    }


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
        print(
            f"skewed files over {instances:2d} instances: busiest instance holds {by_key / ideal:.2f}x the "
            f"mean by key, {by_size / ideal:.2f}x by size"
        )
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
