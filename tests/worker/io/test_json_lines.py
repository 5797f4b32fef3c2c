"""JSON lines from Arrow batches: every value reads back exactly as written, and what Arrow cannot format is left
to pandas."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from shardline.worker.io import formats
from shardline.worker.io.json_lines import batch_lines


def _lines(batch: pa.RecordBatch) -> list[dict]:
    return [json.loads(line) for line in batch_lines(batch).to_pybytes().decode().splitlines()]


def test_floats_read_back_exactly_as_written_where_pandas_kept_15_digits():
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.random(5000), [0.009009009009009009, 1e-300, 1e22, -0.0, 2.0, 123456789.125]])
    rows = _lines(pa.record_batch([pa.array(values)], names=["prediction"]))
    assert [row["prediction"] for row in rows] == values.tolist()
    pandas = pa.record_batch([pa.array(values)], names=["p"]).to_pandas().to_json(orient="records", lines=True)
    assert json.loads(pandas.splitlines()[5000])["p"] != values[5000]  # why the writer no longer uses it


def test_float32_is_written_as_its_own_shortest_text_and_whole_numbers_stay_floats():
    batch = pa.record_batch([pa.array(np.array([0.1, 1 / 3, 2.0, -7.0], dtype=np.float32))], names=["p"])
    text = batch_lines(batch).to_pybytes().decode()
    assert text == '{"p":0.1}\n{"p":0.33333334}\n{"p":2.0}\n{"p":-7.0}\n'
    assert np.array([row["p"] for row in _lines(batch)], dtype=np.float32).tolist() == batch.column(0).to_pylist()


def test_nan_infinities_and_nulls_are_null_and_other_types_keep_their_json_kind():
    batch = pa.record_batch(
        [
            pa.array([np.nan, np.inf, None, 1.5]),
            pa.array([1, None, -3, 4], pa.int32()),
            pa.array([True, False, None, True]),
            pa.array(["plain", 'quote " and \\ back', None, "ünïcode"]),
            pa.array(["a", "b", "a", None]).dictionary_encode(),
        ],
        names=["p", "id", "flag", "name", "label"],
    )
    assert _lines(batch) == [
        {"p": None, "id": 1, "flag": True, "name": "plain", "label": "a"},
        {"p": None, "id": None, "flag": False, "name": 'quote " and \\ back', "label": "b"},
        {"p": None, "id": -3, "flag": None, "name": None, "label": "a"},
        {"p": 1.5, "id": 4, "flag": True, "name": "ünïcode", "label": None},
    ]


def test_a_slice_writes_its_own_rows_and_an_empty_batch_nothing():
    batch = pa.record_batch([pa.array(np.arange(10)), pa.array(np.arange(10) / 4)], names=["id", "p"])
    assert _lines(batch.slice(3, 2)) == [{"id": 3, "p": 0.75}, {"id": 4, "p": 1.0}]
    assert batch_lines(batch.slice(0, 0)).to_pybytes() == b""


@pytest.mark.parametrize(
    "column",
    [pa.array(["tab\there", "ok"]), pa.array([1_700_000_000_000, 0], pa.timestamp("ms")), pa.array([[1], [2]])],
    ids=["control character", "timestamp", "list"],
)
def test_what_arrow_cannot_format_here_is_left_to_pandas_and_still_written(tmp_path, column):
    batch = pa.record_batch([pa.array([1, 2]), column], names=["id", "x"])
    assert batch_lines(batch) is None
    writer = formats.OutputWriter(tmp_path / "out.jsonl", "jsonl", False, batch.schema)
    writer.write(batch)
    writer.close()
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == [1, 2] and len(rows) == 2
