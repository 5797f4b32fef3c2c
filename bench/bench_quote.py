"""Quote benchmark (`make bench-quote`): is `shardline quote` right before a run?

Two pipelines on the local backend (the embedded moto_server, the real orchestration functions, no Airflow), each
an hourly partition after another: an XGBoost model over rows of an id and 32 float features, and a scikit-learn
HistGradientBoosting model over wider rows (the same features and a 200-byte text column carried through). Five
partitions each, 0.2M to 5M rows in files of 100,000 rows, in an order that is not their size's. Each partition is
quoted (``orchestration.quote.quote``, as ``shardline quote`` quotes it) before it runs, from the runs before it; the
first of each pipeline has none, so its quote times a sample run here (``oncall.tune.sample_rates``). The actual
figure is what the run's own report priced (``cost.total``: each instance from its first file to its last
heartbeat, at its instance type's price). Printed, per run, then in one line:

    quote: 10 runs, actual within range N/10, expected within +-X% (worst)

The script exits non-zero when a run's actual cost is outside its quoted range, or the worst expected figure is
off by more than ``--max-error`` (15%).

    python bench/bench_quote.py [--out bench-results] [--max-error 0.15] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for examples/

STEP = "score"
FILE_ROWS = 100_000
DAY = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
# (kind, partition sizes in the order they run, in rows)
KINDS = (
    ("xgboost", (1_000_000, 200_000, 5_000_000, 500_000, 2_000_000)),
    ("sklearn", (500_000, 200_000, 2_000_000, 1_000_000, 300_000)),
)
# The watch's poll, as the trigger polls: each poll reads the ledger from the moto_server on the same two cores as
# the instances, so a faster one only adds to their noise.
POLL_SECONDS = 2
NOTE = "x" * 200  # the wider rows' text column


def stage(s3, bucket: str, tmp: Path, table: str, kind: str, sizes: tuple[int, ...]):
    """The kind's model, its partitions' inputs, and its spec."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from examples import synthetic
    from shardline.spec import parse_spec

    model = (synthetic.train_xgboost if kind == "xgboost" else synthetic.train_sklearn)(tmp / kind / "model")
    sha = synthetic.pack(model.parent, tmp / kind / "model.tar.gz")
    s3.upload_file(str(tmp / kind / "model.tar.gz"), bucket, f"model/{kind}/model.tar.gz")
    first = 0
    for hour, rows in enumerate(sizes):
        for n, at in enumerate(range(0, rows, FILE_ROWS)):
            part = synthetic.make_table(min(FILE_ROWS, rows - at), first_id=first, seed=hour * 1000 + n)
            if kind == "sklearn":
                part = part.append_column("note", pa.array([NOTE] * part.num_rows))
            first += part.num_rows
            buf = io.BytesIO()
            pq.write_table(part, buf, use_dictionary=["id"], compression="snappy")
            s3.put_object(
                Bucket=bucket, Key=f"in/{kind}/dt=2026-11-01/hour={hour:02d}/part-{n:04d}.parquet", Body=buf.getvalue()
            )
    where = "dt={{ data_interval_start | ds }}/hour={{ data_interval_start.strftime('%H') }}/"
    features = synthetic.feature_names()
    step = {
        "name": STEP,
        "model": {"uri": f"s3://{bucket}/model/{kind}/model.tar.gz", "sha256": sha},
        "input": {"prefix": f"s3://{bucket}/in/{kind}/{where}", "passthrough": ["id"]},
        "output": {"prefix": f"s3://{bucket}/out/{kind}/{where}"},
        "resources": {"instance_count": 1, "instance_type": "ml.m5.xlarge"},
        "retry": {"max_attempts": 2, "backoff_seconds": 0},
    }
    if kind == "sklearn":
        step["input"] = {**step["input"], "features": features, "passthrough": ["id", "note"]}
    spec = {
        "pipeline": f"bench_quote_{kind}",
        "ledger_table": table,
        "schedule": "@hourly",
        "start_date": "2026-10-01",
        "poll_interval_seconds": POLL_SECONDS,
        "steps": [step],
    }
    return parse_spec(spec, f"bench_quote_{kind}.yaml")


def run_partition(spec, start: dt.datetime) -> None:
    """Plan, submit and watch the partition's step to its end, as its DAG run would."""
    from shardline.decision.policy import Action
    from shardline.orchestration.step import end as step_end
    from shardline.orchestration.step import jobs as step_jobs
    from shardline.orchestration.step import plan as step_plan
    from shardline.spec.templates import render_interval

    s = spec.step(STEP)
    end = start + dt.timedelta(hours=1)
    version = s.model.version
    request = step_plan.PlanRequest(
        f"hour-{start:%H}",
        input_prefix=render_interval(s.input.prefix, version, start, end),
        output_prefix=render_interval(s.output.prefix, version, start, end),
        model_uri=s.model.uri,
        instance_count=s.resources.instance_count,
    )
    attempt = step_jobs.submit(spec, step_plan.plan(spec, STEP, request)).attempt
    from shardline.orchestration.step import watch

    while True:
        decision = watch.decide_now(spec, attempt)
        if decision.action is Action.RESUBMIT:
            attempt = step_jobs.resubmit(spec, attempt, list(decision.retry_files), beside=decision.beside).attempt
        elif decision.action is Action.ADVANCE:
            status = step_end.finish(spec, attempt, Action.ADVANCE, decision.reason)
            if status is None or status.value != "SUCCEEDED":
                raise SystemExit(f"bench-quote: the step ended {status}: {step_end.step_message(spec, attempt)}")
            return
        elif decision.action is not Action.WAIT:
            raise SystemExit(f"bench-quote: {decision.action.value}: {decision.reason}")
        time.sleep(POLL_SECONDS)


def actual_of(spec, s3, start: dt.datetime):
    """The run's own report: what it priced."""
    from shardline.ledger.keys import StepRef
    from shardline.orchestration.step.files import latest_attempt
    from shardline.report.model import RunReport
    from shardline.s3uri import parse_s3_uri

    attempt = latest_attempt(spec, StepRef(spec.pipeline, f"hour-{start:%H}", STEP))
    bucket, key = parse_s3_uri(attempt.report_uri("json"))
    return RunReport.from_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--max-error", type=float, default=0.15, help="the bound on the worst expected figure's error")
    args = parser.parse_args()

    from shardline.local.embedded_aws import apply_env, embedded_aws

    results = []
    with tempfile.TemporaryDirectory() as tmp_name, embedded_aws(Path(tmp_name) / "moto.log") as env:
        tmp = Path(tmp_name)
        apply_env(env)
        os.environ["SHARDLINE_LOCAL_ROOT"] = str(tmp / "local")
        os.environ["SHARDLINE_LOCAL_RUNTIME"] = "process"
        import boto3

        from shardline.ledger.table import create_ledger_table
        from shardline.oncall.tune import sample_rates
        from shardline.orchestration.quote import quote, quote_lines

        table = f"bench-quote-{uuid.uuid4().hex[:8]}"
        create_ledger_table(table, "us-east-1")
        s3 = boto3.client("s3")
        bucket = f"bench-quote-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        for kind, sizes in KINDS:
            spec = stage(s3, bucket, tmp, table, kind, sizes)
            for hour, rows in enumerate(sizes):
                start = DAY + dt.timedelta(hours=hour)
                quoted = quote(spec, [start], sampler=sample_rates)
                step = quoted.partitions[0].steps[0]
                began = time.monotonic()
                run_partition(spec, start)
                wall = time.monotonic() - began
                report = actual_of(spec, s3, start)
                actual = report.cost.total or 0.0
                error = actual / step.usd.expected - 1 if step.usd.expected else float("inf")
                result = {
                    "kind": kind,
                    "rows": rows,
                    "basis": step.rates.basis,
                    "quoted": {"low": step.usd.low, "expected": step.usd.expected, "high": step.usd.high},
                    "quoted_instance_seconds": step.instance_seconds.expected,
                    "actual": actual,
                    "actual_instance_seconds": report.cost.instance_seconds,
                    "instances": len(report.instances),
                    "busy_seconds": sum(i.busy_seconds for i in report.instances),
                    "rows_out": report.reconciliation.rows_out,
                    "within": step.usd.holds(actual),
                    "error": error,
                    "wall_seconds": round(wall, 1),
                    "quote": quote_lines(quoted),
                }
                results.append(result)
                print(
                    f"{kind} {rows:>9,} rows ({result['basis']}): quoted ${step.usd.expected:.5f} "
                    f"(${step.usd.low:.5f} to ${step.usd.high:.5f}), actual ${actual:.5f} "
                    f"({report.cost.instance_seconds:.1f} instance-s vs {step.instance_seconds.expected:.1f} quoted): "
                    f"{error:+.1%}, {'within' if result['within'] else 'OUTSIDE'} the range",
                    flush=True,
                )
    within = sum(r["within"] for r in results)
    worst = max(abs(r["error"]) for r in results)
    line = (
        f"quote: {len(results)} runs, actual within range {within}/{len(results)}, "
        f"expected within +-{worst:.0%} (worst)"
    )
    print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quote.json").write_text(json.dumps({"line": line, "runs": results}, indent=2, default=str))
    failures = []
    if within < len(results):
        failures.append(f"{len(results) - within} run(s) cost outside their quoted range")
    if worst > args.max_error:
        failures.append(f"the worst expected figure was {worst:.0%} off, over the bound of {args.max_error:.0%}")
    for failure in failures:
        print(f"bench-quote: FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
