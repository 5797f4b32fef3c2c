"""Streaming readers and writers for parquet, CSV and JSON lines (each optionally gzipped).

Everything here moves Arrow record batches, never whole files, so a worker's memory is
bounded by its batch size whatever the file size. Outputs are written under a temporary
name and renamed into place only when complete.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardline import contract
from shardline.errors import CorruptInputError
from shardline.worker.io.json_lines import batch_lines
from shardline.worker.io.rejects import RejectLog
from shardline.worker.io.text_files import (
    TEXT_BLOCK_BYTES,
    csv_read_options,
    is_empty_text,
    reader_stream,
    refuse_a_data_line_as_header,
    regroup,
    unreadable,
)
from shardline.worker.io.tolerant import (
    Reread,
    as_numbers,
    strict,
    strict_log,
    tolerant_csv,
    tolerant_csv_schema,
    tolerant_jsonl,
    tolerant_jsonl_schema,
)
from shardline.worker.io.work_units import InputFile, WorkUnit

TEMP_MARKER = contract.TEMP_MARKER


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
    file: InputFile,
    scratch: Path,
    *,
    tolerant: bool = False,
    keep_types: Collection[str] | None = (),
    numbers: Collection[str] = (),
) -> pa.Schema:
    """The file's schema (inferred from the first block for CSV and JSON lines).

    ``tolerant`` (``tolerance.rows``): a CSV's lines that do not split into its columns, and a JSON lines file's
    lines that are no JSON object, are left out of the inference, and a CSV column whose values are mostly numbers
    is a float64 column even if a few are not (they are rejected as they are read), as it would be without them;
    except the columns of ``keep_types`` (passthrough columns), and any column when ``keep_types`` is None (a model
    that takes raw text columns). ``numbers``: columns that are number columns whatever the rows hold (a rejects
    part's features named before it is read: its rows all failed once).

    A CSV with a line that does not split in its first block has the schema of its lines that do, and a JSON lines file
    with a line that is no JSON object, or a field of two types, there the schema of its lines that are objects,
    tolerant or not: the reader rejects those lines, or fails naming the first."""
    if tolerant and file.fmt == "csv" and not is_empty_text(file):
        return as_numbers(tolerant_csv_schema(file, keep_types), numbers)
    try:
        schema = _schema(file, scratch)
    except CorruptInputError as err:
        if file.fmt == "parquet" or not isinstance(err.__cause__, pa.ArrowInvalid):
            raise
        # A line of the first block that the fast reader cannot read: the schema of the others (the reader rejects
        # that line, or fails naming it).
        if file.fmt == "csv":
            schema = tolerant_csv_schema(file, keep_types)
        else:
            schema = tolerant_jsonl_schema(file, err, keep_types)
    return as_numbers(schema, numbers) if tolerant else schema


def _schema(file: InputFile, scratch: Path) -> pa.Schema:
    """The file's schema as the fast reader infers it (a CSV column of bytes that are not UTF-8: text)."""
    try:
        if file.fmt == "parquet":
            with _parquet_path(file, scratch) as path:
                return pq.read_schema(path)
        if is_empty_text(file):
            return pa.schema([])  # a 0-byte CSV or JSON lines file is a valid, empty input
        if file.fmt == "csv":
            with reader_stream(file) as stream:
                schema = pacsv.open_csv(stream, read_options=csv_read_options(file)).schema
            if file.csv_names is None:
                refuse_a_data_line_as_header(file, schema.names)
            return pa.schema([f.with_type(pa.string()) if pa.types.is_binary(f.type) else f for f in schema])
        with reader_stream(file) as stream:
            return pajson.open_json(stream, read_options=pajson.ReadOptions(block_size=TEXT_BLOCK_BYTES)).schema
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise unreadable(file.relative_path, file, err) from err


def parquet_meta(file: InputFile) -> tuple[int, list[int]] | None:
    """(rows, row-group sizes) from a parquet footer; None if unreadable (the worker reports why)."""
    if file.refusal:
        return None
    try:
        meta = pq.read_metadata(file.path)
    except (OSError, ValueError):
        return None
    return meta.num_rows, [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]


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

    With ``rejects`` (``tolerance.rows``), a CSV or JSON lines file the fast reader cannot read is read again, from
    where it stopped, row by row where it must (:mod:`~shardline.worker.io.tolerant`): a line it cannot split or
    parse, a value that does not convert and one that is not UTF-8 text are rejected with their line numbers, and
    its batches carry each row's number among the parsed rows in ``ROW_COLUMN``, and each column the type ``schema``
    (the file's, as read for the job) gives it. Without ``rejects`` it is read on in the same way, but fails at its
    first bad row, named by its line and column. Clean files never leave the fast reader."""
    yielded = 0
    try:
        # Without rejects, ``schema`` is the file's as the fast reader infers it: JSON lines need not read it again.
        known = schema if rejects is None else None
        for batch in _batches(unit, columns, features, batch_rows, scratch, threads, known):
            yielded += batch.num_rows
            yield batch
        return
    except CorruptInputError as err:
        if unit.file.fmt == "parquet" or not isinstance(err.__cause__, pa.ArrowInvalid):
            raise
        error = err
    if rejects is None:  # read on row by row, the file failing at its first bad row, named by its line and column
        schema = schema or read_schema(unit.file, scratch)
        reread = Reread(unit, columns, features, batch_rows, schema, strict_log(unit.file), skip=yielded)
        yield from strict(reread, error)
        return
    if schema is None:
        schema = read_schema(unit.file, scratch, tolerant=True)
    reread = Reread(unit, columns, features, batch_rows, schema, rejects, skip=yielded)
    yield from tolerant_jsonl(reread, error) if unit.file.fmt == "jsonl" else tolerant_csv(reread)


def _batches(
    unit: WorkUnit,
    columns: Sequence[str],
    features: Sequence[str],
    batch_rows: int,
    scratch: Path,
    threads: int,
    schema: pa.Schema | None = None,
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
        with reader_stream(file) as stream:
            if file.fmt == "csv":
                reader = pacsv.open_csv(
                    stream,
                    read_options=csv_read_options(file, threads),
                    convert_options=pacsv.ConvertOptions(include_columns=list(columns), column_types=float_features),
                )
                refuse_bytes(reader.schema)
            else:
                schema = schema or read_schema(file, scratch)
                explicit = pa.schema(
                    [pa.field(name, float_features.get(name, schema.field(name).type)) for name in columns]
                )
                reader = pajson.open_json(
                    stream,
                    read_options=pajson.ReadOptions(block_size=TEXT_BLOCK_BYTES, use_threads=threads > 1),
                    parse_options=pajson.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="ignore"),
                )
                reader = _utf8_checked(reader, [f.name for f in explicit if pa.types.is_string(f.type)])
            yield from regroup(reader, batch_rows)  # one batch per block, joined to the requested size
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as err:
        raise unreadable(unit.label, file, err) from err


def refuse_bytes(schema: pa.Schema) -> None:
    """Arrow's CSV reader reads a column whose first block holds a byte that is not UTF-8 (a latin-1 "caf\xe9") as
    binary: that file's rows are read row by row (a later block's such byte stops the reader itself)."""
    binary = [f.name for f in schema if pa.types.is_binary(f.type)]
    if binary:
        raise pa.ArrowInvalid(f"column {binary[0]!r} holds a value that is not UTF-8 text")


def _utf8_checked(batches: Iterable[pa.RecordBatch], text_columns: list[str]) -> Iterator[pa.RecordBatch]:
    """Arrow's JSON reader takes a string's bytes as they are, UTF-8 or not: a JSON lines file's text columns are
    checked (about 1% of the reading time, text columns only), so that such a row is rejected, or the file fails
    naming it, rather than written out as text no reader can read."""
    for batch in batches:
        for name in text_columns:
            batch.column(name).validate(full=True)  # ArrowInvalid: not UTF-8
        yield batch


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


# -- writing ---------------------------------------------------------------------------


GZIP_LEVEL = 1  # gzipped text outputs: zlib's fastest level (see OutputWriter)


def output_target(file: InputFile, output_format: str, tag: str | None = None) -> tuple[str, str, bool]:
    """(relative path, format, gzipped) of a file's output.

    By default the output keeps the input's relative path, format and compression, so
    downstream steps find it where they expect. Gzipped parquet is written as plain
    parquet, which is compressed inside already. ``tag`` (a table step's run and attempt) goes
    before the extension: ``part-00000.TAG.parquet``.
    """
    if output_format == "same" and not (file.fmt == "parquet" and file.gzipped) and tag is None:
        return file.relative_path, file.fmt, file.gzipped
    fmt = file.fmt if output_format == "same" else output_format
    gzipped = file.gzipped and fmt != "parquet" and output_format == "same"
    stem = file.relative_path[:-3] if file.gzipped else file.relative_path
    stem = os.path.splitext(stem)[0]
    name = f"{stem}.{tag}.{fmt}" if tag else f"{stem}.{fmt}"
    return (name + ".gz" if gzipped else name), fmt, gzipped


def temp_path(final: Path, part: int | None = None) -> Path:
    """Where an output is written before it is complete. Deterministic, so retries overwrite."""
    suffix = f".part{part:04d}" if part is not None else ""
    return final.with_name(f".{final.name}{suffix}{TEMP_MARKER}")


class OutputWriter:
    """Writes record batches to one output file in the unit's output format."""

    def __init__(
        self,
        path: Path,
        fmt: str,
        gzipped: bool,
        schema: pa.Schema,
        *,
        header: bool = True,
        constants: Mapping[str, str] | None = None,
    ):
        # ``constants``: text columns added to every row (a table's partition), after the batch's own.
        self.constants = dict(constants or {})
        clash = sorted(set(self.constants) & set(schema.names))
        if clash:
            raise ValueError(
                f"the output already has column(s) {clash}, which output.table.partition adds to every row: name the "
                "partition column otherwise in the spec"
            )
        schema = (
            schema if not self.constants else pa.schema([*schema, *(pa.field(n, pa.string()) for n in self.constants)])
        )
        self._filled: dict[str, pa.Array] = {}
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
        if gzipped:
            # Arrow's gzip writes at level 9: for a CSV of ids and predictions, 20x the CPU of level 1 for a file
            # about 10% smaller, and four times what the model costs (docs/benchmarks.md, "Text inputs").
            raw = self._stack.enter_context(open(path, "wb"))  # noqa: SIM115 - the stack closes it
            packed = self._stack.enter_context(
                gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0)
            )
            self._stream = self._stack.enter_context(pa.PythonFile(packed, mode="w"))
        else:
            self._stream = self._stack.enter_context(pa.output_stream(str(path)))
        if fmt == "csv":
            self._csv = pacsv.CSVWriter(self._stream, schema, write_options=pacsv.WriteOptions(include_header=header))

    def _with_constants(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows = batch.num_rows
        columns = list(batch.columns)
        for name, value in self.constants.items():
            filled = self._filled.get(name)
            if filled is None or len(filled) < rows:  # built once per size, then sliced (no copy)
                filled = self._filled[name] = pa.array([value] * max(rows, 1), pa.string())
            columns.append(filled.slice(0, rows))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def write(self, batch: pa.RecordBatch) -> None:
        if self.constants:
            batch = self._with_constants(batch)
        if self.fmt == "parquet":
            self._parquet.write_batch(batch)
        elif self.fmt == "csv":
            self._csv.write_batch(batch)
        else:
            lines = batch_lines(batch)
            if lines is None:  # a column type Arrow's kernels do not format here: pandas does (15 digits a float)
                text = batch.to_pandas().to_json(orient="records", lines=True, double_precision=15, date_format="iso")
                lines = text.encode() if text.endswith("\n") else (text + "\n").encode()
            self._stream.write(lines)

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
