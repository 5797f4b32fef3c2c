"""The embedded AWS endpoint: moto's standalone server on a free loopback port.

Started by the project itself (tests, ``make demo``) and reached over HTTP by the real
boto3 and pynamodb clients, exactly as they would reach AWS. It handles one request at a
time (``moto_atomic``), so a conditional write is atomic, as DynamoDB's are.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from shardline.errors import ShardlineError
from shardline.local import tether
from shardline.waiting import end_processes, wait_for

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


class EmbeddedAwsError(ShardlineError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_http(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP status means the server is up
    except (urllib.error.URLError, OSError):
        return False


MOTO_MODULE = "shardline.local.moto_atomic"  # moto's server, one request at a time


def moto_server_command(port: int, state_dir: Path | None = None) -> list[str]:
    """moto's standalone server on 127.0.0.1:``port``, one request at a time (``shardline.local.moto_atomic``);
    with ``state_dir``, its S3 and DynamoDB state is kept there across restarts (``shardline.local.moto_state``)."""
    if not all(_installed(name) for name in ("moto", "moto.server", "flask", "flask_cors")):
        raise EmbeddedAwsError(
            f"moto's server is not installed for {sys.executable}: install the `local` extra (pip install "
            "'shardline[local]' -c constraints.txt), or run `make venv` in a checkout"
        )
    command = [sys.executable, "-m", MOTO_MODULE, "-p", str(port), "-H", "127.0.0.1"]
    return command + (["--state-dir", str(state_dir)] if state_dir is not None else [])


def is_moto_command(cmdline: list[str]) -> bool:
    """Whether a process's command line is the embedded endpoint's (or a plain ``moto_server``)."""
    return MOTO_MODULE in cmdline or any(Path(part).name == "moto_server" for part in cmdline)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def start_moto(
    log_path: Path,
    *,
    port: int | None = None,
    timeout: float = 60.0,
    tethered: bool = False,
    state_dir: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start moto_server in its own session and wait until it answers; returns (process, url). ``tethered``: it ends
    when this process does, however this process ends (:mod:`shardline.local.tether`); else it outlives it (`shardline
    local up`). ``state_dir``: its state is put back from there and kept there; without one it starts empty and
    keeps nothing."""
    port = port or free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = moto_server_command(port, state_dir)
    if tethered:
        command = tether.tethered(command)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def answered() -> bool:
        if proc.poll() is not None:
            raise EmbeddedAwsError(f"moto_server exited with code {proc.returncode}; see {log_path}")
        return answers(url)

    if not wait_for(answered, timeout=timeout):
        end_processes([proc], grace=0)
        raise EmbeddedAwsError(f"moto_server did not answer on {url} within {timeout:.0f}s; see {log_path}")
    return proc, url


def answers(url: str) -> bool:
    """Whether a moto_server answers at ``url``."""
    return _answers_http(url.rstrip("/") + "/moto-api/")


def env_for(url: str) -> dict[str, str]:
    """The environment that points boto3 and pynamodb at the endpoint."""
    return {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": url}


@contextlib.contextmanager
def embedded_aws(
    log_path: Path, *, port: int | None = None, timeout: float = 60.0, state_dir: Path | None = None
) -> Iterator[dict[str, str]]:
    """Run moto_server for the duration of the block (and never past this process's life); yield the environment
    that reaches it."""
    proc, url = start_moto(log_path, port=port, timeout=timeout, tethered=True, state_dir=state_dir)
    try:
        yield env_for(url)
    finally:
        end_processes([proc], grace=15)


def apply_env(env: dict[str, str]) -> None:
    """Point this process's AWS clients at the embedded endpoint."""
    os.environ.update(env)
    os.environ.pop("AWS_PROFILE", None)
