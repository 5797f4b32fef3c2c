"""Rows a file may lose with a reason, and what is kept of each (``tolerance.rows``). Pure, no I/O.

With ``tolerance.rows`` above 0, a row the reader cannot parse (a CSV line with another number of fields, a value
that is not a number or not UTF-8 text, a JSON line that is no object) or a record the model or script raises on
costs that row, not the file: it is *rejected*, with its line number (text files: the line an editor shows), its
row number in the file, its passthrough values and the reason, and the file's rows in = rows out + rows rejected.
Over the limit the file fails as it would without one, naming its first rejects. The default, 0, keeps the old
rule: one bad row fails the file, named by its line and column where the reader finds it.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from shardline import contract
from shardline.errors import TooManyRejectsError, clipped
from shardline.report.inputs import reject_where

READ = "read"  # the reader could not parse the row
PREDICT = "predict"  # the model or the script raised on the record, alone
SHOWN_IN_MESSAGES = 5
QUOTED_IN_A_REJECT = 1000  # characters of a line or a reason a reject keeps: a rejects list stays small


@dataclasses.dataclass(frozen=True)
class Reject:
    """One rejected row."""

    row: int | None  # the row's number among the file's data rows, from 1, blank lines not counted (None: not known)
    line: int | None  # its line in a text file as an editor numbers them, from 1 (a record over several: its first)
    stage: str  # READ | PREDICT
    reason: str
    ids: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # its passthrough values, when read
    text: str | None = None  # the line as written, for a line the reader could not split

    def where(self) -> str:
        return reject_where(dataclasses.asdict(self))

    def sort_key(self) -> tuple[int, int]:
        return (self.line or 0, self.row or 0)

    def to_json(self) -> str:
        record = {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, {})}
        return json.dumps(record, default=str, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Reject:
        return cls(**json.loads(line))


allowed = contract.rows_allowed


class RejectLog:
    """The rejects of one work unit, in the order they were found, and the records the reader dropped, to number
    the rows it kept.

    A text file's readers count records (from 1, the header line being record 1, blank lines not counted);
    ``lines`` says which line each starts on (:class:`~shardline.worker.io.text_files.LineMap`), so that a
    reject names the line an editor shows. Without it a record's number is its line."""

    def __init__(
        self, limit: float, *, header_lines: int = 1, row_offset: int = 0, lines: Callable[[int], int] | None = None
    ):
        self.limit = limit
        self.header_lines = header_lines  # 1 for a CSV with a header line, else 0
        self.row_offset = row_offset  # rows of the file before this unit (a part of a split parquet file)
        self.lines = lines
        self.rejects: list[Reject] = []
        self.unparsed_records: list[int] = []  # sorted numbers of the records the reader could not split
        # A rejects part (contract.EVERY_ROW): its rows all failed once, so their failing again is no sign of a wrong
        # setting; each is rejected again, and the file never fails for them.
        self.retake = limit >= contract.EVERY_ROW

    @property
    def count(self) -> int:
        return len(self.rejects)

    @property
    def read_count(self) -> int:
        return sum(1 for r in self.rejects if r.stage == READ)

    def unparsed(self, record: int | None, text: str, reason: str) -> None:
        """The reader skipped record number ``record`` (from 1, the header being 1), which it could not split into
        the file's columns or parse."""
        if record is not None:
            bisect.insort(self.unparsed_records, record)
        row = record - self.header_lines if record is not None else None
        line = self.line(record) if record is not None else None
        text, reason = clipped(text, QUOTED_IN_A_REJECT), clipped(reason, QUOTED_IN_A_REJECT)
        self.rejects.append(Reject(row=row, line=line, stage=READ, reason=reason, text=text))

    def record_of(self, parsed_index: int) -> int:
        """The record number of the parsed row ``parsed_index`` (from 0) of a text file: its place among the
        records the reader kept, the ones it dropped and the header."""
        record = self.header_lines + 1 + parsed_index
        for dropped in self.unparsed_records:
            if dropped > record:
                break
            record += 1
        return record

    def line(self, record: int) -> int:
        """The line record number ``record`` starts on."""
        return self.lines(record) if self.lines is not None else record

    def line_of(self, parsed_index: int) -> int:
        """The line the parsed row ``parsed_index`` (from 0) of a text file starts on."""
        return self.line(self.record_of(parsed_index))

    def add(self, parsed_index: int, stage: str, reason: str, ids: Mapping[str, Any], *, text_file: bool) -> None:
        """A row the reader parsed was rejected (a value, or the model on it)."""
        if text_file:
            record = self.record_of(parsed_index)
            line: int | None = self.line(record)
            row = record - self.header_lines
        else:
            line, row = None, self.row_offset + parsed_index + 1
        reason = clipped(reason, QUOTED_IN_A_REJECT)
        self.rejects.append(Reject(row=row, line=line, stage=stage, reason=reason, ids=dict(ids)))

    def check(self, rows: int | None = None) -> None:
        """Raise :class:`TooManyRejectsError` when the rejects are over the limit: a count at once, a fraction of
        ``rows`` once the unit's rows are known."""
        if self.limit >= 1:
            over = self.count > int(self.limit)
        elif rows is None:
            return
        else:
            over = self.count > allowed(self.limit, rows)
        if over:
            raise TooManyRejectsError(self.over_limit_message())

    def over_limit_message(self) -> str:
        ordered = sorted(self.rejects, key=Reject.sort_key)
        first = "; ".join(f"{r.where()}: {r.reason}" for r in ordered[:SHOWN_IN_MESSAGES])
        more = f" (and {self.count - SHOWN_IN_MESSAGES} more)" if self.count > SHOWN_IN_MESSAGES else ""
        return (
            f"{self.count} row(s) rejected, more than tolerance.rows allows ({contract.rows_limit_text(self.limit)}): "
            f"{first}{more}. Fix the rows (or the script), or raise tolerance.rows"
        )

    def to_jsonl(self) -> bytes:
        return "".join(r.to_json() + "\n" for r in self.rejects).encode()
