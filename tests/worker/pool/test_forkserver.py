"""Start-up (worker/pool/forkserver.py): CPU workers fork from a forkserver that loaded the verified model once; GPU
workers spawn.

What must hold whatever the start method: right predictions, each worker under its thread cap,
user code (a custom inference.py) never run outside the workers, and a breakdown of where the
start-up went in the summary (``make bench`` prints it; no test here depends on how long it took).
"""

from __future__ import annotations

import json
import subprocess

import psutil
import pytest

from examples import synthetic
from shardline.contract import EXIT_SETUP_ERROR
from shardline.worker.pool.devices import ENV_SIMULATED_GPUS
from shardline.worker.pool.forkserver import PARENT_ENV
from tests.support.helpers import (
    SYNTHETIC_COLUMNS,
    check_outputs,
    clean_env,
    describe,
    load_manifest,
    run_worker,
    sklearn_predict,
    torch_predict,
    worker_command,
    write_inference_script,
    xgboost_predict,
)

pytestmark = pytest.mark.slow  # each test runs the real worker, pool and all

PREDICT = {"sklearn": sklearn_predict, "xgboost": xgboost_predict, "torch": torch_predict}
TOLERANCE = {"sklearn": {}, "xgboost": {"rtol": 1e-5}, "torch": {"rtol": 1e-5, "atol": 1e-6}}


def _summary(tmp_path) -> dict:
    return json.loads((tmp_path / "summary.json").read_text())


@pytest.mark.parametrize(("workers", "threads"), [(2, 1), (1, 2)], ids=["2x1", "1x2"])
@pytest.mark.parametrize("kind", ["sklearn", "xgboost", "torch"])
def test_cpu_workers_start_from_the_preloaded_model_under_their_thread_cap(tmp_path, kind, workers, threads, request):
    """Both splits of the cores: a worker forked from a process whose OpenMP had started threads would hang
    in its first parallel region (XGBoost's load runs one), so the forkserver must stay single-threaded and
    each worker must still get its own thread count."""
    model = request.getfixturevalue(f"{kind}_model")
    data, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(data, files=3, rows=3000)

    result = run_worker(
        data,
        out,
        model.parent,
        *SYNTHETIC_COLUMNS,
        "--threads-per-worker",
        str(threads),
        "--summary-json",
        str(tmp_path / "summary.json"),
        workers=workers,
        timeout=180,
    )
    assert result.returncode == 0, describe(result)
    check_outputs(data, out, load_manifest(out), PREDICT[kind](model), **TOLERANCE[kind])
    startup = _summary(tmp_path)["startup"]
    assert startup["start_method"] == "forkserver"
    assert startup["model_preloaded"] is True, startup
    assert startup["forkserver_threads_started"] == 0, "the model's library started threads in the forkserver"
    # Its own and Arrow's allocator's: OpenBLAS, loaded with numpy, would add one per core beyond the first,
    # spinning on the cores the main process starts on.
    assert startup["forkserver_threads"] <= 2, startup
    assert startup["threads_in_use"] == threads, "each worker gets its own threads, not the forkserver's one"
    assert startup["forkserver_started_early"] is True, "the command line starts the forkserver before its imports"
    _check_stages(startup)


def _check_stages(startup: dict) -> None:
    """The breakdown's stages end in order, each timed from the launch (their lengths are the bench's to print)."""
    assert startup["launched_at"] <= startup["job_started_at"] <= startup["pool_created_at"]
    assert startup["first_prediction_at"] >= startup["pool_created_at"]
    stages = [startup[s] for s in ("loader_started_s", "library_imported_s", "model_loaded_s", "workers_ready_s")]
    assert stages[0] >= 0 and stages == sorted(stages), startup
    # The first worker up may predict before the last is ready: the first prediction follows the (one) load.
    assert startup["first_prediction_s"] >= startup["model_loaded_s"], startup
    assert startup["library_import_s"] >= 0 and startup["model_load_s"] >= 0


def test_a_model_tarball_is_verified_then_preloaded_by_the_forkserver_started_early(tmp_path, sklearn_model):
    """SageMaker delivers model.tar.gz: the forkserver guesses the library from the tarball's member names and
    imports it while the main process verifies and unpacks; it loads the model only from the unpacked copy
    the main process hands over."""
    data, out, model_dir = tmp_path / "in", tmp_path / "out", tmp_path / "model"
    synthetic.make_dataset(data, files=2, rows=2000)
    model_dir.mkdir()
    digest = synthetic.pack(sklearn_model.parent, model_dir / "model.tar.gz")
    result = run_worker(
        data,
        out,
        model_dir,
        *SYNTHETIC_COLUMNS,
        "--model-sha256",
        digest,
        "--summary-json",
        str(tmp_path / "summary.json"),
        workers=2,
    )
    assert result.returncode == 0, describe(result)
    check_outputs(data, out, load_manifest(out), sklearn_predict(sklearn_model))
    startup = _summary(tmp_path)["startup"]
    assert (startup["forkserver_started_early"], startup["model_preloaded"]) == (True, True), startup
    _check_stages(startup)


def test_a_forkserver_started_early_ends_with_a_main_process_that_never_made_a_pool(tmp_path, xgboost_model):
    """A wrong pin stops the job before any pool: the forkserver, started first thing and waiting for a model
    that never comes, must not outlive the main process (nor ever load the refused artifact)."""
    data = tmp_path / "in"
    synthetic.make_dataset(data, files=1, rows=100)
    command = worker_command(data, tmp_path / "out", xgboost_model.parent, "--model-sha256", "0" * 64)
    with subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as main:
        _, stderr = main.communicate(timeout=120)
    assert main.returncode == EXIT_SETUP_ERROR, stderr
    assert "sha256" in stderr
    # Whatever the main process started (the forkserver, multiprocessing's resource tracker) carries its pid.
    _, alive = psutil.wait_procs(_started_by(main.pid), timeout=60)
    assert not alive, [p.cmdline() for p in alive]


def _started_by(pid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(PARENT_ENV) == str(pid):
                found.append(process)
        except psutil.Error:
            continue  # ended meanwhile, or not ours to read
    return found


def test_a_custom_inference_script_is_loaded_by_each_worker_never_by_the_forkserver(tmp_path):
    data, out, model_dir = tmp_path / "in", tmp_path / "out", tmp_path / "model"
    synthetic.make_dataset(data, files=2, rows=500)
    marker = tmp_path / "loaded-by"
    marker.mkdir()
    write_inference_script(
        model_dir,
        f"""
import os


def model_fn(model_dir):
    open(os.path.join({str(marker)!r}, str(os.getpid())), "w").close()
    return None


def predict_fn(data, model):
    return data.sum(axis=1)
""",
    )
    result = run_worker(
        data, out, model_dir, *SYNTHETIC_COLUMNS, "--summary-json", str(tmp_path / "summary.json"), workers=2
    )
    assert result.returncode == 0, describe(result)
    startup = _summary(tmp_path)["startup"]
    assert startup["start_method"] == "forkserver"
    assert startup["model_preloaded"] is False
    workers = {int(w.split()[1]) for r in load_manifest(out)["file_reports"] for w in r["workers"]}
    loaders = {int(p.name) for p in marker.iterdir()}
    assert workers <= loaders, "model_fn ran in each worker that predicted, and nowhere else"
    assert len(loaders) == 2


def test_torch_gpu_workers_spawn_a_clean_interpreter(tmp_path, torch_model):
    data, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(data, files=2, rows=1000)
    result = run_worker(
        data,
        out,
        torch_model.parent,
        *SYNTHETIC_COLUMNS,
        "--summary-json",
        str(tmp_path / "summary.json"),
        env=clean_env(**{ENV_SIMULATED_GPUS: "1"}),
        workers=None,
    )
    assert result.returncode == 0, describe(result)
    summary = _summary(tmp_path)
    assert any(w["gpu"] is not None for w in summary["workers"]), summary["workers"]
    assert summary["startup"]["start_method"] == "spawn"
    assert summary["startup"]["model_preloaded"] is False
    check_outputs(data, out, load_manifest(out), torch_predict(torch_model), **TOLERANCE["torch"])


def test_start_method_spawn_makes_each_worker_load_the_model_itself(tmp_path, xgboost_model):
    data, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(data, files=2, rows=1000)
    result = run_worker(
        data,
        out,
        xgboost_model.parent,
        *SYNTHETIC_COLUMNS,
        "--start-method",
        "spawn",
        "--summary-json",
        str(tmp_path / "summary.json"),
        workers=2,
    )
    assert result.returncode == 0, describe(result)
    startup = _summary(tmp_path)["startup"]
    assert (startup["start_method"], startup["model_preloaded"], startup["threads_in_use"]) == ("spawn", False, 1)
    check_outputs(data, out, load_manifest(out), xgboost_predict(xgboost_model), **TOLERANCE["xgboost"])
