"""``shardline.worker.pool.preload_now``, imported by the CPU pool's forkserver only: importing it loads the model
the main process hands over. Outside a forkserver of the worker's, or when the main process gives up, it loads
nothing and never raises (each worker then loads its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shardline.worker.pool.forkserver import HANDOVER_ENV, MODEL_DIR_ENV, PARENT_ENV

IMPORT = (
    "import json, os\nfrom shardline.worker.pool import preload\nimport shardline.worker.pool.preload_now\n"
    "print(json.dumps({'preloaded': preload.preloaded is not None, 'omp': os.environ.get('OMP_NUM_THREADS')}))"
)


def _import_it(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in (HANDOVER_ENV, PARENT_ENV, MODEL_DIR_ENV)}
    clean.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(
        [sys.executable, "-c", IMPORT], env={**clean, **env}, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)


def test_outside_a_forkserver_importing_it_loads_nothing_and_caps_nothing():
    assert _import_it() == {"preloaded": False, "omp": None}


def test_in_a_forkserver_whose_main_process_gave_up_it_loads_nothing_after_capping_threads(tmp_path):
    folder = tmp_path / "handover"
    folder.mkdir(mode=0o700)
    (folder / "model").write_text("null")  # what the main process writes when it makes no pool
    (tmp_path / "model").mkdir()  # no file names a library: none is imported
    env = {HANDOVER_ENV: str(folder / "model"), PARENT_ENV: str(os.getpid()), MODEL_DIR_ENV: str(tmp_path / "model")}
    got = _import_it(**env)
    assert got == {"preloaded": False, "omp": "1"}  # it acted as the forkserver: one thread before anything loads
