"""input.format (--input-format): files named the way other tools name them are read right, or fail naming it.

Spark and Hive write ``part-00000`` with no extension, exports often end in ``.txt`` or ``.json``.
Without a declared format the worker cannot know what they hold; with one, it reads them as that
format, and a file whose name says another format fails alone instead of being read wrongly.
"""

from __future__ import annotations

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pytest

from examples import synthetic
from shardline.contract import EXIT_FILES_FAILED
from shardline.worker.io.work_units import discover_inputs
from tests.support.helpers import (
    SYNTHETIC_COLUMNS,
    describe,
    load_manifest,
    reports_by_input,
    run_worker,
    sklearn_predict,
)


def _touch(folder, *names):
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")


def test_without_a_format_each_name_says_its_format_and_others_are_ignored_outside_a_pipeline(tmp_path):
    _touch(tmp_path, "a.parquet", "b.csv.gz", "c.ndjson", "part-00000", "notes.txt")
    files, ignored = discover_inputs(tmp_path)
    assert [(f.relative_path, f.fmt, f.gzipped, f.refusal) for f in files] == [
        ("a.parquet", "parquet", False, None),
        ("b.csv.gz", "csv", True, None),
        ("c.ndjson", "jsonl", False, None),
    ]
    assert ignored == ["notes.txt", "part-00000"]


def test_in_a_pipeline_a_name_with_no_known_format_fails_naming_input_format(tmp_path):
    _touch(tmp_path, "a.parquet", "part-00000")
    files, ignored = discover_inputs(tmp_path, refuse_unknown=True)
    assert ignored == []
    refused = {f.relative_path: f.refusal for f in files}
    assert refused["a.parquet"] is None
    assert "input.format" in refused["part-00000"] and "input.exclude" in refused["part-00000"]


def test_a_declared_format_reads_names_without_one_and_refuses_names_that_say_another(tmp_path):
    _touch(tmp_path, "part-00000", "part-00001.gz", "x.txt", "y.csv", "z.parquet")
    files, ignored = discover_inputs(tmp_path, "csv")
    assert ignored == []
    by_name = {f.relative_path: f for f in files}
    assert {n: (f.fmt, f.gzipped) for n, f in by_name.items() if f.refusal is None} == {
        "part-00000": ("csv", False),
        "part-00001.gz": ("csv", True),
        "x.txt": ("csv", False),
        "y.csv": ("csv", False),
    }
    reason = by_name["z.parquet"].refusal
    assert "parquet by its name" in reason and "input.format: parquet" in reason


@pytest.mark.slow
def test_spark_style_csv_and_json_lines_are_predicted_right_and_a_mismatched_file_fails_alone(tmp_path, sklearn_model):
    data, out = tmp_path / "in", tmp_path / "out"
    data.mkdir()
    table = synthetic.make_table(300, seed=3)
    synthetic.write_table(table, data / "part-00000.csv", "csv")
    (data / "part-00000.csv").rename(data / "part-00000")
    synthetic.write_table(table, data / "stray.parquet", "parquet")

    result = run_worker(data, out, sklearn_model.parent, "--input-format", "csv", *SYNTHETIC_COLUMNS)
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    reports = reports_by_input(load_manifest(out))
    assert reports["stray.parquet"]["status"] == "FAILED"
    assert reports["stray.parquet"]["error_class"] == "InputFormatError"
    assert "input.format: parquet" in reports["stray.parquet"]["error_message"]
    assert not (out / "stray.parquet").exists()

    assert reports["part-00000"]["status"] == "SUCCEEDED", reports["part-00000"]
    written = pacsv.read_csv(out / "part-00000")
    assert written.column("id").to_pylist() == table.column("id").to_pylist()
    np.testing.assert_allclose(written.column("prediction").to_numpy(), sklearn_predict(sklearn_model)(table))


@pytest.mark.slow
def test_json_lines_named_json_are_read_with_input_format_jsonl(tmp_path, sklearn_model):
    data, out = tmp_path / "in", tmp_path / "out"
    data.mkdir()
    table = synthetic.make_table(200, seed=4)
    synthetic.write_table(table, data / "export.jsonl", "jsonl")
    (data / "export.jsonl").rename(data / "export.json")

    result = run_worker(data, out, sklearn_model.parent, "--input-format", "jsonl", *SYNTHETIC_COLUMNS)
    assert result.returncode == 0, describe(result)
    written = pajson.read_json(out / "export.json")
    assert written.column("id").to_pylist() == table.column("id").to_pylist()
    want = sklearn_predict(sklearn_model)(table)
    np.testing.assert_allclose(written.column("prediction").to_numpy(), want)
