"""``shardline.worker.pool.one_thread``, the forkserver's first import: every native thread pool capped at one
thread, whatever the environment said, before numpy reads the setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shardline.worker.pool.devices import thread_cap_env


def test_importing_it_caps_every_native_pool_at_one_thread_over_what_was_set():
    code = (
        "import json, os, sys\nimport shardline.worker.pool.one_thread\n"
        "print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))"
    )
    names = sorted(thread_cap_env(1))
    env = {**os.environ, "OMP_NUM_THREADS": "8", "OPENBLAS_NUM_THREADS": "8"}
    done = subprocess.run(
        [sys.executable, "-c", code, *names], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == dict.fromkeys(names, "1")
    assert {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"} <= set(names)
