"""The `shardline` command as installed (its console script), run in a subprocess like a person would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).with_name("shardline")


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "160", **(env or {})})


@pytest.mark.parametrize("command", ["runs", "status", "failed", "resubmit", "cancel", "preview", "local"])
def test_every_command_has_help(command):
    result = run(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: shardline {command}" in result.stdout
    assert len(result.stdout.splitlines()) > 5


def test_top_level_help_shows_the_on_call_flow():
    out = run("--help").stdout
    for command in ("runs", "status", "failed", "resubmit", "cancel", "preview", "local"):
        assert re.search(rf"^\s+{command}\s", out, re.M), command
    assert "on-call flow:" in out and "SHARDLINE_AIRFLOW_URL" in out
    assert "shardline preview tabular_scoring_hourly" in out


def test_resubmit_needs_exactly_one_selection():
    result = run("resubmit", "p/r", "--step", "score")
    assert result.returncode == 2
    assert "one of the arguments --all-failed --shard --file is required" in result.stderr


def test_local_up_creates_what_the_specs_name_and_down_stops_it(tmp_path):
    state = tmp_path / "stack"
    up = run("--dags-folder", str(REPO / "dags"), "local", "up", "--state-dir", str(state))
    assert up.returncode == 0, up.stderr
    url = re.search(r"export AWS_ENDPOINT_URL=(\S+)", up.stdout).group(1)
    try:
        assert "bucket s3://shardline-demo: created" in up.stdout
        assert "ledger table shardline-jobs: created" in up.stdout
        again = run("--dags-folder", str(REPO / "dags"), "local", "up", "--state-dir", str(state))
        assert "already up" in again.stdout  # a second `up` adopts the running stack
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        assert "shardline-demo" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
        dynamodb = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                                aws_secret_access_key="testing")
        assert "shardline-jobs" in dynamodb.list_tables()["TableNames"]
        assert run("local", "status", "--state-dir", str(state)).returncode == 0
    finally:
        down = run("local", "down", "--state-dir", str(state))
    assert down.returncode == 0 and "stopped the embedded stack" in down.stdout
    deadline = time.monotonic() + 10
    from shardline.localstack import answers

    while answers(url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not answers(url)
    status = run("local", "status", "--state-dir", str(state))
    assert status.returncode == 1 and "shardline local up" in status.stdout


def test_an_unknown_run_says_how_to_find_the_right_one(aws_env, ledger_table, tmp_path):
    pipelines = tmp_path / "dags" / "pipelines"
    pipelines.mkdir(parents=True)
    (pipelines / "p.yaml").write_text(
        f"pipeline: p\nledger_table: {ledger_table}\nsteps:\n  - name: score\n    model: {{uri: s3://b/m.tar.gz}}\n"
        "    input: {prefix: s3://b/in/}\n    output: {prefix: s3://b/out/}\n")
    result = run("--dags-folder", str(tmp_path / "dags"), "status", "p/nope", env=aws_env)
    assert result.returncode == 1
    assert "no run p/nope" in result.stderr and "shardline runs --pipeline p" in result.stderr
    other = run("--dags-folder", str(tmp_path / "dags"), "status", "q/nope", env=aws_env)
    assert other.returncode == 1 and "no pipeline 'q'" in other.stderr
    empty = run("--dags-folder", str(tmp_path / "dags"), "runs", env=aws_env)
    assert empty.returncode == 0 and "no runs recorded yet" in empty.stdout


def test_preview_of_an_unknown_pipeline_or_step_lists_the_known_ones():
    result = run("--dags-folder", str(REPO / "dags"), "preview", "no_such_pipeline")
    assert result.returncode == 1
    assert "no pipeline 'no_such_pipeline'" in result.stderr and "tabular_scoring_hourly" in result.stderr
    result = run("--dags-folder", str(REPO / "dags"), "preview", "daily_churn", "--step", "nope")
    assert result.returncode == 1 and "(steps: score, calibrate)" in result.stderr
