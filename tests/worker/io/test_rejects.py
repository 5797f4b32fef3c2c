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


# -- dirty files as users write them: each bad row costs itself, named by the line an editor shows --------------------


def _listed(out: Path, report: dict) -> list[dict]:
    return [json.loads(line) for line in (out / report["rejects_file"]).read_text().splitlines()]


def _accounted(report: dict) -> None:
    assert report["rows_in"] == report["rows_out"] + report["rows_rejected"], report


@pytest.fixture(scope="module")
def latin1_export(tmp_path_factory) -> tuple[Path, pd.DataFrame, dict[int, str]]:
    """A customer list written by pandas with encoding="latin-1", as older pipelines write it: every name ASCII but
    three, one in the fast reader's first block and two past it. Row i is on line i + 2."""
    root = tmp_path_factory.mktemp("latin1")
    frame = pd.DataFrame(np.random.default_rng(7).normal(size=(40_000, 3)), columns=FEATURES)
    frame.insert(0, "id", np.arange(40_000))
    frame.insert(1, "name", [f"customer {i}" for i in range(40_000)])
    accented = {10: "Zoë", 25_000: "café", 39_000: "Müller"}
    for row, name in accented.items():
        frame.loc[row, "name"] = name
    frame.to_csv(root / "part-0.csv", index=False, encoding="latin-1", float_format="%.17g")
    return root, frame, accented


def test_a_latin1_byte_in_a_passthrough_column_costs_its_row_alone(latin1_export, model_dir, tmp_path):
    inputs, frame, accented = latin1_export
    result = run_worker(inputs, tmp_path / "out", model_dir, "--passthrough", "id,name", "--tolerate-rows", "10")
    assert result.returncode == EXIT_OK, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.csv"]
    _accounted(report)
    assert (report["rows_in"], report["rows_rejected"]) == (40_000, 3)
    listed = _listed(tmp_path / "out", report)
    assert [(r["line"], r["row"]) for r in listed] == [(12, 11), (25_002, 25_001), (39_002, 39_001)]
    assert [r["reason"] for r in listed] == [
        f"column 'name': {name.encode('latin-1')!r} is not UTF-8 text" for name in accented.values()
    ]
    assert listed[0]["ids"] == {"id": 10, "name": "Zo\ufffd"}
    written = read_table(tmp_path / "out" / report["output"]).to_pandas().set_index("id")
    kept = frame[~frame.id.isin(list(accented))]
    assert sorted(written.index) == sorted(kept.id) and list(written.loc[kept.id, "name"]) == list(kept.name)


def test_without_tolerance_a_latin1_byte_fails_the_file_naming_its_line_and_column(latin1_export, model_dir, tmp_path):
    inputs, _, _ = latin1_export
    result = run_worker(inputs, tmp_path / "out", model_dir, "--passthrough", "id,name")
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.csv"]
    assert report["error_class"] == "CorruptInputError"
    assert report["error_message"] == (
        "cannot read part-0.csv as csv: line 12 (id=10, name=Zo\ufffd): column 'name': b'Zo\\xeb' is not UTF-8 text. "
        "Fix the row, or set tolerance.rows (--tolerate-rows) to reject such rows and score the rest"
    )


def _json_line(i: int, **changes) -> str:
    record = {"id": i, "name": f"n{i}", "a": round(i / 7, 6), "b": 1.5, "c": -0.25, **changes}
    return json.dumps(record)


@pytest.fixture(scope="module")
def hand_written_jsonl(tmp_path_factory) -> Path:
    """JSON lines as people write and edit them: a string in a number field on line 1 of one file; in the other,
    three blank lines (one of spaces) after record 100, a string where a number goes in record 500 (line 503), a
    latin-1 name in record 551 (line 554), a line cut short (line 570) and a blank line at the end."""
    root = tmp_path_factory.mktemp("hand-jsonl")
    front = [_json_line(0, a="twelve"), *(_json_line(i) for i in range(1, 600))]
    (root / "front.jsonl").write_text("\n".join(front) + "\n")
    late = [_json_line(i) for i in range(600)]
    late[499] = _json_line(499, b="1,5")  # a decimal comma
    late[566] = late[566][:12]
    body = "\n".join(late[:100]) + "\n\n   \n\n" + "\n".join(late[100:]) + "\n\n"
    body = body.encode().replace(b'"n550"', '"Hélène"'.encode("latin-1"))
    (root / "late.jsonl").write_bytes(body)
    return root


def test_hand_written_json_lines_reject_each_bad_row_by_its_line(hand_written_jsonl, model_dir, tmp_path):
    result = run_worker(
        hand_written_jsonl, tmp_path / "out", model_dir, "--passthrough", "id,name", "--tolerate-rows", "5"
    )
    assert result.returncode == EXIT_OK, describe(result)
    reports = reports_by_input(load_manifest(tmp_path / "out"))
    front, late = reports["front.jsonl"], reports["late.jsonl"]
    for report in (front, late):
        _accounted(report)
    assert (front["rows_in"], front["rows_rejected"]) == (600, 1)
    assert [(r["line"], r["row"], r["reason"]) for r in _listed(tmp_path / "out", front)] == [
        (1, 1, "column 'a': 'twelve' is not a number")
    ]
    assert (late["rows_in"], late["rows_rejected"]) == (600, 3)
    listed = _listed(tmp_path / "out", late)
    assert [(r["line"], r["row"]) for r in listed] == [(503, 500), (554, 551), (570, 567)]
    assert listed[0]["reason"] == "column 'b': '1,5' is not a number"
    assert listed[1]["reason"] == "column 'name': b'H\\xe9l\\xe8ne' is not UTF-8 text"
    assert listed[2]["reason"].startswith("not valid JSON")


def test_without_tolerance_json_lines_fail_naming_the_line_and_column_from_1(hand_written_jsonl, model_dir, tmp_path):
    """Arrow says "changed from number to string in row 499", counting from 0 and without blank lines; the worker
    says the line an editor shows, as a rejects list does."""
    result = run_worker(hand_written_jsonl, tmp_path / "out", model_dir, "--passthrough", "id,name")
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    reports = reports_by_input(load_manifest(tmp_path / "out"))
    assert {r["error_class"] for r in reports.values()} == {"CorruptInputError"}
    assert (
        "as jsonl: line 1 (id=0, name=n0): column 'a': 'twelve' is not a number. Fix the row, or set tolerance.rows"
        in (reports["front.jsonl"]["error_message"])
    )
    assert (
        "as jsonl: line 503 (id=499, name=n499): column 'b': '1,5' is not a number"
        in (reports["late.jsonl"]["error_message"])
    )


@pytest.fixture(scope="module")
def spreadsheet_export(tmp_path_factory) -> Path:
    """CSVs as a spreadsheet exports them and a person then edits them: a note with a line break (quoted, so row 3
    spans lines 5 and 6), a blank line after row 9 (line 13), and in one file a row with a field too many (row 15,
    line 19) and text in a number column (row 25, line 29); in both a row with a missing feature the model cannot
    score (row 20, line 24)."""
    root = tmp_path_factory.mktemp("spreadsheet")
    frame = pd.DataFrame(np.random.default_rng(9).normal(size=(30, 3)), columns=FEATURES)
    frame.insert(0, "id", np.arange(30))
    frame.insert(1, "note", ["ok"] * 30)
    frame.loc[3, "note"] = "two\nlines"
    frame.loc[5, "note"] = 'said "hi"'
    frame["a"] = frame["a"].astype(object)
    frame.loc[20, "a"] = ""
    lines = frame.to_csv(index=False, float_format="%.17g").split("\n")  # pandas quotes the note with a break
    lines.insert(12, "")  # after row 9's line (line 12): a blank line 13
    (root / "clean.csv").write_text("\n".join(lines))
    lines[18] += ",extra"  # row 15, line 19
    lines[28] = lines[28].replace(lines[28].split(",")[3], "twelve", 1)  # row 25's b, line 29
    (root / "dirty.csv").write_text("\n".join(lines))
    return root


def test_a_quoted_line_break_and_a_blank_line_do_not_shift_the_lines_named(spreadsheet_export, model_dir, tmp_path):
    result = run_worker(spreadsheet_export, tmp_path / "out", model_dir, "--passthrough", "id", "--tolerate-rows", "5")
    assert result.returncode == EXIT_OK, describe(result)
    reports = reports_by_input(load_manifest(tmp_path / "out"))
    for report in reports.values():
        _accounted(report)
    # A file the fast reader reads: its model's reject is named by its line, not its record count.
    assert [(r["line"], r["row"], r["stage"]) for r in _listed(tmp_path / "out", reports["clean.csv"])] == [
        (24, 21, "predict")
    ]
    listed = _listed(tmp_path / "out", reports["dirty.csv"])
    assert [(r["line"], r["row"], r["stage"]) for r in listed] == [
        (19, 16, "read"),
        (24, 21, "predict"),
        (29, 26, "read"),
    ]
    assert listed[0]["reason"] == "6 field(s) where the file has 5 column(s)"
    assert listed[2]["reason"] == "column 'b': 'twelve' is not a number" and listed[2]["ids"] == {"id": 25}
    written = read_table(tmp_path / "out" / reports["dirty.csv"]["output"]).to_pandas()
    assert sorted(written.id) == sorted(set(range(30)) - {15, 20, 25})
    result = run_worker(spreadsheet_export, tmp_path / "strict", model_dir, "--passthrough", "id")
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    message = reports_by_input(load_manifest(tmp_path / "strict"))["dirty.csv"]["error_message"]
    assert "as csv: line 19: 6 field(s) where the file has 5 column(s). Fix the row" in message, message


def test_a_reject_keeps_at_most_a_thousand_characters_of_a_line(model_dir, tmp_path):
    """A row a writer lost its line breaks in is 600 KB of text: its reject, the log and the failure quote its start."""
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "part-0.csv").write_text("id,a,b,c\n" + "1,2,3,4\n" + ",".join(["9" * 1000] * 600) + "\n")
    result = run_worker(wide, tmp_path / "out", model_dir, "--passthrough", "id", "--tolerate-rows", "5")
    assert result.returncode == EXIT_OK, describe(result)
    report = reports_by_input(load_manifest(tmp_path / "out"))["part-0.csv"]
    (listed,) = _listed(tmp_path / "out", report)
    assert listed["line"] == 3 and listed["text"].endswith("... (599,599 more characters)")
    assert len(listed["text"]) < 1_100
    assert max(len(line) for line in result.stderr.splitlines()) < 3_000
    strict = run_worker(wide, tmp_path / "strict", model_dir, "--passthrough", "id")
    message = reports_by_input(load_manifest(tmp_path / "strict"))["part-0.csv"]["error_message"]
    assert message.startswith("cannot read part-0.csv as csv: line 3: 600 field(s)") and len(message) < 3_000
    assert max(len(line) for line in strict.stderr.splitlines()) < 3_000


def test_a_json_passthrough_field_of_numbers_and_text_is_read_whole_without_tolerance(model_dir, tmp_path):
    """Order references typed by hand: most numbers, some text. The fast reader stops at the first text one; read on
    row by row, every row is good, so the file succeeds whole, tolerance or not, its references as text."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    refs = [f"A-{i}" if i % 250 == 7 else i for i in range(2000)]
    lines = [json.dumps({"ref": ref, "a": i / 3, "b": 0.5, "c": -1.0}) for i, ref in enumerate(refs)]
    (inputs / "orders.jsonl").write_text("\n".join(lines) + "\n")
    for args in ((), ("--tolerate-rows", "1")):
        out = tmp_path / f"out{len(args)}"
        result = run_worker(inputs, out, model_dir, "--passthrough", "ref", "--batch-rows", "100", *args)
        assert result.returncode == EXIT_OK, describe(result)
        report = reports_by_input(load_manifest(out))["orders.jsonl"]
        assert (report["rows_in"], report["rows_out"], report["rows_rejected"]) == (2000, 2000, 0)
        written = read_table(out / report["output"]).to_pandas()
        assert list(written.ref) == [str(ref) for ref in refs]
