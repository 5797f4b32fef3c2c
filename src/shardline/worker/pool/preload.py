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
started when ``shardline.worker.pool.process`` is imported, are fork-safe: Arrow re-creates its pools in
a forked child.) GPU pools still spawn.

The forkserver learns what to load from the main process (``worker/pool/forkserver.py``): the model
directory, to guess the library from and import it at once, and then, in a file of the main
process's own, the verified artifact. A worker uses the preloaded model only if it is the very
artifact, thread count and options its job verified; anything else is loaded afresh.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path, PurePosixPath

from shardline.worker.pool.forkserver import HANDOVER_ENV, MODEL_DIR_ENV, PARENT_ENV, PIN_ENV

PRELOADABLE = ("sklearn", "xgboost", "torch")  # a custom inference.py's model_fn runs in each worker

HANDOVER_POLL_SECONDS = 0.005
HANDOVER_TIMEOUT_SECONDS = 1800.0  # verifying a model of many GB takes a while; a worker loads its own after this


@dataclasses.dataclass(frozen=True)
class Preloaded:
    key: str  # what was asked for: forkserver.preload_key() of the artifact and options
    predictor: object
    started_at: float
    imported_at: float  # the guessed library is imported (the model's own kind, if the guess was wrong)
    handed_over_at: float  # the main process named the verified model
    loaded_at: float
    threads_started: int  # OS threads the library's import and the model's load started: 0, or a fork is unsafe
    threads_before: int  # OS threads the forkserver had before that: its own and Arrow's (OpenBLAS's: capped)


def native_threads() -> int:
    """This process's OS threads (Linux), Python's and native libraries' alike."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def guess_kind(model_dir: str, pinned_sha256: str = "") -> str | None:
    """The model's kind from file names, before the main process has verified anything: the directory's, or
    a model.tar.gz's first members (nothing is extracted). A pinned tarball is read only if it has the pinned
    digest, as the main process reads it. None when no name tells."""
    from shardline.worker.model.loading import TARBALL, detect_kind, sha256_of

    root = Path(model_dir)
    try:
        if (root / TARBALL).is_file():
            if pinned_sha256 and sha256_of(root / TARBALL) != pinned_sha256.strip().lower():
                return None  # not the pinned artifact: the main process refuses it; parse none of it here
            return _guess_from_tarball(root / TARBALL)
        return detect_kind(root)[0]
    except Exception:  # noqa: BLE001 - a guess: the hand-over says what the model is
        return None


def _guess_from_tarball(path: Path, members: int = 32, large: int = 8 << 20) -> str | None:
    """custom if code/inference.py is among the first members (a script's model_fn loads its own libraries),
    else the kind of the first model file; reading stops before the data of a large member."""
    import tarfile

    from shardline.worker.model.loading import kind_of_name

    guess = None
    with tarfile.open(path, "r|gz") as archive:  # a stream: the next header is read after this member's data
        for number, member in enumerate(archive):
            name = PurePosixPath(member.name)
            if name.parts[-2:] == ("code", "inference.py"):
                return "custom"
            if guess is None and member.isfile():
                guess = kind_of_name(name)
            if number + 1 >= members or member.size > large:
                break
    return guess


def await_handover(path: Path, parent: int, timeout: float = HANDOVER_TIMEOUT_SECONDS) -> str | None:
    """The key the main process writes to ``path`` once it verified the model; None if it ends first, gives up
    (``null``), or the file is not the main process's own (its directory is, mode 0700)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if os.getppid() != parent:
                return None  # the main process ended without a pool (a preview, a setup error)
            time.sleep(HANDOVER_POLL_SECONDS)
            continue
        except OSError:
            return None  # a link (O_NOFOLLOW), or unreadable: no order of the main process's
        with os.fdopen(descriptor) as handover:
            folder = path.parent.stat(follow_symlinks=False)
            mine = os.fstat(descriptor).st_uid == folder.st_uid == os.getuid() and not folder.st_mode & 0o077
            text = handover.read()
        return text if mine and text != "null" else None
    return None


preloaded: Preloaded | None = None  # set in the forkserver only (worker/pool/preload_now.py); forked workers inherit it


def load_in_forkserver() -> Preloaded | None:
    """Import the library and load the model the main process hands over; None when there is nothing to load.

    Never raises: each worker then loads the model itself, and reports why it cannot.
    """
    try:
        return _load()
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def _load() -> Preloaded | None:
    handover, parent = os.environ.get(HANDOVER_ENV), os.environ.get(PARENT_ENV)
    if not handover or not parent or int(parent) == os.getpid():
        return None  # not in a forkserver of the worker's: nothing to load
    started_at = time.time()
    from shardline.worker.model.loading import ModelArtifact, import_library, load_predictor
    from shardline.worker.pool.devices import thread_cap_env

    # One thread everywhere, before any library reads its setting: nothing here may start a thread.
    os.environ.update(thread_cap_env(1))
    threads_before = native_threads()
    guess = guess_kind(os.environ.get(MODEL_DIR_ENV, ""), os.environ.get(PIN_ENV, ""))
    if guess in PRELOADABLE:
        import_library(guess)  # a library's import runs none of the model's code: safe before verification
    imported_at = time.time()
    request = await_handover(Path(handover), int(parent))
    handed_over_at = time.time()
    if request is None:
        return None
    artifact, probabilities = json.loads(request)
    artifact = ModelArtifact(**artifact)
    if artifact.kind not in PRELOADABLE:
        return None  # a custom inference.py runs user code at load: each worker runs it itself
    if artifact.kind != guess:
        import_library(artifact.kind)
        imported_at = handed_over_at = time.time()
    predictor = load_predictor(artifact, threads=1, device="cpu", probabilities=probabilities)
    return Preloaded(
        request,
        predictor,
        started_at,
        imported_at,
        handed_over_at,
        time.time(),
        native_threads() - threads_before,
        threads_before,
    )
