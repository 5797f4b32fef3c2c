"""The `shardline` commands for before launch and for the machine (``shardline.oncall.cli_tools``): ``preview``,
``tune``, ``local`` and ``fleet``, and what each says when what it needs is not there."""

from __future__ import annotations

import pytest

from shardline.oncall.cli import main
from tests.support.cli import REPO, run


def test_preview_of_an_unknown_pipeline_or_step_lists_the_known_ones():
    result = run("--dags-folder", str(REPO / "dags"), "preview", "no_such_pipeline")
    assert result.returncode == 1
    assert "no pipeline 'no_such_pipeline'" in result.stderr and "tabular_scoring_hourly" in result.stderr
    result = run("--dags-folder", str(REPO / "dags"), "preview", "daily_churn", "--step", "nope")
    assert result.returncode == 1 and "(steps: score, calibrate)" in result.stderr


@pytest.mark.parametrize(("action", "verb"), [("show", "read"), ("sync", "synced")])
def test_fleet_without_airflow_changes_nothing_and_says_how_to_give_it_access(
    action, verb, tmp_path, monkeypatch, capsys
):
    for name in ("SHARDLINE_AIRFLOW_URL", "SHARDLINE_AIRFLOW_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SHARDLINE_AIRFLOW_CONFIG", str(tmp_path / "no-login.json"))
    assert main(["--dags-folder", str(REPO / "dags"), "fleet", action]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"shardline fleet: Airflow is not configured, so no pool was {verb}: `shardline login URL`")
    assert "airflow pools set sagemaker-TYPE QUOTA" in err


def test_local_status_of_a_stack_never_started_says_how_to_start_it(tmp_path, capsys):
    assert main(["local", "status", "--state-dir", str(tmp_path / "state")]) == 1
    assert capsys.readouterr().out.strip() == "the embedded stack is down; start it with: shardline local up"
