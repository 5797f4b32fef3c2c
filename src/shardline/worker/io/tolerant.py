"""Reading a text file row by row under ``tolerance.rows``: what the worker falls back to, from where the fast reader
stopped, once a CSV or JSON lines file holds a row it cannot read. A line that does not split (or parse), and a value
that does not convert to its column's type, cost that row: it is rejected into the unit's :class:`RejectLog` with
its line number and reason, and the rest is read as the fast reader would have read it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Collection, Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from shardline.errors import CorruptInputError
from shardline.worker.io.rejects import RejectLog
from shardline.worker.io.text_files import (
    csv_read_options,
    describe,
    names_hint,
    reader_stream,
    rebatch,
    refuse_a_data_line_as_header,
)
from shardline.worker.io.work_units import InputFile, WorkUnit

# A column the tolerant reader adds to each batch: the row's number among the rows the reader parsed (from 0), for
# the line numbers of rows rejected later. Never written: outputs hold the passthrough and prediction columns only.
ROW_COLUMN = "__shardline_row__"
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$|^\s*[-+]?(inf|infinity|nan)\s*$"


def tolerant_csv_schema(file: InputFile, keep_types: Collection[str] | None) -> pa.Schema:
    import pyarrow.compute as pc

    first = None
    try:
        with reader_stream(file) as stream:
            reader = pacsv.open_csv(
                stream,
                read_options=csv_read_options(file),
                parse_options=pacsv.ParseOptions(invalid_row_handler=lambda row: "skip"),
            )
            schema = reader.schema
            with contextlib.suppress(StopIteration):  # a header line alone: an empty input
                first = reader.read_next_batch() if schema.names else None
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise CorruptInputError(
            f"cannot read {file.relative_path} as {describe(file)}: {err}{names_hint(file)}"
        ) from err
    if file.csv_names is None:
        refuse_a_data_line_as_header(file, schema.names)
    fields = []
    for field in schema:
        mostly_numbers = False
        if (
            first is not None
            and keep_types is not None
            and field.name not in keep_types
            and pa.types.is_string(field.type)
        ):
            text = _as_text_values(first.column(field.name))
            values = len(text) - text.null_count
            numbers = pc.sum(pc.match_substring_regex(text, _NUMBER, ignore_case=True)).as_py() or 0
            mostly_numbers = values > 0 and numbers * 2 > values  # a numeric column with some bad values
        fields.append(field.with_type(pa.float64()) if mostly_numbers else field)
    return pa.schema(fields)


@dataclasses.dataclass(frozen=True)
class Reread:
    """A CSV or JSON lines file the fast reader stopped in, to be read again tolerantly: its ``columns`` (of which
    ``features`` go to the model), in batches of ``batch_rows``, typed as ``schema`` (the file's, as read for the
    job) has them, the bad rows going to ``rejects``, and the ``skip`` rows the fast reader already gave left out."""

    unit: WorkUnit
    columns: Sequence[str]
    features: Sequence[str]
    batch_rows: int
    schema: pa.Schema
    rejects: RejectLog
    skip: int

    @functools.cached_property
    def wanted(self) -> dict[str, pa.DataType]:
        """Each column's type: a feature's float64, a passthrough column's as the fast reader gave it."""
        return {name: pa.float64() if name in self.features else self.schema.field(name).type for name in self.columns}

    @functools.cached_property
    def passthrough(self) -> list[str]:
        return [name for name in self.columns if name not in self.features]


def tolerant_csv(reread: Reread) -> Iterator[pa.RecordBatch]:
    """A CSV file read again with every column as text, on one thread (so the reader numbers the lines it cannot
    split), skipping the ``skip`` rows the fast reader already gave; each column then becomes the type the fast
    reader gave it (a feature: float64), and a row with a value that does not convert is rejected."""
    unit, columns, rejects, skip = reread.unit, reread.columns, reread.rejects, reread.skip
    file, wanted, ids, batch_rows = unit.file, reread.wanted, reread.passthrough, reread.batch_rows

    def unsplittable(row) -> str:
        rejects.unparsed(
            row.number, row.text, f"{row.actual_columns} field(s) where the file has {row.expected_columns} column(s)"
        )
        return "skip"

    parsed = 0
    try:
        with reader_stream(file) as stream:
            reader = pacsv.open_csv(
                stream,
                read_options=csv_read_options(file),
                parse_options=pacsv.ParseOptions(invalid_row_handler=unsplittable),
                convert_options=pacsv.ConvertOptions(
                    include_columns=list(columns), column_types={name: pa.string() for name in columns}
                ),
            )
            for block in reader:
                start, parsed = parsed, parsed + block.num_rows
                refuse_a_file_no_line_of_which_splits(unit, parsed, rejects)
                if parsed <= skip:
                    continue
                new = block.slice(skip - start) if start < skip else block
                good = _typed_rows(new, wanted, ids, max(start, skip), rejects)
                rejects.check()
                yield from rebatch(good, batch_rows)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise CorruptInputError(f"cannot read {unit.label} as {describe(file)}: {err}{names_hint(file)}") from err
    refuse_a_file_no_line_of_which_splits(unit, parsed, rejects)


def refuse_a_file_no_line_of_which_splits(unit: WorkUnit, parsed: int, rejects: RejectLog) -> None:
    """Not one line splits into the file's columns: its settings are wrong (a headerless file's names, a delimiter),
    not its rows. The file fails saying so, rather than rejecting every row."""
    if parsed or rejects.read_count < 2 or rejects.retake:
        return
    first = rejects.rejects[0]
    raise CorruptInputError(
        f"no line of {unit.label} splits into the file's columns: {first.where()}: {first.reason}"
        f"{names_hint(unit.file)}"
    )


@functools.cache
def _nulls() -> pa.Array:
    """What the CSV reader reads as null in a number column. Made on first use: ``pa.array`` of a list imports
    pandas (0.2 s and about 100 MiB in every worker), which a clean file never needs."""
    return pa.array(pacsv.ConvertOptions().null_values, pa.string())


def _as_text_values(column: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    trimmed = pc.utf8_trim_whitespace(column)
    return pc.if_else(pc.is_in(trimmed, value_set=_nulls()), pa.scalar(None, pa.string()), trimmed)


def _bad_values(column: pa.Array, dtype: pa.DataType, name: str) -> dict[int, str]:
    """The rows of a text column whose values do not convert to ``dtype``, with the reason."""
    import pyarrow.compute as pc

    try:
        pc.cast(column, dtype)
        return {}
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    numeric = pa.types.is_floating(dtype) or pa.types.is_integer(dtype)
    kind = "an integer" if pa.types.is_integer(dtype) else "a number" if numeric else f"a {dtype} value"
    suspects = range(len(column))
    if pa.types.is_floating(dtype):  # only the values that do not look like numbers need a look of their own
        looks = pc.fill_null(pc.match_substring_regex(column, _NUMBER, ignore_case=True), True)
        suspects = pc.indices_nonzero(pc.invert(looks)).to_pylist() or range(len(column))
    bad = {}
    values = column.to_pylist() if suspects else []
    for index in suspects:
        value = values[index]
        if value is None:
            continue
        try:
            pc.cast(pa.array([value]), dtype)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            bad[index] = f"column {name!r}: {value[:80]!r} is not {kind}"
    return bad


def _typed_value(text: str | None, dtype: pa.DataType):
    """A rejected row's passthrough value as its column's type, or as written when it does not convert."""
    if text is None or pa.types.is_string(dtype):
        return text
    try:
        return pa.array([text.strip()]).cast(dtype)[0].as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return text


def _typed_rows(
    batch: pa.RecordBatch, wanted: dict[str, pa.DataType], ids: Sequence[str], start: int, rejects: RejectLog
) -> pa.RecordBatch:
    """``batch`` (all text) with each column of its wanted type, less the rows whose values do not convert (each
    rejected with its first such value and its ``ids`` columns as text), plus :data:`ROW_COLUMN`."""
    import pyarrow.compute as pc

    converted, bad = {}, {}
    for name, dtype in wanted.items():
        column = batch.column(name)
        if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
            converted[name] = column
            continue
        converted[name] = _as_text_values(column)
        for index, reason in _bad_values(converted[name], dtype, name).items():
            bad.setdefault(index, reason)
    for index, reason in sorted(bad.items()):
        values = {name: _typed_value(batch.column(name)[index].as_py(), wanted[name]) for name in ids}
        rejects.add(start + index, "read", reason, values, text_file=True)
    rows = pa.array(range(start, start + batch.num_rows), pa.int64())
    if bad:
        keep = pa.array([index not in bad for index in range(batch.num_rows)])
        converted = {name: pc.filter(column, keep) for name, column in converted.items()}
        rows = pc.filter(rows, keep)
    arrays = [
        column if wanted[name] == column.type else pc.cast(column, wanted[name]) for name, column in converted.items()
    ]
    return pa.RecordBatch.from_arrays([*arrays, rows], names=[*wanted, ROW_COLUMN])


def tolerant_jsonl_schema(file: InputFile, error: CorruptInputError, sample_lines: int = 1000) -> pa.Schema:
    """The schema of a JSON lines file the fast reader cannot infer one for (a bad line in its first block): from
    the first ``sample_lines`` lines that are JSON objects. A file none of whose first lines is one fails with
    ``error``, the fast reader's."""
    records = []
    with _lines(file) as lines:
        for raw in lines:
            if len(records) >= sample_lines:
                break
            record = _json_object(raw)
            if isinstance(record, dict):
                records.append(record)
    if not records:
        raise error
    try:
        return pa.Table.from_pylist(records).schema
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # a column of mixed types: the fast reader's error says which
        raise error from None


def as_numbers(schema: pa.Schema, names: Collection[str]) -> pa.Schema:
    """``schema`` with the text (or all-null) columns of ``names`` as number columns: a rejects part's feature
    columns, whose rows all failed once, so that their values are no guide to the columns' types."""
    if not names:
        return schema
    return pa.schema(
        [
            f.with_type(pa.float64())
            if f.name in names and (pa.types.is_string(f.type) or pa.types.is_null(f.type))
            else f
            for f in schema
        ]
    )


def tolerant_jsonl(reread: Reread, error: CorruptInputError) -> Iterator[pa.RecordBatch]:
    """A JSON lines file read again line by line, skipping the ``skip`` rows the fast reader already gave: a line
    that is not a JSON object is rejected with its line number (blank lines not counted), and each record's values
    become their column's type as the fast reader would have made them (a feature: float64), a record with a value
    that does not convert being rejected. A file with nested columns fails with ``error``, the fast reader's."""
    unit, columns, rejects, skip = reread.unit, reread.columns, reread.rejects, reread.skip
    wanted, ids, batch_rows = reread.wanted, reread.passthrough, reread.batch_rows
    if any(pa.types.is_nested(dtype) for dtype in wanted.values()):
        raise error
    texts: dict[str, list[str | None]] = {name: [] for name in columns}
    parsed = line = 0
    with _lines(unit.file) as lines:
        for raw in lines:
            if not raw.strip():
                continue
            line += 1
            if line <= skip:
                # The fast reader gave ``skip`` rows before it stopped: they are these lines only when each is one
                # JSON object (it also reads two objects on one line, or one over several); else the file fails
                # with its error, rather than lose or double a row.
                if not isinstance(_json_object(raw), dict):
                    raise error
                parsed += 1
                continue
            record = _json_object(raw)
            if not isinstance(record, dict):
                rejects.unparsed(line, raw.decode("utf-8", "replace").rstrip("\r\n"), record)
                rejects.check()
                continue
            for name in columns:
                texts[name].append(_as_text(record.get(name)))
            if len(texts[columns[0]]) >= batch_rows:
                yield _typed_batch(texts, wanted, ids, parsed, rejects)
                parsed += batch_rows
    if held := len(texts[columns[0]]):
        yield _typed_batch(texts, wanted, ids, parsed, rejects)
        parsed += held
    refuse_a_file_no_line_of_which_splits(unit, parsed, rejects)


def _typed_batch(texts: dict[str, list], wanted, ids, start: int, rejects: RejectLog) -> pa.RecordBatch:
    """The records held in ``texts`` (emptied) as a typed batch, less the ones with a value that does not convert."""
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.string()) for values in texts.values()], names=list(texts))
    for values in texts.values():
        values.clear()
    good = _typed_rows(batch, wanted, ids, start, rejects)
    rejects.check()
    return good


@contextlib.contextmanager
def _lines(file: InputFile):
    """The file's lines, as bytes, decompressed."""
    import gzip

    with gzip.open(file.path, "rb") if file.gzipped else open(file.path, "rb") as stream:
        yield stream


def _json_object(raw: bytes):
    """The line's JSON object, or why it is none (a str)."""
    import json

    try:
        record = json.loads(raw)
    except ValueError as err:
        return f"not valid JSON: {err}"
    return record if isinstance(record, dict) else f"a JSON {type(record).__name__}, not an object"


def _as_text(value) -> str | None:
    """A JSON value as the text a column of any type converts from (strings as they are)."""
    import json

    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)
