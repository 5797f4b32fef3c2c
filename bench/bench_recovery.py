"""Recovery benchmark (`make bench-recovery`): what one lost instance costs a step.

One step of 8 instances over 400 parquet files on the local backend (the embedded moto_server, the real
orchestration functions, no Airflow), run twice on the same data: once as is (W0), once with one instance
SIGKILLed (its whole worker process tree, as a lost machine) once the endpoint holds the outputs of half its files
(X%: its outputs the endpoint held when it died). The step is then driven as its watch drives it (decide, resubmit,
finish) until it ends. Printed:

    recovery: 8 instances, F files, 1 instance killed at X%: files retried R, files scored twice D (from the
    endpoint's writes), rows in = rows out N (read from S3), wall W s vs W0 s without the kill (K.KKx)

- R, files retried: the files a later attempt ran (the watch resubmitted them; their FILE items end at attempt 2+).
- D, files scored twice: of those R files, the ones whose output attempt 1 had already PUT before attempt 2 ran
  them again, counted from what the endpoint stored (see :func:`endpoint_writes`), not from the ledger.
- N: the rows of every input and every output, each file's ``id`` column read back from S3; every input id must
  be in the outputs exactly once.
- K.KK = W / W0, W and W0 the medians of ``--pairs`` runs of each kind (3), a plain run and a killed one back to
  back: one run on a shared 2-core machine varies by 15% on its own, more than the bound's margin. Each pair's
  figures are printed as it ends, and ``recovery.json`` holds every run's timeline (each instance's first and last
  file, the watch's decisions, each job's end).

The script exits non-zero when K.KK > 1.25 (``--max-ratio``), when rows in != rows out in any run, when an id is
missing from the outputs or is there twice, or when no instance was killed.

    python bench/bench_recovery.py --out bench-results [--files 400] [--instances 8] [--rows 2000] \\
        [--max-ratio 1.25] [--pairs 3]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import io
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for examples/

STEP = "score"
VICTIM = "algo-3"
POLL_SECONDS = 0.5
MAX_RATIO = 1.25  # a lost instance of 8 may cost at most this much of the step's wall time


def stage(tmp: Path, files: int, rows: int, instances: int):
    """A ledger table, a versioned bucket with ``files`` parquet inputs and the packed XGBoost model, and a spec."""
    import boto3
    import pyarrow.parquet as pq

    from examples import synthetic
    from shardline.ledger.table import create_ledger_table
    from shardline.spec import parse_spec

    table = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    create_ledger_table(table, "us-east-1")
    s3 = boto3.client("s3")
    bucket = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    # Versioned, so the endpoint keeps every PUT of an output key: see endpoint_writes.
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for i in range(files):
        buf = io.BytesIO()
        pq.write_table(synthetic.make_table(rows, first_id=i * rows, seed=i), buf)
        s3.put_object(Bucket=bucket, Key=f"in/part-{i:04d}.parquet", Body=buf.getvalue())
    model = synthetic.train_xgboost(tmp / "model")
    sha = synthetic.pack(model.parent, tmp / "model.tar.gz")
    s3.upload_file(str(tmp / "model.tar.gz"), bucket, "model/model.tar.gz")
    spec = parse_spec(
        {
            "pipeline": "bench_recovery",
            "ledger_table": table,
            "poll_interval_seconds": 1,
            "steps": [
                {
                    "name": STEP,
                    "model": {"uri": f"s3://{bucket}/model/model.tar.gz", "sha256": sha},
                    "input": {"prefix": f"s3://{bucket}/in/", "passthrough": ["id"]},
                    "output": {"prefix": f"s3://{bucket}/out/"},
                    "resources": {"instance_count": instances, "workers_per_instance": 1},
                    "retry": {"max_attempts": 3, "backoff_seconds": 0},
                }
            ],
        },
        "bench_recovery.yaml",
    )
    return spec, bucket


def files_of(spec, run_id: str):
    from shardline.ledger.keys import StepRef
    from shardline.orchestration.step.files import read_step_files

    return read_step_files(spec, StepRef(spec.pipeline, run_id, STEP), file_attributes=None).files


def timeline(files, started: float) -> dict[str, dict]:
    """Per instance (attempt and host), from its FILE items: files finished, and the seconds after the step's start
    of its first file's start and its last file's end. Where a step's wall time goes."""
    spans: dict[str, dict] = {}
    for f in files:
        if f.started_at is None or f.finished_at is None:
            continue
        span = spans.setdefault(f"{f.attempt}/{f.host}", {"files": 0, "first_start": 1e9, "last_end": 0.0})
        span["files"] += 1
        span["first_start"] = round(min(span["first_start"], f.started_at.timestamp() - started), 1)
        span["last_end"] = round(max(span["last_end"], f.finished_at.timestamp() - started), 1)
    return dict(sorted(spans.items()))


def stems(keys) -> set[str]:
    """``part-0042`` of ``.../part-0042.parquet``: an input and its output share it."""
    return {Path(key).name.split(".")[0] for key in keys}


def kill_at_half(spec, run_id: str, bucket: str, job_dir: Path, *, kill: bool = True) -> dict:
    """SIGKILL the victim's worker tree once the endpoint holds outputs of half its files; return its share, and how
    many of its files' outputs the endpoint held and the ledger had recorded SUCCEEDED, read once it was dead.

    The trigger is the endpoint's, not the ledger's: an instance writes its FILE items through a queue behind its
    uploads, and on a loaded machine that queue runs seconds behind, so "half recorded" could be an instance that had
    uploaded nearly everything. Each poll is one listing of the prefix (every 0.5 s). ``kill=False``: watch the same
    way, and kill nothing, so the run without the kill carries the same load of watching as the run with it.
    """
    import boto3
    import psutil

    from shardline.ledger.states import FileStatus

    s3 = boto3.client("s3")
    instance = job_dir / VICTIM
    while not (instance / "worker.log").exists():
        time.sleep(0.1)
    share = stems(p.name for p in (instance / "processing" / "input" / "data").rglob("*.parquet"))
    prefix = f"out/{run_id}/"

    def stored() -> int:
        return len(share & stems(k for k in listed(s3, bucket, prefix) if is_output(k, prefix)))

    while stored() < len(share) // 2:
        time.sleep(0.5)
    if not kill:
        return {}
    victims = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "shardline.worker" in (p.info["cmdline"] or []) and any(str(instance) in a for a in p.info["cmdline"])
    ]
    if not victims:
        raise SystemExit(f"bench-recovery: no worker process of {instance} to kill")
    for proc in victims:
        for child in [proc, *proc.children(recursive=True)]:
            child.kill()
    killed_at = time.monotonic()
    psutil.wait_procs(victims, timeout=10)
    recorded = sum(
        f.status is FileStatus.SUCCEEDED and f.host == VICTIM and f.attempt == 1 for f in files_of(spec, run_id)
    )
    return {"share": len(share), "stored_at_kill": stored(), "recorded_at_kill": recorded, "killed_at": killed_at}


def drive(spec, attempt, events: list) -> list[dict]:
    """What the watch does: poll, resubmit on RESUBMIT, end the step on ADVANCE. Returns each resubmission: the
    attempt it started, when (the wall clock, before its job was submitted) and the files it was given."""
    from shardline.decision.policy import Action
    from shardline.orchestration.step import end as step_end
    from shardline.orchestration.step import jobs as step_jobs
    from shardline.orchestration.step import watch

    resubmitted: list[dict] = []
    polls: list[float] = []
    events.append(("polls", polls))
    while True:
        polled = time.monotonic()
        decision = watch.decide_now(spec, attempt)
        polls.append(time.monotonic() - polled)
        if decision.action is not Action.WAIT or not events or events[-1][0] != f"WAIT: {decision.reason[:60]}":
            events.append((f"{decision.action.value}: {decision.reason[:60]}", polled))
        if decision.action is Action.RESUBMIT:
            keys = list(decision.retry_files)
            at, since = dt.datetime.now(dt.UTC), time.monotonic()
            attempt = step_jobs.resubmit(spec, attempt, keys, beside=decision.beside).attempt
            took = time.monotonic() - since
            resubmitted.append(
                {
                    "attempt": attempt.number,
                    "job": attempt.job_name,
                    "at": at,
                    "files": keys,
                    "since": since,
                    "took": took,
                }
            )
        elif decision.action is Action.ADVANCE:
            events.append(("advance decided", time.monotonic()))
            status = step_end.finish(spec, attempt, Action.ADVANCE, decision.reason)
            events.append(("step ended", time.monotonic()))
            if status is None or status.value != "SUCCEEDED":
                raise SystemExit(f"bench-recovery: the step ended {status}: {step_end.step_message(spec, attempt)}")
            return resubmitted
        elif decision.action is not Action.WAIT:
            raise SystemExit(f"bench-recovery: {decision.action.value}: {decision.reason}")
        time.sleep(POLL_SECONDS)


def is_output(key: str, prefix: str) -> bool:
    """An output of the step under ``prefix``: not Shardline's own files (``_shardline/``) nor ``_SUCCESS``."""
    from shardline import contract

    relative = key[len(prefix) :]
    return not (relative.startswith(contract.METADATA_FOLDER + "/") or relative == contract.SUCCESS_MARKER)


def endpoint_writes(s3, bucket: str, prefix: str) -> dict[str, list[dt.datetime]]:
    """Every PUT the endpoint stored of each output key under ``prefix``: its versions' times, oldest first.

    Why the bucket's versions: an attempt writes a file's output under the same key as the attempt before it, so a
    listing of the prefix shows only the last PUT of each key; the ledger's FILE item of a retried file is
    overwritten by the next attempt; and the instances' own per-attempt records (the manifests under
    ``_shardline/attempt-NNNN/``) are written when an instance ends, which a killed instance never does, so they
    cannot say what it PUT before it died. A versioned bucket keeps each PUT the endpoint accepted as its own
    version, whoever wrote it and however it died after, which is the fact "scored twice" is about.
    """
    writes: dict[str, list[dt.datetime]] = collections.defaultdict(list)
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for version in page.get("Versions", []):
            if is_output(version["Key"], prefix):
                writes[version["Key"]].append(version["LastModified"])
    return {key: sorted(times) for key, times in writes.items()}


def ids_of(s3, bucket: str, keys: list[str]) -> collections.Counter:
    """How many times each ``id`` is in the objects ``keys`` (their current versions), read from S3."""
    import pyarrow.parquet as pq

    ids: collections.Counter = collections.Counter()
    for key in keys:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        ids.update(pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist())
    return ids


def listed(s3, bucket: str, prefix: str) -> list[str]:
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def check_rows(s3, bucket: str, prefix: str, inputs: collections.Counter) -> dict:
    """Rows in and out, and every input id in the outputs once: read from the objects in S3, not from the ledger."""
    outputs = ids_of(s3, bucket, [k for k in listed(s3, bucket, prefix) if is_output(k, prefix)])
    missing = sum(1 for i in inputs if i not in outputs)
    duplicated = sum(1 for n in outputs.values() if n > 1)
    unknown = sum(1 for i in outputs if i not in inputs)
    return {
        "rows_in": sum(inputs.values()),
        "rows_out": sum(outputs.values()),
        "ids_missing": missing,
        "ids_duplicated": duplicated,
        "ids_not_in_inputs": unknown,
    }


def run_once(spec, bucket: str, run_id: str, local_root: Path, *, kill: bool, inputs: collections.Counter) -> dict:
    import threading

    import boto3

    from shardline.orchestration.step import jobs as step_jobs
    from shardline.orchestration.step import plan as step_plan

    started = time.monotonic()
    attempt = step_jobs.submit(
        spec,
        step_plan.plan(
            spec,
            STEP,
            step_plan.PlanRequest(
                run_id,
                input_prefix=f"s3://{bucket}/in/",
                output_prefix=f"s3://{bucket}/out/{run_id}/",
                model_uri=f"s3://{bucket}/model/model.tar.gz",
                instance_count=spec.step(STEP).resources.instance_count,
            ),
        ),
    ).attempt
    killed: dict = {}

    def inject() -> None:
        killed.update(kill_at_half(spec, run_id, bucket, local_root / "jobs" / attempt.job_name, kill=kill))

    # Both runs are watched alike; only the one with the kill kills.
    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    events: list = []
    resubmitted = drive(spec, attempt, events)
    injector.join()
    wall = time.monotonic() - started
    started_wall = time.time() - wall
    for job in [attempt.job_name, *(r["job"] for r in resubmitted)]:  # each job's end, as its supervisor wrote it
        job_dir = local_root / "jobs" / job
        state = json.loads((job_dir / "state.json").read_text())
        if "ended_at" in state:
            events.append((f"job {job_dir.name[-12:]} ended", started + state["ended_at"] - started_wall))
        for host, seen in (state.get("lost_instances") or {}).items():
            events.append((f"{host} seen lost", started + seen["seen_at"] - started_wall))

    s3 = boto3.client("s3")
    prefix = f"out/{run_id}/"
    files = files_of(spec, run_id)
    retried = [f for f in files if int(f.attempt or 1) > 1]
    writes = endpoint_writes(s3, bucket, prefix)
    # LastModified is to the second: the resubmission comes after the first job has ended, long after the kill.
    first_resubmit = resubmitted[0]["at"].replace(microsecond=0) if resubmitted else None

    def writes_of(f) -> list[dt.datetime]:
        return writes.get(f.output_key.removeprefix(f"s3://{bucket}/"), []) if f.output_key else []

    def by_attempt_1(f) -> bool:
        return first_resubmit is not None and any(t < first_resubmit for t in writes_of(f))

    return {
        "wall_seconds": round(wall, 1),
        "instances": timeline(files, time.time() - wall),
        # In the order they happened (a WAIT that comes back, a second resubmission: each its own entry).
        "events": [
            [what, round(at - started, 1)]
            if isinstance(at, float)
            else [what, {"count": len(at), "longest": round(max(at), 2), "mean": round(sum(at) / len(at), 2)}]
            for what, at in events
        ],
        "files": len(files),
        "attempts": 1 + len(resubmitted),
        "resubmissions": [
            {
                "attempt": r["attempt"],
                "at": r["at"].isoformat(),
                "after_seconds": round(r["since"] - started, 1),
                "submit_seconds": round(r["took"], 1),
                "files": len(r["files"]),
            }
            for r in resubmitted
        ],
        "files_retried": len(retried),
        "scored_twice": sum(by_attempt_1(f) for f in retried),
        # Keys the endpoint stored more than once, however (for the files above, and any other: none expected).
        "keys_stored_more_than_once": sum(len(t) > 1 for t in writes.values()),
        "output_keys": len(writes),
        "retried": [
            {"input": f.input_key, "attempt": f.attempt, "stored": [t.isoformat() for t in writes_of(f)]}
            for f in retried
        ],
        **check_rows(s3, bucket, prefix, inputs),
        **{key: value for key, value in killed.items() if key != "killed_at"},
        **({"killed_after_seconds": round(killed["killed_at"] - started, 1)} if killed else {}),
    }


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the lower of the two middle ones of an even count)."""
    ranked = sorted(runs, key=lambda run: run["wall_seconds"])
    return ranked[(len(ranked) - 1) // 2]


def rows_ok(result: dict) -> bool:
    return (
        result["rows_in"] == result["rows_out"]
        and not result["ids_missing"]
        and not result["ids_duplicated"]
        and not result["ids_not_in_inputs"]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--rows", type=int, default=2000, help="rows per file")
    parser.add_argument("--max-ratio", type=float, default=MAX_RATIO, help="the bound on W / W0")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each kind, back to back; medians are reported")
    args = parser.parse_args()

    from shardline.local.embedded_aws import apply_env, embedded_aws

    with tempfile.TemporaryDirectory() as tmp_name, embedded_aws(Path(tmp_name) / "moto.log") as env:
        tmp = Path(tmp_name)
        apply_env(env)
        import os

        import boto3

        os.environ["SHARDLINE_LOCAL_ROOT"] = str(tmp / "local")
        os.environ["SHARDLINE_LOCAL_RUNTIME"] = "process"
        spec, bucket = stage(tmp, args.files, args.rows, args.instances)
        s3 = boto3.client("s3")
        inputs = ids_of(s3, bucket, listed(s3, bucket, "in/"))
        pairs = []
        for n in range(1, args.pairs + 1):  # back to back, so a pair shares the machine's state of the moment
            plain = run_once(spec, bucket, f"run-plain-{n}", tmp / "local", kill=False, inputs=inputs)
            killed = run_once(spec, bucket, f"run-killed-{n}", tmp / "local", kill=True, inputs=inputs)
            pairs.append((plain, killed))
            print(
                f"pair {n}: wall {killed['wall_seconds']:.0f} s vs {plain['wall_seconds']:.0f} s "
                f"({killed['wall_seconds'] / plain['wall_seconds']:.2f}x), killed after "
                f"{killed.get('killed_after_seconds', 0):.0f} s, files retried {killed['files_retried']}, "
                f"scored twice {killed['scored_twice']}",
                flush=True,
            )

    # The median run of each kind: one run on a shared 2-core machine varies by 15% on its own (W0 measured 40 to
    # 56 s over ten runs), more than the bound's margin.
    plain, killed = (median_run([pair[kind] for pair in pairs]) for kind in (0, 1))
    share = killed.get("share", 0)
    at = 100 * killed.get("stored_at_kill", 0) / share if share else 0
    ratio = killed["wall_seconds"] / plain["wall_seconds"]
    rows = killed["rows_out"] if rows_ok(killed) else f"NO ({killed['rows_in']} in, {killed['rows_out']} out)"
    medians = f", medians of {len(pairs)} runs each" if len(pairs) > 1 else ""
    line = (
        f"recovery: {args.instances} instances, {killed['files']} files, 1 instance killed at {at:.0f}%: "
        f"files retried {killed['files_retried']}, files scored twice {killed['scored_twice']} (from the endpoint's "
        f"writes), rows in = rows out {rows} (read from S3), "
        f"wall {killed['wall_seconds']:.0f} s vs {plain['wall_seconds']:.0f} s without the kill{medians} "
        f"({ratio:.2f}x)"
    )
    print(line)
    failures = []
    if not all(k.get("share") for _, k in pairs):
        failures.append("an instance was not killed")
    if ratio > args.max_ratio:
        failures.append(f"the kill cost {ratio:.2f}x the wall time, over the bound of {args.max_ratio:.2f}x")
    for n, pair in enumerate(pairs, 1):
        for name, result in zip(("without the kill", "with the kill"), pair, strict=True):
            if not rows_ok(result):
                failures.append(
                    f"run {n} {name}: rows in {result['rows_in']}, rows out {result['rows_out']}, ids missing "
                    f"{result['ids_missing']}, duplicated {result['ids_duplicated']}, not in the inputs "
                    f"{result['ids_not_in_inputs']}"
                )
    for failure in failures:
        print(f"bench-recovery: FAILED: {failure}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recovery.json").write_text(
        json.dumps(
            {
                "pairs": [{"plain": p, "killed": k} for p, k in pairs],
                "median_plain": plain["wall_seconds"],
                "median_killed": killed["wall_seconds"],
                "ratio": round(ratio, 2),
                "line": line,
                "failures": failures,
            },
            indent=2,
            default=str,
        )
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
