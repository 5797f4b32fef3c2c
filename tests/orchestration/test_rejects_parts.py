"""Picking a file's rejected rows again (`resubmit --rejects`): by number, as the worker numbered them, from the
source as it is now; and the ledger's reading that folds a part into its source."""

from __future__ import annotations

import dataclasses
import io

import pyarrow as pa
import pyarrow.parquet as pq

from shardline.ledger.records import FileRecord, settle_parts, stale_parts
from shardline.ledger.states import FileStatus
from shardline.orchestration.rejects_parts import pick_lines, pick_parquet, with_rejects
from shardline.planning import naming


def test_rows_are_numbered_as_the_worker_numbers_them_blank_lines_not_counted():
    source = b"id,x\n0,1.0\n\n1,oops\r\n2,3.0\n3,4.0"
    picked, rows = pick_lines(io.BytesIO(source), [2, 4], header=True)
    assert (picked, rows) == (b"id,x\n1,oops\r\n3,4.0\n", 4)
    picked, rows = pick_lines(io.BytesIO(b'{"a":1}\n{"a":2}\n'), [1], header=False)
    assert (picked, rows) == (b'{"a":1}\n', 2)


def test_parquet_rows_are_picked_across_row_groups(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"id": list(range(10))}), path, row_group_size=3)
    body, rows = pick_parquet(str(path), [1, 4, 10])
    assert rows == 10
    assert pq.read_table(io.BytesIO(body))["id"].to_pylist() == [0, 3, 9]


def test_a_part_is_named_as_one_more_part_of_its_source():
    assert naming.rejects_part_name("day/x.csv.gz", 3) == "day/x.rejects-a3.csv.gz"
    assert naming.rejects_part_name("x.parquet.gz", 3) == "x.rejects-a3.parquet"
    assert naming.rejects_part_name("x.parquet", 2) == "x.rejects-a2.parquet"
    assert naming.rejects_part_name("part-00000", 2) == "part-00000.rejects-a2"


def _file(key, status=FileStatus.SUCCEEDED, attempt=1, **figures) -> FileRecord:
    return FileRecord(key, status, attempt, **figures)


def test_a_succeeded_part_is_folded_into_its_source_and_the_balance_holds():
    source = _file("s3://b/in/x.csv", rows_in=100, rows_out=90, rows_rejected=10, rejects_key="s3://b/r1")
    first = _file(
        "s3://b/m/attempt-0002.rejects/x.rejects-a2.csv",
        attempt=2,
        rows_in=10,
        rows_out=7,
        rows_rejected=3,
        rejects_key="s3://b/r2",
        output_key="s3://b/out/x.rejects-a2.csv",
        part_of=source.input_key,
    )
    other = _file("s3://b/in/y.csv", rows_in=5, rows_out=5, rows_rejected=0)
    (settled, same) = settle_parts([source, first, other])
    assert (settled.rows_in, settled.rows_out, settled.rows_rejected, settled.rejects_key) == (100, 97, 3, "s3://b/r2")
    assert settled.parts == ("s3://b/out/x.rejects-a2.csv",)
    assert same == other
    assert [f.input_key for f in with_rejects([source, first, other])] == [source.input_key]

    # A part that failed stays a file of its own, and changes nothing, until a later part of the source succeeds.
    failed = _file("s3://b/m/attempt-0003.rejects/x.rejects-a3.csv", FileStatus.FAILED, 3, part_of=source.input_key)
    assert [f.input_key for f in settle_parts([source, first, failed])] == [source.input_key, failed.input_key]
    second = _file(
        "s3://b/m/attempt-0004.rejects/x.rejects-a4.csv",
        attempt=4,
        rows_in=3,
        rows_out=3,
        rows_rejected=0,
        output_key="s3://b/out/x.rejects-a4.csv",
        part_of=source.input_key,
    )
    (done,) = settle_parts([source, first, failed, second])
    assert (done.rows_out, done.rows_rejected, done.rejects_key) == (100, 0, None)
    assert with_rejects([source, first, failed, second]) == []
    # The newest part, unfinished, is a file of the step's; an older unfinished one a newer part took again is not.
    running = dataclasses.replace(failed, status=FileStatus.RUNNING)
    newer = dataclasses.replace(second, status=FileStatus.RUNNING)
    assert [f.input_key for f in settle_parts([source, first, running, newer])] == [source.input_key, newer.input_key]


def test_a_part_of_an_earlier_version_of_its_source_counts_for_nothing():
    """The source changed again after its rows were picked, and was scored again whole (attempt 3): the part of
    attempt 2 holds rows its source's new output holds too."""
    source = _file("s3://b/in/x.csv", attempt=3, rows_in=100, rows_out=100, rows_rejected=0)
    old = _file(
        "s3://b/m/attempt-0002.rejects/x.rejects-a2.csv",
        attempt=2,
        rows_in=10,
        rows_out=10,
        rows_rejected=0,
        output_key="s3://b/out/x.rejects-a2.csv",
        part_of=source.input_key,
    )
    assert settle_parts([source, old]) == [source]
    assert stale_parts([source, old]) == {old.input_key}


def test_a_blank_json_line_of_white_space_is_no_row():
    picked, rows = pick_lines(io.BytesIO(b'{"a":1}\n   \n{"a":2}\n'), [2], header=False, fmt="jsonl")
    assert (picked, rows) == (b'{"a":2}\n', 2)
