"""Streaming readers and writers for parquet, CSV and JSON lines (each optionally gzipped).

Everything here moves Arrow record batches, never whole files, so a worker's memory is
bounded by its batch size whatever the file size. Outputs are written under a temporary
name and renamed into place only when complete.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Collection, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardline import contract
from shardline.errors import CorruptInputError, InputSchemaError
from shardline.worker.model.rejects import RejectLog
from shardline.worker.pool.work_units import InputFile, WorkUnit

TEMP_MARKER = contract.TEMP_MARKER
# Arrow's CSV/JSON readers infer types from the first block; 1 MiB blocks keep memory low
# while amortising per-block overhead.
TEXT_BLOCK_BYTES = 1 << 20
# A column the tolerant reader adds to each batch: the row's number among the rows the reader parsed (from 0), for
# the line numbers of rows rejected later. Never written: outputs hold the passthrough and prediction columns only.
ROW_COLUMN = "__shardline_row__"


# -- columns ---------------------------------------------------------------------------


def to_matrix(batch: pa.RecordBatch, features: Sequence[str], dtype: np.dtype, order: str = "C") -> np.ndarray:
    """Feature columns as one contiguous matrix, converted once. Nulls become NaN.

    ``order`` is the model's preferred memory layout: "C" (row-major) for models that
    read a row at a time, "F" (column-major) for tree ensembles that walk one tree over
    all rows, where a column-major matrix keeps each split's feature reads sequential.
    """
    out = np.empty((batch.num_rows, len(features)), dtype=dtype, order=order)
    for j, name in enumerate(features):
        out[:, j] = column_values(batch.column(name))
    return out


def column_values(column: pa.Array) -> np.ndarray:
    """One column as numpy values, nulls as NaN (decimals, booleans and dictionaries as float64).

    A number column goes through Arrow's tensor conversion, not ``Array.to_numpy``: that one
    runs Arrow's pandas conversion, which imports pandas (0.2 s, in every worker, on its first
    batch) even for a plain float column. The values are the same: a column without nulls keeps
    its type, one with nulls becomes a float type that holds each value exactly, with NaN.
    """
    column = _as_float_ready(column)
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        single = pa.RecordBatch.from_arrays([column], names=["values"])
        return single.to_tensor(null_to_nan=column.null_count > 0).to_numpy().reshape(-1)
    return column.to_numpy(zero_copy_only=False)


def values_to_arrow(values: np.ndarray) -> pa.Array:
    """A numpy array of predictions as an Arrow array (NaN stays NaN), like ``pa.array(values)``.

    A 1-D number array is wrapped without a copy and without ``pa.array``, whose checks for
    pandas objects import pandas (0.2 s, in every worker, on its first batch).
    """
    if values.ndim == 1 and values.dtype.kind in "iuf" and values.dtype.isnative:
        values = np.ascontiguousarray(values)
        return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])
    return pa.array(values)


def _as_float_ready(column: pa.Array) -> pa.Array:
    dtype = column.type
    if (
        pa.types.is_decimal(dtype)
        or pa.types.is_null(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_dictionary(dtype)
    ):
        return column.cast(pa.float64())  # a null stays a null, and becomes NaN in to_numpy
    return column


# -- reading ---------------------------------------------------------------------------


def read_schema(
    file: InputFile, scratch: Path, *, tolerant: bool = False, keep_types: Collection[str] | None = ()
) -> pa.Schema:
    """The file's schema (inferred from the first block for CSV and JSON lines).

    ``tolerant`` (``tolerance.rows``): a CSV's lines that do not split into its columns are left out of the
    inference, and a column whose values are mostly numbers is a float64 column even if a few are not (they are
    rejected as they are read), as it would be without them; except the columns of ``keep_types`` (passthrough
    columns), and any column when ``keep_types`` is None (a model that takes raw text columns)."""
    if tolerant and file.fmt == "csv" and not _is_empty_text(file):
        return _tolerant_csv_schema(file, keep_types)
    try:
        if file.fmt == "parquet":
            with _parquet_path(file, scratch) as path:
                return pq.read_schema(path)
        if _is_empty_text(file):
            return pa.schema([])  # a 0-byte CSV or JSON lines file is a valid, empty input
        if file.fmt == "csv":
            with pa.input_stream(file.path, compression=_compression(file)) as stream:
                schema = pacsv.open_csv(stream, read_options=_csv_read_options(file)).schema
            if file.csv_names is None:
                _refuse_a_data_line_as_header(file, schema.names)
            return schema
        with pa.input_stream(file.path, compression=_compression(file)) as stream:
            return pajson.open_json(stream, read_options=pajson.ReadOptions(block_size=TEXT_BLOCK_BYTES)).schema
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        what = f"cannot read {file.relative_path} as {_describe(file)}"
        raise CorruptInputError(f"{what}: {err}{_names_hint(file)}") from err


_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$|^\s*[-+]?(inf|infinity|nan)\s*$"


def _tolerant_csv_schema(file: InputFile, keep_types: Collection[str] | None) -> pa.Schema:
    import pyarrow.compute as pc

    first = None
    try:
        with pa.input_stream(file.path, compression=_compression(file)) as stream:
            reader = pacsv.open_csv(
                stream,
                read_options=_csv_read_options(file),
                parse_options=pacsv.ParseOptions(invalid_row_handler=lambda row: "skip"),
            )
            schema = reader.schema
            with contextlib.suppress(StopIteration):  # a header line alone: an empty input
                first = reader.read_next_batch() if schema.names else None
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise CorruptInputError(
            f"cannot read {file.relative_path} as {_describe(file)}: {err}{_names_hint(file)}"
        ) from err
    if file.csv_names is None:
        _refuse_a_data_line_as_header(file, schema.names)
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


def _csv_read_options(file: InputFile, threads: int = 1) -> pacsv.ReadOptions:
    """A CSV with a header line names its own columns; one without (input.csv_header: false) is named by
    position, and its first line is data."""
    names = list(file.csv_names) if file.csv_names is not None else None
    return pacsv.ReadOptions(block_size=TEXT_BLOCK_BYTES, use_threads=threads > 1, column_names=names)


def _names_hint(file: InputFile) -> str:
    if file.csv_names is None:
        return ""
    return (
        f". input.csv_header is false, so input.features names this file's {len(file.csv_names)} column(s) by "
        "position: every line must have exactly that many fields"
    )


def _looks_like_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip().lower() not in ("nan", "inf", "-inf", "infinity", "-infinity", "+inf")


def _refuse_a_data_line_as_header(file: InputFile, names: Sequence[str]) -> None:
    """A CSV whose header line reads as numbers has no header: its first data line would be lost and every
    column misnamed. Refused: a line of numbers only, or one of which most names are decimals (``0.53``, ``1e-3``:
    no one names a column so; an id beside them does not make it a header). pandas' default names (0, 1, ...,
    n-1, from ``to_csv`` of an unnamed frame) are a header, and ``input.csv_header: true`` vouches for any."""
    if not names or file.trust_header or list(names) == [str(i) for i in range(len(names))]:
        return
    numbers = [name for name in names if _looks_like_number(name)]
    decimals = [name for name in numbers if not name.strip().lstrip("+-").isdigit()]
    if len(numbers) < len(names) and len(decimals) * 2 <= len(names):
        return
    shown = ", ".join(list(names)[:6]) + (", ..." if len(names) > 6 else "")
    raise InputSchemaError(
        f"the first line of {file.relative_path} reads as numbers ({shown}), not column names: it looks like a "
        "data line, and reading it as the header would lose that row and misname every column. For a CSV without "
        "a header line, set input.csv_header: false (--input-csv-header false) and name its columns, in order, "
        "with input.features; if these really are its column names, set input.csv_header: true"
    )


def parquet_meta(file: InputFile) -> tuple[int, list[int]] | None:
    """(rows, row-group sizes) from a parquet footer; None if unreadable (the worker reports why)."""
    if file.refusal:
        return None
    try:
        meta = pq.read_metadata(file.path)
    except (OSError, ValueError):
        return None
    return meta.num_rows, [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]


def _is_empty_text(file: InputFile) -> bool:
    with pa.input_stream(file.path, compression=_compression(file)) as stream:
        return stream.read(1) == b""


def iter_batches(
    unit: WorkUnit,
    columns: Sequence[str],
    features: Sequence[str],
    batch_rows: int,
    scratch: Path,
    *,
    threads: int = 1,
    rejects: RejectLog | None = None,
    schema: pa.Schema | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stream the unit's rows as record batches holding only ``columns``.

    With ``rejects`` (``tolerance.rows``), a CSV file the fast reader cannot read is read again, from where it
    stopped, row by row where it must (:func:`_tolerant_csv`): a line it cannot split and a
    value that does not parse are rejected with their line numbers, and its batches carry each row's number among
    the parsed rows in :data:`ROW_COLUMN`, and each column the type ``schema`` (the file's, as read for the job)
    gives it. Clean files never leave the fast reader."""
    yielded = 0
    try:
        for batch in _batches(unit, columns, features, batch_rows, scratch, threads):
            yielded += batch.num_rows
            yield batch
        return
    except CorruptInputError as err:
        if rejects is None or unit.file.fmt != "csv" or not isinstance(err.__cause__, pa.ArrowInvalid):
            raise
    if schema is None:
        schema = read_schema(unit.file, scratch, tolerant=True)
    yield from _tolerant_csv(unit, columns, features, batch_rows, schema, rejects, skip=yielded)


def _batches(
    unit: WorkUnit, columns: Sequence[str], features: Sequence[str], batch_rows: int, scratch: Path, threads: int
) -> Iterator[pa.RecordBatch]:
    file = unit.file
    try:
        if file.fmt == "parquet":
            with _parquet_path(file, scratch) as path:
                parquet = pq.ParquetFile(path, buffer_size=8 << 20, pre_buffer=False)
                yield from parquet.iter_batches(
                    batch_size=batch_rows,
                    row_groups=list(unit.row_groups) if unit.row_groups is not None else None,
                    columns=list(columns),
                    use_threads=threads > 1,
                )
            return
        float_features = {name: pa.float64() for name in features}
        with pa.input_stream(file.path, compression=_compression(file)) as stream:
            if file.fmt == "csv":
                reader = pacsv.open_csv(
                    stream,
                    read_options=_csv_read_options(file, threads),
                    convert_options=pacsv.ConvertOptions(include_columns=list(columns), column_types=float_features),
                )
            else:
                schema = read_schema(file, scratch)
                explicit = pa.schema(
                    [pa.field(name, float_features.get(name, schema.field(name).type)) for name in columns]
                )
                reader = pajson.open_json(
                    stream,
                    read_options=pajson.ReadOptions(block_size=TEXT_BLOCK_BYTES, use_threads=threads > 1),
                    parse_options=pajson.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="ignore"),
                )
            for batch in reader:
                # Text readers yield one batch per block; re-slice to the requested size.
                yield from _rebatch(batch, batch_rows)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise CorruptInputError(f"cannot read {unit.label} as {_describe(file)}: {err}{_names_hint(file)}") from err


def _tolerant_csv(
    unit: WorkUnit,
    columns: Sequence[str],
    features: Sequence[str],
    batch_rows: int,
    schema: pa.Schema,
    rejects: RejectLog,
    *,
    skip: int,
) -> Iterator[pa.RecordBatch]:
    """A CSV file read again with every column as text, on one thread (so the reader numbers the lines it cannot
    split), skipping the ``skip`` rows the fast reader already gave; each column then becomes the type the fast
    reader gave it (a feature: float64), and a row with a value that does not convert is rejected."""
    file = unit.file
    wanted = {name: pa.float64() if name in features else schema.field(name).type for name in columns}
    ids = [name for name in columns if name not in features]  # the passthrough columns

    def unsplittable(row) -> str:
        rejects.unparsed(
            row.number, row.text, f"{row.actual_columns} field(s) where the file has {row.expected_columns} column(s)"
        )
        return "skip"

    parsed = 0
    try:
        with pa.input_stream(file.path, compression=_compression(file)) as stream:
            reader = pacsv.open_csv(
                stream,
                read_options=_csv_read_options(file),
                parse_options=pacsv.ParseOptions(invalid_row_handler=unsplittable),
                convert_options=pacsv.ConvertOptions(
                    include_columns=list(columns), column_types={name: pa.string() for name in columns}
                ),
            )
            for block in reader:
                start, parsed = parsed, parsed + block.num_rows
                _refuse_a_file_no_line_of_which_splits(unit, parsed, rejects)
                if parsed <= skip:
                    continue
                new = block.slice(skip - start) if start < skip else block
                good = _typed_rows(new, wanted, ids, max(start, skip), rejects)
                rejects.check()
                yield from _rebatch(good, batch_rows)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise CorruptInputError(f"cannot read {unit.label} as {_describe(file)}: {err}{_names_hint(file)}") from err
    _refuse_a_file_no_line_of_which_splits(unit, parsed, rejects)


def _refuse_a_file_no_line_of_which_splits(unit: WorkUnit, parsed: int, rejects: RejectLog) -> None:
    """Not one line splits into the file's columns: its settings are wrong (a headerless file's names, a delimiter),
    not its rows. The file fails saying so, rather than rejecting every row."""
    if parsed or rejects.read_count < 2:
        return
    first = rejects.rejects[0]
    raise CorruptInputError(
        f"no line of {unit.label} splits into the file's columns: {first.where()}: {first.reason}"
        f"{_names_hint(unit.file)}"
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


def _rebatch(batch: pa.RecordBatch, rows: int) -> Iterator[pa.RecordBatch]:
    if batch.num_rows <= rows:
        yield batch
        return
    for offset in range(0, batch.num_rows, rows):
        yield batch.slice(offset, rows)


class _parquet_path:
    """Context manager: a seekable local path for a parquet file, gunzipped to scratch if needed."""

    def __init__(self, file: InputFile, scratch: Path):
        self.file, self.scratch, self.tmp = file, scratch, None

    def __enter__(self) -> str:
        if not self.file.gzipped:
            return self.file.path
        self.scratch.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(suffix=".parquet", dir=self.scratch)
        with os.fdopen(fd, "wb") as out, pa.input_stream(self.file.path, compression="gzip") as src:
            while chunk := src.read(8 << 20):
                out.write(chunk)
        return self.tmp

    def __exit__(self, *exc) -> None:
        if self.tmp:
            Path(self.tmp).unlink(missing_ok=True)


def _compression(file: InputFile) -> str | None:
    return "gzip" if file.gzipped else None


def _describe(file: InputFile) -> str:
    return f"{file.fmt}{' (gzip)' if file.gzipped else ''}"


# -- writing ---------------------------------------------------------------------------


def output_target(file: InputFile, output_format: str) -> tuple[str, str, bool]:
    """(relative path, format, gzipped) of a file's output.

    By default the output keeps the input's relative path, format and compression, so
    downstream steps find it where they expect. Gzipped parquet is written as plain
    parquet, which is compressed inside already.
    """
    if output_format == "same" and not (file.fmt == "parquet" and file.gzipped):
        return file.relative_path, file.fmt, file.gzipped
    fmt = file.fmt if output_format == "same" else output_format
    stem = file.relative_path[:-3] if file.gzipped else file.relative_path
    stem = os.path.splitext(stem)[0]
    return f"{stem}.{fmt}", fmt, False


def temp_path(final: Path, part: int | None = None) -> Path:
    """Where an output is written before it is complete. Deterministic, so retries overwrite."""
    suffix = f".part{part:04d}" if part is not None else ""
    return final.with_name(f".{final.name}{suffix}{TEMP_MARKER}")


class OutputWriter:
    """Writes record batches to one output file in the unit's output format."""

    def __init__(self, path: Path, fmt: str, gzipped: bool, schema: pa.Schema, *, header: bool = True):
        self.path, self.fmt, self.schema = path, fmt, schema
        self._stack = ExitStack()
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            # Dictionary encoding on float predictions costs time and space for nothing.
            stats = [f.name for f in schema if not pa.types.is_floating(f.type)]
            self._parquet = pq.ParquetWriter(
                str(path), schema, compression="snappy", use_dictionary=False, write_statistics=stats
            )
            return
        self._stream = self._stack.enter_context(pa.output_stream(str(path), compression="gzip" if gzipped else None))
        if fmt == "csv":
            self._csv = pacsv.CSVWriter(self._stream, schema, write_options=pacsv.WriteOptions(include_header=header))

    def write(self, batch: pa.RecordBatch) -> None:
        if self.fmt == "parquet":
            self._parquet.write_batch(batch)
        elif self.fmt == "csv":
            self._csv.write_batch(batch)
        else:
            text = batch.to_pandas().to_json(orient="records", lines=True, double_precision=15)
            self._stream.write(text.encode() if text.endswith("\n") else (text + "\n").encode())

    def close(self) -> None:
        if self.fmt == "parquet":
            self._parquet.close()
        elif self.fmt == "csv":
            self._csv.close()
        self._stack.close()

    def abort(self) -> None:
        try:
            self.close()
        finally:
            self.path.unlink(missing_ok=True)


def merge_parts(parts: Sequence[Path], dest: Path, fmt: str) -> None:
    """Join part files, in order, into ``dest``.

    CSV and JSON lines parts (gzipped or not) concatenate byte for byte: only the first
    CSV part has a header, and concatenated gzip members are a valid gzip stream.
    Parquet parts are re-framed row group by row group; they hold only the output columns.
    """
    if fmt == "parquet":
        schema = pq.read_schema(parts[0])
        stats = [f.name for f in schema if not pa.types.is_floating(f.type)]
        with pq.ParquetWriter(
            str(dest), schema, compression="snappy", use_dictionary=False, write_statistics=stats
        ) as writer:
            for part in parts:
                source = pq.ParquetFile(part)
                for index in range(source.num_row_groups):
                    writer.write_table(source.read_row_group(index))
        return
    with open(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 8 << 20)
