"""End to end through real Airflow (dag.test) on moto_server and the local backend.

`python -m shardline.demo` is what `make demo` runs: it kills one instance of the first
attempt, and the sensor must resubmit exactly the unfinished files and finish green
with every row accounted for.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_pipeline_recovers_a_killed_instance(tmp_path):
    result = subprocess.run([sys.executable, "-m", "shardline.demo", "--workdir", str(tmp_path / "demo")],
                            capture_output=True, text=True, timeout=600, check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert "killed instance algo-2 of attempt 1" in out
    assert "go to attempt 2 of 3" in out
    assert "files             24 (24 succeeded, 0 failed)" in out
    assert "rows in / out     1,200,000 / 1,200,000" in out
    assert "attempts          2 (2 processing job(s))" in out
