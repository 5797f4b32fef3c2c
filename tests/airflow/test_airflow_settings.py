"""Where the CLI finds Airflow: flags, then the environment, then the file `shardline login` keeps."""

from __future__ import annotations

import json
import stat

import pytest

from shardline.oncall.airflow_client import AirflowApiError, config_path, find_settings, save_login


def test_flags_win_over_the_environment_and_the_environment_over_the_login_file(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert find_settings(env=env) is None
    save_login("http://saved:8080/", "saved-token", env)
    saved = find_settings(env=env)
    assert (saved.url, saved.token, saved.source) == (
        "http://saved:8080",
        "saved-token",
        str(tmp_path / "shardline" / "airflow.json"),
    )
    env |= {"SHARDLINE_AIRFLOW_URL": "http://env:8080", "SHARDLINE_AIRFLOW_TOKEN": "env-token"}
    assert (find_settings(env=env).url, find_settings(env=env).source) == ("http://env:8080", "SHARDLINE_AIRFLOW_URL")
    flags = find_settings("http://flag:8080", "flag-token", env=env)
    assert (flags.url, flags.token, flags.source) == ("http://flag:8080", "flag-token", "--airflow-url")


def test_the_login_file_is_private_even_when_it_existed_before(tmp_path):
    env = {"SHARDLINE_AIRFLOW_CONFIG": str(tmp_path / "cfg" / "airflow.json")}
    path = config_path(env)
    path.parent.mkdir()
    path.write_text("{}")
    path.chmod(0o644)
    assert save_login("http://a:1", "t", env) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": "http://a:1", "token": "t"}


def test_a_broken_login_file_says_to_log_in_again(tmp_path):
    env = {"SHARDLINE_AIRFLOW_CONFIG": str(tmp_path / "airflow.json")}
    (tmp_path / "airflow.json").write_text("not json")
    with pytest.raises(AirflowApiError, match=r"run `shardline login URL` again"):
        find_settings(env=env)
