"""Regenerate docs/on-call.md's "Step by step, with real output": the on-call loop in a real `airflow
standalone` on the embedded stack, through the `shardline` CLI as an engineer runs it.

    .venv/bin/python -m tools.walkthrough_oncall [--out walkthrough.txt]

It starts moto_server and Airflow (a few minutes on 2 cores), triggers the hourly pipeline for
10:00 with one corrupt input, and prints each command with its output (COLUMNS=130), from
`shardline login` to the run turning green. Not a test: tests/scenarios/test_oncall_airflow.py
checks the same loop.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import yaml

from examples import synthetic
from shardline.ledger.table import create_ledger_table
from shardline.local.embedded_aws import embedded_aws
from shardline.local.provision import SEED_MODELS
from shardline.spec import load_spec
from tests.conftest import AWS_TEST_ENV
from tests.support.airflow_stack import airflow_standalone

REPO = Path(__file__).resolve().parents[1]
PIPELINE, BUCKET = "tabular_scoring_hourly", "shardline-demo"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the transcript here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardline-walkthrough-"))
    transcript: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        transcript.append(text)

    with embedded_aws(work / "moto.log") as aws:
        dags = work / "dags"
        shutil.copytree(REPO / "dags", dags)
        for path in (dags / "pipelines").glob("*.yaml"):  # triggered by hand here: no scheduled runs
            spec = yaml.safe_load(path.read_text())
            spec["schedule"] = None
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
        env = {**AWS_TEST_ENV, "AWS_ENDPOINT_URL": aws["AWS_ENDPOINT_URL"]}
        os.environ.update(env)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        spec = load_spec(dags / "pipelines" / f"{PIPELINE}.yaml")
        create_ledger_table(spec.ledger_table, "us-east-1", env["AWS_ENDPOINT_URL"])
        # The demo model the spec pins, as `shardline local up` uploads it.
        s3.upload_file(str(SEED_MODELS / "xgboost-v1.tar.gz"), BUCKET, "models/xgboost/v1/model.tar.gz")
        hour = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)
        prefix = f"events/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
        files = synthetic.make_dataset(work / "data", files=8, rows=400_000)
        for path in files:
            s3.upload_file(str(path), BUCKET, prefix + path.name)
        s3.put_object(Bucket=BUCKET, Key=prefix + "part-late.parquet", Body=b"PAR1 truncated upload")

        with airflow_standalone(work / "home", dags, env) as stack:
            # The engineer's shell has Airflow's settings (AIRFLOW_HOME: where the local backend's jobs live, the
            # DAGs folder, the AWS endpoint), as docs/pipelines.md's recipe exports them, and logs in once.
            shell = {k: v for k, v in stack.cli_env().items() if not k.startswith("SHARDLINE_AIRFLOW_")}
            cli_env = {
                **shell,
                "AIRFLOW_HOME": str(stack.home),
                "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                "COLUMNS": "130",
                "HOME": str(work / "user"),
                "XDG_CONFIG_HOME": str(work / "user" / ".config"),
            }

            def shardline(*words: str, stdin: str | None = None) -> str:
                shown = " ".join(words)
                done = subprocess.run(
                    ["shardline", *words],
                    env=cli_env,
                    input=stdin,
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
                say(f"$ shardline {shown}\n{done.stdout}{done.stderr}".rstrip() + "\n")
                return done.stdout

            shardline("login", stack.url, "--username", stack.username, "--password-stdin", stdin=stack.password)
            client = stack.client()
            run = client.trigger(PIPELINE, {}, logical_date=hour.isoformat())  # Airflow names the run
            run_id = run["dag_run_id"]
            stack.wait_for_run(PIPELINE, run_id, timeout=600)
            ref = f"{PIPELINE}/{run_id}"
            shardline("runs")
            shardline("status", ref)
            shardline("failed", ref)
            s3.upload_file(str(files[0]), BUCKET, prefix + "part-late.parquet")  # the fix: upload it again
            say("# the fix: part-late.parquet uploaded again\n")
            shardline("resubmit", ref, "--step", "score", "--all-failed", "--dry-run")
            started = time.monotonic()
            shardline("resubmit", ref, "--step", "score", "--all-failed")
            shardline("resubmit", ref, "--step", "score", "--all-failed")
            final = stack.wait_for_run(PIPELINE, run_id, timeout=600)
            say(f"# DAG run {final['state']} {time.monotonic() - started:.0f} s after the resubmission\n")
            shardline("status", ref)
            shardline("runs")
            listing = sorted(
                o["Key"].removeprefix(f"scores/dt={hour:%Y-%m-%d}/hour={hour:%H}/")
                for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"scores/dt={hour:%Y-%m-%d}/")["Contents"]
            )
            say("# the output prefix:\n" + "\n".join(listing) + "\n")
    if args.out:
        args.out.write_text("\n".join(transcript))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
