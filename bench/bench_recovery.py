"""Recovery benchmark (`make bench-recovery`): what one lost instance costs a step.

One step of 8 instances over 400 parquet files on the local backend (the embedded moto_server, the real
orchestration functions, no Airflow), run twice on the same data: once as is (W0), once with one instance
SIGKILLed (its whole worker process tree, as a lost machine) when about half its files are recorded SUCCEEDED.
The step is then driven as its watch drives it (decide, resubmit, finish) until it ends. Printed:

    recovery: 8 instances, F files, 1 instance killed at X%: files scored twice D (<= killed share S),
    rows in = rows out R, wall W s vs W0 s without the kill

D counts the files some later attempt scored again; S is the killed instance's unfinished files (those not
recorded SUCCEEDED when it was killed, the one in flight included). Each output is uploaded before its file is
recorded SUCCEEDED, so D <= S; with SageMaker's EndOfJob upload every file the job had finished went again.

    python bench/bench_recovery.py --out bench-results [--files 400] [--instances 8] [--rows 2000]
"""

from __future__ import annotations

import argparse
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


def stage(tmp: Path, files: int, rows: int, instances: int):
    """A ledger table, a bucket with ``files`` parquet inputs and the packed XGBoost model, and a spec."""
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


def kill_at_half(spec, run_id: str, job_dir: Path) -> tuple[int, int]:
    """SIGKILL the victim's worker tree once half its files are SUCCEEDED; return (its share, its unfinished)."""
    import psutil

    from shardline.ledger.states import FileStatus

    instance = job_dir / VICTIM
    while not (instance / "worker.log").exists():
        time.sleep(0.1)
    share = sum(1 for _ in (instance / "processing" / "input" / "data").rglob("*.parquet"))
    while True:
        done = sum(
            f.status is FileStatus.SUCCEEDED and f.host == VICTIM and f.attempt == 1 for f in files_of(spec, run_id)
        )
        if done >= share // 2:
            break
        time.sleep(0.1)
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
    return share, share - done


def drive(spec, attempt) -> None:
    """What the watch does: poll, resubmit on RESUBMIT, end the step on ADVANCE."""
    from shardline.decision.policy import Action
    from shardline.orchestration import watch
    from shardline.orchestration.step import end as step_end
    from shardline.orchestration.step import jobs as step_jobs

    while True:
        decision = watch.decide_now(spec, attempt)
        if decision.action is Action.RESUBMIT:
            attempt = step_jobs.resubmit(spec, attempt, list(decision.retry_files))
        elif decision.action is Action.ADVANCE:
            status = step_end.finish(spec, attempt, Action.ADVANCE, decision.reason)
            if status is None or status.value != "SUCCEEDED":
                raise SystemExit(f"bench-recovery: the step ended {status}: {step_end.step_message(spec, attempt)}")
            return
        elif decision.action is not Action.WAIT:
            raise SystemExit(f"bench-recovery: {decision.action.value}: {decision.reason}")
        time.sleep(POLL_SECONDS)


def run_once(spec, bucket: str, run_id: str, local_root: Path, *, kill: bool) -> dict:
    import threading

    from shardline.orchestration.step import end as step_end
    from shardline.orchestration.step import jobs as step_jobs
    from shardline.orchestration.step import plan as step_plan

    started = time.monotonic()
    attempt = step_jobs.submit(
        spec,
        step_plan.plan(
            spec,
            STEP,
            run_id,
            input_prefix=f"s3://{bucket}/in/",
            output_prefix=f"s3://{bucket}/out/{run_id}/",
            model_uri=f"s3://{bucket}/model/model.tar.gz",
            instance_count=spec.step(STEP).resources.instance_count,
        ),
    )
    killed: dict = {}

    def inject() -> None:
        killed["share"], killed["unfinished"] = kill_at_half(spec, run_id, local_root / "jobs" / attempt.job_name)

    injector = threading.Thread(target=inject, daemon=True)
    if kill:
        injector.start()
    drive(spec, attempt)
    if kill:
        injector.join()
    wall = time.monotonic() - started
    files = files_of(spec, run_id)
    report = step_end.report(spec, attempt.ref)
    return {
        "wall_seconds": round(wall, 1),
        "files": len(files),
        "scored_twice": sum(int(f.attempt or 1) > 1 for f in files),
        "rows_in": report["rows_in"],
        "rows_out": report["rows_out"],
        **killed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--rows", type=int, default=2000, help="rows per file")
    args = parser.parse_args()

    from shardline.local.embedded_aws import apply_env, embedded_aws

    with tempfile.TemporaryDirectory() as tmp_name, embedded_aws(Path(tmp_name) / "moto.log") as env:
        tmp = Path(tmp_name)
        apply_env(env)
        import os

        os.environ["SHARDLINE_LOCAL_ROOT"] = str(tmp / "local")
        os.environ["SHARDLINE_LOCAL_RUNTIME"] = "process"
        spec, bucket = stage(tmp, args.files, args.rows, args.instances)
        plain = run_once(spec, bucket, "run-plain", tmp / "local", kill=False)
        killed = run_once(spec, bucket, "run-killed", tmp / "local", kill=True)

    share, unfinished = killed.get("share", 0), killed.get("unfinished", 0)
    at = 100 * (share - unfinished) / share if share else 0
    line = (
        f"recovery: {args.instances} instances, {killed['files']} files, 1 instance killed at {at:.0f}%: "
        f"files scored twice {killed['scored_twice']} (<= killed share {unfinished}), "
        f"rows in = rows out {killed['rows_out'] if killed['rows_in'] == killed['rows_out'] else 'NO'}, "
        f"wall {killed['wall_seconds']:.0f} s vs {plain['wall_seconds']:.0f} s without the kill"
    )
    print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recovery.json").write_text(json.dumps({"plain": plain, "killed": killed, "line": line}, indent=2))
    ok = killed["scored_twice"] <= unfinished and killed["rows_in"] == killed["rows_out"] == args.files * args.rows
    return 0 if ok and share else 1


if __name__ == "__main__":
    raise SystemExit(main())
