"""The tether: a server the tests or `make demo` start never outlives what started it, however that ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardline.local.tether import tethered
from shardline.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal")

# A command whose own child leaves its process group (as uvicorn's workers do) but not its session; it prints both.
SERVER = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); time.sleep(600)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie nobody reaped yet (a container's init may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_server_ends_with_the_process_that_started_it_even_one_killed_outright(tmp_path):
    """The caller is SIGKILLed, so no clean-up of its runs: the tether, its command and the command's child end."""
    out = tmp_path / "pids"
    caller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"server = subprocess.Popen({tethered([sys.executable, '-c', SERVER])!r}, start_new_session=True, "
            f"stdout=open({str(out)!r}, 'w'))\n"
            f"open({str(out) + '.tether'!r}, 'w').write(str(server.pid))\n"
            "time.sleep(600)\n",
        ]
    )
    assert wait_for(lambda: out.exists() and out.read_text().strip() and Path(f"{out}.tether").exists(), timeout=60)
    tether, grandchild = int(Path(f"{out}.tether").read_text()), int(out.read_text().split()[0])
    assert not _gone(tether) and not _gone(grandchild)
    caller.kill()
    caller.wait()
    assert wait_for(lambda: _gone(tether) and _gone(grandchild), timeout=60), "the server outlived its caller"


def test_sigterm_ends_the_command_and_what_it_started_in_its_session():
    server = subprocess.Popen(
        tethered([sys.executable, "-c", SERVER]), start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    grandchild = int(server.stdout.readline())
    os.kill(server.pid, signal.SIGTERM)  # as a caller's clean-up stops it
    server.wait(timeout=60)
    assert wait_for(lambda: _gone(grandchild), timeout=60), "the command's child outlived the tether"


def test_it_refuses_to_end_a_session_that_is_not_its_own():
    refused = subprocess.run(tethered(["true"]), capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "a session of its own" in refused.stderr
