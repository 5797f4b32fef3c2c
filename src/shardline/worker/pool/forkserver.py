"""The CPU pool's forkserver, started by the main process as its first act.

CPU workers fork from a forkserver that imported the worker's code and the model's library and
loaded the verified model once (``worker/pool/preload.py``). Started when the pool is created, all of
that waited for the main process's own start-up: its imports, the model's verification, the
input's footers. Started right after the command line is parsed (:func:`start_early`), the two
run side by side, one core each. The library is chosen from the model directory's file names, so
it is imported while the main process still verifies the artifact; a library import runs none of
the model's code. The model itself is loaded only once the main process hands the verified
artifact over (:func:`hand_over`), exactly as when the forkserver starts with the pool.

The hand-over is a file in a directory of the main process's own (mode 0700) that the forkserver
waits for. A forkserver started early and never handed a model (a preview, a setup error, a GPU
pool that spawns) loads nothing, and ends with the main process.

This module is imported before anything heavy: it must stay light (no numpy, no pyarrow).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import shutil
import tempfile
from pathlib import Path

from shardline.worker.pool import devices

HANDOVER_ENV = "SHARDLINE_WORKER_HANDOVER"  # the file the main process writes the verified model's key to
MODEL_DIR_ENV = "SHARDLINE_WORKER_MODEL_DIR"  # where the forkserver guesses the model's library from
PARENT_ENV = "SHARDLINE_WORKER_PARENT"  # the main process: the forkserver stops waiting when it is gone
PIN_ENV = "SHARDLINE_WORKER_PIN"  # the pinned sha256: the forkserver reads a tarball's names only if it has it
# What the forkserver imports before it forks the first worker: the one-thread caps (before numpy reads them),
# the worker's code (pyarrow with it), the compute functions and threadpoolctl its first batch uses, then the
# library and the model.
PRELOAD_MODULES = [
    "shardline.worker.pool.one_thread",
    "shardline.worker.pool.process",
    "pyarrow.compute",
    "threadpoolctl",
    "shardline.worker.pool.preload_now",
]

_handover: Path | None = None  # set once the forkserver's environment names it
_handed_over = False
_started_early = False


def preload_key(artifact, probabilities: bool) -> str:
    """What the forkserver loads, and what a worker checks it got: the verified artifact and its options."""
    return json.dumps([dataclasses.asdict(artifact), probabilities], sort_keys=True)


def start_early(*, model_dir: Path, pinned_sha256: str | None, start_method: str, use_gpu: bool) -> bool:
    """Start the forkserver now if the pool will fork its workers from one; True if it started.

    ``auto`` forks CPU workers and spawns GPU workers; whether this instance has a GPU is only known
    for sure later (``nvidia-smi``), so a machine that may have one starts nothing here, and the
    pool starts its own forkserver or spawns, as it decides then.
    """
    global _started_early

    if _started_early or start_method == "spawn" or "forkserver" not in mp.get_all_start_methods():
        return _started_early
    if start_method == "auto" and use_gpu and devices.may_have_gpus(os.environ):
        return False
    _prepare_environment(model_dir, pinned_sha256)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD_MODULES)
    from multiprocessing import forkserver

    forkserver.ensure_running()
    _started_early = True
    return True


def started_early() -> bool:
    return _started_early


def hand_over(artifact, probabilities: bool) -> None:
    """Name the verified model to the forkserver, once: a forkserver already running loads it now; one not
    yet started (the pool starts it) finds it when it starts."""
    global _handed_over
    if _handed_over:
        return  # the forkserver loads one model per process; a worker given another loads its own
    if _handover is None:
        _prepare_environment(Path(artifact.root), artifact.sha256)
        mp.get_context("forkserver").set_forkserver_preload(PRELOAD_MODULES)
    _write(preload_key(artifact, probabilities))
    _handed_over = True


def _write(text: str) -> None:
    partial = _handover.with_suffix(".partial")
    partial.write_text(text)
    os.replace(partial, _handover)  # the forkserver never reads half a key


def _give_up() -> None:
    """At exit without a hand-over: tell a waiting forkserver so, before the directory goes (once it is gone,
    another user could make one of the same name)."""
    if not _handed_over and _handover is not None:
        with contextlib.suppress(OSError):  # the directory went already: a forkserver then sees the parent gone
            _write("null")


def _prepare_environment(model_dir: Path, pinned_sha256: str | None) -> None:
    """The forkserver reads its orders from the environment it starts with."""
    global _handover
    folder = Path(tempfile.mkdtemp(prefix="shardline-handover-"))  # mode 0700, a name no one else can take
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    atexit.register(_give_up)  # runs first: atexit goes in reverse
    _handover = folder / "model.json"
    os.environ.update(
        {
            HANDOVER_ENV: str(_handover),
            MODEL_DIR_ENV: str(model_dir),
            PARENT_ENV: str(os.getpid()),
            PIN_ENV: (pinned_sha256 or "").strip(),
        }
    )
