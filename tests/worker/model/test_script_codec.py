"""script_codec.py: request bodies, response decoding and settings, as pure functions (no subprocess). The script
itself, imported and called, is in test_script_runner.py.

The end-to-end runs of real scripts are in test_custom_scripts.py.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from shardline.errors import SetupError
from shardline.worker.model.script_codec import (
    CSV,
    JSON,
    JSONLINES,
    NPY,
    RecordEncodingError,
    ResponseShapeError,
    ScriptProtocol,
    decode_response,
    encode_records,
    media_type,
    request_ranges,
)

# -- request_ranges ------------------------------------------------------------------------------------------


def test_ranges_respect_max_rows():
    assert request_ranges([10] * 7, 3, 1000, single=False) == [(0, 3), (3, 6), (6, 7)]


def test_ranges_respect_max_bytes():
    assert request_ranges([10] * 7, 100, 25, single=False) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    # a body may reach the limit exactly
    assert request_ranges([10, 10, 5], 100, 25, single=False) == [(0, 3)]
    # a record as large as the limit goes alone
    assert request_ranges([30, 10], 100, 30, single=False) == [(0, 1), (1, 2)]


def test_ranges_single_record_is_one_call_per_record():
    assert request_ranges([10, 20, 30], 100, 1000, single=True) == [(0, 1), (1, 2), (2, 3)]


def test_ranges_of_no_records():
    assert request_ranges([], 10, 100, single=False) == []
    assert request_ranges([], 10, 100, single=True) == []


@pytest.mark.parametrize("single", [False, True])
def test_a_record_larger_than_max_payload_is_an_error_naming_max_payload_mb(single):
    with pytest.raises(RecordEncodingError) as info:
        request_ranges([10, 3 * 2**20, 10], 100, 2**20, single=single)
    message = str(info.value)
    assert "record 1 is 3.0 MB" in message
    assert "model.max_payload_mb" in message
    assert "--max-payload-mb" in message


# -- encode_records ----------------------------------------------------------------------------------------------

F32 = np.array([0.1, -1.7], dtype=np.float32)


def _batch() -> pa.RecordBatch:
    return pa.record_batch(
        {
            "a": pa.array(F32),  # float32: sent as the exact float64 of each value
            "b": pa.array([1.5, None], pa.float64()),
            "c": pa.array([7, -2], pa.int64()),
            "d": pa.array([True, False]),  # booleans: 1 / 0
            "s": pa.array(["north", "south"]),
        }
    )


A0, A1 = repr(float(F32[0])), repr(float(F32[1]))  # '0.10000000149011612', '-1.7000000476837158'


def test_float32_values_are_sent_as_their_exact_float64():
    assert A0 == "0.10000000149011612"
    assert float(A0) == float(F32[0]) and np.float32(float(A0)) == F32[0]


def _protocol(content_type: str, layout: str = "records", single: bool = False, **extra) -> ScriptProtocol:
    return ScriptProtocol(
        content_type=content_type,
        json_layout=layout,
        batch_strategy="single_record" if single else "multi_record",
        **extra,
    )


CSV_LINES = [f"{A0},1.5,7,1,north", f"{A1},,-2,0,south"]
RECORDS = [
    {"a": float(F32[0]), "b": 1.5, "c": 7, "d": 1, "s": "north"},
    {"a": float(F32[1]), "b": None, "c": -2, "d": 0, "s": "south"},
]
ROWS = [[float(F32[0]), 1.5, 7, 1, "north"], [float(F32[1]), None, -2, 0, "south"]]


def test_csv_bodies():
    encoded = encode_records(_batch(), _protocol(CSV))
    assert encoded.body(0, 2) == "\n".join(CSV_LINES) + "\n"  # a str, no header, text unquoted
    assert encoded.body(1, 2) == CSV_LINES[1] + "\n"
    single = encode_records(_batch(), _protocol(CSV, single=True))
    assert single.body(0, 1) == CSV_LINES[0]  # one line, as Batch Transform's SingleRecord sends it
    assert single.body(1, 2) == CSV_LINES[1]
    assert encoded.sizes == [len(line) + 1 for line in CSV_LINES]


def test_csv_bodies_with_a_header_line():
    encoded = encode_records(_batch(), _protocol(CSV, csv_header=True))
    assert encoded.body(0, 2) == "a,b,c,d,s\n" + "\n".join(CSV_LINES) + "\n"
    single = encode_records(_batch(), _protocol(CSV, single=True, csv_header=True))
    assert single.body(1, 2) == "a,b,c,d,s\n" + CSV_LINES[1]


def test_csv_quotes_only_when_a_value_needs_it():
    batch = pa.record_batch({"s": ["plain", "a,b", 'say "hi"']})
    assert encode_records(batch, _protocol(CSV)).body(0, 3) == '"plain"\n"a,b"\n"say ""hi"""\n'
    batch = pa.record_batch({"s": ["plain", "with space"]})
    assert encode_records(batch, _protocol(CSV)).body(0, 2) == "plain\nwith space\n"


def test_csv_sizes_are_bytes():
    encoded = encode_records(pa.record_batch({"s": ["é", "e"]}), _protocol(CSV))
    assert encoded.sizes == [3, 2]


def test_a_string_with_a_line_break_cannot_be_sent_as_csv():
    batch = pa.record_batch({"id": [1, 2], "text": ["one line", "two\nlines"]})
    with pytest.raises(RecordEncodingError) as info:
        encode_records(batch, _protocol(CSV))
    assert "line breaks" in str(info.value)
    assert "model.content_type application/json" in str(info.value)
    # JSON carries it
    body = encode_records(batch, _protocol(JSON)).body(0, 2)
    assert json.loads(body)[1]["text"] == "two\nlines"


@pytest.mark.parametrize(
    ("layout", "multi", "first_single", "second_single"),
    [
        ("records", RECORDS, RECORDS[0], RECORDS[1]),
        ("instances", {"instances": ROWS}, {"instances": [ROWS[0]]}, {"instances": [ROWS[1]]}),
        ("array", ROWS, ROWS[0], ROWS[1]),
    ],
)
def test_json_bodies(layout, multi, first_single, second_single):
    encoded = encode_records(_batch(), _protocol(JSON, layout))
    body = encoded.body(0, 2)
    assert isinstance(body, str)
    assert json.loads(body) == multi
    single = encode_records(_batch(), _protocol(JSON, layout, single=True))
    assert json.loads(single.body(0, 1)) == first_single
    assert json.loads(single.body(1, 2)) == second_single


def test_json_records_are_keyed_by_column_name_in_order():
    body = encode_records(_batch(), _protocol(JSON)).body(0, 1)
    assert body == f'[{{"a": {A0}, "b": 1.5, "c": 7, "d": 1, "s": "north"}}]'


@pytest.mark.parametrize(("layout", "rows"), [("records", RECORDS), ("array", ROWS)])
def test_jsonlines_bodies(layout, rows):
    encoded = encode_records(_batch(), _protocol(JSONLINES, layout))
    body = encoded.body(0, 2)
    assert isinstance(body, bytes)  # as the inference toolkit passes application/jsonlines
    assert body.endswith(b"\n")
    assert [json.loads(line) for line in body.splitlines()] == rows
    single = encode_records(_batch(), _protocol(JSONLINES, layout, single=True))
    assert json.loads(single.body(1, 2)) == rows[1]


def test_json_lines_labelled_application_json():
    """json_layout lines: what Batch Transform sends of a JSON lines file split by line with ContentType
    application/json (SageMaker's examples do): an object per line, as a str, as the toolkit decodes JSON."""
    encoded = encode_records(_batch(), _protocol(JSON, "lines"))
    body = encoded.body(0, 2)
    assert isinstance(body, str) and body.endswith("\n")
    assert [json.loads(line) for line in body.splitlines()] == RECORDS
    single = encode_records(_batch(), _protocol(JSON, "lines", single=True))
    assert json.loads(single.body(1, 2)) == RECORDS[1]
    assert "json_layout lines" in _protocol(JSON, "lines").describe()


@pytest.mark.parametrize(
    ("response", "accept"),
    [
        ("[0.1 0.2 0.3]", CSV),  # str(array): neither CSV nor JSON, so neither accept type is named
        ("[0.1 0.2 0.3]", JSON),
        ("[[0.1 0.9]\n [0.2 0.8]\n [0.3 0.7]]", CSV),
        ("[ 1.5e-03  nan -2.   ]", JSON),
        ("[0.1 0.2 ... 0.3]", JSON),  # over 1,000 values: numpy leaves the middle out
    ],
)
def test_numpy_text_names_no_accept_type_but_how_to_return_it(response, accept):
    records = 3 if "0.3" in response or "nan" in response else 2
    with pytest.raises(ResponseShapeError) as info:
        decode_response(response, accept, records)
    message = str(info.value)
    assert "numpy's text of an array" in message and "array.tolist()" in message
    assert "set model.accept" not in message


def test_a_hint_names_an_accept_type_only_when_the_response_reads_as_it():
    # Not JSON either (a stray bracket): the run on application/json would fail too, so it is not suggested.
    with pytest.raises(ResponseShapeError) as info:
        decode_response("[0.1, 0.2", CSV, 2)
    assert "model.accept" in str(info.value) and "set model.accept" not in str(info.value)
    # Read as JSON, a body of two CSV values per line for three records is still three records: named.
    with pytest.raises(ResponseShapeError, match=re.escape("It reads as CSV: set model.accept: text/csv")):
        decode_response("0.1,0.9\n0.2,0.8\n0.3,0.7\n", JSON, 3)


def test_json_values_of_other_types():
    batch = pa.record_batch(
        {
            "when": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5)]),
            "amount": pa.array([decimal.Decimal("1.25")], pa.decimal128(5, 2)),
            "segment": pa.array(["east"]).dictionary_encode(),
        }
    )
    assert json.loads(encode_records(batch, _protocol(JSON)).body(0, 1)) == [
        {"when": "2024-01-02T03:04:05", "amount": 1.25, "segment": "east"}
    ]
    with pytest.raises(RecordEncodingError, match="binary values cannot be sent as JSON"):
        encode_records(pa.record_batch({"blob": pa.array([b"\x00"])}), _protocol(JSON))


def test_npy_bodies():
    matrix = np.array([[0.1, 2.0], [3.0, np.float32(0.1)]], dtype=np.float64)
    batch = pa.record_batch({"x": matrix[:, 0], "y": matrix[:, 1]})
    encoded = encode_records(batch, _protocol(NPY), matrix)
    body = encoded.body(0, 2)
    assert isinstance(body, bytes)
    loaded = np.load(io.BytesIO(body))
    assert loaded.dtype == np.float64 and loaded.shape == (2, 2)
    np.testing.assert_array_equal(loaded, matrix)
    single = encode_records(batch, _protocol(NPY, single=True), matrix)
    np.testing.assert_array_equal(np.load(io.BytesIO(single.body(1, 2))), matrix[1])  # one 1-D row
    assert encoded.sizes == [16, 16]
    with pytest.raises(RecordEncodingError, match="numbers only"):
        encode_records(batch, _protocol(NPY))


def test_random_floats_survive_every_text_body_exactly():
    rng = np.random.default_rng(3)
    f64 = rng.standard_normal(200) * 10.0 ** rng.integers(-30, 30, 200)
    f32 = rng.standard_normal(200).astype(np.float32)
    batch = pa.record_batch({"f64": f64, "f32": f32})
    want = np.column_stack([f64, f32.astype(np.float64)])
    csv_body = encode_records(batch, _protocol(CSV)).body(0, 200)
    np.testing.assert_array_equal(np.loadtxt(io.StringIO(csv_body), delimiter=","), want)
    json_body = encode_records(batch, _protocol(JSON, "array")).body(0, 200)
    np.testing.assert_array_equal(np.array(json.loads(json_body)), want)
    frame = pd.DataFrame(json.loads(encode_records(batch, _protocol(JSON)).body(0, 200)))
    np.testing.assert_array_equal(frame[["f64", "f32"]].to_numpy(), want)


# -- decode_response -------------------------------------------------------------------------------------------------


def _decoded(response, content_type, records):
    return [(name, values.tolist()) for name, values in decode_response(response, content_type, records)]


@pytest.mark.parametrize(
    ("response", "content_type", "records", "columns"),
    [
        # CSV: one prediction per line
        ("0.25\n0.5\n0.75\n", CSV, 3, [("prediction", [0.25, 0.5, 0.75])]),
        (b"1\n2\n", CSV, 2, [("prediction", [1.0, 2.0])]),
        ("1\n2", "text/csv; charset=utf-8", 2, [("prediction", [1.0, 2.0])]),
        # several values per line: a column each
        ("0.1,0.9\n0.8,0.2\n", CSV, 2, [("prediction_0", [0.1, 0.8]), ("prediction_1", [0.9, 0.2])]),
        # a header line names the columns; text stays text
        ("score,label\n0.5,cat\n0.7,dog\n", CSV, 2, [("score", [0.5, 0.7]), ("label", ["cat", "dog"])]),
        ("score\n0.5\n", CSV, 1, [("score", [0.5])]),
        # N values joined on ONE line, as many endpoint scripts return
        ("0.5,0.7,0.9", CSV, 3, [("prediction", [0.5, 0.7, 0.9])]),
        ("0.5,0.7,0.9\n", CSV, 1, [("prediction_0", [0.5]), ("prediction_1", [0.7]), ("prediction_2", [0.9])]),
        # an empty value is NaN
        ("1\n\n", CSV, 1, [("prediction", [1.0])]),
        # JSON
        ("[1, 2, 3]", JSON, 3, [("prediction", [1, 2, 3])]),
        ('{"predictions": [0.1, 0.2]}', JSON, 2, [("prediction", [0.1, 0.2])]),
        (
            '{"outputs": [[0.1, 0.9], [0.2, 0.8]]}',
            JSON,
            2,
            [("prediction_0", [0.1, 0.2]), ("prediction_1", [0.9, 0.8])],
        ),
        (
            '{"predictions": [{"probability": 0.9, "label": 1}, {"probability": 0.2, "label": 0}]}',
            JSON,
            2,
            [("probability", [0.9, 0.2]), ("label", [1, 0])],
        ),
        (
            '[{"probability": 0.9, "label": "yes", "model_version": "v3"}, '
            '{"probability": 0.2, "label": "no", "model_version": "v3"}]',
            JSON,
            2,
            [("probability", [0.9, 0.2]), ("label", ["yes", "no"]), ("model_version", ["v3", "v3"])],
        ),
        (
            '[{"scores": [0.1, 0.9]}, {"scores": [0.7, 0.3]}]',
            JSON,
            2,
            [("scores_0", [0.1, 0.7]), ("scores_1", [0.9, 0.3])],
        ),
        # an object of columns
        ('{"score": [0.5, 0.7], "label": ["a", "b"]}', JSON, 2, [("score", [0.5, 0.7]), ("label", ["a", "b"])]),
        # one record: an object is its fields, a flat list its values
        ('{"score": 0.5, "label": "a"}', JSON, 1, [("score", [0.5]), ("label", ["a"])]),
        ("[0.1, 0.9]", JSON, 1, [("prediction_0", [0.1]), ("prediction_1", [0.9])]),
        ("0.5", JSON, 1, [("prediction", [0.5])]),
        # JSON lines, under application/jsonlines or as several JSON documents under application/json
        (b'{"p": 0.1}\n{"p": 0.2}\n', JSONLINES, 2, [("p", [0.1, 0.2])]),
        ("0.1\n0.2\n", JSONLINES, 2, [("prediction", [0.1, 0.2])]),
        ('{"p": 0.1}\n{"p": 0.2}\n', JSON, 2, [("p", [0.1, 0.2])]),
        (
            "[0.1, 0.9]\n[0.2, 0.8]\n",
            "application/x-ndjson",
            2,
            [("prediction_0", [0.1, 0.2]), ("prediction_1", [0.9, 0.8])],
        ),
        # Python values, when there is no output_fn
        (np.array([1.0, 2.0]), CSV, 2, [("prediction", [1.0, 2.0])]),
        (np.array([[1.0, 2.0], [3.0, 4.0]]), JSON, 2, [("prediction_0", [1.0, 3.0]), ("prediction_1", [2.0, 4.0])]),
        ([0.1, 0.9], CSV, 1, [("prediction_0", [0.1]), ("prediction_1", [0.9])]),
        (0.5, CSV, 1, [("prediction", [0.5])]),
        (["cat", "dog"], CSV, 2, [("prediction", ["cat", "dog"])]),
        (pd.Series([1.0, 2.0]), CSV, 2, [("prediction", [1.0, 2.0])]),
        ({"score": np.array([1.0, 2.0]), "label": ["a", "b"]}, CSV, 2, [("score", [1.0, 2.0]), ("label", ["a", "b"])]),
        ({"proba": np.array([[0.1, 0.9], [0.6, 0.4]])}, CSV, 2, [("proba_0", [0.1, 0.6]), ("proba_1", [0.9, 0.4])]),
    ],
)
def test_decode_response(response, content_type, records, columns):
    assert _decoded(response, content_type, records) == columns


def test_decode_npy():
    sink = io.BytesIO()
    np.save(sink, np.array([[0.25], [0.5]], dtype=np.float32))
    ((name, values),) = decode_response(sink.getvalue(), NPY, 2)
    assert name == "prediction" and values.dtype == np.float32 and values.tolist() == [0.25, 0.5]
    sink = io.BytesIO()
    np.save(sink, np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert _decoded(sink.getvalue(), NPY, 2) == [("prediction_0", [1.0, 3.0]), ("prediction_1", [2.0, 4.0])]


def test_decode_torch_tensors():
    import torch

    column = torch.tensor([[0.25], [0.5]], requires_grad=True) * 1  # a (N, 1) output with a grad graph
    ((name, values),) = decode_response(column, JSON, 2)
    assert name == "prediction" and values.tolist() == [0.25, 0.5]
    assert _decoded(torch.tensor([1.0, 2.0, 3.0]), CSV, 3) == [("prediction", [1.0, 2.0, 3.0])]
    assert _decoded(torch.tensor([[0.1, 0.9], [0.6, 0.4]], dtype=torch.float64), CSV, 2) == [
        ("prediction_0", [0.1, 0.6]),
        ("prediction_1", [0.9, 0.4]),
    ]


def test_decode_a_pandas_dataframe_keeps_its_column_names():
    frame = pd.DataFrame({"probability": [0.9, 0.1], "label": ["yes", "no"]})
    assert _decoded(frame, CSV, 2) == [("probability", [0.9, 0.1]), ("label", ["yes", "no"])]
    with pytest.raises(ResponseShapeError, match=r"DataFrame of 2 row\(s\) for 3 record\(s\)"):
        decode_response(frame, CSV, 3)


@pytest.mark.parametrize(
    ("response", "content_type", "records", "message"),
    [
        # a JSON body read as text/csv: says to set model.accept
        (
            "[0.1, 0.2]",
            CSV,
            2,
            re.escape(
                "is not CSV but is read as text/csv (model.accept). It reads as JSON: set model.accept: "
                "application/json (--accept application/json)"
            ),
        ),
        ('{"predictions": [0.1]}', CSV, 1, "model.accept: application/json"),
        # a CSV body read as JSON
        ("0.1,0.2,0.3", JSON, 3, "set model.accept: text/csv"),
        # one value for N records
        ("0.5", CSV, 3, r"1 line\(s\) for 3 record\(s\)"),
        ("[0.5]", JSON, 3, r"1 prediction\(s\) for 3 record\(s\)"),
        (0.5, CSV, 2, r"1 prediction\(s\) for 2 record\(s\)"),
        # ragged CSV
        ("1,2\n3\n", CSV, 2, "lines of 1 to 2 values"),
        # too few, too many
        ("1\n2\n", CSV, 3, r"2 line\(s\) for 3 record\(s\)"),
        ("1\n2\n3\n4\n", CSV, 3, r"4 line\(s\) for 3 record\(s\)"),
        ("[1, 2, 3, 4]", JSON, 3, r"4 prediction\(s\) for 3 record\(s\)"),
        ("", CSV, 2, r"0 line\(s\) for 2 record\(s\)"),
        # JSON shapes that are not one prediction per record
        ("[[1, 2], [3]]", JSON, 2, "ragged list"),
        ('{"x": 1}', JSON, 2, r"JSON object with keys \['x'\] for 2 record\(s\)"),
        ('{"predictions": [1], "outputs": [2]}', JSON, 1, "both 'predictions' and 'outputs'"),
        ('[{"a": 1}, {"b": 2}]', JSON, 2, "do not all have the fields"),
        (np.zeros((2, 2, 2)), CSV, 2, r"array of shape \(2, 2, 2\)"),
        (b"not npy", NPY, 2, "not a .npy array"),
        ("x", "text/plain", 1, "cannot read a response of content type 'text/plain'"),
        (object(), CSV, 1, "cannot read predictions from a object"),
    ],
)
def test_decode_response_errors(response, content_type, records, message):
    with pytest.raises(ResponseShapeError, match=message):
        decode_response(response, content_type, records)


def test_decode_errors_count_what_came_back():
    with pytest.raises(ResponseShapeError) as info:
        decode_response("0.5", CSV, 3)
    assert (info.value.got, info.value.records) == (1, 3)
    with pytest.raises(ResponseShapeError) as info:
        decode_response("[1, 2]", JSON, 3)
    assert (info.value.got, info.value.records) == (2, 3)


# -- ScriptProtocol ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"content_type": "text/plain"}, "model.content_type, --content-type"),
        ({"accept": "text/html"}, "model.accept, --accept"),
        ({"batch_strategy": "mini_batch"}, "model.batch_strategy"),
        ({"json_layout": "split"}, "model.json_layout"),
        ({"content_type": JSONLINES, "json_layout": "instances"}, "json_layout"),
        ({"content_type": JSONLINES, "json_layout": "lines"}, "is JSON lines labelled application/json"),
        ({"max_payload_mb": 0}, "max_payload_mb (--max-payload-mb)"),
        ({"max_payload_mb": -1.5}, "max_payload_mb"),
    ],
)
def test_protocol_validation_names_the_setting(settings, named):
    with pytest.raises(SetupError) as info:
        ScriptProtocol(**settings)
    assert named in str(info.value)


def test_protocol_normalises_media_types():
    protocol = ScriptProtocol(content_type="Application/JSON; charset=utf-8", accept="application/x-ndjson")
    assert (protocol.content_type, protocol.response_type) == (JSON, JSONLINES)
    assert ScriptProtocol().response_type == JSON  # accept defaults to application/json, as in the toolkit
    assert media_type("application/jsonl") == JSONLINES
    assert media_type("text/json") == JSON
    assert ScriptProtocol(content_type=JSON, json_layout="instances").describe() == (
        "content_type application/json, accept application/json, multi_record, json_layout instances"
    )
    assert ScriptProtocol(csv_header=True, batch_strategy="single_record").describe() == (
        "content_type text/csv, accept application/json, single_record, with a header line"
    )
