"""devices.py: which GPUs are visible and how worker slots are planned (unit), and GPU pinning with
simulated devices end to end."""

from __future__ import annotations

import itertools
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from examples import synthetic
from shardline.contract import EXIT_OK
from shardline.errors import SetupError
from shardline.worker.pool.devices import (
    ENV_SIMULATED_GPUS,
    GPU_CAPABLE_KINDS,
    WorkerSlot,
    cpu_count,
    plan_slots,
    thread_cap_env,
    visible_gpus,
)
from tests.support.helpers import (
    FEATURES,
    SYNTHETIC_COLUMNS,
    check_outputs,
    clean_env,
    describe,
    feature_matrix,
    load_manifest,
    run_worker,
)

# -- visible_gpus -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "detected", "expected"),
    [
        ({}, 0, []),
        ({}, 3, ["0", "1", "2"]),
        ({"CUDA_VISIBLE_DEVICES": "0,2"}, 4, ["0", "2"]),
        ({"CUDA_VISIBLE_DEVICES": " 1 , 3 ,"}, 4, ["1", "3"]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8f2c,GPU-aa01"}, 2, ["GPU-8f2c", "GPU-aa01"]),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 4, []),
        ({"CUDA_VISIBLE_DEVICES": ""}, 4, []),
        ({"CUDA_VISIBLE_DEVICES": "3"}, 0, ["3"]),  # the variable wins over detection
        ({ENV_SIMULATED_GPUS: "2"}, 0, ["0", "1"]),
        ({ENV_SIMULATED_GPUS: "0"}, 4, []),
        # simulation wins over both
        ({ENV_SIMULATED_GPUS: "3", "CUDA_VISIBLE_DEVICES": "-1"}, 1, ["0", "1", "2"]),
    ],
)
def test_visible_gpus(env, detected, expected):
    assert visible_gpus(env, detected) == expected


# -- plan_slots -------------------------------------------------------------------------------------------


def test_cpu_default_is_one_single_threaded_worker_per_core():
    assert plan_slots(cpu_count=4, gpus=[], model_kind="xgboost") == [WorkerSlot(i, 1) for i in range(4)]


def test_sklearn_never_goes_to_a_gpu():
    assert "sklearn" not in GPU_CAPABLE_KINDS
    slots = plan_slots(cpu_count=8, gpus=["0", "1"], model_kind="sklearn")
    assert len(slots) == 8
    assert all(s.gpu is None and s.label == "cpu" for s in slots)


@pytest.mark.parametrize("kind", ["torch", "xgboost", "custom"])
def test_one_worker_per_gpu_sharing_the_cores(kind):
    slots = plan_slots(cpu_count=16, gpus=["0", "1"], model_kind=kind)
    assert slots == [WorkerSlot(0, 8, "0"), WorkerSlot(1, 8, "1")]
    assert [s.label for s in slots] == ["gpu0", "gpu1"]


def test_gpu_ids_from_cuda_visible_devices_are_used_verbatim():
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}, 8)
    assert [s.gpu for s in plan_slots(cpu_count=4, gpus=gpus, model_kind="torch")] == ["2", "5"]


def test_more_workers_than_gpus_share_devices_round_robin():
    slots = plan_slots(cpu_count=12, gpus=["0", "1"], model_kind="torch", workers=4)
    assert [s.gpu for s in slots] == ["0", "1", "0", "1"]
    assert all(s.threads == 3 for s in slots)


def test_no_gpu_or_hidden_gpus_fall_back_to_cpu_slots():
    assert all(s.gpu is None for s in plan_slots(cpu_count=2, gpus=["0"], model_kind="torch", use_gpu=False))
    hidden = visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, 4)
    assert all(s.gpu is None for s in plan_slots(cpu_count=2, gpus=hidden, model_kind="torch"))


def test_explicit_workers_and_threads():
    assert plan_slots(cpu_count=8, gpus=[], model_kind="sklearn", workers=2) == [WorkerSlot(0, 4), WorkerSlot(1, 4)]
    assert plan_slots(cpu_count=8, gpus=[], model_kind="sklearn", threads_per_worker=3) == [
        WorkerSlot(0, 3),
        WorkerSlot(1, 3),
    ]
    assert plan_slots(cpu_count=8, gpus=[], model_kind="sklearn", workers=3, threads_per_worker=2) == [
        WorkerSlot(i, 2) for i in range(3)
    ]


def test_workers_times_threads_never_exceeds_the_cores():
    """Whatever is left to the planner is sized to fit the cores.

    Not covered, by design: both --workers and --threads-per-worker given (the user's explicit choice),
    more GPUs than cores (one worker per GPU needs a thread each), and --threads-per-worker on GPUs
    (the worker count is the GPU count there, so an explicit thread count is taken as given).
    """
    kinds = ["sklearn", "xgboost", "torch", "custom"]
    for cpus, n_gpus, kind, use_gpu in itertools.product(range(1, 33), range(4), kinds, [True, False]):
        gpus = [str(i) for i in range(n_gpus)]
        if n_gpus > cpus:
            continue
        on_gpu = use_gpu and n_gpus > 0 and kind != "sklearn"
        choices = [(None, None)] + [(w, None) for w in range(1, cpus + 1)]
        if not on_gpu:
            choices += [(None, t) for t in range(1, cpus + 1)]
        for workers, threads in choices:
            slots = plan_slots(
                cpu_count=cpus, gpus=gpus, model_kind=kind, workers=workers, threads_per_worker=threads, use_gpu=use_gpu
            )
            assert slots, (cpus, gpus, kind, workers, threads)
            assert len(slots) * slots[0].threads <= cpus, (cpus, gpus, kind, workers, threads, slots)
            assert [s.index for s in slots] == list(range(len(slots)))
            assert len({s.threads for s in slots}) == 1
            assert all((s.gpu is not None) == on_gpu for s in slots)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu_count": 0}, "cpu_count"),
        ({"cpu_count": 2, "workers": 0}, "--workers"),
        ({"cpu_count": 2, "threads_per_worker": 0}, "--threads-per-worker"),
    ],
)
def test_plan_slots_rejects_nonsense(kwargs, message):
    with pytest.raises(SetupError, match=message):
        plan_slots(gpus=[], model_kind="torch", **kwargs)


def test_thread_cap_env():
    env = thread_cap_env(3)
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"


# -- end to end: two simulated GPUs, a torch model --------------------------------------------------------


def _busy_torch_model(path: Path, rounds: int) -> Path:
    """A TorchScript model whose output is a plain linear layer, but which spends a fixed amount of
    compute per batch (``rounds`` small matmuls whose result is multiplied by zero)."""
    import torch

    class BusyNet(torch.nn.Module):
        def __init__(self, rounds: int):
            super().__init__()
            self.linear = torch.nn.Linear(len(FEATURES), 1)
            self.mix = torch.nn.Linear(len(FEATURES), len(FEATURES))
            self.rounds = rounds

        def forward(self, x):
            h = x
            for _ in range(self.rounds):
                h = torch.tanh(self.mix(h))
            return self.linear(x) + 0.0 * h[:, :1]

    torch.manual_seed(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(BusyNet(rounds)), str(path))
    return path


@pytest.mark.slow
def test_simulated_gpus_pin_one_worker_per_device(tmp_path):
    import torch

    inputs, out = tmp_path / "in", tmp_path / "out"
    model_path = _busy_torch_model(tmp_path / "model" / "model.pt", rounds=1000)
    # The largest unit starts first and keeps one worker busy for about 30 batches (~1.5 s), so the
    # small files go to the other worker: both devices get work whichever worker starts first.
    synthetic.make_dataset(inputs, files=8, rows=0, sizes=[15_000] + [500] * 7, row_group_rows=500)
    result = run_worker(
        inputs,
        out,
        model_path.parent,
        *SYNTHETIC_COLUMNS,
        "--batch-rows",
        "500",
        "--inflight-per-worker",
        "1",
        env=clean_env(**{ENV_SIMULATED_GPUS: "2"}),
        workers=None,
    )
    assert result.returncode == EXIT_OK, describe(result)
    assert "2 GPU worker(s)" in result.stderr
    manifest = load_manifest(out)
    threads = max(1, cpu_count() // 2)  # the cores are shared between the two GPU workers
    assert [(w["gpu"], w["threads"]) for w in manifest["workers"]] == [("0", threads), ("1", threads)]
    labels = [label for r in manifest["file_reports"] for label in r["workers"]]
    assert len(labels) == 8, manifest
    pinned = set()
    for label in labels:
        match = re.fullmatch(r"pid \d+ (\S+) \(CUDA_VISIBLE_DEVICES=(\d+)\)", label)
        assert match, f"unexpected worker label {label!r}"
        device, gpu = match.groups()
        assert device == "cpu", "simulated devices must fall back to computing on the CPU"
        pinned.add(gpu)
    assert pinned == {"0", "1"}, f"files should have been processed by workers on both devices: {labels}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = torch.jit.load(str(model_path))

    def predict(table):
        with torch.inference_mode():
            return model.linear(torch.from_numpy(feature_matrix(table, dtype=np.float32))).numpy()[:, 0]

    check_outputs(inputs, out, manifest, predict, rtol=1e-5, atol=1e-6)
