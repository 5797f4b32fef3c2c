"""The `shardline` command as installed (its console script), run in a subprocess like a person would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import CLI, REPO, run, write_spec


@pytest.mark.parametrize(
    "command",
    [
        "runs",
        "status",
        "failed",
        "report",
        "resubmit",
        "cancel",
        "preview",
        "tune",
        "local",
        "checks",
        "approve",
        "table",
    ],
)
def test_every_command_has_help(command):
    result = run(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: shardline {command}" in result.stdout
    assert len(result.stdout.splitlines()) > 5


def test_python_dash_m_knows_every_command_the_console_script_knows():
    """Inside an Airflow container on-call runs `python -m shardline.oncall.cli` (docker-compose.yaml says so): a
    command defined below the module's `__main__` block would be missing there, and only there."""
    script = run("--help")
    module = subprocess.run(
        [sys.executable, "-m", "shardline.oncall.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert module.returncode == 0, module.stderr
    assert module.stdout == script.stdout


def test_resubmit_needs_exactly_one_selection():
    result = run("resubmit", "p/r", "--step", "score")
    assert result.returncode == 2
    assert "one of the arguments --all-failed --instance --file --rejects is required" in result.stderr
    both = run("resubmit", "p/r", "--step", "score", "--all-failed", "--file", "a.parquet")
    assert both.returncode == 2 and "argument --file: not allowed with argument --all-failed" in both.stderr
    assert "usage: shardline resubmit" in both.stderr
    # --shard, the old name of --instance, still chooses an instance (and is not listed in --help).
    old = run("resubmit", "p/r", "--step", "score", "--all-failed", "--shard", "algo-1")
    assert old.returncode == 2 and "argument --instance: not allowed with argument --all-failed" in old.stderr
    assert "--shard" not in run("resubmit", "--help").stdout


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


def test_an_unknown_run_says_how_to_find_the_right_one(aws_env, ledger_table, tmp_path):
    write_spec(tmp_path / "dags", ledger_table)
    result = run("--dags-folder", str(tmp_path / "dags"), "status", "p/nope", env=aws_env)
    assert result.returncode == 1
    assert "no run p/nope" in result.stderr and "shardline runs --pipeline p" in result.stderr
    other = run("--dags-folder", str(tmp_path / "dags"), "status", "q/nope", env=aws_env)
    assert other.returncode == 1 and "no pipeline 'q'" in other.stderr
    empty = run("--dags-folder", str(tmp_path / "dags"), "runs", env=aws_env)
    assert empty.returncode == 0 and "no runs recorded yet" in empty.stdout


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
    from shardline.oncall.messages import plain_http_warning

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


def test_failed_of_a_red_run_prints_what_happened_and_the_rerun_command(aws_env, ledger_table, tmp_path):
    from tests.support.oncall_runs import red_run

    write_spec(tmp_path / "dags", ledger_table)
    red_run(ledger_table, "run-p", scored=False)
    red_run(ledger_table, "run-s", scored=True)
    planless = run("--dags-folder", str(tmp_path / "dags"), "failed", "p/run-p", env=aws_env)
    assert planless.returncode == 1 and "check the run name" not in planless.stderr
    assert "no step of p/run-p was planned" in planless.stderr and "shardline rerun p/run-p" in planless.stderr
    scored = run("--dags-folder", str(tmp_path / "dags"), "failed", "p/run-s", env=aws_env)
    assert scored.returncode == 0, scored.stderr
    assert "nothing to resubmit; yet the run ended FAILED" in scored.stdout
    assert "`shardline rerun p/run-s`" in scored.stdout
    assert (
        json.loads(run("--dags-folder", str(tmp_path / "dags"), "failed", "p/run-s", "--json", env=aws_env).stdout)
        == []
    )


def test_a_baseline_is_made_from_a_local_file_and_a_malformed_request_is_a_usage_error(aws_env, ledger_table, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardline.ledger.baselines import read_baseline
    from shardline.ledger.table import bind_ledger

    write_spec(tmp_path / "dags", ledger_table)
    folder = ("--dags-folder", str(tmp_path / "dags"))
    incomplete = run(*folder, "checks", "baseline", "p", "--step", "score", env=aws_env)
    assert (
        incomplete.returncode == 2 and "shardline checks baseline PIPELINE --step STEP --from URI" in incomplete.stderr
    )
    missing = run(
        *folder, "checks", "baseline", "p", "--step", "score", "--from", str(tmp_path / "no.parquet"), env=aws_env
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr
    pq.write_table(pa.table({"prediction": [0.1, 0.4, 0.9], "label": ["a", "b", "a"]}), tmp_path / "v.parquet")
    made = run(
        *folder, "checks", "baseline", "p", "--step", "score", "--from", str(tmp_path / "v.parquet"), env=aws_env
    )
    assert made.returncode == 0, made.stderr
    assert f"baseline of p step score: 3 rows of {tmp_path / 'v.parquet'} (prediction, label)" in made.stdout
    kept = read_baseline(bind_ledger(ledger_table), "p", "score")
    assert kept["profile"]["outputs"]["label"]["labels"] == {"a": 2, "b": 1}
