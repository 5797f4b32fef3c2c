"""What runs inside each worker process of the pool (``shardline.worker.pool.process``): the initializer, one unit
streamed through a custom inference.py to its output, a unit refused, and a split file's parts merged.

A pool worker replaces its process's log handlers and thread settings, so the worker's side runs in a Python of its
own here, as a pool runs it; the merge, which keeps no state, runs in this process."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from shardline.worker.io.work_units import InputFile
from shardline.worker.model.loading import sha256_of
from shardline.worker.pool.process import merge_file

SCRIPT = """\
def model_fn(model_dir):
    return 2.0


def predict_fn(data, model):
    return data[:, 0] * model
"""

BROKEN = """\
def model_fn(model_dir):
    raise RuntimeError("the weights are not there")


def predict_fn(data, model):
    return data[:, 0]
"""

WORKER = """\
import json, multiprocessing, queue, sys
from pathlib import Path

from shardline.worker.model.loading import ModelArtifact
from shardline.worker.model.script_codec import ScriptProtocol
from shardline.worker.pool import process
from shardline.worker.pool.devices import WorkerSlot
from shardline.worker.io.work_units import InputFile, WorkUnit

root = Path(sys.argv[1])
slots = queue.Queue()
slots.put(WorkerSlot(0, 1))
script = root / "model" / "code" / "inference.py"
settings = process.JobSettings(
    artifact=ModelArtifact("custom", str(script), str(root / "model"), "0" * 64),
    output_dir=str(root / "out"),
    scratch_dir=str(root / "scratch"),
    features=("f0", "f1"),
    passthrough=("id",),
    batch_rows=2,
    gpu_batch_rows=2,
    output_format="same",
    probabilities=False,
    protocol=ScriptProtocol(),
)
counter = multiprocessing.Value("q", 0)
process.init_worker(settings, slots, counter)
warm = process.warm_up()
data = root / "in" / "a.csv"
unit = WorkUnit(InputFile("a.csv", str(data), "csv", False, data.stat().st_size), est_bytes=1)
done = process.run_unit(unit)
other = InputFile("b.txt", str(data), "csv", False, 1, refusal="b.txt says no format")
refused = process.run_unit(WorkUnit(other, est_bytes=1))
print(json.dumps({
    "warm": [warm.ok, warm.fatal, warm.error_class, warm.error_message],
    "done": [done.ok, done.fatal, done.rows_in, done.rows_out, done.output, done.sha256, done.error_message],
    "refused": [refused.ok, refused.fatal, refused.error_class, refused.error_message],
    "rows_counted": counter.value,
}))
"""


def _run_worker(tmp_path, script: str) -> dict:
    (tmp_path / "model" / "code").mkdir(parents=True)
    (tmp_path / "model" / "code" / "inference.py").write_text(script)
    for folder in ("in", "out", "scratch"):
        (tmp_path / folder).mkdir()
    (tmp_path / "in" / "a.csv").write_text("id,f0,f1\n1,0.5,9\n2,1.5,9\n3,2.5,9\n")
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_unit_goes_through_the_model_to_its_output_and_a_refused_file_fails_alone(tmp_path):
    got = _run_worker(tmp_path, SCRIPT)
    assert got["warm"] == [True, False, None, None]
    ok, fatal, rows_in, rows_out, output, sha256, error = got["done"]
    assert (ok, fatal, rows_in, rows_out, error) == (True, False, 3, 3, None)
    assert output == str(tmp_path / "out" / "a.csv") and sha256 == sha256_of(tmp_path / "out" / "a.csv")
    written = pacsv.read_csv(tmp_path / "out" / "a.csv")
    assert written.column("id").to_pylist() == [1, 2, 3]
    assert written.column("prediction").to_pylist() == [1.0, 3.0, 5.0]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["a.csv"]  # no temp file left
    assert got["rows_counted"] == 3
    assert got["refused"] == [False, False, "InputFormatError", "b.txt says no format"]


def test_a_worker_whose_model_does_not_load_fails_every_unit_as_a_setup_error(tmp_path):
    got = _run_worker(tmp_path, BROKEN)
    ok, fatal, error_class, message = got["warm"]
    assert (ok, fatal, error_class) == (False, True, "SetupError")
    assert "the weights are not there" in message
    assert got["done"][:2] == [False, True] and got["done"][-1] == message  # the job stops: no file is to blame
    assert not (tmp_path / "out" / "a.csv").exists()


def _part(path, first: int) -> str:
    pq.write_table(pa.table({"id": [first, first + 1], "prediction": [0.5, 0.25]}), path)
    return str(path)


def test_a_split_files_parts_are_merged_in_order_into_its_output_and_removed(tmp_path):
    (tmp_path / "out" / "dt=1").mkdir(parents=True)
    file = InputFile("dt=1/a.parquet", str(tmp_path / "a.parquet"), "parquet", False, 1)
    parts = [_part(tmp_path / "out" / "dt=1" / f".a.parquet.part{i}", 10 * i) for i in range(3)]
    result = merge_file(file, parts, "same", str(tmp_path / "out"))
    final = tmp_path / "out" / "dt=1" / "a.parquet"
    assert result.ok and result.output == str(final) and result.sha256 == sha256_of(final)
    assert pq.read_table(final).column("id").to_pylist() == [0, 1, 10, 11, 20, 21]
    assert [p.name for p in final.parent.iterdir()] == ["a.parquet"]  # the parts are gone, and no temp file


def test_parts_that_cannot_be_merged_fail_the_file_and_leave_no_output(tmp_path):
    (tmp_path / "out").mkdir()
    file = InputFile("a.parquet", str(tmp_path / "a.parquet"), "parquet", False, 1)
    good = _part(tmp_path / "out" / ".a.parquet.part0", 0)
    (tmp_path / "out" / ".a.parquet.part1").write_bytes(b"not parquet")
    result = merge_file(file, [good, str(tmp_path / "out" / ".a.parquet.part1")], "same", str(tmp_path / "out"))
    assert not result.ok and result.error_message.startswith("merging parts failed: ")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".a.parquet.part0", ".a.parquet.part1"]
