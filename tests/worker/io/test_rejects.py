"""tolerance.rows: a bad row costs a row, never the file, and every row is accounted for (in = out + rejected).

The worker runs for real (``python -m shardline.worker``) on files with malformed lines, values that do not parse
and records a script raises on; every written prediction is compared with the model's on the same row, and every
rejected row is named with its line (or row) number and its reason.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from shardline.contract import EXIT_FILES_FAILED, EXIT_OK
from shardline.errors import TooManyRejectsError
from shardline.worker.io.rejects import RejectLog, allowed
from tests.support.helpers import (
    describe,
    load_manifest,
    read_table,
    reports_by_input,
    run_worker,
    write_inference_script,
)

FEATURES = ["a", "b", "c"]


# -- the pure parts: limits and line numbers ----------------------------------------------------------------------


def test_a_limit_is_a_count_or_a_fraction_of_the_rows():
    assert allowed(100, 200_000) == 100
    assert allowed(0.001, 200_000) == 200
    assert allowed(0, 10) == 0


def test_line_numbers_count_the_header_and_the_lines_the_reader_dropped():
    log = RejectLog(100, header_lines=1)
    log.unparsed(4, "x,y,z,w", "4 field(s) where the file has 3 column(s)")
    log.unparsed(6, "x", "1 field(s) where the file has 3 column(s)")
    # parsed rows 0, 1 are lines 2, 3; line 4 was dropped; parsed row 2 is line 5; line 6 dropped; row 3 is line 7
    assert [log.line_of(k) for k in range(4)] == [2, 3, 5, 7]
    log.add(3, "predict", "ValueError: no", {"id": 7}, text_file=True)
    assert (log.rejects[-1].line, log.rejects[-1].row) == (7, 6)
    assert log.read_count == 2 and log.count == 3


def test_over_the_limit_names_the_first_rejects_in_file_order():
    log = RejectLog(2, header_lines=1)
    log.add(9, "read", "column 'a': 'x' is not a number", {"id": 10}, text_file=True)
    log.unparsed(3, "1,2", "2 field(s) where the file has 3 column(s)")
    log.check()
    log.add(20, "predict", "ValueError: bad", {"id": 21}, text_file=True)
    with pytest.raises(TooManyRejectsError) as info:
        log.check()
    message = str(info.value)
    assert message.startswith("3 row(s) rejected, more than tolerance.rows allows (2 row(s)): line 3: 2 field(s)")
    assert "tolerance.rows" in message
    fraction = RejectLog(0.01)
    fraction.add(0, "predict", "ValueError: bad", {}, text_file=False)
    fraction.check()  # a fraction waits for the file's row count
    with pytest.raises(TooManyRejectsError, match=r"0\.01 of the file's rows"):
        fraction.check(rows=50)
    fraction.check(rows=100)


# -- a CSV with malformed lines ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from sklearn.linear_model import LinearRegression

    root = tmp_path_factory.mktemp("rejects-model")
    rng = np.random.default_rng(0)
    train = pd.DataFrame(rng.normal(size=(300, 3)), columns=FEATURES)
    joblib.dump(LinearRegression().fit(train, train.a * 2 + train.b - train.c), root / "model.joblib")
    return root


@pytest.fixture(scope="module")
def malformed(tmp_path_factory) -> tuple[Path, pd.DataFrame, dict[int, str]]:
    """A 20,000-row CSV with 9 bad lines, as real exports have them: an extra field, a missing one, text in a
    number column, a stray quote. Returns the folder, the good rows, and the bad lines (1-based) with what is
    wrong with each."""
    root = tmp_path_factory.mktemp("rejects-csv")
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(rng.normal(size=(20_000, 3)), columns=FEATURES)
    frame.insert(0, "id", np.arange(20_000))
    lines = frame.to_csv(index=False, float_format="%.17g").splitlines()
    wrong = {
        3: "extra field",
        4_000: "text",
        4_001: "missing field",
        9_999: "text",
        12_345: "extra field",
        15_000: "n/a spelled out",
        17_777: "missing field",
        19_998: "text",
        20_001: "extra field",
    }
    for line, kind in wrong.items():
        fields = lines[line - 1].split(",")
        if kind == "extra field":
            fields.append("note")
        elif kind == "missing field":
            fields.pop()
        elif kind == "text":
            fields[2] = "twelve"
        else:
            fields[3] = "not available"
        lines[line - 1] = ",".join(fields)
    (root / "part-0.csv").write_text("\n".join(lines) + "\n")
    bad_ids = [line - 2 for line in wrong]
    return root, frame[~frame.id.isin(bad_ids)], wrong


def _run(inputs: Path, out: Path, model_dir: Path, *args: str):
    return run_worker(inputs, out, model_dir, "--passthrough", "id", *args)


def test_bad_lines_within_the_limit_are_rejected_with_their_lines_and_the_rest_is_exact(malformed, model_dir, tmp_path):
    inputs, good, wrong = malformed
    result = _run(inputs, tmp_path / "out", model_dir, "--tolerate-rows", "100")
    assert result.returncode == EXIT_OK, describe(result)
    manifest = load_manifest(tmp_path / "out")
    report = reports_by_input(manifest)["part-0.csv"]
    assert (report["rows_in"], report["rows_out"], report["rows_rejected"]) == (20_000, 20_000 - 9, 9)
    assert manifest["rows_rejected"] == 9
    # Every written prediction is the model's on that row; no row twice, none lost.
    written = read_table(tmp_path / "out" / report["output"]).to_pandas().set_index("id")
    assert sorted(written.index) == sorted(good.id)
    model = joblib.load(model_dir / "model.joblib")
    expected = model.predict(good[FEATURES])
    np.testing.assert_allclose(written.loc[good.id, "prediction"].to_numpy(), expected, rtol=1e-12)
    # The rejects file lists each bad line, in file order, with its reason.
    listed = [json.loads(line) for line in (tmp_path / "out" / report["rejects_file"]).read_text().splitlines()]
    assert [r["line"] for r in listed] == sorted(wrong)
    reasons = {r["line"]: r["reason"] for r in listed}
    assert reasons[3] == "5 field(s) where the file has 4 column(s)"
    assert reasons[4_001] == "3 field(s) where the file has 4 column(s)"
    assert reasons[4_000] == "column 'b': 'twelve' is not a number"
    assert reasons[15_000] == "column 'c': 'not available' is not a number"
    assert {r["line"]: r.get("ids") for r in listed}[9_999] == {"id": 9_997}
    assert "9 row(s) rejected (tolerance.rows)" in result.stderr


def test_over_the_limit_the_file_fails_naming_its_first_rejects(malformed, model_dir, tmp_path):
    inputs, _, _ = malformed
    result = _run(inputs, tmp_path / "out", model_dir, "--tolerate-rows", "5")
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.csv"]
    assert report["error_class"] == "TooManyRejectsError"
    # Counted as each block of the file is read: more than 5, at most the 9 there are.
    assert re.match(
        r"[6-9] row\(s\) rejected, more than tolerance.rows allows \(5 row\(s\)\): line 3: 5 field",
        report["error_message"],
    ), report["error_message"]
    assert not (tmp_path / "out" / "part-0.csv").exists()


def test_without_tolerate_rows_one_bad_line_fails_the_file_as_before(malformed, model_dir, tmp_path):
    inputs, _, _ = malformed
    result = _run(inputs, tmp_path / "out", model_dir)
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.csv"]
    assert report["error_class"] == "CorruptInputError" and report["rows_rejected"] == 0


# -- records the model or a script raises on ---------------------------------------------------------------------

PICKY_SCRIPT = """
    import io
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        return np.loadtxt(io.StringIO(request_body), delimiter=",", ndmin=2)


    def predict_fn(data, model):
        if (data[:, 0] > 3.0).any():  # a record the script refuses, as real validation code does
            raise ValueError("a is out of range")
        return model.predict(data)
"""


@pytest.fixture(scope="module")
def parquet_inputs(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    root = tmp_path_factory.mktemp("rejects-parquet")
    rng = np.random.default_rng(2)
    frame = pd.DataFrame(rng.normal(size=(30_000, 3)), columns=FEATURES)
    frame.insert(0, "id", np.arange(30_000))
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), root / "part-0.parquet", row_group_size=7_000)
    return root, frame


def test_records_a_script_raises_on_are_isolated_and_rejected_and_the_rest_is_exact(
    parquet_inputs, model_dir, tmp_path
):
    inputs, frame = parquet_inputs
    script_dir = tmp_path / "script"
    script_dir.mkdir()
    (script_dir / "model.joblib").write_bytes((model_dir / "model.joblib").read_bytes())
    write_inference_script(script_dir, PICKY_SCRIPT)
    bad = frame[frame.a > 3.0]
    assert 0 < len(bad) < 50
    refused = _run(inputs, tmp_path / "refused", script_dir, "--features", "a,b,c")
    assert refused.returncode == EXIT_FILES_FAILED, describe(refused)
    result = _run(inputs, tmp_path / "out", script_dir, "--features", "a,b,c", "--tolerate-rows", "50")
    assert result.returncode == EXIT_OK, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.parquet"]
    assert (report["rows_in"], report["rows_out"], report["rows_rejected"]) == (30_000, 30_000 - len(bad), len(bad))
    listed = [json.loads(line) for line in (tmp_path / "out" / report["rejects_file"]).read_text().splitlines()]
    assert [r["ids"]["id"] for r in listed] == list(bad.id)
    assert [r["row"] for r in listed] == [int(i) + 1 for i in bad.id]  # row numbers from 1, across row groups
    assert all(r["stage"] == "predict" and "a is out of range" in r["reason"] for r in listed)
    written = read_table(tmp_path / "out" / report["output"]).to_pandas().set_index("id")
    good = frame[frame.a <= 3.0]
    model = joblib.load(model_dir / "model.joblib")
    np.testing.assert_allclose(written.loc[good.id, "prediction"].to_numpy(), model.predict(good[FEATURES]), rtol=1e-12)


def test_a_setting_that_fails_every_record_fails_the_file_not_row_by_row(parquet_inputs, model_dir, tmp_path):
    inputs, _ = parquet_inputs
    script_dir = tmp_path / "script"
    script_dir.mkdir()
    (script_dir / "model.joblib").write_bytes((model_dir / "model.joblib").read_bytes())
    write_inference_script(script_dir, PICKY_SCRIPT.replace("(data[:, 0] > 3.0).any()", "True"))
    result = _run(inputs, tmp_path / "out", script_dir, "--features", "a,b,c", "--tolerate-rows", "0.5")
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.parquet"]
    assert report["error_class"] == "ScriptError" and "a is out of range" in report["error_message"]


def test_a_bad_line_past_the_first_block_loses_and_doubles_no_row(model_dir, tmp_path):
    """The fast reader gives the first blocks, fails at a later one, and the tolerant reader picks up after them."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(rng.normal(size=(60_000, 3)), columns=FEATURES)
    frame.insert(0, "id", np.arange(60_000))
    lines = frame.to_csv(index=False, float_format="%.17g").splitlines()
    assert len("\n".join(lines[:40_000])) > 2 << 20  # past the reader's first 1 MiB blocks
    lines[40_000] += ",extra"  # line 40,001
    lines[55_000] = lines[55_000].replace(lines[55_000].split(",")[1], "?", 1)  # line 55,001
    (inputs / "part-0.csv").write_text("\n".join(lines) + "\n")
    result = _run(inputs, tmp_path / "out", model_dir, "--tolerate-rows", "10")
    assert result.returncode == EXIT_OK, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.csv"]
    assert (report["rows_in"], report["rows_out"], report["rows_rejected"]) == (60_000, 59_998, 2)
    written = read_table(tmp_path / "out" / report["output"]).to_pandas()
    assert written["id"].is_unique and sorted(written["id"]) == sorted(set(range(60_000)) - {39_999, 54_999})
    listed = [json.loads(line) for line in (tmp_path / "out" / report["rejects_file"]).read_text().splitlines()]
    assert [r["line"] for r in listed] == [40_001, 55_001]


@pytest.mark.parametrize("name", ["part-0.jsonl", "part-0.jsonl.gz"])
def test_json_lines_that_are_no_object_and_values_that_are_no_number_are_rejected_with_their_lines(
    model_dir, tmp_path, name
):
    """JSON lines as exports break them: a line cut short, a stray non-object, text where a number goes; one in the
    first block (so the schema is inferred without it) and the rest past the fast reader's first blocks."""
    import gzip

    inputs = tmp_path / "in"
    inputs.mkdir()
    rng = np.random.default_rng(4)
    frame = pd.DataFrame(rng.normal(size=(40_000, 3)), columns=FEATURES)
    frame.insert(0, "id", np.arange(40_000))
    lines = frame.to_json(orient="records", lines=True, double_precision=15).splitlines()
    lines[5] = lines[5][:20]  # line 6: cut short
    lines[30_000] = "[1, 2, 3]"  # line 30,001: an array, not an object
    lines[35_000] = lines[35_000].replace('"b":', '"b":"twelve","was":', 1)  # line 35,001
    body = ("\n".join(lines) + "\n").encode()
    (inputs / name).write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    result = _run(inputs, tmp_path / "out", model_dir, "--tolerate-rows", "10")
    assert result.returncode == EXIT_OK, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))[name]
    assert (report["rows_in"], report["rows_out"], report["rows_rejected"]) == (40_000, 39_997, 3)
    written = read_table(tmp_path / "out" / report["output"]).to_pandas().set_index("id")
    good = frame[~frame.id.isin([5, 30_000, 35_000])]
    assert written.index.is_unique and sorted(written.index) == sorted(good.id)
    expected = joblib.load(model_dir / "model.joblib").predict(good[FEATURES])
    # the values were written with 15 significant digits
    np.testing.assert_allclose(written.loc[good.id, "prediction"].to_numpy(), expected, rtol=1e-9, atol=1e-12)
    listed = [json.loads(line) for line in (tmp_path / "out" / report["rejects_file"]).read_text().splitlines()]
    assert [(r["line"], r["row"]) for r in listed] == [(6, 6), (30_001, 30_001), (35_001, 35_001)]
    assert listed[0]["reason"].startswith("not valid JSON") and listed[1]["reason"] == "a JSON list, not an object"
    assert listed[2]["reason"] == "column 'b': 'twelve' is not a number" and listed[2]["ids"] == {"id": 35_000}


def test_json_lines_the_fast_reader_read_otherwise_than_line_by_line_fail_the_file_rather_than_lose_a_row(
    model_dir, tmp_path
):
    """Two objects on one line (a writer's lost newline) are two rows to the fast reader: the row-by-row reader,
    picking up after it at a later bad line, cannot tell which rows it gave, so the file fails with its error.
    When the fast reader gave no batch before the bad line (the file is smaller than a batch), the row-by-row
    reader reads every line itself, and that line is rejected as what it is."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    frame = pd.DataFrame(np.random.default_rng(6).normal(size=(40_000, 3)), columns=FEATURES)
    frame.insert(0, "id", np.arange(40_000))
    lines = frame.to_json(orient="records", lines=True).splitlines()
    lines[10:12] = [lines[10] + lines[11]]
    lines[35_000] = lines[35_000][:15]
    (inputs / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    result = _run(inputs, tmp_path / "out", model_dir, "--tolerate-rows", "10", "--batch-rows", "1000")
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    assert "CorruptInputError" in result.stderr

    result = _run(inputs, tmp_path / "out-whole", model_dir, "--tolerate-rows", "10")
    assert result.returncode == EXIT_OK, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out-whole"))["part-0.jsonl"]
    assert (report["rows_in"], report["rows_out"], report["rows_rejected"]) == (39_999, 39_997, 2)
    listed = [json.loads(line) for line in (tmp_path / "out-whole" / report["rejects_file"]).read_text().splitlines()]
    assert [r["line"] for r in listed] == [11, 35_001] and listed[0]["reason"].startswith("not valid JSON")


def test_a_setting_error_on_small_batches_still_fails_the_file(parquet_inputs, model_dir, tmp_path):
    inputs, _ = parquet_inputs
    script_dir = tmp_path / "script"
    script_dir.mkdir()
    (script_dir / "model.joblib").write_bytes((model_dir / "model.joblib").read_bytes())
    write_inference_script(script_dir, PICKY_SCRIPT.replace("(data[:, 0] > 3.0).any()", "True"))
    result = _run(
        inputs, tmp_path / "out", script_dir, "--features", "a,b,c", "--tolerate-rows", "100000", "--batch-rows", "4"
    )
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.parquet"]
    assert report["error_class"] == "ScriptError" and report["rows_rejected"] == 0


def test_a_header_alone_is_an_empty_input_and_a_file_no_line_of_which_splits_fails_saying_so(model_dir, tmp_path):
    empty, shifted = tmp_path / "empty", tmp_path / "shifted"
    empty.mkdir()
    shifted.mkdir()
    (empty / "part-0.csv").write_text("id,a,b,c\n")
    result = _run(empty, tmp_path / "out-empty", model_dir, "--tolerate-rows", "100")
    assert result.returncode == EXIT_OK, describe(result)
    assert reports_by_input(load_manifest(tmp_path / "out-empty"))["part-0.csv"]["rows_out"] == 0
    # A headerless file named with one column too few: every line has a field more. The names are wrong, not
    # the rows, and the file fails saying so instead of rejecting all 50.
    (shifted / "part-0.csv").write_text("".join(f"{i},1.0,2.0,3.0,4.0\n" for i in range(50)))
    args = ("--tolerate-rows", "100", "--input-csv-header", "false", "--features", "id,a,b,c")
    result = _run(shifted, tmp_path / "out-shifted", model_dir, *args)
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out-shifted"))["part-0.csv"]
    assert report["error_class"] == "CorruptInputError", report
    assert "no line of part-0.csv splits into the file's columns" in report["error_message"]
    assert "input.csv_header is false" in report["error_message"]


def test_the_worker_imports_no_pandas_for_a_clean_file():
    """The tolerant reader's helpers are made on first use: importing pandas costs every worker 0.2 s and about
    100 MiB, which the hot path never needs (its absence was measured in the benchmark's peak RSS)."""
    import subprocess
    import sys

    code = (
        "import sys; import shardline.worker.pool.process, shardline.worker.pool.runner, shardline.worker.job.run; "
        "print('pandas' in sys.modules)"
    )
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert said.stdout.strip() == "False", said.stderr
