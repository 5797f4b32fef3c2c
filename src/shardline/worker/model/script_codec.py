"""The request bodies a SageMaker endpoint or Batch Transform sends a custom ``inference.py``, and how its
responses are read there: pure encoding and decoding (``worker/model/script_runner.py`` calls the script).

Requests (``content_type``), one body per call:

- ``text/csv``: one line per record, no header unless ``csv_header`` (Batch Transform
  splits input on lines); a str, as the inference toolkit decodes UTF-8 types.
- ``application/json``: ``json_layout`` ``records`` (default): a JSON array of objects keyed
  by column name; ``instances``: ``{"instances": [[...], ...]}``; ``inputs``: ``{"inputs": [[...], ...]}``
  (Hugging Face-style handlers); ``array``: ``[[...], ...]``; ``lines``: one object per line, as Batch Transform
  sends a JSON lines file split by line with ContentType application/json (SageMaker's own examples do).
  A str.
- ``application/jsonlines``: one JSON object per line (``json_layout: array``: one JSON
  array per line). Bytes, as the toolkit passes them.
- ``application/x-npy``: a 2-D float64 array saved with ``numpy.save``. Bytes.

``batch_strategy`` ``multi_record`` packs records into a call up to ``--batch-rows`` and
``max_payload_mb`` (like Batch Transform's MaxPayloadInMB); ``single_record`` sends one record
per call: one CSV line, one JSON object (or ``{"instances": [row]}``, ``{"inputs": [row]}``, or one flat array),
one JSON line, or a 1-D npy array.

Responses (``accept``, application/json unless set, as in SageMaker's inference toolkit; or the
content type of a ``(body, content_type)`` tuple): CSV with one
prediction per line, several values per line (one column each), an optional header line, or
one line holding N values for N records; JSON as a list, ``{"predictions": [...]}``, a list
of objects (each field an output column) or an object of columns; JSON lines; npy; or a
Python value (array, list, tensor, DataFrame) when there is no ``output_fn``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from shardline.contract import JSON_LAYOUTS, JSON_LINES_LAYOUTS, WRAPPED_JSON_LAYOUTS
from shardline.errors import FileError, PredictionError, SetupError, clipped

CSV = "text/csv"
JSON = "application/json"
JSONLINES = "application/jsonlines"
NPY = "application/x-npy"
CONTENT_TYPES = (CSV, JSON, JSONLINES, NPY)
DEFAULT_ACCEPT = JSON  # what the inference toolkit asks output_fn for when the request names no Accept
_ALIASES = {
    "application/x-jsonlines": JSONLINES,
    "application/jsonl": JSONLINES,
    "application/x-ndjson": JSONLINES,
    "application/json-lines": JSONLINES,
    "text/json": JSON,
}

MULTI_RECORD = "multi_record"
SINGLE_RECORD = "single_record"
# Keys under which JSON responses commonly carry the predictions (TF Serving, the SageMaker containers).
PREDICTION_KEYS = ("predictions", "outputs")


def media_type(value: str) -> str:
    """``'text/csv; charset=utf-8'`` -> ``'text/csv'``; known aliases map to one name."""
    base = value.split(";", 1)[0].strip().lower()
    return _ALIASES.get(base, base)


@dataclasses.dataclass(frozen=True)
class ScriptProtocol:
    """How records travel to the script and back. Mirrors the spec's ``model.*`` settings."""

    content_type: str = CSV
    # None: application/json, as SageMaker's inference toolkit asks output_fn for when no Accept is given
    # (its SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT default).
    accept: str | None = None
    batch_strategy: str = MULTI_RECORD
    json_layout: str = "records"
    max_payload_mb: float = 6.0
    csv_header: bool = False
    # The script computes the model's features itself from the columns it is sent (model.derives_features): the
    # names the model recorded are then not the columns to send.
    derives_features: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "content_type", media_type(self.content_type))
        if self.accept is not None:
            object.__setattr__(self, "accept", media_type(self.accept))
        if self.content_type not in CONTENT_TYPES:
            raise SetupError(
                f"unsupported content type {self.content_type!r} (model.content_type, --content-type); "
                f"use one of {', '.join(CONTENT_TYPES)}"
            )
        if self.response_type not in CONTENT_TYPES:
            raise SetupError(
                f"unsupported accept type {self.response_type!r} (model.accept, --accept); "
                f"use one of {', '.join(CONTENT_TYPES)}"
            )
        if self.batch_strategy not in (MULTI_RECORD, SINGLE_RECORD):
            raise SetupError(
                f"unknown batch strategy {self.batch_strategy!r} (model.batch_strategy, "
                "--batch-strategy): use multi_record or single_record"
            )
        if self.json_layout not in JSON_LAYOUTS:
            raise SetupError(
                f"unknown JSON layout {self.json_layout!r} (model.json_layout, --json-layout): "
                f"use one of {', '.join(JSON_LAYOUTS)}"
            )
        if self.content_type == JSONLINES and self.json_layout not in JSON_LINES_LAYOUTS:
            what = "is JSON lines labelled application/json" if self.json_layout == "lines" else "is one JSON document"
            raise SetupError(
                f"model.json_layout (--json-layout) {self.json_layout!r} {what}; with "
                "model.content_type application/jsonlines use 'records' (an object per line) or 'array' "
                "(an array per line), or model.content_type: application/json"
            )
        if not self.max_payload_mb > 0:
            raise SetupError("max_payload_mb (--max-payload-mb) must be greater than 0")

    @property
    def response_type(self) -> str:
        return self.accept or DEFAULT_ACCEPT

    @property
    def single(self) -> bool:
        return self.batch_strategy == SINGLE_RECORD

    def replace(self, **changes) -> ScriptProtocol:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        parts = [f"content_type {self.content_type}", f"accept {self.response_type}", self.batch_strategy]
        if self.content_type in (JSON, JSONLINES):
            parts.append(f"json_layout {self.json_layout}")
        if self.content_type == CSV:
            parts.append("with a header line" if self.csv_header else "no header")
        return ", ".join(parts)


# -- requests ---------------------------------------------------------------------------------------------


class RecordEncodingError(FileError):
    """The file's records cannot be carried by the configured content type."""


@dataclasses.dataclass
class EncodedRecords:
    """A batch of records serialised once; request bodies are cut from it."""

    protocol: ScriptProtocol
    sizes: list[int]  # bytes per record, to respect max_payload_mb
    pieces: list[Any]  # one serialised record each (a matrix for npy)
    header: str = ""

    def body(self, start: int, stop: int) -> str | bytes:
        p, pieces = self.protocol, self.pieces
        if p.content_type == NPY:
            sink = io.BytesIO()
            np.save(sink, pieces[start] if p.single else pieces[start:stop], allow_pickle=False)
            return sink.getvalue()
        if p.content_type == CSV:
            if p.single:
                return self.header + pieces[start]
            return self.header + "\n".join(pieces[start:stop]) + "\n"
        if p.content_type == JSONLINES:
            text = pieces[start] if p.single else "\n".join(pieces[start:stop]) + "\n"
            return text.encode()
        if p.json_layout == "lines":  # JSON lines labelled application/json: a str, as the toolkit decodes JSON
            return pieces[start] if p.single else "\n".join(pieces[start:stop]) + "\n"
        # application/json
        if p.json_layout in WRAPPED_JSON_LAYOUTS:
            return '{"' + p.json_layout + '": [' + ", ".join(pieces[start:stop]) + "]}"
        if p.single:
            return pieces[start]
        return "[" + ", ".join(pieces[start:stop]) + "]"


def _text_table(table: pa.Table | pa.RecordBatch) -> pa.Table:
    """Columns as they are written into a text body: floats as float64 (exact, shortest form), booleans
    as 1/0, dictionary columns decoded."""
    return pa.table([_text_ready(column) for column in table.columns], names=table.schema.names)


def _text_ready(column: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_floating(column.type) and column.type != pa.float64():
        return column.cast(pa.float64())
    if pa.types.is_boolean(column.type):
        return column.cast(pa.int8())
    return column


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        raise TypeError("binary values cannot be sent as JSON")
    import decimal

    if isinstance(value, decimal.Decimal):
        return float(value)
    raise TypeError(f"cannot send a {type(value).__name__} as JSON")


def encode_records(table: pa.RecordBatch, protocol: ScriptProtocol, matrix: np.ndarray | None = None) -> EncodedRecords:
    """Serialise every record of ``table`` (the feature columns, in order) once."""
    names = table.schema.names
    ct = protocol.content_type
    if ct == NPY:
        if matrix is None:
            raise RecordEncodingError("application/x-npy carries numbers only")
        row_bytes = matrix.dtype.itemsize * matrix.shape[1]
        return EncodedRecords(protocol, [row_bytes] * matrix.shape[0], matrix)
    text = _text_table(table)
    if ct == CSV:
        sink = io.BytesIO()
        try:  # text unquoted, as in the files Batch Transform splits into lines
            pacsv.write_csv(text, sink, write_options=pacsv.WriteOptions(include_header=False, quoting_style="none"))
        except pa.ArrowInvalid:  # a value with a comma, quote or line break: quote the text values
            sink = io.BytesIO()
            pacsv.write_csv(text, sink, write_options=pacsv.WriteOptions(include_header=False))
        raw = sink.getvalue().split(b"\n")
        if raw and raw[-1] == b"":
            raw.pop()
        lines = [line.decode() for line in raw]
        if len(lines) != table.num_rows:
            raise RecordEncodingError(
                "a text column holds line breaks, which text/csv records cannot carry (Batch Transform splits "
                "CSV on lines too); use model.content_type application/json or application/jsonlines"
            )
        header = ",".join(_csv_field(n) for n in names) + "\n" if protocol.csv_header else ""
        return EncodedRecords(protocol, [len(line) + 1 for line in raw], lines, header)  # bytes, not characters
    columns = [column.to_pylist() for column in text.columns]
    try:
        if protocol.json_layout in ("records", "lines"):
            pieces = [
                json.dumps(dict(zip(names, values, strict=True)), default=_json_default)
                for values in zip(*columns, strict=True)
            ]
        else:
            pieces = [json.dumps(list(values), default=_json_default) for values in zip(*columns, strict=True)]
    except TypeError as err:
        raise RecordEncodingError(f"cannot send these records as JSON: {err}") from err
    return EncodedRecords(protocol, [len(p) + 2 for p in pieces], pieces)


def _csv_field(name: str) -> str:
    return f'"{name}"' if any(c in name for c in ',"\n') else name


def request_ranges(sizes: Sequence[int], max_rows: int, max_bytes: int, single: bool) -> list[tuple[int, int]]:
    """Cut records into calls: one each, or as many as fit ``max_rows`` and ``max_bytes``."""
    n = len(sizes)
    if single:
        too_big = [i for i, s in enumerate(sizes) if s > max_bytes]
        if too_big:
            raise RecordEncodingError(
                f"record {too_big[0]} is {sizes[too_big[0]] / 2**20:.1f} MB, over max_payload_mb "
                f"({max_bytes / 2**20:g} MB): raise model.max_payload_mb (--max-payload-mb)"
            )
        return [(i, i + 1) for i in range(n)]
    ranges, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if size > max_bytes:
            raise RecordEncodingError(
                f"record {i} is {size / 2**20:.1f} MB, over max_payload_mb ({max_bytes / 2**20:g} MB): raise "
                "model.max_payload_mb (--max-payload-mb)"
            )
        if i > start and (i - start >= max_rows or total + size > max_bytes):
            ranges.append((start, i))
            start, total = i, 0
        total += size
    if start < n:
        ranges.append((start, n))
    return ranges


# -- responses --------------------------------------------------------------------------------------------


class ResponseShapeError(PredictionError):
    """A response that does not hold exactly one prediction per record of its request."""

    def __init__(self, message: str, *, got: int | None = None, records: int = 0):
        super().__init__(message)
        self.got, self.records = got, records


Columns = list[tuple[str, np.ndarray]]


def decode_response(response: Any, content_type: str, records: int) -> Columns:
    """One array per output column, each with one value per record, from what the script returned."""
    ct = media_type(content_type)
    if isinstance(response, (str, bytes, bytearray, memoryview)):
        raw = response.encode() if isinstance(response, str) else bytes(response)
        if ct == NPY:
            try:
                return _from_value(np.load(io.BytesIO(raw), allow_pickle=False), records)
            except ValueError as err:
                raise ResponseShapeError(f"the response is not a .npy array ({err}); check model.accept") from err
        if ct not in (CSV, JSON, JSONLINES):
            raise ResponseShapeError(
                f"cannot read a response of content type {ct!r}; use one of "
                f"{', '.join(CONTENT_TYPES)} (model.accept), or return (body, content_type)"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            npy = raw.startswith(b"\x93NUMPY")
            raise ResponseShapeError(
                f"the response is binary, not UTF-8 text, but is read as {ct} (model.accept)"
                + (
                    ": it is a .npy array, so set model.accept: application/x-npy (--accept application/x-npy)"
                    if npy
                    else f" ({err})"
                )
            ) from err
        if ct == CSV:
            return _from_csv(text, records)
        if ct == JSON:
            return _from_json_text(text, records)
        return _from_value(_json_lines(text), records)
    return _from_value(response, records)


def _from_json_text(text: str, records: int, hint: bool = True) -> Columns:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        stripped = text.strip()
        try:
            value = _json_lines(stripped)  # several JSON documents, one per line: JSON lines
        except json.JSONDecodeError:
            other = _other_reading(text, records, CSV) if hint else ""
            raise ResponseShapeError(
                f"the response is not valid JSON ({err}), but is read as {JSON} (model.accept).{other}"
            ) from err
    return _from_value(value, records)


def _other_reading(text: str, records: int, other: str) -> str:
    """What to set for a text response that is not the accept type's: the ``other`` accept type only when the
    response reads as it (a hint never names a setting that fails too), or how to return numpy's text of an array,
    which no accept type reads."""
    if _numpy_text(text):
        return (
            f" It is numpy's text of an array ({clipped(text.strip(), 40)!r}, as str(array) writes it), which no "
            "accept type reads: return the array itself, array.tolist() or json.dumps(array.tolist()) from output_fn"
        )
    try:
        (_from_csv if other == CSV else _from_json_text)(text, records, hint=False)
    except (ResponseShapeError, csv.Error):
        return ""
    return (
        f" It reads as {'CSV' if other == CSV else 'JSON'}: set model.accept: {other} (--accept {other}), or return "
        f"(body, '{other}') from output_fn"
    )


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf)", re.IGNORECASE)


def _numpy_text(text: str) -> bool:
    """Whether ``text`` is numpy's text of an array: "[0.1 0.2 0.3]", "[[1. 2.]\\n [3. 4.]]", "[0.1 0.2 ... 0.9]"
    (over 1,000 values: the middle left out). Not JSON: no commas."""
    head = text.strip()[:2000]
    if not head.startswith("[") or "," in head:
        return False
    tokens = [t for t in re.split(r"[\s\[\]]+", head) if t]
    whole = tokens if head.endswith("]") or len(head) < 2000 else tokens[:-1]  # the last may be cut short
    return bool(whole) and all(t == "..." or _NUMBER.fullmatch(t) for t in whole)


def _json_lines(text: str) -> list:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _from_csv(text: str, records: int, hint: bool = True) -> Columns:
    stripped = text.lstrip()
    if stripped[:1] in ("[", "{"):
        other = _other_reading(text, records, JSON) if hint else ""
        raise ResponseShapeError(f"the response is not CSV but is read as {CSV} (model.accept).{other}")
    rows = list(csv.reader(line for line in text.splitlines() if line.strip()))
    widths = sorted({len(r) for r in rows})
    if len(widths) > 1:
        raise ResponseShapeError(
            f"the CSV response has lines of {widths[0]} to {widths[-1]} values; expected the "
            "same number of values on every line"
        )
    header = None
    if len(rows) == records + 1 and records >= 1 and not any(_is_number(v) for v in rows[0]):
        header, rows = [v.strip() for v in rows[0]], rows[1:]  # one line more than records: a header line
    if len(rows) == 1 and records > 1 and len(rows[0]) == records:
        rows = [[value] for value in rows[0]]  # N values joined on one line, as many endpoint scripts return
    if len(rows) != records:
        got = len(rows) * (widths[0] if widths and len(rows) == 1 else 1)
        raise ResponseShapeError(
            f"the CSV response has {len(rows)} line(s) for {records} record(s)", got=got, records=records
        )
    columns = list(zip(*rows, strict=True)) if rows else []
    arrays = [_text_column(values) for values in columns]
    if header is not None:
        return list(zip(header, arrays, strict=True))
    return _named(arrays)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _text_column(values: Sequence[str]) -> np.ndarray:
    """CSV values as float64 when every one is a number (an empty one is NaN), else as strings."""
    try:
        return np.array([float(v) if v.strip() else math.nan for v in values], dtype=np.float64)
    except ValueError:
        return np.array(values, dtype=object)


def _named(arrays: list[np.ndarray], name: str = "prediction") -> Columns:
    if len(arrays) == 1:
        return [(name, arrays[0])]
    return [(f"{name}_{k}", a) for k, a in enumerate(arrays)]


def _to_python(value: Any) -> Any:
    """Tensors and pandas objects as numpy arrays; everything else unchanged."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        return value.detach().cpu().numpy()
    module = type(value).__module__
    if module.startswith("pandas") and type(value).__name__ == "Series":
        return value.to_numpy()
    return value


def _from_value(value: Any, records: int) -> Columns:
    value = _to_python(value)
    module = type(value).__module__
    if module.startswith("pandas") and type(value).__name__ == "DataFrame":
        if len(value) != records:
            raise ResponseShapeError(
                f"the response is a DataFrame of {len(value)} row(s) for {records} record(s)",
                got=len(value),
                records=records,
            )
        return [(str(name), value[name].to_numpy()) for name in value.columns]
    if isinstance(value, dict):
        return _from_dict(value, records)
    if isinstance(value, (list, tuple)):
        if len(value) == records and value and all(isinstance(v, dict) for v in value):
            return _from_objects(value)
        if records == 1 and value and not any(isinstance(v, (list, tuple, dict)) for v in value):
            value = [value]  # one record, several outputs: [p0, p1]
        try:
            value = np.asarray(value)
        except ValueError as err:
            raise ResponseShapeError(
                f"the response is a ragged list ({err}); expected one prediction, or the same "
                "number of values, per record"
            ) from err
    if isinstance(value, np.ndarray):
        return _from_array(value, records)
    if isinstance(value, (int, float, str, bool, np.generic)):
        return _from_array(np.asarray([value]), records)
    raise ResponseShapeError(
        f"cannot read predictions from a {type(value).__name__}; return a list, an array or "
        "an encoded body from output_fn"
    )


def _from_array(array: np.ndarray, records: int) -> Columns:
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim == 1 and records == 1 and len(array) > 1:
        array = array.reshape(1, -1)
    if array.shape[0] != records:
        got = array.shape[0] if array.ndim <= 2 else None
        raise ResponseShapeError(
            f"the response holds {array.shape[0]} prediction(s) for {records} record(s)", got=got, records=records
        )
    if array.ndim == 1:
        return [("prediction", _plain(array))]
    if array.ndim == 2:
        return _named([_plain(array[:, k]) for k in range(array.shape[1])])
    raise ResponseShapeError(
        f"the response is an array of shape {array.shape}; expected one value, or one row of values, per record"
    )


def _plain(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in "US":
        return array.astype(object)
    return np.ascontiguousarray(array)


def _from_dict(value: dict, records: int) -> Columns:
    keys = [k for k in PREDICTION_KEYS if k in value]
    if len(keys) == 1:
        return _from_value(value[keys[0]], records)
    if len(keys) > 1:
        raise ResponseShapeError(f"the response has both {keys[0]!r} and {keys[1]!r}; return one of them")
    # A column may be a list, or (from a predict_fn without output_fn) an array, tensor or Series.
    lists = {
        k: c
        for k, c in ((k, _to_python(v)) for k, v in value.items())
        if isinstance(c, (list, tuple)) or (isinstance(c, np.ndarray) and c.ndim >= 1)
    }
    if value and len(lists) == len(value) and all(len(v) == records for v in lists.values()):
        columns: Columns = []
        for key, column in lists.items():  # an object of columns: {"label": [...], "score": [...]}
            columns += [
                (f"{key}{name.removeprefix('prediction')}", array) for name, array in _from_value(list(column), records)
            ]
        return columns
    if records == 1:
        return _from_objects([value])
    raise ResponseShapeError(
        f"the response is a JSON object with keys {sorted(value)[:10]} for {records} record(s); expected a list of "
        'predictions, {"predictions": [...]}, a list of objects, or an object of equally long lists',
        got=1,
        records=records,
    )


def _from_objects(objects: Sequence[dict]) -> Columns:
    """A list of record objects: each field becomes an output column (a list field, one column per value)."""
    keys = list(dict.fromkeys(k for o in objects for k in o))
    ragged = [k for k in keys if any(k not in o for o in objects)]
    if ragged:
        raise ResponseShapeError(f"the response's objects do not all have the fields {ragged[:5]}")
    columns: Columns = []
    for key in keys:
        values = [o[key] for o in objects]
        for name, array in _from_value(values, len(objects)):
            columns.append((f"{key}{name.removeprefix('prediction')}", array))
    return columns


def concatenate(parts: list[Columns]) -> Columns:
    """The columns of a batch's responses, joined in order: each response must have the same output columns."""
    if len(parts) == 1:
        return parts[0]
    names = [name for name, _ in parts[0]]
    for part in parts[1:]:
        if [name for name, _ in part] != names:
            raise ResponseShapeError(
                f"the responses of one batch have different output columns: {names} vs {[name for name, _ in part]}"
            )
    return [(name, _join([part[k][1] for part in parts])) for k, name in enumerate(names)]


def _join(arrays: list[np.ndarray]) -> np.ndarray:
    if any(a.dtype == object for a in arrays):
        return np.concatenate([a.astype(object) for a in arrays])
    return np.concatenate(arrays)
