"""The `shardline` command as installed (its console script), run in a subprocess like a person would."""

from __future__ import annotations

import json
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
PIN = "a" * 64  # a pinned model digest, as a spec must give


def run(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # Without FORCE_COLOR (a developer's shell may set it) rich writes no styles into a pipe, so any ESC in the
    # output came from the data.
    here = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run(
        [str(CLI), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**here, "COLUMNS": "160", **(env or {})},
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "command", ["runs", "status", "failed", "report", "resubmit", "cancel", "preview", "tune", "local"]
)
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
    both = run("resubmit", "p/r", "--step", "score", "--all-failed", "--file", "a.parquet")
    assert both.returncode == 2 and "argument --file: not allowed with argument --all-failed" in both.stderr
    assert "usage: shardline resubmit" in both.stderr


def test_version_and_help_start_without_the_aws_clients_airflow_or_the_service():
    """What the first command a person types costs: no boto3, pynamodb, Airflow or HTTP client is imported."""
    code = (
        "import json, sys\nfrom shardline.oncall import cli\n"
        "codes = [cli.main(argv) for argv in (['--help'], ['resubmit', '--help'], ['local', '--help'], "
        "['--version'])]\n"
        "print(json.dumps([codes, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('boto3', 'botocore', 'pynamodb', 'airflow', 'httpx') or m == 'shardline.oncall.service')]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [[0, 0, 0, 0], []]
    assert "shardline " in run("--version").stdout and run("-h").stdout == run("--help").stdout


def test_a_bad_logical_date_is_a_usage_error_that_shows_the_form():
    result = run("--dags-folder", str(REPO / "dags"), "preview", "daily_churn", "--logical-date", "yesterday")
    assert result.returncode == 2
    assert "expected an ISO date or time like 2026-11-22T10:00, got 'yesterday'" in result.stderr


def test_cancel_without_a_terminal_asks_for_yes_and_changes_nothing():
    result = subprocess.run(
        [str(CLI), "--dags-folder", str(REPO / "dags"), "cancel", "daily_churn/run-1"],
        input="y\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "shardline cancel: refusing to cancel daily_churn/run-1 without a terminal to "
        "confirm on; pass --yes to cancel it anyway"
    )


@pytest.mark.integration  # starts its own moto_server
def test_local_up_creates_what_the_specs_name_and_down_stops_it_from_any_directory(tmp_path):
    # The stack's state is the user's (XDG_STATE_HOME), not the directory's: `down` works from anywhere.
    user = {"XDG_STATE_HOME": str(tmp_path / "xdg-state"), "SHARDLINE_STATE_DIR": ""}
    here, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    up = run("--dags-folder", str(REPO / "dags"), "local", "up", env=user, cwd=here)
    assert up.returncode == 0, up.stderr
    url = re.search(r"export AWS_ENDPOINT_URL=(\S+)", up.stdout).group(1)
    assert (tmp_path / "xdg-state" / "shardline" / "local" / "stack.json").exists()
    try:
        assert "bucket s3://shardline-demo: created" in up.stdout
        assert "ledger table shardline-jobs: created" in up.stdout
        again = run("--dags-folder", str(REPO / "dags"), "local", "up", env=user, cwd=elsewhere)
        assert "already up" in again.stdout  # a second `up`, anywhere, adopts the running stack
        s3 = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        assert "shardline-demo" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
        dynamodb = boto3.client(
            "dynamodb",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        assert "shardline-jobs" in dynamodb.list_tables()["TableNames"]
        assert run("local", "status", env=user, cwd=elsewhere).returncode == 0
    finally:
        down = run("local", "down", env=user, cwd=elsewhere)
    assert down.returncode == 0 and "stopped the embedded stack" in down.stdout
    deadline = time.monotonic() + 10
    from shardline.local.embedded_aws import answers

    while answers(url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not answers(url)
    status = run("local", "status", env=user, cwd=here)
    assert status.returncode == 1 and "shardline local up" in status.stdout
    # A state dir given explicitly still wins.
    assert "is down" in run("local", "status", "--state-dir", str(tmp_path / "other"), env=user).stdout


def write_spec(dags: Path, ledger_table: str) -> None:
    """A one-step pipeline ``p`` over ``ledger_table``."""
    (dags / "pipelines").mkdir(parents=True)
    (dags / "pipelines" / "p.yaml").write_text(
        f"pipeline: p\nledger_table: {ledger_table}\nsteps:\n  - name: score\n"
        f"    model: {{uri: s3://b/m.tar.gz, sha256: {PIN}}}\n"
        "    input: {prefix: s3://b/in/}\n    output: {prefix: s3://b/out/}\n"
    )


def test_an_unknown_run_says_how_to_find_the_right_one(aws_env, ledger_table, tmp_path):
    write_spec(tmp_path / "dags", ledger_table)
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


# --- text from the ledger is printed as written --------------------------------------------------------------

# What a crafted S3 key, a worker's error message echoing an input row, or a step message could hold: rich
# markup (a fake status, a link), and terminal controls (clear screen, an OSC 8 link, a window title, a cursor
# move, carriage return and backspace that overwrite what was printed, a bidi override that reorders it).
MARKUP = "[bold red]FAKE OK[/bold red]"
LINK = "[link=file:///etc]x[/link]"
CONTROLS = "\x1b[2J\x1b]8;;file:///etc\x1b\\click\x1b]8;;\x1b\\\x1b]0;pwned\x07\x1b[1A\r\b\u202e"
HOSTILE = {
    "key_name": f"part-{MARKUP}{CONTROLS}.parquet",
    "error_class": f"Corrupt{MARKUP}Error",
    "error_message": f"row 7: {LINK} {CONTROLS} :warning:",
    "host": f"algo-1{CONTROLS}",
    "step_message": f"{MARKUP} {LINK}{CONTROLS}",
    "run_message": f"{LINK}{CONTROLS}",
    "step_name": f"sc{MARKUP}{CONTROLS}ore",
}


def assert_printed_as_written(text: str, *expected: str) -> None:
    """No terminal control reached the output, and each expected text is there verbatim (markup not read)."""
    assert not [ch for ch in text if not ch.isprintable() and ch not in "\n"], repr(text)
    for part in expected:
        assert part in text, (part, text)


@pytest.fixture
def hostile_run(aws_env, ledger_table, tmp_path):
    """A failed run whose ledger holds hostile text: written with the ledger's own functions, as a worker would."""
    from shardline.ledger import bind_ledger
    from shardline.ledger.context import LedgerContext
    from shardline.ledger.job_writes import FileOutcome, WorkerLedger
    from shardline.ledger.states import FileStatus, StepStatus
    from shardline.ledger.step_writes import ensure_run, finish_step, set_run_status, start_attempt

    write_spec(tmp_path / "dags", ledger_table)
    model = bind_ledger(ledger_table)
    key = "s3://b/in/" + HOSTILE["key_name"]
    ensure_run(model, "p", "run-1")
    start_attempt(
        model,
        "p",
        "run-1",
        "score",
        1,
        [(key, 10), ("s3://b/in/good.parquet", 10)],
        plan_json=json.dumps(
            {
                "input_prefix": "s3://b/in/",
                "output_prefix": "s3://b/out/",
                "model_uri": "s3://b/model.tar.gz",
                "requested_instances": 1,
            }
        ),
    )
    worker = WorkerLedger(
        LedgerContext(ledger_table, "p", "run-1", "score", 1, input_uri="s3://b/in/"), HOSTILE["host"]
    )
    worker.claim_file(HOSTILE["key_name"])
    worker.finish_file(
        HOSTILE["key_name"],
        FileOutcome(FileStatus.FAILED, error_class=HOSTILE["error_class"], error_message=HOSTILE["error_message"]),
    )
    finish_step(model, "p", "run-1", "score", 1, StepStatus.FAILED, HOSTILE["step_message"])
    set_run_status(model, "p", "run-1", StepStatus.FAILED, HOSTILE["run_message"])
    # A second run, still going, with a STEP item of a hostile name: what `cancel` lists.
    ensure_run(model, "p", "run-2")
    start_attempt(model, "p", "run-2", HOSTILE["step_name"], 1, [])
    env = {**aws_env, "SHARDLINE_LOCAL_ROOT": str(tmp_path / "local"), "COLUMNS": "400"}  # wide: no cell folds
    return ["--dags-folder", str(tmp_path / "dags")], env, key


def test_ledger_text_is_printed_as_written_never_as_markup_or_terminal_controls(hostile_run):
    folder, env, key = hostile_run
    runs = run(*folder, "runs", env=env)
    assert runs.returncode == 0, runs.stderr
    # The column is shortened to fit, which turns whitespace (\r too) into single spaces.
    assert_printed_as_written(runs.stdout, LINK, "\\x1b[2J", " \\x08\\u202e")

    status = run(*folder, "status", "p/run-1", env=env)
    assert status.returncode == 0, status.stderr
    assert_printed_as_written(status.stdout, f"  {LINK}\\x1b[2J", f"step score: {MARKUP} {LINK}\\x1b[2J")

    failed = run(*folder, "failed", "p/run-1", env=env)
    assert failed.returncode == 0, failed.stderr
    printed_key = (
        key.replace("\x1b", "\\x1b")
        .replace("\x07", "\\x07")
        .replace("\r", "\\r")
        .replace("\b", "\\x08")
        .replace("\u202e", "\\u202e")
    )
    # (the ERROR cell may wrap at a space: its parts are looked for one by one)
    assert_printed_as_written(
        failed.stdout,
        printed_key,
        f"Corrupt{MARKUP}Error: row 7: {LINK}",
        "\\x1b[2J\\x1b]8;;",
        ":warning:",
        "algo-1\\x1b[2J",
    )

    resubmit = run(
        *folder, "resubmit", "p/run-1", "--step", "score", "--all-failed", "--dry-run", "--ledger-only", env=env
    )
    assert resubmit.returncode == 0, resubmit.stderr
    assert_printed_as_written(resubmit.stdout, f"  {printed_key}")

    cancel = run(*folder, "cancel", "p/run-2", "--yes", env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert_printed_as_written(cancel.stdout, f"step sc{MARKUP}\\x1b[2J")


def test_json_output_keeps_ledger_text_exact_and_escaped(hostile_run):
    folder, env, key = hostile_run
    failed = run(*folder, "failed", "p/run-1", "--json", env=env)
    assert failed.returncode == 0, failed.stderr
    assert "\x1b" not in failed.stdout and "\r" not in failed.stdout  # JSON writes them as \u001b, \r
    [row] = [r for r in json.loads(failed.stdout) if r["status"] == "FAILED"]
    assert (row["input_key"], row["host"], row["error_class"], row["error_message"]) == (
        key,
        HOSTILE["host"],
        HOSTILE["error_class"],
        HOSTILE["error_message"],
    )
    status = json.loads(run(*folder, "status", "p/run-1", "--json", env=env).stdout)
    assert (status["message"], status["steps"][0]["message"]) == (HOSTILE["run_message"], HOSTILE["step_message"])


def test_an_error_message_prints_terminal_controls_escaped(hostile_run):
    folder, env, _ = hostile_run
    result = run(*folder, "status", f"p/nope{CONTROLS}", env=env)
    assert result.returncode == 1
    assert_printed_as_written(result.stderr, "no run p/nope\\x1b[2J")


def test_a_malformed_run_name_is_a_usage_error():
    result = run("--dags-folder", str(REPO / "dags"), "status", "tabular_scoring_hourly")
    assert result.returncode == 2 and "is not a run name" in result.stderr, result.stderr


def test_login_never_takes_a_secret_from_the_command_line(tmp_path):
    refused = run(
        "login",
        "https://airflow.example.com",
        "--token",
        "eyJsecret",
        env={"SHARDLINE_AIRFLOW_CONFIG": str(tmp_path / "login.json")},
    )
    assert refused.returncode == 2, refused.stderr
    assert "--token-stdin" in refused.stderr and "ps" in refused.stderr
    assert not (tmp_path / "login.json").exists()


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("http://airflow.example.com:8080", True),
        ("http://10.0.0.7:8080", True),
        ("https://airflow.example.com", False),
        ("http://localhost:8080", False),
        ("http://127.0.0.1:8080", False),
        ("http://[::1]:8080", False),
    ],
)
def test_login_warns_before_sending_secrets_over_plain_http_to_another_host(url, warned):
    from shardline.oncall.cli import plain_http_warning

    warning = plain_http_warning(url)
    assert bool(warning) == warned, (url, warning)
    if warned:
        assert warning.startswith("WARNING:") and "unencrypted" in warning and "https://" in warning


def test_the_core_install_runs_the_cli_without_the_report_libraries():
    """`pip install shardline` (no extras) has no numpy or matplotlib: every command still imports."""
    code = (
        "import sys; sys.modules['numpy'] = None; sys.modules['matplotlib'] = None; "
        "import shardline.oncall.cli, shardline.oncall.service"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
