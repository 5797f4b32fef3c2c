"""Reading a text file row by row (``shardline.worker.io.tolerant``): a line that does not split or parse, and a
value that does not convert, cost that row alone, rejected with its line number; the rest is read as the fast reader
reads it. Small files in tmp_path, read in this process."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from shardline.errors import CorruptInputError
from shardline.worker.io.rejects import RejectLog
from shardline.worker.io.tolerant import (
    ROW_COLUMN,
    Reread,
    as_numbers,
    tolerant_csv,
    tolerant_csv_schema,
    tolerant_jsonl,
    tolerant_jsonl_schema,
)
from shardline.worker.io.work_units import InputFile, WorkUnit

CSV_ROWS = ["id,f0", "1,0.5", "2,1.5,9", "3,abc", "4,2.5", "5,3.5"]  # line 3 does not split, line 4's f0 is no number


def _file(tmp_path, name: str, lines: list[str], fmt: str, **more) -> InputFile:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return InputFile(name, str(path), fmt, False, path.stat().st_size, **more)


def _read_csv(file: InputFile, rejects: RejectLog, *, skip: int = 0, batch_rows: int = 100) -> list[pa.RecordBatch]:
    schema = tolerant_csv_schema(file, keep_types=("id",))
    unit = WorkUnit(file, est_bytes=file.size)
    return list(tolerant_csv(Reread(unit, ["id", "f0"], ["f0"], batch_rows, schema, rejects, skip=skip)))


def test_a_csv_row_that_does_not_split_or_convert_is_rejected_by_its_line_and_the_rest_read(tmp_path):
    rejects = RejectLog(100)
    batches = _read_csv(_file(tmp_path, "a.csv", CSV_ROWS, "csv"), rejects)
    table = pa.Table.from_batches(batches)
    assert table.column("id").to_pylist() == [1, 4, 5]
    assert table.column("f0").to_pylist() == [0.5, 2.5, 3.5] and table.schema.field("f0").type == pa.float64()
    assert table.column(ROW_COLUMN).to_pylist() == [0, 2, 3]  # each row's place among the rows parsed
    assert [(r.line, r.stage) for r in rejects.rejects] == [(3, "read"), (4, "read")]
    assert rejects.rejects[0].reason == "3 field(s) where the file has 2 column(s)"
    assert rejects.rejects[0].text == "2,1.5,9" and rejects.rejects[1].ids == {"id": 3}


def test_the_rows_the_fast_reader_gave_are_skipped_and_batches_keep_their_size(tmp_path):
    rejects = RejectLog(100)
    batches = _read_csv(_file(tmp_path, "a.csv", CSV_ROWS, "csv"), rejects, skip=1, batch_rows=1)
    assert [b.column("id").to_pylist() for b in batches] == [[4], [5]]  # row 1 was given already, not again
    assert [r.line for r in rejects.rejects] == [3, 4]
    assert [b.column(ROW_COLUMN).to_pylist() for b in batches] == [[2], [3]]  # numbered as if read from the top


def test_a_headerless_csv_none_of_whose_lines_splits_fails_naming_its_settings(tmp_path):
    file = _file(tmp_path, "h.csv", ["1,0.5,x", "2,1.5,y"], "csv", csv_names=("id", "f0"))
    with pytest.raises(CorruptInputError, match=r"no line of h\.csv splits into the file's columns: .*input\.features"):
        _read_csv(file, RejectLog(100, header_lines=0))


def test_json_lines_that_are_no_object_or_whose_value_does_not_convert_are_rejected(tmp_path):
    lines = [
        json.dumps({"id": 1, "f0": 0.5}),
        "",  # a blank line is not counted
        '{"id": 2, "f0": ',
        "[1, 2]",
        json.dumps({"id": 3, "f0": "abc"}),
        json.dumps({"id": 4, "f0": 2}),
    ]
    file = _file(tmp_path, "a.jsonl", lines, "jsonl")
    schema = pa.schema([("id", pa.int64()), ("f0", pa.float64())])
    rejects = RejectLog(100, header_lines=0)
    error = CorruptInputError("the fast reader's error")
    unit = WorkUnit(file, est_bytes=file.size)
    table = pa.Table.from_batches(
        list(tolerant_jsonl(Reread(unit, ["id", "f0"], ["f0"], 100, schema, rejects, skip=0), error))
    )
    assert table.column("id").to_pylist() == [1, 4] and table.column("f0").to_pylist() == [0.5, 2.0]
    assert [r.line for r in rejects.rejects] == [2, 3, 4]
    assert rejects.rejects[0].reason.startswith("not valid JSON")
    assert rejects.rejects[1].reason == "a JSON list, not an object"


def test_a_json_lines_schema_comes_from_the_lines_that_are_objects_or_the_fast_readers_error(tmp_path):
    error = CorruptInputError("the fast reader's error")
    file = _file(tmp_path, "a.jsonl", ["not json", json.dumps({"id": 1, "f0": 0.5})], "jsonl")
    assert tolerant_jsonl_schema(file, error) == pa.schema([("id", pa.int64()), ("f0", pa.float64())])
    with pytest.raises(CorruptInputError, match="the fast reader's error"):
        tolerant_jsonl_schema(_file(tmp_path, "b.jsonl", ["not json", "[1]"], "jsonl"), error)


def test_a_json_field_of_numbers_and_a_few_strings_is_a_number_column_unless_its_type_is_kept(tmp_path):
    """A string where a number goes (``"a": "twelve"``) is that row's problem, not the column's: the column stays a
    number column and the row is rejected as it is read. A passthrough field keeps every value, as text."""
    lines = [json.dumps({"id": i, "a": "twelve" if i == 1 else i / 2, "ref": "r7" if i == 2 else i}) for i in range(5)]
    file = _file(tmp_path, "a.jsonl", lines, "jsonl")
    error = CorruptInputError("the fast reader's error")
    assert tolerant_jsonl_schema(file, error) == pa.schema(
        [("id", pa.int64()), ("a", pa.float64()), ("ref", pa.float64())]
    )
    assert tolerant_jsonl_schema(file, error, keep_types=("ref",)).field("ref").type == pa.string()
    assert tolerant_jsonl_schema(file, error, keep_types=None).field("a").type == pa.string()
    half = _file(tmp_path, "b.jsonl", [json.dumps({"a": 1}), json.dumps({"a": "x"})], "jsonl")
    assert tolerant_jsonl_schema(half, error).field("a").type == pa.string()  # not mostly numbers: text


def test_a_rejects_parts_feature_columns_are_read_as_numbers():
    schema = pa.schema([("id", pa.string()), ("f0", pa.string()), ("f1", pa.null()), ("f2", pa.int64())])
    assert as_numbers(schema, {"f0", "f1", "f2"}) == pa.schema(
        [("id", pa.string()), ("f0", pa.float64()), ("f1", pa.float64()), ("f2", pa.int64())]
    )
    assert as_numbers(schema, ()) is schema
