"""Worker slots: how many worker processes to start and which device each one owns.

Pure functions, so the GPU assignment can be tested with a simulated device count on a
machine without GPUs.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Mapping

from shardline.errors import SetupError

# Model kinds that can run on a GPU. scikit-learn cannot.
GPU_CAPABLE_KINDS = frozenset({"torch", "xgboost", "custom"})
ENV_SIMULATED_GPUS = "SHARDLINE_SIMULATED_GPUS"


@dataclasses.dataclass(frozen=True)
class WorkerSlot:
    """One worker process: its index, the GPU it is pinned to (if any), its thread budget."""

    index: int
    threads: int
    gpu: str | None = None  # value for CUDA_VISIBLE_DEVICES, or None for a CPU worker

    @property
    def label(self) -> str:
        return f"gpu{self.gpu}" if self.gpu is not None else "cpu"


def visible_gpus(env: Mapping[str, str], detected_count: int) -> list[str]:
    """The GPU ids this instance may use.

    ``CUDA_VISIBLE_DEVICES`` wins when set (an empty value or ``-1`` hides every GPU).
    ``SHARDLINE_SIMULATED_GPUS=N`` pretends N devices exist, for tests on CPU machines.
    """
    if ENV_SIMULATED_GPUS in env:
        return [str(i) for i in range(int(env[ENV_SIMULATED_GPUS]))]
    if "CUDA_VISIBLE_DEVICES" in env:
        ids = [part.strip() for part in env["CUDA_VISIBLE_DEVICES"].split(",") if part.strip()]
        return [] if ids in ([], ["-1"]) else ids
    return [str(i) for i in range(detected_count)]


def may_have_gpus(env: Mapping[str, str]) -> bool:
    """Whether :func:`visible_gpus` might find a GPU, asked without running ``nvidia-smi`` (which takes a while)."""
    return bool(visible_gpus(env, 1 if shutil.which("nvidia-smi") else 0))


def detect_gpu_count() -> int:
    """Count NVIDIA GPUs without initialising CUDA in this process (so children can pin)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def plan_slots(
    *,
    cpu_count: int,
    gpus: list[str],
    model_kind: str,
    workers: int | None = None,
    threads_per_worker: int | None = None,
    use_gpu: bool = True,
) -> list[WorkerSlot]:
    """Choose worker slots so that workers x threads never exceeds the cores.

    With GPUs and a GPU-capable model: one worker per GPU, each pinned to its device,
    sharing the cores between them for decode and encode. Otherwise one single-threaded
    worker per core, which beats fewer multi-threaded workers because parquet decode,
    the model and the writer all run in parallel across files.
    """
    if cpu_count < 1:
        raise SetupError(f"cpu_count must be >= 1, got {cpu_count}")
    if workers is not None and workers < 1:
        raise SetupError(f"--workers must be >= 1, got {workers}")
    if threads_per_worker is not None and threads_per_worker < 1:
        raise SetupError(f"--threads-per-worker must be >= 1, got {threads_per_worker}")

    on_gpu = use_gpu and bool(gpus) and model_kind in GPU_CAPABLE_KINDS
    if on_gpu:
        count = workers or len(gpus)
        threads = threads_per_worker or max(1, cpu_count // count)
        # More workers than GPUs share devices round-robin.
        return [WorkerSlot(index=i, threads=threads, gpu=gpus[i % len(gpus)]) for i in range(count)]

    if workers is None:
        workers = max(1, cpu_count // threads_per_worker) if threads_per_worker else cpu_count
    threads = threads_per_worker or max(1, cpu_count // workers)
    return [WorkerSlot(index=i, threads=threads) for i in range(workers)]


def thread_cap_env(threads: int) -> dict[str, str]:
    """Environment that caps every native thread pool a model library may start."""
    value = str(threads)
    return {
        "OMP_NUM_THREADS": value,
        "OPENBLAS_NUM_THREADS": value,
        "MKL_NUM_THREADS": value,
        "VECLIB_MAXIMUM_THREADS": value,
        "NUMEXPR_NUM_THREADS": value,
    }


def cpu_count() -> int:
    """Cores this process may use (honours cgroup/affinity limits, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
