"""`shardline local` (``shardline.oncall.local_stack``): the embedded AWS stack started, found from any
directory, and stopped, through the installed command."""

from __future__ import annotations

import re
import time

import boto3
import pytest

from tests.support.cli import REPO, run


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
