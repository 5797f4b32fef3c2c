"""Fleet benchmark (`make bench-fleet`): many pipelines' runs at once, within an instance quota, in a real
`airflow standalone` on the local backend, with throttles and capacity errors injected by the emulator.

P generated pipelines (one step on ml.c5.xlarge, a tiny XGBoost model, small inputs), R runs of each, all
triggered at once: the demand is P x R jobs against a quota of Q instances. dags/fleet.yaml declares the quota,
`shardline fleet sync` makes its pool; the emulator enforces the same quota itself, refuses a share of the submit
calls (ThrottlingException) and fails a share of the jobs for capacity (the fallback is ml.c5.2xlarge). Every
pipeline has retry.max_attempts: 1, so a refusal or a capacity failure counted as an attempt would fail its run.
Each job's instances take ``--startup-seconds`` to start (the emulator's ``startup_seconds``), as SageMaker's
provisioning takes minutes: the scheduling around a job (its task's start-up, the last poll, the step's end) is
then as small a share of the job as it is on AWS. The tiny model scores its rows in a second or two.

It prints one line:

    fleet: P pipelines, R runs, quota Q: F runs failed, peak in use N <= Q, quota busy X% of the makespan,
    median admission wait W s, scheduler overhead per job O s

- peak in use: the most instances of the type in use at any moment, from the emulator's own record (not from
  Airflow);
- quota busy: instance-seconds in use over Q x the time while steps wait (at least one step's plan has ended and
  its watch, which submits the job, has not started), within the makespan (first job start to last job end:
  before the first job, the runs are still being planned and the quota is free for them); the share of the whole
  makespan is printed below it;
- admission wait: from a step's plan task ending to its watch task (it submits the job) starting (its pool had no room);
- scheduler overhead per job: a run's wall time less its admission wait and its jobs' own time, per job.

    python bench/bench_fleet.py [--pipelines 6] [--runs 2] [--quota 4] [--startup-seconds 120]
                                [--out bench-results] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # examples/ and tests/support/ (the Airflow stack helper)

TYPE, FALLBACK = "ml.c5.xlarge", "ml.c5.2xlarge"
BUCKET = "fleet-bench"
ROWS_PER_FILE, FILES_PER_RUN = 2000, 2


def stage(root: Path, pipelines: int, runs: int, quota: int) -> tuple[Path, list[str]]:
    """The model, every run's inputs, and a DAGs folder of ``pipelines`` specs with their two-line DAG files."""
    import io

    import boto3
    import pyarrow.parquet as pq
    import yaml

    from examples import synthetic

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    model = synthetic.train_xgboost(root / "model")  # <dir>/model.json
    sha = synthetic.pack(model.parent, root / "model.tar.gz")
    s3.upload_file(str(root / "model.tar.gz"), BUCKET, "model/model.tar.gz")
    dags = root / "dags"
    (dags / "pipelines").mkdir(parents=True)
    (dags / "fleet.yaml").write_text(yaml.safe_dump({"quotas": {TYPE: quota, FALLBACK: quota}}))
    names = []
    for p in range(pipelines):
        name = f"fleet_p{p:02d}"
        names.append(name)
        for r in range(runs):
            for f in range(FILES_PER_RUN):
                body = io.BytesIO()
                first = (p * runs + r) * FILES_PER_RUN * ROWS_PER_FILE + f * ROWS_PER_FILE
                pq.write_table(synthetic.make_table(ROWS_PER_FILE, first_id=first, seed=first), body)
                s3.put_object(Bucket=BUCKET, Key=f"in/{name}/r{r:02d}/part-{f}.parquet", Body=body.getvalue())
        spec = {
            "pipeline": name,
            "priority": "high" if p % 4 == 0 else "low" if p % 4 == 3 else "normal",
            "poll_interval_seconds": 1,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{BUCKET}/model/model.tar.gz", "sha256": sha},
                    "input": {"prefix": f"s3://{BUCKET}/in/{name}/", "passthrough": ["id"]},
                    "output": {"prefix": f"s3://{BUCKET}/out/{name}/{{{{ run_id }}}}/"},
                    "resources": {
                        "instance_count": 1,
                        "instance_type": TYPE,
                        "fallback_instance_types": [FALLBACK],
                        "workers_per_instance": 1,
                    },
                    "retry": {"max_attempts": 1, "backoff_seconds": 1},
                }
            ],
        }
        (dags / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        (dags / f"{name}.py").write_text(
            f'from shardline.airflow.dag_factory import dag_from_spec\n\ndag = dag_from_spec(__file__, "{name}.yaml")\n'
        )
    return dags, names


def _seconds(text: str | None) -> float | None:
    return dt.datetime.fromisoformat(text).timestamp() if text else None


def wait_for_dags(client, names: list[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        found = {d["dag_id"] for d in client._call("GET", "/dags", params={"limit": 1000})["dags"]}
        if set(names) <= found:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"DAGs not parsed after {timeout:.0f}s: missing {sorted(set(names) - found)}")
        time.sleep(2)


def job_spans(record: list[dict]) -> dict[str, tuple[float, float, int, str]]:
    """Each job of the emulator's record: (took its instances, gave them back, instances, type)."""
    spans: dict[str, list] = {}
    for entry in record:
        if entry["delta"] > 0:
            spans[entry["job"]] = [entry["t"], None, entry["delta"], entry["type"]]
        elif entry["job"] in spans:
            spans[entry["job"]][1] = entry["t"]
    return {job: tuple(span) for job, span in spans.items() if span[1] is not None}


def _trigger(client, name: str, run_id: str, conf: dict, tries: int = 10) -> None:
    """Trigger a run; standalone Airflow's SQLite database is sometimes locked by the scheduler (a 500, or no
    answer in time)."""
    from shardline.oncall.airflow_client import AirflowApiError

    for attempt in range(1, tries + 1):
        try:
            client.trigger(name, conf, run_id=run_id)
            return
        except AirflowApiError as err:
            if err.status == 409:  # the earlier try got through after all
                return
            if err.status not in (None, 500) or attempt == tries:  # None: no answer in time (a busy SQLite)
                raise
            time.sleep(2 * attempt)


def run_all(client, names: list[str], runs: int, timeout: float) -> dict[tuple[str, str], str]:
    """Trigger every run at once; wait until each has ended. Returns each run's state."""
    started = time.monotonic()
    for r in range(runs):
        for name in names:
            _trigger(client, name, f"r{r:02d}", {"input_prefix": f"s3://{BUCKET}/in/{name}/r{r:02d}/"})
            time.sleep(0.5)  # standalone Airflow keeps its database in SQLite: one writer at a time
    states: dict[tuple[str, str], str] = {}
    pending = [(name, f"r{r:02d}") for r in range(runs) for name in names]
    while pending:
        if time.monotonic() - started > timeout:
            raise SystemExit(f"{len(pending)} run(s) not finished after {timeout:.0f}s")
        time.sleep(5)
        # One request for every run that ended (not one per run): the API server shares SQLite's lock.
        ended = client._call("GET", "/dags/~/dagRuns", params={"state": ["success", "failed"], "limit": 1000})
        for run in ended["dag_runs"]:
            key = (run["dag_id"], run["dag_run_id"])
            if key in pending:
                states[key] = run["state"]
                pending.remove(key)
    return states


def merged(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of time windows, as disjoint windows in order."""
    union: list[tuple[float, float]] = []
    for start, end in sorted(w for w in windows if w[1] > w[0]):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


def busy_within(spans, windows: list[tuple[float, float]]) -> float:
    """Instance-seconds of ``spans`` ((start, end, instances)) inside the disjoint ``windows``."""
    return sum(n * max(0.0, min(e, b) - max(s, a)) for s, e, n in spans for a, b in windows)


def measure(client, states: dict[tuple[str, str], str], record: list[dict], quota: int) -> dict:
    from shardline.backends.local_fleet import peak_in_use
    from shardline.planning import naming

    spans = job_spans(record)
    first = min(s for s, _, _, _ in spans.values())
    last = max(e for _, e, _, _ in spans.values())
    busy = sum((e - s) * n for s, e, n, t in spans.values() if t == TYPE)
    waits, overheads, waiting = [], [], []
    for name, run_id in states:
        tis = {t["task_id"]: t for t in client.task_instances(name, run_id)}
        plan_end, submit_start = _seconds(tis["plan_score"]["end_date"]), _seconds(tis["watch_score"]["start_date"])
        wait = max(0.0, submit_start - plan_end) if plan_end and submit_start else 0.0
        waits.append(wait)
        if wait:
            waiting.append((plan_end, submit_start))
        run = client.dag_run(name, run_id)
        wall = _seconds(run["end_date"]) - _seconds(run["start_date"])
        jobs = [spans[j] for n in range(1, 10) if (j := naming.job_name(name, run_id, "score", n)) in spans]
        overheads.append((wall - wait - sum(e - s for s, e, _, _ in jobs)) / max(1, len(jobs)))
    peaks = peak_in_use(record)
    waited = [(max(a, first), min(b, last)) for a, b in merged(waiting) if min(b, last) > max(a, first)]
    waited_s = sum(b - a for a, b in waited)
    busy_waiting = busy_within([(s, e, n) for s, e, n, t in spans.values() if t == TYPE], waited)
    return {
        "runs": len(states),
        "failed": sum(1 for s in states.values() if s == "failed"),
        "jobs": len(spans),
        "peak": peaks.get(TYPE, 0),
        "peak_fallback": peaks.get(FALLBACK, 0),
        "busy_percent": 100 * busy / (quota * (last - first)),
        "busy_while_waiting_percent": 100 * busy_waiting / (quota * waited_s) if waited_s else None,
        "waiting_s": waited_s,
        "waiting_windows": [(round(a - first, 1), round(b - first, 1)) for a, b in waited],  # from the first job
        "job_median_s": statistics.median(e - s for s, e, _, _ in spans.values()),
        "makespan_s": last - first,
        "median_wait_s": statistics.median(waits),
        "overhead_per_job_s": statistics.median(overheads),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", type=int, default=6)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--quota", type=int, default=4)
    parser.add_argument(
        "--startup-seconds",
        type=float,
        default=120,
        help="each job's emulated instance start-up (SageMaker's: minutes)",
    )
    parser.add_argument("--throttle-share", type=float, default=0.2, help="share of submit calls throttled")
    parser.add_argument("--capacity-share", type=float, default=0.1, help="share of jobs failed for capacity")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--workdir", type=Path, help="keep the stack's files here (default: a temporary folder)")
    args = parser.parse_args()

    from shardline.backends.local_fleet import FLEET_ENV, read_record
    from shardline.local.embedded_aws import apply_env, embedded_aws
    from shardline.local.provision import apply, make_plan
    from shardline.oncall.fleet import sync_pools
    from tests.support.airflow_stack import airflow_standalone

    emulated = {
        "quotas": {TYPE: args.quota, FALLBACK: args.quota},
        "refuse": {"ThrottlingException": args.throttle_share},
        "capacity_errors": {TYPE: args.capacity_share},
        "startup_seconds": args.startup_seconds,
        "seed": "bench-fleet",
    }
    with contextlib.ExitStack() as cleanup:
        if args.workdir:
            args.workdir.mkdir(parents=True)
        root = args.workdir or Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="bench-fleet-")))
        env = cleanup.enter_context(embedded_aws(root / "moto.log"))
        apply_env(env)
        dags, names = stage(root, args.pipelines, args.runs, args.quota)
        apply(make_plan(dags / "pipelines"))  # the ledger table
        extra = {
            FLEET_ENV: json.dumps(emulated),
            "SHARDLINE_SUBMIT_WAIT_FIRST_SECONDS": "2",
            # The generated DAGs never change: parsing them less often leaves SQLite's one write lock to the
            # scheduler and the triggerer.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "600",
            # A task's calls to the API server wait out SQLite's lock (60 s, tests/support/sqlite_args.py) instead
            # of failing the try after 5 s and costing a 30 s retry (seen when a dozen plans start at once).
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "90",
        }
        with airflow_standalone(root / "home", dags, env, extra_env=extra) as stack:
            client = stack.client()
            for change in sync_pools(dags, client):
                print(f"pool {change.pool}: {change.slots} slot(s) ({change.action})")
            wait_for_dags(client, names)
            states = run_all(client, names, args.runs, args.timeout)
            figures = measure(client, states, read_record(root / "home" / "shardline-local"), args.quota)
    figures.update(pipelines=args.pipelines, runs_per_pipeline=args.runs, quota=args.quota, emulated=emulated)
    busy = figures["busy_while_waiting_percent"]
    busy_text = "n/a (no step waited)" if busy is None else f"{busy:.0f}%"
    line = (
        f"fleet: {args.pipelines} pipelines, {args.runs} runs, quota {args.quota}: {figures['failed']} runs failed, "
        f"peak in use {figures['peak']} <= {args.quota}, quota busy {busy_text} of the makespan while steps wait, "
        f"median admission wait {figures['median_wait_s']:.0f} s, scheduler overhead per job "
        f"{figures['overhead_per_job_s']:.1f} s"
    )
    print(line)
    print(
        f"  {figures['jobs']} jobs ({figures['jobs'] - figures['runs']} resubmitted for capacity), each holding its "
        f"instances a median {figures['job_median_s']:.0f} s ({args.startup_seconds:.0f} s of it emulated "
        f"start-up); makespan {figures['makespan_s']:.0f} s, steps waiting for {figures['waiting_s']:.0f} s of it; "
        f"quota busy {figures['busy_percent']:.0f}% of the whole makespan; peak on the fallback {FALLBACK}: "
        f"{figures['peak_fallback']}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet.json").write_text(json.dumps({**figures, "line": line}, indent=1))
    return 1 if figures["failed"] or figures["peak"] > args.quota else 0


if __name__ == "__main__":
    raise SystemExit(main())
