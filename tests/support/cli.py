"""The `shardline` command as installed (its console script), run in a subprocess as a person would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).with_name("shardline")
PIN = "a" * 64  # a pinned model digest, as a spec must give


def run(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # Without FORCE_COLOR (a developer's shell may set it) rich writes no styles into a pipe, so any ESC in the
    # output came from the data.
    here = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run(
        [str(CLI), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**here, "COLUMNS": "160", **(env or {})},
        cwd=cwd,
    )


def write_spec(dags: Path, ledger_table: str) -> None:
    """A one-step pipeline ``p`` over ``ledger_table``."""
    (dags / "pipelines").mkdir(parents=True)
    (dags / "pipelines" / "p.yaml").write_text(
        f"pipeline: p\nledger_table: {ledger_table}\nsteps:\n  - name: score\n"
        f"    model: {{uri: s3://b/m.tar.gz, sha256: {PIN}}}\n"
        "    input: {prefix: s3://b/in/}\n    output: {prefix: s3://b/out/}\n"
    )
