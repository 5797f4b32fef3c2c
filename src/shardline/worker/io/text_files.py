"""What the worker's text readers share: how a CSV is opened, how a text file is described in an error, and the
checks of a CSV's header line. Pure helpers over pyarrow; :mod:`formats` reads, :mod:`tolerant` reads row by row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from shardline.errors import InputSchemaError
from shardline.worker.io.work_units import InputFile

# Arrow's CSV/JSON readers infer types from the first block; 1 MiB blocks keep memory low
# while amortising per-block overhead.
TEXT_BLOCK_BYTES = 1 << 20


def csv_read_options(file: InputFile, threads: int = 1) -> pacsv.ReadOptions:
    """A CSV with a header line names its own columns; one without (input.csv_header: false) is named by
    position, and its first line is data."""
    names = list(file.csv_names) if file.csv_names is not None else None
    return pacsv.ReadOptions(block_size=TEXT_BLOCK_BYTES, use_threads=threads > 1, column_names=names)


def names_hint(file: InputFile) -> str:
    if file.csv_names is None:
        return ""
    return (
        f". input.csv_header is false, so input.features names this file's {len(file.csv_names)} column(s) by "
        "position: every line must have exactly that many fields"
    )


def looks_like_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip().lower() not in ("nan", "inf", "-inf", "infinity", "-infinity", "+inf")


def refuse_a_data_line_as_header(file: InputFile, names: Sequence[str]) -> None:
    """A CSV whose header line reads as numbers has no header: its first data line would be lost and every
    column misnamed. Refused: a line of numbers only, or one of which most names are decimals (``0.53``, ``1e-3``:
    no one names a column so; an id beside them does not make it a header). pandas' default names (0, 1, ...,
    n-1, from ``to_csv`` of an unnamed frame) are a header, and ``input.csv_header: true`` vouches for any."""
    if not names or file.trust_header or list(names) == [str(i) for i in range(len(names))]:
        return
    numbers = [name for name in names if looks_like_number(name)]
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


@contextlib.contextmanager
def reader_stream(file: InputFile) -> Iterator[pa.NativeFile]:
    """The file's bytes, decompressed, for Arrow's CSV and JSON readers, left to Arrow to close.

    Those readers read ahead on Arrow's I/O threads. Closed by hand (``with pa.input_stream(...)``) while a read
    ahead was still in flight, as after reading only a schema or after a bad block, the file's descriptor number was
    free again and the late read took its bytes from the next file opened under that number: the row-by-row
    reader's, which then skipped a thousand rows. Arrow closes the file once the last read lets go of it."""
    stream = pa.input_stream(file.path, compression=compression(file))
    try:
        yield stream
    finally:
        del stream


def is_empty_text(file: InputFile) -> bool:
    with pa.input_stream(file.path, compression=compression(file)) as stream:
        return stream.read(1) == b""


# A joined batch stops growing at this many bytes, whatever its rows: Arrow's string columns hold at most 2 GiB
# (wide text rows, such as documents for a model that takes raw text, reach that well before --batch-rows), and
# a worker's memory stays a few blocks' worth.
GROUP_BYTES = 64 << 20


def regroup(batches: Iterable[pa.RecordBatch], rows: int, max_bytes: int = GROUP_BYTES) -> Iterator[pa.RecordBatch]:
    """The reader's batches as batches of ``rows`` rows (the last one fewer), or of ``max_bytes`` when rows are
    wide.

    A text reader yields one batch per block: about 3,000 rows of a 1 MiB CSV block. Each batch costs the model a
    call and the worker its per-batch steps; over so few rows that was about a tenth of a csv.gz file's time.
    Blocks stay 1 MiB (larger ones read slower), and are joined here: one copy of at most ``rows`` rows.
    """
    pending: list[pa.RecordBatch] = []
    held = held_bytes = 0
    for batch in batches:
        offset = 0
        while offset < batch.num_rows:
            take = min(rows - held, batch.num_rows - offset)
            part = batch.slice(offset, take)
            pending.append(part)
            held += take
            held_bytes += part.nbytes
            offset += take
            if held == rows or held_bytes >= max_bytes:
                yield _joined(pending)
                pending, held, held_bytes = [], 0, 0
    if pending:
        yield _joined(pending)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    # Through a table, not pa.concat_batches: that needs pyarrow 19 (we allow 16), and it is slower.
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def rebatch(batch: pa.RecordBatch, rows: int) -> Iterator[pa.RecordBatch]:
    if batch.num_rows <= rows:
        yield batch
        return
    for offset in range(0, batch.num_rows, rows):
        yield batch.slice(offset, rows)


def compression(file: InputFile) -> str | None:
    return "gzip" if file.gzipped else None


def describe(file: InputFile) -> str:
    return f"{file.fmt}{' (gzip)' if file.gzipped else ''}"
