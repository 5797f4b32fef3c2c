"""The embedded AWS endpoint (``shardline.local.embedded_aws``): the command that starts moto's server, how a
process is recognised as one, and whether one answers (the session's moto_server, over HTTP)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from shardline.local.embedded_aws import (
    DUMMY_CREDENTIALS,
    MOTO_MODULE,
    answers,
    apply_env,
    env_for,
    free_port,
    is_moto_command,
    moto_server_command,
)


def test_the_server_runs_one_request_at_a_time_on_loopback_and_keeps_state_only_when_told(tmp_path):
    assert moto_server_command(5001) == [sys.executable, "-m", MOTO_MODULE, "-p", "5001", "-H", "127.0.0.1"]
    assert moto_server_command(5001, tmp_path)[-2:] == ["--state-dir", str(tmp_path)]
    assert MOTO_MODULE == "shardline.local.moto_atomic"


@pytest.mark.parametrize(
    ("cmdline", "moto"),
    [
        ([sys.executable, "-m", "shardline.local.moto_atomic", "-p", "5001"], True),
        (["/usr/local/bin/moto_server", "-p", "5000"], True),
        (["moto_server"], True),
        ([sys.executable, "-m", "shardline.worker"], False),
        (["/usr/bin/moto_server_helper"], False),
        ([], False),
    ],
)
def test_a_process_is_the_endpoint_by_its_command_line(cmdline, moto):
    assert is_moto_command(cmdline) is moto


def test_the_environment_that_reaches_it_holds_dummy_keys_never_real_ones():
    env = env_for("http://127.0.0.1:5001")
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:5001"
    assert {k: env[k] for k in DUMMY_CREDENTIALS} == DUMMY_CREDENTIALS
    assert env["AWS_ACCESS_KEY_ID"] == "testing"


def test_applying_it_points_this_process_there_and_drops_a_profile(monkeypatch):
    for name in (*DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.setenv(name, "before")  # restored after the test
    apply_env(env_for("http://127.0.0.1:5999"))
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:5999"
    assert os.environ["AWS_REGION"] == "us-east-1"
    assert "AWS_PROFILE" not in os.environ


def test_a_running_endpoint_answers_and_a_free_port_does_not(moto_endpoint):
    assert answers(moto_endpoint) and answers(moto_endpoint + "/")
    assert not answers(f"http://127.0.0.1:{free_port()}")


def test_the_launcher_refuses_without_moto_installed_naming_the_extra(tmp_path):
    """Run with a Python that has no moto: the project's own interpreter with the site-packages left out."""
    import subprocess

    code = (
        "from shardline.local.embedded_aws import EmbeddedAwsError, moto_server_command\n"
        "try:\n    moto_server_command(5001)\nexcept EmbeddedAwsError as err:\n    print(err)\n"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(src), "PATH": os.environ["PATH"]},
        timeout=60,
        check=False,
    )
    assert "moto's server is not installed" in done.stdout, done.stdout + done.stderr
    assert "shardline[local]" in done.stdout
