"""What the CPU pool's forkserver loads once, before it forks the pool's workers.

Each worker of a spawned pool starts a fresh interpreter, imports the model's library and loads
the model again: about a second per worker for scikit-learn or torch, every time the pool is
(re)built. A CPU pool instead forks its workers from a forkserver that imported this module:
the library is imported, and the model (already verified by the main process) loaded, once;
every worker starts with both in its memory, shared copy-on-write.

The forkserver is a clean process of its own (no threads of the main process, no CUDA), and
nothing here computes a prediction, so no thread pool exists yet when it forks: each worker's
OpenMP/BLAS pools start in the worker, under its own thread cap. GPU pools still spawn.

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
    key: str  # what was asked for: preload_key() of the artifact, threads and options
    predictor: object
    started_at: float
    imported_at: float
    loaded_at: float


def preload_key(artifact, threads: int, probabilities: bool) -> str:
    return json.dumps([dataclasses.asdict(artifact), threads, probabilities], sort_keys=True)


def _preload() -> Preloaded | None:
    request = os.environ.get(ENV)
    if not request:
        return None
    started_at = time.time()
    from shardline.worker.devices import thread_cap_env
    from shardline.worker.models import ModelArtifact, import_library, load_predictor

    artifact, threads, probabilities = json.loads(request)
    artifact = ModelArtifact(**artifact)
    if artifact.kind not in ("sklearn", "xgboost", "torch"):
        return None  # a custom inference.py runs user code at load: each worker runs it itself
    os.environ.update(thread_cap_env(threads))  # before the library's thread pools read them
    import_library(artifact.kind)
    imported_at = time.time()
    predictor = load_predictor(artifact, threads=threads, device="cpu", probabilities=probabilities)
    return Preloaded(request, predictor, started_at, imported_at, time.time())


try:
    preloaded = _preload()
except Exception:  # noqa: BLE001 - each worker then loads the model itself, and reports why it cannot
    preloaded = None
