"""`make demo`: the example pipeline through Airflow on the embedded local stack.

`make demo DEMO_ARGS="--pipeline daily_churn"` runs the two-step pipeline instead: a scikit-learn
model scores a day of customers, then custom inference.py code calibrates the scores it committed.

The hourly pipeline, by default:

1. starts moto_server on a free loopback port (S3 + DynamoDB + SageMaker API);
2. creates the bucket and the ledger table;
3. generates 160 parquet files (8M rows), trains an XGBoost model, uploads model.tar.gz;
4. runs the `tabular_scoring_hourly` DAG with Airflow's `dag.test()` on the local
   backend with 2 instances, and kills one instance mid-run so the watch's
   resubmission shows in the log;
5. prints a summary table, with the path of the step's run report fetched to
   .shardline/reports/ and of the run's OpenLineage events, and stops every server it started.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import subprocess
import threading
import time
from pathlib import Path

from examples import private_folder
from shardline.ledger.keys import StepRef

REPO = Path(__file__).resolve().parents[1]
PIPELINE = "tabular_scoring_hourly"
BUCKET = "shardline-demo"
HOUR = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)  # the partition the demo scores
# A manual run scores the last whole interval before its logical date: triggered a second after 11:00, the hourly
# DAG's interval is the hour 10:00-11:00. Not at 11:00 itself: that is the logical date of the 11:00-12:00 scheduled
# run, which Airflow would then never create (docs/pipelines.md, "Manual runs name their partition by its start").
OFF_BOUNDARY = dt.timedelta(seconds=1)
LOGICAL_DATE = HOUR + dt.timedelta(hours=1) + OFF_BOUNDARY
FILES, ROWS = 160, 8_000_000
LINEAGE_FILE = "lineage.jsonl"  # under the work folder: the OpenLineage events of the run


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


@dataclasses.dataclass
class Kill:
    """What the failure injection did: the instance it killed and how far that instance had got."""

    host: str
    finished: int = 0  # its files recorded SUCCEEDED (each output in S3 already) when it was killed
    share: int = 0  # the files dealt to it
    done: bool = False


def kill_one_instance(local_root: Path, spec, kill: Kill, stop: threading.Event) -> None:
    try:
        _kill_one_instance(local_root, spec, kill, stop)
    except Exception as err:  # noqa: BLE001 - a thread's error would vanish in the log: say it, the summary fails
        print(f"\n!!! demo: the failure injection failed: {type(err).__name__}: {err}", flush=True)


def _kill_one_instance(local_root: Path, spec, kill: Kill, stop: threading.Event) -> None:
    """Failure injection: SIGKILL one instance of attempt 1 once a quarter of its files are durable, as a machine
    lost mid-job: its finished files must be kept, and only its unfinished ones scored again."""
    import psutil

    from shardline.ledger.states import FileStatus
    from shardline.ledger.step_reads import read_step
    from shardline.orchestration import services

    model = services.ledger_model(spec)
    while not stop.is_set():
        for log in local_root.glob(f"jobs/*-a1/{kill.host}/worker.log"):
            job = log.parent.parent
            run_id = json.loads((job / "request.json").read_text())["Environment"]["SHARDLINE_RUN_ID"]
            share = sum(1 for _ in (log.parent / "processing" / "input" / "data").rglob("*.parquet"))
            records = read_step(model, StepRef(spec.pipeline, run_id, "score"), file_attributes=None)
            finished = sum(
                f.status is FileStatus.SUCCEEDED and f.host == kill.host and f.attempt == 1 for f in records.files
            )
            if not share or finished < share // 4:
                continue
            if json.loads((job / "state.json").read_text()).get("runtime") == "docker":
                # The instance is a container of the worker image: kill it whole, as a lost machine.
                from shardline.backends.local_container import container_name

                name = container_name(job.name, kill.host)
                if subprocess.run(["docker", "kill", name], capture_output=True, check=False).returncode == 0:
                    kill.finished, kill.share, kill.done = finished, share, True
                    print(
                        f"\n!!! demo: killed instance {kill.host} of attempt 1 (container {name}) {_when(kill, share)}"
                    )
                    return
                continue
            marker = str(log.parent)
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info["cmdline"] or []
                if "shardline.worker" in cmd and any(marker in part for part in cmd):
                    victims = [proc, *proc.children(recursive=True)]
                    for victim in victims:
                        victim.kill()
                    kill.finished, kill.share, kill.done = finished, share, True
                    print(f"\n!!! demo: killed instance {kill.host} of attempt 1 (pid {proc.pid}) {_when(kill, share)}")
                    return
        time.sleep(0.2)


def _when(kill: Kill, share: int) -> str:
    return (
        f"with {kill.finished} of its {share} files recorded SUCCEEDED (their outputs are in S3 already): "
        "only its unfinished files should be scored again\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.airflow_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", type=Path, default=REPO / ".shardline" / "demo-airflow")
    parser.add_argument("--no-failure", action="store_true", help="skip the killed-instance injection")
    parser.add_argument("--corrupt", type=int, default=0, help="also upload N corrupt parquet files")
    parser.add_argument(
        "--bad-model",
        action="store_true",
        help="score the hour first with a broken model (it predicts one value for every row): the output checks "
        "hold the hour back and the run ends red; then rerun it with the right model, green",
    )
    parser.add_argument(
        "--dags-folder",
        type=Path,
        default=REPO / "dags",
        help="DAG folder to load the pipeline from (default: the repo's dags/)",
    )
    parser.add_argument("--files", type=int, default=FILES)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument(
        "--pipeline",
        choices=(PIPELINE, CHURN),
        default=PIPELINE,
        help=f"{PIPELINE} (one step, an instance killed) or {CHURN} (two steps: score, calibrate)",
    )
    args = parser.parse_args(argv)
    work = private_folder(args.workdir.resolve(), fresh=True)  # a run's conf and Airflow's database: 0700
    from shardline.local.embedded_aws import apply_env, embedded_aws

    say("starting the embedded AWS endpoint (moto_server on 127.0.0.1)")
    with embedded_aws(work / "moto_server.log") as env:
        apply_env(env)
        print(f"    {env['AWS_ENDPOINT_URL']}")
        os.environ.update(
            {
                "AIRFLOW_HOME": str(work / "airflow"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                # The pipeline runs from a copy of the DAG folder that pins the model the demo trains.
                "AIRFLOW__CORE__DAGS_FOLDER": str(work / "dags"),
                "SHARDLINE_LOCAL_ROOT": str(work / "local"),
                # OpenLineage (shardline[lineage]): every task's events, one JSON line each, in this file; each
                # event built in a thread of the task's process, not a fork of it (about 5 s less of this run).
                "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                    {"type": "file", "log_file_path": str(work / LINEAGE_FILE), "append": True}
                ),
                "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
                # Past this the provider drops the event (10 s by default): a busy laptop keeps its lineage.
                "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "120",
            }
        )
        say("preparing Airflow's metadata database (airflow db migrate)")
        migrate_airflow_db()
        if args.pipeline == CHURN:
            return run_churn(work, args.dags_folder, files=min(args.files, 8), rows=min(args.rows, 400_000))
        return run_pipeline(
            work,
            args.dags_folder,
            inject_failure=not args.no_failure and not args.bad_model,
            corrupt=args.corrupt,
            files=args.files,
            rows=args.rows,
            bad_model=args.bad_model,
        )


def migrate_airflow_db() -> None:
    """What `airflow db migrate` does, in this process: it imports Airflow for the DAG run anyway, and a second
    interpreter would import it again only to migrate (about 2 CPU-s). AIRFLOW_HOME is set before this first
    import of Airflow's settings."""
    import contextlib
    import io

    from airflow.utils import db

    with contextlib.redirect_stdout(io.StringIO()):
        db.upgradedb()


def pin_model(
    dags: Path, copy: Path, pins: dict[int, str], pipeline: str = PIPELINE, versions: dict[str, str] | None = None
) -> Path:
    """A copy of the DAG folder whose pipeline pins the models just made (``pins``: step index -> sha256; or, for a
    URI of model versions, ``versions``: version -> sha256): each job refuses any other artifact."""
    import shutil

    import yaml

    if not copy.exists():
        shutil.copytree(dags, copy)
    path = copy / "pipelines" / f"{pipeline}.yaml"
    data = yaml.safe_load(path.read_text())
    for index, digest in pins.items():
        model = data["steps"][index]["model"]
        model.pop("allow_unpinned", None)
        if "params.model_version" in model["uri"].replace(" ", ""):
            model["versions"] = versions or {model.get("version", "v1"): digest}
        else:
            model["sha256"] = digest
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def create_stack(dags: Path, pipeline: str):
    """The pipeline's spec, an S3 client, and the demo bucket and ledger table created on the embedded endpoint."""
    import boto3

    from shardline.ledger.table import create_ledger_table
    from shardline.spec import load_spec

    spec = load_spec(dags / "pipelines" / f"{pipeline}.yaml")
    s3 = boto3.client("s3")
    say(f"creating bucket {BUCKET} and ledger table {spec.ledger_table}")
    s3.create_bucket(Bucket=BUCKET)
    create_ledger_table(spec.ledger_table)
    return spec, s3


def run_dag(dags: Path, pipeline: str, logical_date: dt.datetime, conf: dict | None = None):
    """Run the pipeline's DAG once with dag.test() (``conf``: the run's Params): (the DAG run, wall seconds), or
    None on an import error."""
    logging.getLogger("pynamodb").setLevel(logging.WARNING)
    from airflow.dag_processing.dagbag import DagBag

    from shardline.airflow.triggers.step import SETTLE_ENV

    bag = DagBag(dag_folder=str(dags))
    if bag.import_errors:
        print(json.dumps(bag.import_errors, indent=2))
        return None
    os.environ.setdefault(SETTLE_ENV, "0")  # dag.test() runs triggers in-process: no scheduler to race
    started = time.monotonic()
    run = bag.get_dag(pipeline).test(logical_date=logical_date, run_conf=conf)
    return run, time.monotonic() - started


CHURN = "daily_churn"
DAY = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)  # the day the churn demo scores (triggered at its end)


def run_churn(work: Path, dags: Path, *, files: int, rows: int) -> int:
    """The two-step pipeline: score a day of customers, then calibrate the committed scores."""
    import io

    import numpy as np
    import pyarrow.parquet as pq

    from examples import synthetic
    from shardline.orchestration.step import end
    from shardline.spec import load_spec

    spec, s3 = create_stack(dags, CHURN)
    prefix = f"customers/dt={DAY:%Y-%m-%d}/"
    say(f"generating {files} parquet files ({rows:,} customers) and uploading to s3://{BUCKET}/{prefix}")
    for path in synthetic.make_dataset(work / "data", files=files, rows=rows):
        s3.upload_file(str(path), BUCKET, prefix + path.name)
    say("training the scikit-learn churn model, writing the calibration code, uploading both")
    score_sha = synthetic.pack(synthetic.train_sklearn(work / "score-model").parent, work / "score.tar.gz")
    s3.upload_file(str(work / "score.tar.gz"), BUCKET, "models/sklearn/v1/model.tar.gz")
    calibration_sha = synthetic.pack(synthetic.calibration_model(work / "calibration"), work / "calibration.tar.gz")
    s3.upload_file(str(work / "calibration.tar.gz"), BUCKET, "models/calibration/v1/model.tar.gz")
    dags = pin_model(dags, work / "dags", {0: score_sha, 1: calibration_sha}, CHURN)
    print(
        f"    pinned score {score_sha[:12]}... and calibrate {calibration_sha[:12]}... in "
        f"{dags / 'pipelines' / f'{CHURN}.yaml'}"
    )

    say(f"running DAG {CHURN} for the day {DAY:%Y-%m-%d} with dag.test() on the local backend")
    ran = run_dag(dags, CHURN, DAY + dt.timedelta(days=1) + OFF_BOUNDARY)  # its data interval: DAY
    if ran is None:
        return 1
    run, wall = ran
    spec = load_spec(dags / "pipelines" / f"{CHURN}.yaml")
    summaries = [end.summarize(spec, StepRef(CHURN, run.run_id, s.name)) for s in spec.steps]

    def column(out_prefix: str, name: str) -> dict[int, float]:
        values: dict[int, float] = {}
        for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=out_prefix).get("Contents", []):
            if "/_" not in "/" + item["Key"][len(out_prefix) :]:
                table = pq.read_table(io.BytesIO(s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()))
                values.update(zip(table.column("id").to_pylist(), table.column(name).to_pylist(), strict=True))
        return values

    scored = column(f"churn/scores/dt={DAY:%Y-%m-%d}/", "proba_1")
    calibrated = column(f"churn/calibrated/dt={DAY:%Y-%m-%d}/", "prediction")
    joined = sorted(scored) == sorted(calibrated)
    right = joined and bool(
        np.allclose(
            [calibrated[i] for i in sorted(scored)],
            synthetic.calibrate(np.array([scored[i] for i in sorted(scored)])),
            rtol=1e-5,
        )
    )
    say("summary")
    print(f"  DAG run          {run.run_id}: {run.state} in {wall:.1f}s")
    for s in summaries:
        print(
            f"  step {s.step:<11} {s.succeeded}/{s.files} files, rows in / out {s.rows_in:,} / "
            f"{s.rows_out:,}, attempts {s.attempts}"
        )
    print(
        f"  joined on id     {len(calibrated):,} calibrated rows for {len(scored):,} scored customers: "
        f"{'each the calibration of its own score' if right else 'MISMATCH'}"
    )
    print(f"  output           s3://{BUCKET}/churn/calibrated/dt={DAY:%Y-%m-%d}/")
    # The second step reads the first one's output: in the lineage, one dataset joins the two watch tasks.
    lineage, _ = lineage_of(work / LINEAGE_FILE, CHURN, run.run_id, "watch_calibrate")
    print(f"  lineage          {lineage}")
    ok = str(run.state) == "success" and right and len(scored) == rows
    return 0 if ok else 1


def run_pipeline(
    work: Path, dags: Path, *, inject_failure: bool, corrupt: int, files: int, rows: int, bad_model: bool = False
) -> int:
    from examples import synthetic

    spec, s3 = create_stack(dags, PIPELINE)
    prefix = f"events/dt={HOUR:%Y-%m-%d}/hour={HOUR:%H}/"
    say(f"generating {files} parquet files ({rows:,} rows) and uploading to s3://{BUCKET}/{prefix}")
    paths = synthetic.make_dataset(work / "data", files=files, rows=rows)
    for path in paths:
        s3.upload_file(str(path), BUCKET, prefix + path.name)
    for i in range(corrupt):
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}corrupt-{i}.parquet", Body=b"PAR1 this is not parquet")
        print(f"    uploaded corrupt file {prefix}corrupt-{i}.parquet")
    say("training the XGBoost model and uploading model.tar.gz")
    model_file = synthetic.train_xgboost(work / "model")
    sha = synthetic.pack(model_file.parent, work / "model.tar.gz")
    s3.upload_file(str(work / "model.tar.gz"), BUCKET, "models/xgboost/v1/model.tar.gz")
    if bad_model:
        return run_bad_model(work, dags, spec, s3, sha, rows)
    dags = pin_model(dags, work / "dags", {0: sha})
    print(f"    sha256 {sha}, pinned as model.versions.v1 in {dags / 'pipelines' / f'{PIPELINE}.yaml'}")
    spec = load_spec_of(dags, PIPELINE)
    if (table := spec.step("score").output.table) is not None:
        print(
            f"    output.table: {table.qualified} in the {table.catalog!r} Iceberg catalog "
            "(the stack's own: SQLite beside the local jobs, its warehouse on the embedded S3; docs/tables.md)"
        )

    stop = threading.Event()
    kill = Kill("algo-2") if inject_failure else None
    if kill:
        threading.Thread(target=kill_one_instance, args=(work / "local", spec, kill, stop), daemon=True).start()

    say(
        f"running DAG {PIPELINE} for the hour {HOUR:%Y-%m-%d %H:00}-{LOGICAL_DATE:%H:00} with dag.test() on the local "
        "backend"
    )
    ran = run_dag(dags, PIPELINE, LOGICAL_DATE)
    if ran is None:
        return 1
    run, wall = ran
    stop.set()
    return summarize(spec, run, wall, work, expected_rows=rows, kill=kill)


BROKEN = "v0-broken"  # the model version --bad-model scores with first


def load_spec_of(dags: Path, pipeline: str):
    from shardline.spec import load_spec

    return load_spec(dags / "pipelines" / f"{pipeline}.yaml")


def table_line(spec, run_id: str, rows_out: int) -> tuple[str, bool]:
    """The summary's table line: the run's partition counted by scanning the table back with pyiceberg (not from
    the ledger), and whether that count is the rows out."""
    from shardline.orchestration import tables
    from shardline.orchestration.step.files import latest_attempt

    attempt = latest_attempt(spec, StepRef(spec.pipeline, run_id, "score"))
    partition = attempt.table_partition or {}
    scanned = tables.scanned_rows(spec, "score", partition)
    snapshot = tables.load_table(spec, "score").current_snapshot()
    where = "/".join(f"{k}={v}" for k, v in partition.items())
    name = spec.step("score").output.table.qualified
    text = f"{name} partition {where}: {scanned:,} rows in snapshot {snapshot.snapshot_id if snapshot else '-'}"
    if scanned != rows_out:
        text += f" (rows out {rows_out:,}: WRONG)"
    return text, scanned == rows_out


def run_bad_model(work: Path, dags: Path, spec, s3, good_sha: str, rows: int) -> int:
    """``--bad-model``: the hour scored first with a broken model (every row the same score), which the output checks
    hold back (no _SUCCESS, the run red, the reason in one line), then rerun with the right model: green."""
    from examples import synthetic
    from shardline.ledger.step_reads import read_step_item
    from shardline.orchestration import services
    from shardline.planning import naming

    say(f"training a broken XGBoost model (its labels all 0: it scores every row the same) as version {BROKEN}")
    broken_sha = synthetic.pack(synthetic.train_xgboost(work / "broken", broken=True).parent, work / "broken.tar.gz")
    s3.upload_file(str(work / "broken.tar.gz"), BUCKET, f"models/xgboost/{BROKEN}/model.tar.gz")
    dags = pin_model(dags, work / "dags", {0: good_sha}, versions={"v1": good_sha, BROKEN: broken_sha})
    print(f"    pinned v1 {good_sha[:12]}... and {BROKEN} {broken_sha[:12]}...")

    say(f"running DAG {PIPELINE} for the hour {HOUR:%Y-%m-%d %H:00} with model_version {BROKEN}")
    ran = run_dag(dags, PIPELINE, LOGICAL_DATE, {"model_version": BROKEN})
    if ran is None:
        return 1
    first, _ = ran
    step = read_step_item(services.ledger_model(spec), StepRef(PIPELINE, first.run_id, "score"))
    held = (step.message or "") if step else ""
    out = f"scores/dt={HOUR:%Y-%m-%d}/hour={HOUR:%H}/"
    marker = s3.list_objects_v2(Bucket=BUCKET, Prefix=out + "_SUCCESS").get("KeyCount", 0)
    say("summary of the run with the broken model")
    print(f"  DAG run  {first.run_id}: {first.state}")
    print(f"  {held.split('; report:')[0] if held else 'no step message: MISSING'}")
    print(f"  _SUCCESS {'written: WRONG' if marker else 'not written: readers of the hour see nothing complete'}")
    print(f"  on call  {naming.checks_command(PIPELINE, first.run_id)} shows every check against the last hours")

    say("the fix: rerunning the hour with the right model (model_version v1) over the held-back outputs")
    ran = run_dag(dags, PIPELINE, LOGICAL_DATE + OFF_BOUNDARY, {"model_version": "v1"})
    if ran is None:
        return 1
    run, wall = ran
    held_back = str(first.state) == "failed" and held.startswith("checks: blocked by") and not marker
    code = summarize(spec, run, wall, work, expected_rows=rows)
    return code if held_back else 1


def _task_span(dag_id: str, run_id: str) -> tuple[float, float]:
    """Epoch seconds when the plan task's code started (it records it) and when the last task ended."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id).all()
        ends = [ti.end_date.timestamp() for ti in tis if ti.end_date]
        plan = (
            session.query(XComModel)
            .filter(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == "plan_score",
                XComModel.key == "return_value",
            )
            .one()
        )
        value = plan.value if isinstance(plan.value, dict) else json.loads(plan.value)
    return value["planning"]["started_at"], max(ends)


def fetch_report(spec, run_id: str, step: str) -> tuple[str, bool]:
    """The step's run report (written when the step ended), fetched as `shardline report` does: its local path,
    or why there is none."""
    from shardline.oncall.errors import NotFound
    from shardline.oncall.service import OnCall
    from shardline.oncall.values import RunRef

    try:
        [saved] = OnCall({spec.pipeline: spec}).save_reports(RunRef(spec.pipeline, run_id), step, root=Path.cwd())
    except NotFound as err:
        return f"none: {err}", False
    path = Path(saved.path)
    return str(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path), True


def _covered_seconds(spans: list[tuple[float, float]]) -> float:
    """How long at least one of the (start, end) spans was going on: their union's length."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


def summarize(spec, run, wall: float, work: Path, expected_rows: int, kill: Kill | None = None) -> int:
    from shardline.orchestration.step import end
    from shardline.orchestration.step.files import read_step_files

    run_id = run.run_id
    summary = end.summarize(spec, StepRef(spec.pipeline, run_id, "score"))
    jobs = [  # this run's jobs (--bad-model runs the hour twice)
        job
        for job in sorted((work / "local" / "jobs").glob("sl-*"))
        if json.loads((job / "request.json").read_text())["Environment"]["SHARDLINE_RUN_ID"] == run_id
    ]
    spans = []
    for job in jobs:
        state = json.loads((job / "state.json").read_text())
        spans.append((state["created_at"], state.get("ended_at") or time.time()))
    # Job time is the time at least one job ran: a lost instance's files run in a second job beside the first, and
    # summing the two would count those seconds twice (orchestration then came out below zero).
    worker_seconds = _covered_seconds(spans)
    out = f"s3://{BUCKET}/scores/dt={HOUR:%Y-%m-%d}/hour={HOUR:%H}/"
    # dag.test() starts an in-process API server before the first task's code can run: Airflow's
    # own start-up, which a deployed Airflow has already paid. Orchestration is measured from the
    # moment the plan task's code starts to the end of the last task.
    first_start, last_end = _task_span(spec.pipeline, run_id)
    tasks = last_end - first_start
    overhead = tasks - worker_seconds
    report_path, reported = fetch_report(spec, run_id, "score")
    rows = [
        ("DAG run", f"{run_id}: {run.state}"),
        ("files", f"{summary.files} ({summary.succeeded} succeeded, {summary.failed} failed)"),
        ("rows in / out", f"{summary.rows_in:,} / {summary.rows_out:,}"),
        ("attempts", f"{summary.attempts} ({len(jobs)} processing job(s))"),
        (
            "rows/s (in jobs)",
            f"{summary.rows_in / worker_seconds:,.0f} over {worker_seconds:.1f}s of job time ({len(jobs)} job(s))",
        ),
        (
            "wall time",
            f"{wall:.1f}s for the whole DAG run: {wall - tasks:.1f}s of dag.test() start-up, then "
            f"{tasks:.1f}s from the plan task's start to the last task's end",
        ),
        (
            "orchestration",
            f"{overhead:.1f}s of those {tasks:.1f}s beyond job time "
            f"({overhead / worker_seconds:.0%} of job time): planning, submits, polls, backoff, report",
        ),
        ("output", out),
        ("report", report_path),
    ]
    lineage, lineage_rows = lineage_of(work / LINEAGE_FILE, spec.pipeline, run_id, "watch_score")
    rows.append(("lineage", lineage))
    table_ok = True
    if spec.steps[0].output.table is not None:
        if str(run.state) == "success" and not summary.failed:
            text, table_ok = table_line(spec, run_id, summary.rows_out)
        else:  # a failed or PARTIAL step writes no _SUCCESS, and commits nothing
            text = "nothing committed: the step did not succeed whole (no _SUCCESS)"
        rows.append(("table", text))
    redone_ok = True
    if kill is not None:
        files = read_step_files(spec, StepRef(spec.pipeline, run_id, "score")).files
        redone = sum(f.attempt > 1 for f in files)
        share = kill.share
        unfinished = share - kill.finished
        redone_ok = kill.done and redone <= unfinished
        rows.insert(
            4,
            (
                "recovery",
                f"attempt 2 scored {redone} file(s) again: {kill.host} was killed with {kill.finished} of its "
                f"{share} files durable, so at most its {unfinished} unfinished ones go again; the other "
                f"{len(files) - redone} file(s) were kept"
                if kill.done
                else "the failure injection did not fire (the job ended first)",
            ),
        )
    say("summary")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    for failed in summary.failed_files:
        print(f"  failed file       {failed.input}: {failed.error}")
    ok = (
        str(run.state) == "success"
        and summary.rows_in == summary.rows_out == expected_rows
        and lineage_rows in (None, (summary.rows_in, summary.rows_out))
        and reported
        and redone_ok
        and table_ok
    )
    return 0 if ok else 1


def lineage_of(path: Path, pipeline: str, run_id: str, task_id: str) -> tuple[str, tuple[int, int] | None]:
    """The summary's lineage line: how many OpenLineage events the run wrote to ``path``, and the datasets and rows
    the watch task's COMPLETE event names; with those rows (in, out), or None where no such event was written (the
    OpenLineage provider is not installed)."""
    events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    ended = [
        e
        for e in events
        if e.get("eventType") == "COMPLETE"
        and e["job"]["name"] == f"{pipeline}.{task_id}"
        and e["run"]["facets"].get("airflow", {}).get("dagRun", {}).get("run_id") == run_id
    ]
    if not ended:
        return (
            f"no OpenLineage event of {task_id} (is the provider installed, pip install 'shardline[lineage]', and not "
            f"disabled?); {path}",
            None,
        )
    source, target = (ended[-1].get(side) or [{}] for side in ("inputs", "outputs"))
    source, target = source[0], target[0]
    rows_in = source.get("inputFacets", {}).get("inputStatistics", {}).get("rowCount")
    rows_out = target.get("outputFacets", {}).get("outputStatistics", {}).get("rowCount")
    if rows_in is None or rows_out is None:
        # (-1, -1) is never the summary's rows: the demo fails, as it should for an event without them.
        return f"{len(events)} OpenLineage events in {path}; {task_id}'s names no rows", (-1, -1)
    said = (
        f"{len(events)} OpenLineage events in {path}; {task_id}: {source['namespace']}/{source['name']} "
        f"({rows_in:,} rows) -> {target['namespace']}/{target['name']} ({rows_out:,} rows)"
    )
    return said, (rows_in, rows_out)


if __name__ == "__main__":
    raise SystemExit(main())
