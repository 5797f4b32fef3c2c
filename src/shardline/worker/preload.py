"""What the CPU pool's forkserver loads once, before it forks the pool's workers.

Each worker of a spawned pool starts a fresh interpreter, imports the model's library and loads
the model again: about a second per worker for scikit-learn or torch, every time the pool is
(re)built. A CPU pool instead forks its workers from a forkserver that imported this module:
the library is imported, and the model (already verified by the main process) loaded, once;
every worker starts with both in its memory, shared copy-on-write.

The forkserver is a clean process of its own (no threads of the main process, no CUDA), and it must
stay single-threaded: GNU OpenMP's thread team does not survive a fork, so a worker forked from a
process whose OpenMP had started threads hangs in its first parallel region (loading an XGBoost
model runs one). So the forkserver imports and loads with every thread pool capped at one thread
(it never starts a thread), and each worker then sets its own count (``set_threads``, and
threadpoolctl's caps). ``threads_started`` records how many OS threads the import and the load
started in the forkserver: a test holds it at 0 for every model kind. (pyarrow's own threads,
started when ``shardline.worker.process`` is imported, are fork-safe: Arrow re-creates its pools in
a forked child.) GPU pools still spawn.

The main process names the model in :data:`ENV` just before the forkserver starts (the runner
overwrites whatever was there). A worker uses the preloaded model only if it is the very
artifact, thread count and options its job verified; anything else is loaded afresh.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

ENV = "SHARDLINE_WORKER_PRELOAD"


@dataclasses.dataclass(frozen=True)
class Preloaded:
    key: str  # what was asked for: preload_key() of the artifact and options
    predictor: object
    started_at: float
    imported_at: float
    loaded_at: float
    threads_started: int  # OS threads the library's import and the model's load started: 0, or a fork is unsafe


def preload_key(artifact, probabilities: bool) -> str:
    return json.dumps([dataclasses.asdict(artifact), probabilities], sort_keys=True)


def native_threads() -> int:
    """This process's OS threads (Linux), Python's and native libraries' alike."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _preload() -> Preloaded | None:
    request = os.environ.get(ENV)
    if not request:
        return None
    started_at = time.time()
    from shardline.worker.devices import thread_cap_env
    from shardline.worker.models import ModelArtifact, import_library, load_predictor

    artifact, probabilities = json.loads(request)
    artifact = ModelArtifact(**artifact)
    if artifact.kind not in ("sklearn", "xgboost", "torch"):
        return None  # a custom inference.py runs user code at load: each worker runs it itself
    # One thread everywhere, before any library reads its setting: nothing here may start a thread.
    os.environ.update(thread_cap_env(1))
    threads_before = native_threads()
    import_library(artifact.kind)
    imported_at = time.time()
    predictor = load_predictor(artifact, threads=1, device="cpu", probabilities=probabilities)
    return Preloaded(request, predictor, started_at, imported_at, time.time(), native_threads() - threads_before)


try:
    preloaded = _preload()
except Exception:  # noqa: BLE001 - each worker then loads the model itself, and reports why it cannot
    preloaded = None
