"""A zombie instance (its attempt superseded, its run ended, or its output prefix taken by another run while it
still runs) finishes late: asked just before its upload, the ledger refuses it, so its output never goes up where
the newer attempt's (or the other run's) goes, and its local copy is withdrawn. Outputs it uploaded and committed
before stay."""

from __future__ import annotations

import datetime as dt
import subprocess
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardline.contract import EXIT_FENCED
from shardline.ledger.keys import StepRef
from shardline.ledger.partitions import release, take
from shardline.ledger.states import StepStatus, Succession
from shardline.ledger.step_reads import read_step
from shardline.ledger.step_writes import set_run_status, start_attempt
from shardline.ledger.table import bind_ledger
from tests.support.helpers import clean_env, describe, worker_command, write_inference_script
from tests.support.records import hold_run

REF = StepRef("p", "r1", "score")
OUTPUT = "s3://zombie-data/out/"

# Blocks on any batch of the second file (x == 2.0) until the test drops the release file.
SCRIPT = """
    import time
    from pathlib import Path

    import numpy as np

    RELEASE = Path({release!r})


    def model_fn(model_dir):
        return None


    def predict_fn(data, model):
        if (data[:, 0] == 2.0).any():
            while not RELEASE.exists():
                time.sleep(0.05)
        return data[:, 0] * 10
"""


def _wait_for(predicate, what: str, worker: subprocess.Popen, release: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout  # a safety net against a hang, not a timing assertion
    while not predicate():
        if time.monotonic() > deadline or worker.poll() is not None:
            release.touch()  # lets a blocked model process end, so its pipes close
            worker.kill()
            _, stderr = worker.communicate(timeout=60)
            raise AssertionError(f"gave up waiting for {what}; worker exit {worker.returncode}:\n{stderr[-4000:]}")
        time.sleep(0.1)


def _newer_attempt(model, keys) -> tuple[str, int]:
    # The orchestrator gives up on attempt 1 (say its heartbeat looked lost) and plans b as attempt 2.
    start_attempt(model, REF, 2, [keys[1]], follows=Succession(after=1))
    return ("PENDING", 2)


def _run_ended(model, keys) -> tuple[str, int]:
    # The run's failure callback marked it failed (its job is being stopped, and may take minutes to stop).
    set_run_status(model, REF.pipeline, REF.run_id, StepStatus.FAILED, "the DAG run failed")
    return ("RUNNING", 1)


def _prefix_taken(model, keys) -> tuple[str, int]:
    # The hold moved to another run (a lease nobody renewed): that run writes the prefix now.
    release(model, OUTPUT, REF)
    take(model, OUTPUT, StepRef("p", "r2", "score"), dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    return ("RUNNING", 1)


SUPERSEDED = {"by a newer attempt": _newer_attempt, "its run ended": _run_ended, "its prefix taken": _prefix_taken}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(SUPERSEDED))
def test_stale_attempt_zombie_outputs_are_withdrawn_and_its_records_refused(ledger_table, aws_env, tmp_path, how):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, x, first_id in (("a.parquet", 1.0, 0), ("b.parquet", 2.0, 100)):
        pq.write_table(
            pa.table(
                {"id": pa.array(range(first_id, first_id + 100), pa.int64()), "x": pa.array([x] * 100, pa.float64())}
            ),
            inputs / name,
        )
    model_dir = tmp_path / "model"
    release = tmp_path / "release"
    write_inference_script(model_dir, SCRIPT.format(release=str(release)))
    model = bind_ledger(ledger_table)
    keys = [("s3://zombie-data/in/a.parquet", 1), ("s3://zombie-data/in/b.parquet", 1)]
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="zombie-data")
    start_attempt(model, REF, 1, keys)
    hold_run(model, "p", "r1", "score", OUTPUT)
    env = clean_env(
        **aws_env,
        SHARDLINE_LEDGER_TABLE=ledger_table,
        SHARDLINE_PIPELINE="p",
        SHARDLINE_RUN_ID="r1",
        SHARDLINE_STEP="score",
        SHARDLINE_ATTEMPT="1",
        SHARDLINE_INPUT_URI="s3://zombie-data/in",
        SHARDLINE_OUTPUT_URI=OUTPUT,
    )
    out = tmp_path / "out"
    command = worker_command(inputs, out, model_dir, "--passthrough", "id", "--features", "x", workers=2)
    worker = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:

        def statuses() -> dict[str, tuple[str, int]]:
            return {
                f.input_key.rsplit("/", 1)[1]: (f.status, int(f.attempt))
                for f in read_step(model, StepRef("p", "r1", "score")).files
            }

        # a is done and committed at attempt 1; b is being worked on, blocked in the model.
        _wait_for(
            lambda: statuses() == {"a.parquet": ("SUCCEEDED", 1), "b.parquet": ("RUNNING", 1)},
            "a committed and b claimed by attempt 1",
            worker,
            release,
        )
        b_now = SUPERSEDED[how](model, keys)
        release.touch()  # the zombie finishes b late
        stdout, stderr = worker.communicate(timeout=300)
    finally:
        release.touch()
        if worker.poll() is None:
            worker.kill()
    result = subprocess.CompletedProcess(command, worker.returncode, stdout, stderr)
    assert worker.returncode == EXIT_FENCED, describe(result)
    assert statuses() == {"a.parquet": ("SUCCEEDED", 1), "b.parquet": b_now}, describe(result)
    written = sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*") if p.is_file())
    assert written == [], (written, describe(result))  # a went up; b's late output withdrawn; no manifest
    assert "withdrew 1 output(s)" in stderr, describe(result)
    uploaded = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="zombie-data", Prefix="out/").get("Contents", []))
    assert uploaded == ["out/a.parquet"], uploaded  # the zombie never put b where attempt 2's goes
    body = s3.get_object(Bucket="zombie-data", Key="out/a.parquet")["Body"].read()
    assert pq.read_table(pa.BufferReader(body)).column("prediction").to_pylist() == [10.0] * 100
