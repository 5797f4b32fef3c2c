"""What the worker's text readers share: how a CSV is opened, how a text file is described in an error, the checks
of a CSV's header line, which line an editor shows each record on (:class:`LineMap`), and how a byte that is not
UTF-8 is read by the row-by-row readers (:class:`MarkedBytes`). Helpers over pyarrow; :mod:`formats` reads,
:mod:`tolerant` reads row by row.
"""

from __future__ import annotations

import bisect
import codecs
import contextlib
import io
import re
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from shardline.errors import CorruptInputError, InputSchemaError, clipped
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


# -- bytes that are not UTF-8 ---------------------------------------------------------------------------------------

# The row-by-row readers read a byte that is not UTF-8 (a latin-1 "caf\xe9") as the character MARK + the byte, one of
# Unicode's last private-use plane, that no export writes: Arrow's CSV reader cannot even name a line it cannot split
# when the line holds such a byte, and a row's value is found bad, and said as written, by its marks.
MARK = 0x10FF00
MARKED = "[\U0010ff00-\U0010ffff]"
_MARKED = re.compile(MARKED)
_BYTE_MARKS = "shardline.byte-marks"


def _byte_marks(err: UnicodeError) -> tuple[str, int]:
    assert isinstance(err, UnicodeDecodeError)
    return "".join(chr(MARK + byte) for byte in err.object[err.start : err.end]), err.end


codecs.register_error(_BYTE_MARKS, _byte_marks)


def marked_text(raw: bytes) -> str:
    """``raw`` as text, each byte that is not UTF-8 as its mark."""
    return raw.decode("utf-8", _BYTE_MARKS)


def has_marks(text: str) -> bool:
    return not text.isascii() and _MARKED.search(text) is not None


def as_written(text: str) -> bytes:
    """Marked text as the bytes it was read from."""
    if not has_marks(text):
        return text.encode()
    return b"".join(bytes([ord(c) - MARK]) if ord(c) >= MARK else c.encode() for c in text)


def readable(text: str) -> str:
    """Marked text as a person reads it: each mark as U+FFFD, as a UTF-8 decoder shows such a byte."""
    return _MARKED.sub("\ufffd", text) if has_marks(text) else text


class MarkedBytes(io.RawIOBase):
    """A text file's bytes with each byte that is not UTF-8 replaced by its mark (as UTF-8), for Arrow's readers;
    ``marked`` says whether there was one."""

    def __init__(self, raw: pa.NativeFile):
        self.raw = raw
        self.decoder = codecs.getincrementaldecoder("utf-8")(_BYTE_MARKS)
        self.held = b""
        self.marked = False
        self.done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while len(self.held) < len(buffer) and not self.done:
            chunk = self.raw.read(TEXT_BLOCK_BYTES)
            self.done = not chunk
            if chunk.isascii() and not self.decoder.getstate()[0]:
                self.held += chunk  # most text: no byte to mark, nothing to decode
                continue
            text = self.decoder.decode(chunk, final=self.done)
            self.marked = self.marked or has_marks(text)
            self.held += text.encode()
        size = min(len(buffer), len(self.held))
        buffer[:size] = self.held[:size]
        self.held = self.held[size:]
        return size


@contextlib.contextmanager
def marked_stream(file: InputFile) -> Iterator[tuple[pa.NativeFile, MarkedBytes]]:
    """The file's bytes, decompressed and marked (:class:`MarkedBytes`), for Arrow's CSV reader."""
    marked = MarkedBytes(pa.input_stream(file.path, compression=compression(file)))
    stream = pa.PythonFile(marked, mode="r")
    try:
        yield stream, marked
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


def unreadable(label: str, file: InputFile, err: Exception) -> CorruptInputError:
    """The file cannot be read in its format: the reader's words, clipped (Arrow's CSV errors quote the whole
    line, which may be a megabyte of text)."""
    return CorruptInputError(f"cannot read {label} as {describe(file)}: {clipped(str(err))}{names_hint(file)}")


def header_lines(file: InputFile) -> int:
    """The lines before a text file's first data row: a CSV's header line, unless input.features names its
    columns (input.csv_header: false)."""
    return 1 if file.fmt == "csv" and file.csv_names is None else 0


class LineMap:
    """Which line of a text file, as an editor numbers them (from 1), each of its records starts on.

    The readers count records: a CSV record with a quoted line break spans two lines, and neither reader counts a
    blank line (a CSV's empty line, a JSON lines file's line of white space), so after one the Nth record is not on
    line N. The file is read once, on the first question (only a file with a rejected row or a bad line asks), and
    only the records where the count and the lines part are kept: a clean file's map is empty.
    """

    CHUNK = 8 << 20

    def __init__(self, file: InputFile):
        self.file = file
        # From each of these records (from 1) on, a record's line is its number plus the matching ``_ahead``.
        self._starts: list[int] | None = None
        self._ahead: list[int] = []

    def __call__(self, record: int) -> int:
        """The line record number ``record`` (from 1, the header line being record 1) starts on."""
        if self._starts is None:
            self._scan()
        at = bisect.bisect_right(self._starts, record) - 1
        return record + (self._ahead[at] if at >= 0 else 0)

    def _scan(self) -> None:
        import numpy as np

        starts: list[int] = []
        ahead: list[int] = []
        csv = self.file.fmt == "csv"
        quoted = 0  # 1 when the held text starts inside a quoted CSV value
        lines = records = 0  # the lines and records before the held text
        held = b""
        with pa.input_stream(self.file.path, compression=compression(self.file)) as stream:
            while True:
                chunk = stream.read(self.CHUNK)
                text = held + chunk
                end = text.rfind(b"\n") + 1 if chunk else len(text)  # whole lines; at the end, the last one too
                if end == 0:
                    if not chunk:
                        break
                    held = text
                    continue
                data = np.frombuffer(text, dtype=np.uint8, count=end)
                ends = np.flatnonzero(data == 10)
                if not chunk:
                    ends = np.append(ends, end)  # the last line, with no line break after it
                begins = np.concatenate(([0], ends[:-1] + 1))
                starts_record = ~self._blank(data, begins, ends, csv)
                if csv:  # a line that starts inside a quoted value goes on its record
                    quotes = np.flatnonzero(data == 34)
                    starts_record &= (np.searchsorted(quotes, begins) + quoted) % 2 == 0
                    quoted = (len(quotes) + quoted) % 2
                numbers = records + np.cumsum(starts_record)  # at a line that starts a record: its number
                gaps = (lines + 1 + np.arange(len(begins)) - numbers)[starts_record]
                changes = np.flatnonzero(np.diff(gaps, prepend=ahead[-1] if ahead else 0))
                starts += numbers[starts_record][changes].tolist()
                ahead += gaps[changes].tolist()
                lines += len(begins)
                records = int(numbers[-1])
                held = text[end:]
                if not chunk:
                    break
        self._starts, self._ahead = starts, ahead

    @staticmethod
    def _blank(data, begins, ends, csv: bool):
        """Which lines the readers skip: a CSV's empty lines ("\\r" alone, too), a JSON lines file's of white
        space."""
        import numpy as np

        if csv:
            length = ends - begins
            return (length == 0) | ((length == 1) & (data[np.minimum(begins, len(data) - 1)] == 13))
        solid = np.concatenate(([0], np.cumsum(~np.isin(data, (9, 10, 13, 32)))))
        return solid[ends] - solid[begins] == 0
