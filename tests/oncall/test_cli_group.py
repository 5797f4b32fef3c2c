"""The `shardline` command group (``shardline.oncall.cli_group``): its help, and the one place that prints a
command's reply (as JSON with ``--json``) and turns an error into its message and exit code."""

from __future__ import annotations

import json
import re

import pytest

from shardline.oncall.cli import main
from tests.support.cli import run, write_spec


def test_top_level_help_shows_the_on_call_flow():
    out = run("--help").stdout
    for command in ("runs", "status", "failed", "resubmit", "cancel", "preview", "local"):
        assert re.search(rf"^\s+{command}\s", out, re.M), command
    assert "on-call flow:" in out and "SHARDLINE_AIRFLOW_URL" in out
    assert "shardline preview tabular_scoring_hourly" in out


@pytest.fixture
def no_airflow(monkeypatch, tmp_path):
    """No Airflow the CLI could find: no URL, no token, no login file."""
    for name in ("SHARDLINE_AIRFLOW_URL", "SHARDLINE_AIRFLOW_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SHARDLINE_AIRFLOW_CONFIG", str(tmp_path / "no-login.json"))


def test_an_on_call_error_is_its_message_on_stderr_and_its_exit_code(tmp_path, capsys, no_airflow):
    write_spec(tmp_path / "dags", "shardline-unused")
    assert main(["--dags-folder", str(tmp_path / "dags"), "status", "q/run-1"]) == 1  # NotFound's exit code
    said = capsys.readouterr()
    assert said.err.startswith("shardline status: no pipeline 'q'") and said.out == ""
    assert main(["--dags-folder", str(tmp_path / "dags"), "status", "no-slash"]) == 2  # BadRequest's
    assert "shardline status: " in capsys.readouterr().err


def test_a_reply_prints_as_a_table_or_with_json_as_its_data(aws_env, ledger_table, tmp_path, capsys, no_airflow):
    write_spec(tmp_path / "dags", ledger_table)
    assert main(["--dags-folder", str(tmp_path / "dags"), "runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["--dags-folder", str(tmp_path / "dags"), "runs"]) == 0
    assert "no runs recorded yet" in capsys.readouterr().out


def test_an_aws_error_says_where_the_cli_looked_and_what_to_check(aws_env, tmp_path, capsys, no_airflow):
    write_spec(tmp_path / "dags", "shardline-test-no-such-table")
    assert main(["--dags-folder", str(tmp_path / "dags"), "runs"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardline runs: AWS refused or could not be reached: "), err
    assert f"it talked to the endpoint {aws_env['AWS_ENDPOINT_URL']} (AWS_ENDPOINT_URL" in err
    assert f"the ledger table's name in the pipeline specs under {tmp_path / 'dags'}" in err
