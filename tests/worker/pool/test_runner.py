"""runner.py: the pool survives a worker killed mid-file, a file that kills its worker every time is
failed alone as poison, and SIGTERM stops the job without leaving partial outputs. Real processes,
real signals."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pytest

from examples import synthetic
from shardline.contract import EXIT_FILES_FAILED, EXIT_OK, EXIT_TERMINATED
from shardline.ledger.job_writes import FinishedFile
from shardline.ledger.states import FileStatus
from shardline.worker.pool.runner import FileResult
from tests.support.helpers import (
    SYNTHETIC_COLUMNS,
    check_outputs,
    clean_env,
    describe,
    feature_matrix,
    load_manifest,
    no_temp_files,
    read_table,
    reports_by_input,
    run_worker,
    worker_command,
    write_inference_script,
)

pytestmark = pytest.mark.slow

# predict_fn records each batch it starts (one line per batch, in a file named after its pid),
# then sleeps, so that a file is mid-flight for a while and the test can see which process has it.
SLOW_SCRIPT = """
    import os
    import time


    def model_fn(model_dir):
        return {"delay": float(os.environ.get("TEST_BATCH_DELAY", "0.3"))}


    def predict_fn(data, model):
        with open(os.path.join(os.environ["TEST_PROGRESS_DIR"], str(os.getpid())), "a") as f:
            f.write(f"{len(data)}\\n")
        time.sleep(model["delay"])
        return data.sum(axis=1)
"""

POISON_SCRIPT = """
    import os
    import signal


    def model_fn(model_dir):
        return None


    def predict_fn(data, model):
        if (data[:, 0] == 666.0).any():
            os.kill(os.getpid(), signal.SIGKILL)
        return data.sum(axis=1)
"""


def _row_sums(table: pa.Table) -> np.ndarray:
    return feature_matrix(table).sum(axis=1)


def _pool_workers(cli_pid: int) -> list[psutil.Process]:
    """The worker CLI's pool processes: spawned children, or the children of its forkserver (not the
    forkserver itself, nor the resource tracker)."""
    found = []
    for child in psutil.Process(cli_pid).children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            parent = " ".join(child.parent().cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, AttributeError):
            continue
        if (
            "multiprocessing" in cmdline
            and ("spawn_main" in cmdline or "forkserver" in parent)
            and "resource_tracker" not in cmdline
        ):
            found.append(child)
    return found


def _batches_started(progress_dir: Path) -> dict[int, int]:
    counts = {}
    for path in progress_dir.iterdir():
        counts[int(path.name)] = len(path.read_text().splitlines())
    return counts


def _start_slow_run(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path, Path, Path]:
    """Start the worker on 4 files x 5 batches of 100 rows x 0.3 s: each file is in flight ~1.5 s."""
    inputs, out, progress = tmp_path / "in", tmp_path / "out", tmp_path / "progress"
    progress.mkdir()
    model_dir = tmp_path / "model"
    write_inference_script(model_dir, SLOW_SCRIPT)
    synthetic.make_dataset(inputs, files=4, rows=2000, row_group_rows=100)
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            worker_command(inputs, out, model_dir, *SYNTHETIC_COLUMNS, "--batch-rows", "100"),
            env=clean_env(TEST_PROGRESS_DIR=str(progress)),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, inputs, out, progress, log_path


def _stop(proc: subprocess.Popen) -> None:
    """If a test failed half way, kill the worker it started and that worker's own children."""
    if proc.poll() is not None:
        return
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def _wait_for_mid_flight(proc: subprocess.Popen, progress: Path, log_path: Path) -> psutil.Process:
    """A pool worker that has started a batch of its first file, with more of the file to come."""
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, f"the worker exited before a file was mid-flight:\n{log_path.read_text()}"
        assert time.monotonic() < deadline, f"no file went mid-flight:\n{log_path.read_text()}"
        pool = {p.pid: p for p in _pool_workers(proc.pid)}
        busy = [pid for pid, n in _batches_started(progress).items() if pid in pool and 1 <= n <= 3]
        if busy:
            return pool[busy[0]]
        time.sleep(0.05)


def test_sigkill_of_a_worker_mid_file_loses_and_duplicates_nothing(tmp_path):
    proc, inputs, out, progress, log_path = _start_slow_run(tmp_path)
    try:
        victim = _wait_for_mid_flight(proc, progress, log_path)
        assert proc.pid in [p.pid for p in victim.parents()]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        code = proc.wait(timeout=240)
        killed_after = _batches_started(progress)[victim.pid]
    finally:
        _stop(proc)
    log = log_path.read_text()
    assert code == EXIT_OK, log
    assert "died" in log, "the crash should be logged"
    assert 1 <= killed_after < 5, "the victim was killed before finishing its file's 5 batches"

    manifest = load_manifest(out)
    check_outputs(inputs, out, manifest, _row_sums, rtol=1e-12)
    all_ids = []
    for report in manifest["file_reports"]:
        ids = read_table(out / report["output"]).column("id").to_pylist()
        assert ids == read_table(inputs / report["input"]).column("id").to_pylist()
        all_ids += ids
    assert sorted(all_ids) == list(range(2000)), "every row exactly once, none lost, none duplicated"
    assert no_temp_files(out) == []
    assert sorted(p.name for p in out.iterdir()) == ["_shardline", *sorted(p.name for p in inputs.iterdir())]
    assert max(r["crashes"] for r in manifest["file_reports"]) >= 1
    assert manifest["pool_starts"] >= 2


def test_a_poison_file_fails_alone(tmp_path):
    inputs, out = tmp_path / "in", tmp_path / "out"
    model_dir = tmp_path / "model"
    write_inference_script(model_dir, POISON_SCRIPT)
    synthetic.make_dataset(inputs, files=4, rows=2000)
    poison = "part-00002.parquet"
    table = read_table(inputs / poison)
    f0 = table.column("f0").to_numpy().copy()
    f0[250] = 666.0
    synthetic.write_table(
        table.set_column(table.schema.get_field_index("f0"), "f0", pa.array(f0)), inputs / poison, "parquet"
    )

    result = run_worker(inputs, out, model_dir, *SYNTHETIC_COLUMNS)
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    manifest = load_manifest(out)
    reports = reports_by_input(manifest)
    report = reports[poison]
    assert report["status"] == "FAILED"
    assert report["error_class"] == "PoisonFileError"
    assert poison in report["error_message"]
    assert report["crashes"] >= 2
    assert report["output"] is None
    assert not (out / poison).exists(), "no partial output for the poison file"
    assert no_temp_files(out) == []
    assert manifest["pool_starts"] >= 3
    assert (manifest["succeeded"], manifest["failed"]) == (3, 1)
    good = [rel for rel in reports if rel != poison]
    check_outputs(inputs, out, manifest, _row_sums, rtol=1e-12, only=good)
    assert "PoisonFileError" in result.stderr


def test_sigterm_stops_the_job_cleanly(tmp_path):
    proc, _, out, progress, log_path = _start_slow_run(tmp_path)
    try:
        _wait_for_mid_flight(proc, progress, log_path)
        pool = _pool_workers(proc.pid)
        assert pool
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        _stop(proc)
    log = log_path.read_text()
    assert code == EXIT_TERMINATED, log
    assert "SIGTERM" in log
    _, alive = psutil.wait_procs(pool, timeout=30)
    assert alive == [], f"pool workers outlived the stopped job: {alive}"
    assert no_temp_files(out) == [], "no partial output may remain"
    # whatever was renamed into place is complete
    for path in out.glob("*.parquet"):
        assert read_table(path).num_rows == 500


# -- a file's result, as the manifest and the ledger record it ----------------------------------------


def test_every_figure_the_ledger_records_comes_from_the_file_result():
    # Where the output and the rejects list went is known once they are uploaded, not from the result.
    recorded = {f.name for f in dataclasses.fields(FinishedFile)} - {"output_key", "rejects_key"}
    assert recorded <= {f.name for f in dataclasses.fields(FileResult)}, recorded


def test_a_file_result_becomes_its_ledger_outcome():
    result = FileResult(
        "dt=1/a.parquet",
        FileStatus.FAILED,
        None,
        rows_in=7,
        rows_out=0,
        bytes_in=900,
        seconds=0.25,
        tries=2,
        error_class="CorruptInputError",
        error_message="bad footer",
    )
    assert result.finished_file(None) == FinishedFile(
        FileStatus.FAILED,
        rows_in=7,
        bytes_in=900,
        seconds=0.25,
        error_class="CorruptInputError",
        error_message="bad footer",
    )
    done = dataclasses.replace(
        result,
        status=FileStatus.SUCCEEDED,
        output="dt=1/a.parquet",
        rows_out=7,
        bytes_out=300,
        error_class=None,
        error_message=None,
    )
    assert done.finished_file("s3://b/out/dt=1/a.parquet") == FinishedFile(
        FileStatus.SUCCEEDED,
        rows_in=7,
        rows_out=7,
        bytes_in=900,
        bytes_out=300,
        seconds=0.25,
        output_key="s3://b/out/dt=1/a.parquet",
    )
    rejected = dataclasses.replace(done, rows_out=5, rows_rejected=2, model_warnings=1)
    assert rejected.finished_file("s3://b/out/dt=1/a.parquet", "s3://b/r.jsonl") == FinishedFile(
        FileStatus.SUCCEEDED,
        rows_in=7,
        rows_out=5,
        rows_rejected=2,
        model_warnings=1,
        bytes_in=900,
        bytes_out=300,
        seconds=0.25,
        output_key="s3://b/out/dt=1/a.parquet",
        rejects_key="s3://b/r.jsonl",
    )
