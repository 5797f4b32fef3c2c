"""What the worker's text readers share (``shardline.worker.io.text_files``): batches regrouped to the batch size,
a header line of numbers refused, how a text file is opened and described, which line each record starts on, and
bytes that are not UTF-8. Pure: small files in tmp_path."""

from __future__ import annotations

import gzip

import numpy as np
import pyarrow as pa
import pytest

from shardline.errors import InputSchemaError
from shardline.worker.io.text_files import (
    LineMap,
    MarkedBytes,
    as_written,
    csv_read_options,
    describe,
    has_marks,
    is_empty_text,
    looks_like_number,
    marked_text,
    names_hint,
    readable,
    rebatch,
    refuse_a_data_line_as_header,
)
from shardline.worker.io.work_units import InputFile


def _blocks(sizes):
    first = 0
    for size in sizes:
        yield pa.record_batch([pa.array(np.arange(first, first + size))], names=["id"])
        first += size


@pytest.mark.parametrize(
    ("sizes", "rows", "expected"),
    [
        ([3, 3, 3, 3], 5, [5, 5, 2]),  # small blocks joined, across block ends
        ([12], 5, [5, 5, 2]),  # a large one split
        ([5, 5], 5, [5, 5]),  # blocks of the size pass as they are
        ([0, 2, 0, 1], 5, [3]),  # empty blocks add nothing
        ([], 5, []),
    ],
)
def test_text_blocks_are_regrouped_to_the_batch_size_in_order(sizes, rows, expected):
    """A text reader yields a batch per 1 MiB block (about 3,000 CSV rows): the model is called on batches of
    the asked size instead, every row once, in order."""
    from shardline.worker.io.text_files import regroup

    out = list(regroup(_blocks(sizes), rows))
    assert [batch.num_rows for batch in out] == expected
    ids = [value for batch in out for value in batch.column("id").to_pylist()]
    assert ids == list(range(sum(sizes)))


def test_wide_text_rows_are_joined_by_bytes_not_only_rows():
    """Rows of long text (documents for a model that takes raw text) reach Arrow's 2 GiB string limit before
    --batch-rows: a joined batch also stops at a size in bytes, and every row still comes once, in order."""
    from shardline.worker.io.text_files import regroup

    blocks = [
        pa.record_batch([pa.array([f"{i:06d}" + "x" * 994 for i in range(k, k + 10)])], ["text"])
        for k in range(0, 100, 10)
    ]  # ten blocks of ten 1,000-byte rows
    out = list(regroup(blocks, rows=1000, max_bytes=25_000))
    assert [batch.num_rows for batch in out] == [30, 30, 30, 10]
    assert [int(text[:6]) for batch in out for text in batch.column("text").to_pylist()] == list(range(100))


def _csv(path, text: str, *, names=None, trust=False, gz=False) -> InputFile:
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return InputFile(path.name, str(path), "csv", gz, path.stat().st_size, csv_names=names, trust_header=trust)


@pytest.mark.parametrize(
    ("text", "number"),
    [("1", True), ("-2.5e3", True), (" 0.53 ", True), ("nan", False), ("-inf", False), ("Infinity", False)],
)
def test_a_name_looks_like_a_number_when_it_parses_as_a_finite_one(text, number):
    assert looks_like_number(text) is number


@pytest.mark.parametrize(
    "names",
    [
        ["id", "f0", "f1"],
        ["0", "1", "2"],  # pandas' names for an unnamed frame: a header
        ["id", "2024", "2025"],  # years are names: whole numbers beside a name
        ["id", "0.5"],  # one decimal of two: half, not most
    ],
)
def test_a_header_line_of_names_is_read_as_one(tmp_path, names):
    refuse_a_data_line_as_header(_csv(tmp_path / "a.csv", ""), names)


@pytest.mark.parametrize("names", [["1", "2", "3"], ["7", "0.53", "1e-3"], ["id", "0.5", "0.25"]])
def test_a_header_line_of_numbers_is_refused_naming_the_settings(tmp_path, names):
    with pytest.raises(InputSchemaError) as refused:
        refuse_a_data_line_as_header(_csv(tmp_path / "a.csv", ""), names)
    said = str(refused.value)
    assert said.startswith(f"the first line of a.csv reads as numbers ({', '.join(names)}), not column names")
    assert "input.csv_header: false" in said and "input.csv_header: true" in said
    refuse_a_data_line_as_header(_csv(tmp_path / "b.csv", "", trust=True), names)  # csv_header: true vouches


def test_a_headerless_csv_is_named_by_position_and_its_errors_say_so(tmp_path):
    named = _csv(tmp_path / "a.csv", "1,2\n", names=("id", "f0"))
    assert csv_read_options(named).column_names == ["id", "f0"]
    assert csv_read_options(_csv(tmp_path / "b.csv", "id,f0\n")).column_names == []
    assert names_hint(named) == (
        ". input.csv_header is false, so input.features names this file's 2 column(s) by position: every line "
        "must have exactly that many fields"
    )
    assert names_hint(_csv(tmp_path / "c.csv", "id\n")) == ""


def test_a_text_file_is_described_and_its_emptiness_read_through_its_compression(tmp_path):
    empty = _csv(tmp_path / "e.csv.gz", "", gz=True)
    assert describe(empty) == "csv (gzip)" and is_empty_text(empty)
    assert not is_empty_text(_csv(tmp_path / "f.csv.gz", "id\n1\n", gz=True))
    assert describe(_csv(tmp_path / "g.csv", "id\n")) == "csv"


def test_a_batch_is_cut_to_the_batch_size_only_when_larger():
    batch = pa.record_batch([pa.array(np.arange(10))], names=["id"])
    assert [b.num_rows for b in rebatch(batch, 4)] == [4, 4, 2]
    (whole,) = rebatch(batch, 10)
    assert whole is batch


# -- lines as an editor numbers them ---------------------------------------------------------------------------------

# A CSV as a spreadsheet export writes it: a note with a line break (quoted), a blank line, a Windows line ending.
EXPORT = b'id,note,a\n1,plain,0.5\n\n2,"two\nlines",1.5\n3,"say ""hi""",2.5\r\n\r\n4,last,3.5'
EXPORT_LINES = [1, 2, 4, 6, 8]  # the line each record (the header, then ids 1 to 4) starts on


@pytest.mark.parametrize("chunk", [LineMap.CHUNK, 3, 7])  # whole, and cut inside quotes and line ends
@pytest.mark.parametrize("gz", [False, True])
def test_each_csv_record_is_on_the_line_an_editor_shows(tmp_path, chunk, gz):
    path = tmp_path / ("a.csv.gz" if gz else "a.csv")
    path.write_bytes(gzip.compress(EXPORT) if gz else EXPORT)
    lines = LineMap(InputFile(path.name, str(path), "csv", gz, path.stat().st_size))
    lines.CHUNK = chunk
    assert [lines(record) for record in range(1, 6)] == EXPORT_LINES


def test_json_lines_count_their_blank_lines_and_a_clean_file_keeps_no_map(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n\n   \n{"a": 2}\n{"a": 3}\n\t\n{"a": 4}\n')
    lines = LineMap(InputFile("a.jsonl", str(path), "jsonl", False, path.stat().st_size))
    assert [lines(record) for record in range(1, 5)] == [1, 4, 5, 7]
    clean = tmp_path / "b.jsonl"
    clean.write_text("".join(f'{{"a": {i}}}\n' for i in range(1000)))
    lines = LineMap(InputFile("b.jsonl", str(clean), "jsonl", False, clean.stat().st_size))
    assert lines(1000) == 1000 and lines._starts == []


# -- bytes that are not UTF-8 ----------------------------------------------------------------------------------------


def test_a_byte_that_is_not_utf8_is_marked_said_as_written_and_shown_as_a_replacement(tmp_path):
    text = marked_text("café, ".encode("latin-1") + "café".encode())
    assert has_marks(text) and not has_marks("café")
    assert as_written(text) == b"caf\xe9, caf\xc3\xa9"
    assert readable(text) == "caf\ufffd, café"


def test_marked_bytes_read_a_file_whole_across_chunks(tmp_path):
    body = ("né,".encode() + b"caf\xe9\n") * 200_000  # over a block, a two-byte character cut by some
    path = tmp_path / "a.csv"
    path.write_bytes(body)
    marked = MarkedBytes(pa.input_stream(str(path)))
    read = b"".join(iter(lambda: marked.read(100_000), b""))
    assert marked.marked and as_written(read.decode()) == body
