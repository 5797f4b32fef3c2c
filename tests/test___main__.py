"""``python -m shardline``: the on-call CLI, as the ``shardline`` command runs it."""

from __future__ import annotations

import re
import subprocess
import sys


def test_python_m_shardline_is_the_on_call_cli():
    done = subprocess.run(
        [sys.executable, "-m", "shardline", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: shardline [OPTIONS] COMMAND [ARGS]...")
    for command in ("runs", "status", "failed", "resubmit", "cancel", "preview", "local"):
        assert re.search(rf"^\s+{command}\s", done.stdout, re.M), command
