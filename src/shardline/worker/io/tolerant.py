"""Reading a text file row by row under ``tolerance.rows``: what the worker falls back to, from where the fast reader
stopped, once a CSV or JSON lines file holds a row it cannot read. A line that does not split (or parse), a value
that does not convert to its column's type (text in a number column or field), and a value that is not UTF-8 text
cost that row: it is rejected into the unit's :class:`RejectLog` with its line number and reason, and the rest is
read as the fast reader would have read it. Without ``tolerance.rows`` the same reading finds the row a file fails
for, to name its line and column (:func:`strict`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Collection, Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from shardline.errors import CorruptInputError
from shardline.worker.io.rejects import Reject, RejectLog
from shardline.worker.io.text_files import (
    MARKED,
    LineMap,
    as_written,
    csv_read_options,
    describe,
    has_marks,
    header_lines,
    marked_stream,
    marked_text,
    names_hint,
    readable,
    rebatch,
    refuse_a_data_line_as_header,
    unreadable,
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
        with marked_stream(file) as (stream, _):
            reader = pacsv.open_csv(
                stream,
                read_options=csv_read_options(file),
                parse_options=pacsv.ParseOptions(invalid_row_handler=lambda row: "skip"),
            )
            schema = reader.schema
            with contextlib.suppress(StopIteration):  # a header line alone: an empty input
                first = reader.read_next_batch() if schema.names else None
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise unreadable(file.relative_path, file, err) from err
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
    """A CSV file read again with every column as text, on one thread (so the reader numbers the records it cannot
    split), skipping the ``skip`` rows the fast reader already gave; each column then becomes the type the fast
    reader gave it (a feature: float64), and a row with a value that does not convert, or is not UTF-8 text, is
    rejected."""
    unit, columns, rejects, skip = reread.unit, reread.columns, reread.rejects, reread.skip
    file, wanted, ids, batch_rows = unit.file, reread.wanted, reread.passthrough, reread.batch_rows

    def unsplittable(row) -> str:
        fields = f"{row.actual_columns} field(s) where the file has {row.expected_columns} column(s)"
        rejects.unparsed(row.number, readable(row.text), fields)
        return "skip"

    parsed = 0
    try:
        with marked_stream(file) as (stream, marks):
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
                good = _typed_rows(new, wanted, ids, max(start, skip), rejects, marks.marked)
                rejects.check()
                yield from rebatch(good, batch_rows)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise unreadable(unit.label, file, err) from err
    refuse_a_file_no_line_of_which_splits(unit, parsed, rejects)


def strict(reread: Reread, error: CorruptInputError) -> Iterator[pa.RecordBatch]:
    """A CSV or JSON lines file without ``tolerance.rows`` that the fast reader stopped in, read on row by row as
    with it, into ``reread.rejects`` (:func:`strict_log`), but failing at its first bad row, named by its line and
    column: the fast reader's ``error`` names neither, or counts rows from 0 without blank lines. A file whose rows
    are all good though the fast reader stopped (a JSON field of numbers and text, kept as text) is read whole."""
    rows = tolerant_jsonl(reread, error) if reread.unit.file.fmt == "jsonl" else tolerant_csv(reread)
    with contextlib.closing(rows):
        for batch in rows:
            _refuse_a_bad_row(reread, error)
            yield batch.select([name for name in batch.schema.names if name != ROW_COLUMN])
    _refuse_a_bad_row(reread, error)


def _refuse_a_bad_row(reread: Reread, error: CorruptInputError) -> None:
    rejects = reread.rejects.rejects
    if not rejects:
        return
    first = min(rejects, key=Reject.sort_key)  # of the first block with one: the file's first
    raise CorruptInputError(
        f"cannot read {reread.unit.label} as {describe(reread.unit.file)}: {first.where()}: {first.reason}. Fix "
        "the row, or set tolerance.rows (--tolerate-rows) to reject such rows and score the rest"
        f"{names_hint(reread.unit.file)}"
    ) from error.__cause__


def strict_log(file: InputFile) -> RejectLog:
    """The rejects of a file read :func:`strict`: none allowed."""
    return RejectLog(0, header_lines=header_lines(file), lines=LineMap(file))


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
        return readable(text) if text is not None else None
    try:
        return pa.array([text.strip()]).cast(dtype)[0].as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return readable(text)


def _not_utf8(column: pa.Array, name: str) -> dict[int, str]:
    """The rows of a text column whose values hold a byte that is not UTF-8 (read as its mark), with the reason."""
    import pyarrow.compute as pc

    found = pc.indices_nonzero(pc.fill_null(pc.match_substring_regex(column, MARKED), False)).to_pylist()
    values = column.take(pa.array(found, pa.int64())).to_pylist() if found else []
    return {
        index: f"column {name!r}: {as_written(value)[:80]!r} is not UTF-8 text"
        for index, value in zip(found, values, strict=True)
    }


def _typed_rows(
    batch: pa.RecordBatch,
    wanted: dict[str, pa.DataType],
    ids: Sequence[str],
    start: int,
    rejects: RejectLog,
    marked: bool = False,
) -> pa.RecordBatch:
    """``batch`` (all text) with each column of its wanted type, less the rows whose values do not convert, or
    (``marked``: the file holds bytes that are not UTF-8) hold such a byte (each rejected with its first such value
    and its ``ids`` columns as text), plus :data:`ROW_COLUMN`."""
    import pyarrow.compute as pc

    converted, bad = {}, {}
    for name, dtype in wanted.items():
        column = batch.column(name)
        if marked:
            for index, reason in _not_utf8(column, name).items():
                bad.setdefault(index, reason)
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


def tolerant_jsonl_schema(
    file: InputFile, error: CorruptInputError, keep_types: Collection[str] | None = (), sample_lines: int = 1000
) -> pa.Schema:
    """The schema of a JSON lines file the fast reader cannot infer one for (a bad line in its first block, a field
    whose values are of two types): from the first ``sample_lines`` lines that are JSON objects. A field of numbers
    and a few strings (``"a": "twelve"``) is a float64 column, as it would be without them (they are rejected as
    they are read), except the fields of ``keep_types`` (passthrough columns), and any field when ``keep_types`` is
    None: those hold text. A file none of whose first lines is an object fails with ``error``, the fast reader's."""
    records = []
    with _lines(file) as lines:
        for raw in lines:
            if len(records) >= sample_lines:
                break
            record = _json_object(marked_text(raw))
            if isinstance(record, dict):
                records.append(record)
    if not records:
        raise error
    names = dict.fromkeys(name for record in records for name in record)
    return pa.schema([(name, _field_type([r.get(name) for r in records], name, keep_types)) for name in names])


def _field_type(values: list, name: str, keep_types: Collection[str] | None) -> pa.DataType:
    """A JSON field's column type from its values: Arrow's, or for values of two types, float64 when most are
    numbers (and the field's type is not kept), else text."""
    try:
        return pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    present = [value for value in values if value is not None]
    numbers = sum(isinstance(value, (int, float)) and not isinstance(value, bool) for value in present)
    kept = keep_types is None or name in keep_types
    return pa.float64() if not kept and numbers * 2 > len(present) else pa.string()


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
    that is not a JSON object is rejected with its record number (blank lines not counted; the reject log says its
    line), and each record's values become their column's type as the fast reader would have made them (a feature:
    float64), a record with a value that does not convert, or is not UTF-8 text, being rejected. A file with nested
    columns fails with ``error``, the fast reader's."""
    unit, columns, rejects, skip = reread.unit, reread.columns, reread.rejects, reread.skip
    wanted, ids, batch_rows = reread.wanted, reread.passthrough, reread.batch_rows
    if any(pa.types.is_nested(dtype) for dtype in wanted.values()):
        raise error
    texts: dict[str, list[str | None]] = {name: [] for name in columns}
    parsed = line = 0
    marked = False  # a line held a byte that is not UTF-8: the batches' values are looked at for it
    with _lines(unit.file) as lines:
        for raw in lines:
            if not raw.strip():
                continue
            line += 1  # the record's number: the reject log says its line
            if line <= skip:
                # The fast reader gave ``skip`` rows before it stopped: they are these lines only when each is one
                # JSON object (it also reads two objects on one line, or one over several); else the file fails
                # with its error, rather than lose or double a row.
                if not isinstance(_json_object(marked_text(raw)), dict):
                    raise error
                parsed += 1
                continue
            text = marked_text(raw)
            record = _json_object(text)
            if not isinstance(record, dict):
                rejects.unparsed(line, readable(text).rstrip("\r\n"), record)
                rejects.check()
                continue
            marked = marked or has_marks(text)
            for name in columns:
                texts[name].append(_as_text(record.get(name)))
            if len(texts[columns[0]]) >= batch_rows:
                yield _typed_batch(texts, wanted, ids, parsed, rejects, marked)
                parsed += batch_rows
    if held := len(texts[columns[0]]):
        yield _typed_batch(texts, wanted, ids, parsed, rejects, marked)
        parsed += held
    refuse_a_file_no_line_of_which_splits(unit, parsed, rejects)


def _typed_batch(texts: dict[str, list], wanted, ids, start: int, rejects: RejectLog, marked: bool) -> pa.RecordBatch:
    """The records held in ``texts`` (emptied) as a typed batch, less the ones with a value that does not convert."""
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.string()) for values in texts.values()], names=list(texts))
    for values in texts.values():
        values.clear()
    good = _typed_rows(batch, wanted, ids, start, rejects, marked)
    rejects.check()
    return good


@contextlib.contextmanager
def _lines(file: InputFile):
    """The file's lines, as bytes, decompressed."""
    import gzip

    with gzip.open(file.path, "rb") if file.gzipped else open(file.path, "rb") as stream:
        yield stream


def _json_object(text: str):
    """The line's JSON object, or why it is none (a str). ``text``: the line as :func:`marked_text` reads it, so
    that a byte that is not UTF-8 costs only the row whose value holds it."""
    import json

    try:
        record = json.loads(text)
    except ValueError as err:
        return f"not valid JSON: {err}"
    return record if isinstance(record, dict) else f"a JSON {type(record).__name__}, not an object"


def _as_text(value) -> str | None:
    """A JSON value as the text a column of any type converts from (strings as they are)."""
    import json

    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)
