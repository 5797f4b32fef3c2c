"""What every `shardline` command shares (``shardline.oncall.cli_base``): its option types, the global options'
values, and the order `--help` lists the commands in."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click
import pytest

from shardline.oncall.cli_base import COMMAND_ORDER, Group, IsoDate, JsonObject, airflow_token_from, default_dags_folder
from tests.support.cli import REPO, run


def test_a_bad_logical_date_is_a_usage_error_that_shows_the_form():
    result = run("--dags-folder", str(REPO / "dags"), "preview", "daily_churn", "--logical-date", "yesterday")
    assert result.returncode == 2
    assert "expected an ISO date or time like 2026-11-22T10:00, got 'yesterday'" in result.stderr


def test_no_command_takes_an_airflow_token_on_its_command_line(tmp_path):
    refused = run("--airflow-token", "eyJsecret", "runs")
    assert refused.returncode == 2, refused.stderr
    assert "--airflow-token-file" in refused.stderr and "ps" in refused.stderr
    token = tmp_path / "token"
    token.write_text("eyJfromafile\n")
    # The token file is read (and the command then runs; with no Airflow there it says so, not a usage error).
    taken = run("--airflow-token-file", str(token), "--dags-folder", str(REPO / "dags"), "runs", "--json")
    assert taken.returncode != 2, taken.stderr


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        ("2026-11-22", dt.datetime(2026, 11, 22, tzinfo=dt.UTC)),  # a date alone is its midnight, UTC
        ("2026-11-22T10:00", dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)),
        ("2026-11-22T10:00+02:00", dt.datetime(2026, 11, 22, 8, tzinfo=dt.UTC)),  # an offset given is kept
    ],
)
def test_a_date_option_reads_iso_and_a_naive_time_is_utc(given, parsed):
    got = IsoDate().convert(given, None, None)
    assert got == parsed and got.tzinfo is not None


def test_a_date_option_refuses_anything_else_showing_the_form():
    with pytest.raises(click.BadParameter, match="expected an ISO date or time like 2026-11-22T10:00, got '22/11'"):
        IsoDate().convert("22/11", None, None)
    already = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
    assert IsoDate().convert(already, None, None) is already  # a default given as a datetime passes as it is


@pytest.mark.parametrize(
    ("given", "parsed"),
    [('{"instance_count": 2}', {"instance_count": 2}), ("{}", {}), ({"dry_run": True}, {"dry_run": True})],
)
def test_a_conf_option_reads_a_json_object(given, parsed):
    assert JsonObject().convert(given, None, None) == parsed


@pytest.mark.parametrize(
    ("given", "words"),
    [("[1, 2]", "give a JSON object, such as '{}'"), ('"text"', "give a JSON object"), ("{nope", "not JSON (")],
)
def test_a_conf_option_refuses_what_is_no_json_object(given, words):
    with pytest.raises(click.BadParameter, match=words.replace("(", r"\(")):
        JsonObject().convert(given, None, None)


def test_the_token_is_read_from_its_file_and_never_taken_from_the_command_line(tmp_path):
    token = tmp_path / "token"
    token.write_text("  eyJfromafile\n")
    assert airflow_token_from(token, None) == "eyJfromafile"
    token.write_text("\n")
    assert airflow_token_from(token, None) is None  # an empty file is no token
    assert airflow_token_from(None, None) is None
    with pytest.raises(click.BadParameter, match="visible in ps and kept in shell history"):
        airflow_token_from(token, "eyJsecret")


def test_the_dags_folder_is_shardlines_setting_then_airflows_then_dags_here(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SHARDLINE_DAGS_FOLDER", raising=False)
    monkeypatch.delenv("AIRFLOW__CORE__DAGS_FOLDER", raising=False)
    assert default_dags_folder() == tmp_path / "dags"
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", "/opt/airflow/dags")
    assert default_dags_folder() == Path("/opt/airflow/dags")
    monkeypatch.setenv("SHARDLINE_DAGS_FOLDER", "/srv/dags")
    assert default_dags_folder() == Path("/srv/dags")


def test_help_lists_the_on_call_flow_first_then_any_other_command():
    group = Group("shardline")
    for name in ("zeta", "fleet", "status", "runs"):
        group.add_command(click.Command(name))
    assert group.list_commands(click.Context(group)) == ["runs", "status", "fleet", "zeta"]
    assert COMMAND_ORDER[:3] == ("runs", "status", "failed")
