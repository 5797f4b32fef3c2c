"""``python -m shardline.worker``: the worker's command line. Imported by another name (a spawned pool worker imports
it as ``__mp_main__``), it neither runs the job nor imports the command line."""

from __future__ import annotations

import subprocess
import sys


def test_python_m_shardline_worker_answers_help():
    done = subprocess.run(
        [sys.executable, "-m", "shardline.worker", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m shardline.worker")
    assert "--input-dir" in done.stdout and "--model-dir" in done.stdout


def test_imported_by_another_name_it_runs_nothing_and_imports_no_command_line():
    code = (
        "import runpy, sys\nrunpy.run_module('shardline.worker.__main__', run_name='__mp_main__')\n"
        "print('shardline.worker.job.cli' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
