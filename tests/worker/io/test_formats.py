"""formats.py: matrices and output naming (unit), every input format end to end, schema
errors and corrupt inputs failing alone."""

from __future__ import annotations

import decimal
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.contract import EXIT_FILES_FAILED, EXIT_OK
from shardline.worker.io import formats
from shardline.worker.io.work_units import InputFile
from tests.support.helpers import (
    FEATURES,
    SYNTHETIC_COLUMNS,
    check_outputs,
    describe,
    is_gzip,
    load_manifest,
    no_temp_files,
    read_table,
    reports_by_input,
    run_worker,
    sklearn_predict,
    xgboost_predict,
)

# -- to_matrix ------------------------------------------------------------------------------------------


def test_to_matrix_converts_types_and_nulls():
    batch = pa.record_batch(
        [
            pa.array([1.5, None], pa.float32()),
            pa.array([True, False]),
            pa.array([decimal.Decimal("2.25"), decimal.Decimal("-1.00")], pa.decimal128(5, 2)),
            pa.array([7, 8], pa.int64()),
        ],
        names=["a", "b", "c", "d"],
    )
    matrix = formats.to_matrix(batch, ["d", "a", "b", "c"], np.dtype(np.float64))
    assert matrix.flags.c_contiguous
    np.testing.assert_array_equal(matrix, [[7, 1.5, 1, 2.25], [8, np.nan, 0, -1.0]])


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.uint8(),
        pa.uint32(),
        pa.uint64(),
        pa.float16(),
        pa.float32(),
        pa.float64(),
    ],
)
def test_column_values_match_arrows_own_conversion(arrow_type):
    """The worker's conversion (no pandas) gives Arrow's to_numpy values: slices, nulls and large integers."""
    rng = np.random.default_rng(7)
    values = rng.integers(0, 100, size=1000).astype(arrow_type.to_pandas_dtype())
    if pa.types.is_integer(arrow_type) and arrow_type.bit_width == 64:
        values[:3] = [2**53 + 1, 2**40 + 3, 99] if pa.types.is_signed_integer(arrow_type) else [2**63 + 5, 2**53 + 1, 1]
    plain = pa.array(values)
    with_nulls = pa.array(values, mask=rng.random(1000) < 0.1)
    for column in (plain, with_nulls, plain.slice(3, 500), with_nulls.slice(7, 400)):
        expected, got = column.to_numpy(zero_copy_only=False), formats.column_values(column)
        if column.null_count == 0:
            assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


# -- output_target / temp_path ----------------------------------------------------------------------------


def _file(rel: str, fmt: str, gz: bool) -> InputFile:
    return InputFile(rel, f"/in/{rel}", fmt, gz, 100)


@pytest.mark.parametrize(
    ("rel", "fmt", "gz", "output_format", "expected"),
    [
        ("a.parquet", "parquet", False, "same", ("a.parquet", "parquet", False)),
        ("d/e/a.pq", "parquet", False, "same", ("d/e/a.pq", "parquet", False)),
        ("a.csv", "csv", False, "same", ("a.csv", "csv", False)),
        ("d/a.csv.gz", "csv", True, "same", ("d/a.csv.gz", "csv", True)),
        ("a.jsonl", "jsonl", False, "same", ("a.jsonl", "jsonl", False)),
        ("a.jsonl.gz", "jsonl", True, "same", ("a.jsonl.gz", "jsonl", True)),
        ("a.ndjson.gz", "jsonl", True, "same", ("a.ndjson.gz", "jsonl", True)),
        # gzipped parquet is written as plain parquet (compressed inside already)
        ("d/a.parquet.gz", "parquet", True, "same", ("d/a.parquet", "parquet", False)),
        # an explicit output format renames the file and drops the outer gzip
        ("d/a.parquet", "parquet", False, "csv", ("d/a.csv", "csv", False)),
        ("a.csv.gz", "csv", True, "parquet", ("a.parquet", "parquet", False)),
        ("a.csv", "csv", False, "jsonl", ("a.jsonl", "jsonl", False)),
        ("a.pq", "parquet", False, "parquet", ("a.parquet", "parquet", False)),
        ("part.v2.csv", "csv", False, "parquet", ("part.v2.parquet", "parquet", False)),
    ],
)
def test_output_target(rel, fmt, gz, output_format, expected):
    assert formats.output_target(_file(rel, fmt, gz), output_format) == expected


def test_temp_path_is_hidden_deterministic_and_per_part(tmp_path):
    final = tmp_path / "d" / "a.parquet"
    assert formats.temp_path(final) == tmp_path / "d" / f".a.parquet{formats.TEMP_MARKER}"
    assert formats.temp_path(final, 3) == tmp_path / "d" / f".a.parquet.part0003{formats.TEMP_MARKER}"
    assert formats.temp_path(final, 3) == formats.temp_path(final, 3)


def _text_with_bad_lines(folder, fmt: str, rows: int, bad: dict[int, str]) -> InputFile:
    """``rows`` rows of id, a 300-character pad (about 3,300 rows a 1 MiB block) and two features; the rows in
    ``bad`` are a line that does not split ("split") or a value that is no number ("value")."""
    import json

    pad = "p" * 300
    lines = ["id,pad,f0,f1"] if fmt == "csv" else []
    for i in range(rows):
        kind = bad.get(i)
        if fmt == "csv":
            lines.append(
                {"split": f"{i},{pad},1.0,2.0,9", "value": f"{i},{pad},abc,2.0"}.get(kind, f"{i},{pad},{i},2.0")
            )
        elif kind == "split":
            lines.append(f'{{"id": {i}, "pad": "{pad}", "f0": 1.0')
        else:
            lines.append(json.dumps({"id": i, "pad": pad, "f0": "abc" if kind else i * 0.5, "f1": 2.0}))
    path = folder / f"bad.{fmt}"
    path.write_text("\n".join(lines) + "\n")
    return InputFile(path.name, str(path), fmt, False, path.stat().st_size)


@pytest.mark.parametrize("kind", ["split", "value"])
@pytest.mark.parametrize("bad_rows", [(4000,), (15_500,), (5000, 10_001)])
@pytest.mark.parametrize("batch_rows", [1000, 7000, 65_536])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_blocks_joined_or_not_the_row_by_row_reader_takes_over_without_losing_a_row(
    tmp_path, fmt, batch_rows, bad_rows, kind
):
    """With tolerance.rows, the fast reader's blocks are joined into batches: when a bad line stops it, the rows it
    held but had not yet given are read again by the row-by-row reader, and every good row comes once, in order,
    with each bad line rejected by its own line number; whether the bad line falls in the first batch, inside a
    group of blocks being joined, or after batches already given."""
    from shardline.worker.io.rejects import RejectLog
    from shardline.worker.io.work_units import WorkUnit

    rows = 20_000
    file = _text_with_bad_lines(tmp_path, fmt, rows, dict.fromkeys(bad_rows, kind))
    rejects = RejectLog(100, header_lines=1 if fmt == "csv" else 0)
    schema = formats.read_schema(file, tmp_path, tolerant=True, keep_types=("id", "pad"))
    ids = []
    for batch in formats.iter_batches(
        WorkUnit(file, est_bytes=file.size),
        ["id", "pad", "f0", "f1"],
        ["f0", "f1"],
        batch_rows,
        tmp_path,
        rejects=rejects,
        schema=schema,
    ):
        ids += batch.column("id").to_pylist()
    assert ids == [i for i in range(rows) if i not in bad_rows]
    header = 1 if fmt == "csv" else 0
    assert sorted(reject.line for reject in rejects.rejects) == [row + 1 + header for row in bad_rows]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_gzipped_text_output_is_written_fast_and_the_same_bytes_every_time(tmp_path, fmt):
    """Arrow's own gzip writes at level 9, which cost four times the model for a file of ids and predictions:
    the writer uses zlib's fastest level (the gzip header's XFL byte says so: 4) and no timestamp, so a retry's
    output is byte for byte the first's."""
    import gzip

    batch = pa.record_batch([pa.array(np.arange(1000)), pa.array(np.linspace(0, 1, 1000))], names=["id", "prediction"])
    written = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.{fmt}.gz"
        writer = formats.OutputWriter(path, fmt, True, batch.schema)
        writer.write(batch)
        writer.write(batch.slice(0, 10))
        writer.close()
        written.append(path.read_bytes())
    assert written[0] == written[1]
    header = written[0][:10]
    assert header[:2] == b"\x1f\x8b" and header[4:8] == b"\0\0\0\0" and header[8] == 4
    lines = gzip.decompress(written[0]).decode().splitlines()
    assert len(lines) == 1010 + (fmt == "csv")  # the CSV's header line
    assert lines[-1] in ("9,0.009009009009009009", '{"id":9,"prediction":0.009009009009009009}')  # exact


# -- every input format, end to end -----------------------------------------------------------------------

FORMAT_FILES = {
    # input name: (format, expected output name)
    "plain.parquet": ("parquet", "plain.parquet"),
    "zipped.parquet.gz": ("parquet", "zipped.parquet"),
    "plain.csv": ("csv", "plain.csv"),
    "zipped.csv.gz": ("csv", "zipped.csv.gz"),
    "plain.jsonl": ("jsonl", "plain.jsonl"),
    "nested/zipped.jsonl.gz": ("jsonl", "nested/zipped.jsonl.gz"),
}


@pytest.fixture(scope="module")
def format_run(tmp_path_factory, xgboost_model):
    root = tmp_path_factory.mktemp("formats")
    inputs, out = root / "in", root / "out"
    first = 0
    for i, (name, (fmt, _)) in enumerate(FORMAT_FILES.items()):
        rows = 700 + 100 * i
        synthetic.write_table(
            synthetic.make_table(rows, first_id=first, seed=i), inputs / name, fmt, row_group_rows=300
        )
        first += rows
    # --batch-rows smaller than the files: several batches per file, across text blocks and row groups
    result = run_worker(inputs, out, xgboost_model.parent, *SYNTHETIC_COLUMNS, "--batch-rows", "256")
    return inputs, out, result


@pytest.mark.slow
def test_every_format_succeeds_with_correct_predictions(format_run, xgboost_model):
    inputs, out, result = format_run
    assert result.returncode == EXIT_OK, describe(result)
    manifest = load_manifest(out)
    check_outputs(
        inputs, out, manifest, xgboost_predict(xgboost_model), expected_output=lambda rel: FORMAT_FILES[rel][1]
    )
    assert no_temp_files(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMAT_FILES))
def test_output_keeps_format_and_compression(format_run, name):
    inputs, out, result = format_run
    assert result.returncode == EXIT_OK, describe(result)
    fmt, output = FORMAT_FILES[name]
    path = out / output
    assert path.is_file()
    if output.endswith(".gz"):
        assert is_gzip(path), f"{output} should be gzipped like its input"
    else:
        assert not is_gzip(path)
    if fmt == "parquet":
        assert pq.ParquetFile(path).metadata.num_rows == read_table(inputs / name).num_rows
    elif fmt == "csv":
        table = read_table(path)
        assert table.column_names == ["id", "prediction"]
        assert table.schema.field("id").type == pa.int64()
    else:
        table = read_table(path)
        assert table.column_names == ["id", "prediction"]


# -- passthrough, --features, and schema errors that fail one file --------------------------------------


def _with_extras(table: pa.Table, prefix: str) -> pa.Table:
    """id, a string column, an extra numeric column that is not a feature, then the features."""
    names = pa.array([f"{prefix}-{i}" for i in table.column("id").to_pylist()])
    extra = pa.array(np.arange(table.num_rows, dtype=np.float64) * 1000)
    return pa.table({"id": table.column("id"), "name": names, "extra": extra, **{f: table.column(f) for f in FEATURES}})


SCHEMA_GOOD = ("good.parquet", "good.csv", "good.jsonl.gz")


@pytest.fixture(scope="module")
def schema_run(tmp_path_factory, xgboost_model):
    root = tmp_path_factory.mktemp("schema")
    inputs, out = root / "in", root / "out"
    synthetic.write_table(_with_extras(synthetic.make_table(900, seed=1), "p"), inputs / "good.parquet", "parquet")
    synthetic.write_table(
        _with_extras(synthetic.make_table(800, first_id=900, seed=2), "c"), inputs / "good.csv", "csv"
    )
    synthetic.write_table(
        _with_extras(synthetic.make_table(700, first_id=1700, seed=3), "j"), inputs / "good.jsonl.gz", "jsonl"
    )
    missing = _with_extras(synthetic.make_table(500, first_id=2400, seed=4), "m").drop_columns(["f7"])
    synthetic.write_table(missing, inputs / "missing_feature.parquet", "parquet")
    text = _with_extras(synthetic.make_table(500, first_id=2900, seed=5), "t")
    text = text.set_column(text.schema.get_field_index("f3"), "f3", pa.array([f"x{i}" for i in range(500)]))
    synthetic.write_table(text, inputs / "text_feature.csv", "csv")
    result = run_worker(inputs, out, xgboost_model.parent, "--passthrough", "id,name", "--features", ",".join(FEATURES))
    return inputs, out, result


@pytest.mark.slow
def test_schema_errors_fail_their_file_and_exit_3(schema_run):
    _, out, result = schema_run
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    manifest = load_manifest(out)
    assert (manifest["succeeded"], manifest["failed"]) == (3, 2)


@pytest.mark.slow
def test_passthrough_and_explicit_features(schema_run, xgboost_model):
    inputs, out, _ = schema_run
    # "extra" is numeric but not in --features: were it used, the 32-feature booster would refuse the file.
    check_outputs(
        inputs, out, load_manifest(out), xgboost_predict(xgboost_model), passthrough=("id", "name"), only=SCHEMA_GOOD
    )
    table = read_table(out / "good.csv")
    assert table.column("name").to_pylist()[:2] == ["c-900", "c-901"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "column"), [("missing_feature.parquet", "f7"), ("text_feature.csv", "f3")])
def test_schema_error_names_the_column(schema_run, name, column):
    _, out, result = schema_run
    report = reports_by_input(load_manifest(out))[name]
    assert report["status"] == "FAILED"
    assert report["error_class"] == "InputSchemaError"
    named = re.compile(rf"'{column}'|lacks column\(s\) {column}\b")  # spec features quote it; model names list it
    assert named.search(report["error_message"]), report["error_message"]
    assert report["output"] is None
    assert not (out / name).exists()
    assert name in result.stderr and named.search(result.stderr), "the log must say which file and column"


# -- corrupt inputs fail alone; an empty file is not a failure ----------------------------------------------


@pytest.fixture(scope="module")
def corrupt_run(tmp_path_factory, sklearn_model):
    root = tmp_path_factory.mktemp("corrupt")
    inputs, out = root / "in", root / "out"
    synthetic.write_table(synthetic.make_table(1200, seed=1), inputs / "good.parquet", "parquet")
    synthetic.write_table(synthetic.make_table(600, first_id=1200, seed=2), inputs / "good.csv.gz", "csv")
    synthetic.write_table(synthetic.make_table(0), inputs / "empty.parquet", "parquet")
    (inputs / "garbage.parquet").write_bytes(np.random.default_rng(0).bytes(5000))
    synthetic.write_table(synthetic.make_table(800, seed=3), root / "whole.parquet", "parquet", row_group_rows=200)
    whole = (root / "whole.parquet").read_bytes()
    (inputs / "truncated.parquet").write_bytes(whole[: len(whole) // 2])
    (inputs / "not_gzip.csv.gz").write_bytes(b"id,f0\n1,2.0\n")
    # Empty partitions from an upstream job: a header-only CSV and 0-byte text files.
    (inputs / "header_only.csv").write_text("id," + ",".join(synthetic.feature_names()) + "\n")
    (inputs / "zero.jsonl").write_bytes(b"")
    (inputs / "zero.csv.gz").write_bytes(__import__("gzip").compress(b""))
    result = run_worker(inputs, out, sklearn_model.parent, *SYNTHETIC_COLUMNS)
    return inputs, out, result


CORRUPT = ("garbage.parquet", "truncated.parquet", "not_gzip.csv.gz")


@pytest.mark.slow
def test_corrupt_files_fail_alone(corrupt_run, sklearn_model):
    inputs, out, result = corrupt_run
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    manifest = load_manifest(out)
    reports = reports_by_input(manifest)
    for name in CORRUPT:
        report = reports[name]
        assert report["status"] == "FAILED", report
        assert report["error_class"] == "CorruptInputError", report
        assert name in report["error_message"] and "cannot read" in report["error_message"]
        assert not (out / name).exists()
    check_outputs(
        inputs,
        out,
        manifest,
        sklearn_predict(sklearn_model),
        exact=True,
        only=("good.parquet", "good.csv.gz", "empty.parquet", "header_only.csv"),
    )
    assert no_temp_files(out) == []


@pytest.mark.slow
def test_empty_parquet_gives_an_empty_output(corrupt_run):
    _, out, _ = corrupt_run
    report = reports_by_input(load_manifest(out))["empty.parquet"]
    assert report["status"] == "SUCCEEDED"
    assert (report["rows_in"], report["rows_out"]) == (0, 0)
    table = pq.read_table(out / "empty.parquet")
    assert table.num_rows == 0
    assert table.column_names == ["id", "prediction"]


@pytest.mark.slow
def test_explicit_output_format_converts(tmp_path, xgboost_model):
    inputs, out = tmp_path / "in", tmp_path / "out"
    synthetic.write_table(synthetic.make_table(600, seed=1), inputs / "a.parquet.gz", "parquet")
    synthetic.write_table(synthetic.make_table(400, first_id=600, seed=2), inputs / "d" / "b.jsonl", "jsonl")
    synthetic.write_table(synthetic.make_table(300, first_id=1000, seed=3), inputs / "c.csv.gz", "csv")
    result = run_worker(inputs, out, xgboost_model.parent, *SYNTHETIC_COLUMNS, "--output-format", "csv")
    assert result.returncode == EXIT_OK, describe(result)
    renamed = {"a.parquet.gz": "a.csv", "d/b.jsonl": "d/b.csv", "c.csv.gz": "c.csv"}
    check_outputs(
        inputs, out, load_manifest(out), xgboost_predict(xgboost_model), expected_output=lambda rel: renamed[rel]
    )
    assert not any(is_gzip(out / name) for name in renamed.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["header_only.csv", "zero.jsonl", "zero.csv.gz"])
def test_empty_text_files_give_empty_outputs(corrupt_run, name):
    _, out, _ = corrupt_run
    report = reports_by_input(load_manifest(out))[name]
    assert report["status"] == "SUCCEEDED", report
    assert (report["rows_in"], report["rows_out"]) == (0, 0)
    assert read_table(out / name).num_rows == 0


@pytest.mark.slow
def test_exit_zero_on_file_failures_still_records_them(tmp_path, sklearn_model):
    inputs, out = tmp_path / "in", tmp_path / "out"
    synthetic.write_table(synthetic.make_table(500, seed=1), inputs / "good.parquet", "parquet")
    (inputs / "bad.parquet").write_bytes(b"not parquet at all")
    result = run_worker(inputs, out, sklearn_model.parent, *SYNTHETIC_COLUMNS, "--exit-zero-on-file-failures")
    assert result.returncode == EXIT_OK, describe(result)
    reports = reports_by_input(load_manifest(out))
    assert reports["bad.parquet"]["status"] == "FAILED"
    assert reports["good.parquet"]["status"] == "SUCCEEDED"
    assert "exit-zero-on-file-failures" in result.stderr
