"""Rows a file may lose with a reason, and what is kept of each (``tolerance.rows``). Pure, no I/O.

With ``tolerance.rows`` above 0, a row the reader cannot parse (a CSV line with another number of fields, a value
that is not a number) or a record the model or script raises on costs that row, not the file: it is *rejected*,
with its line number (text files), its row number in the file, its passthrough values and the reason, and the
file's rows in = rows out + rows rejected. Over the limit the file fails as it would without one, naming its first
rejects. The default, 0, keeps the old rule: one bad row fails the file.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from shardline import contract
from shardline.errors import TooManyRejectsError
from shardline.report.inputs import reject_where

READ = "read"  # the reader could not parse the row
PREDICT = "predict"  # the model or the script raised on the record, alone
SHOWN_IN_MESSAGES = 5


@dataclasses.dataclass(frozen=True)
class Reject:
    """One rejected row."""

    row: int | None  # the row's number among the file's data rows, from 1 (None: not known)
    line: int | None  # its line in a text file, the header line being 1 (blank lines not counted)
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
    """The rejects of one work unit, in the order they were found, and the line numbers of rows the reader
    dropped, to number the rows it kept."""

    def __init__(self, limit: float, *, header_lines: int = 1, row_offset: int = 0):
        self.limit = limit
        self.header_lines = header_lines  # 1 for a CSV with a header line, else 0
        self.row_offset = row_offset  # rows of the file before this unit (a part of a split parquet file)
        self.rejects: list[Reject] = []
        self.unparsed_lines: list[int] = []  # sorted line numbers of the lines the reader could not split
        # A rejects part (contract.EVERY_ROW): its rows all failed once, so their failing again is no sign of a wrong
        # setting; each is rejected again, and the file never fails for them.
        self.retake = limit >= contract.EVERY_ROW

    @property
    def count(self) -> int:
        return len(self.rejects)

    @property
    def read_count(self) -> int:
        return sum(1 for r in self.rejects if r.stage == READ)

    def unparsed(self, line: int | None, text: str, reason: str) -> None:
        """The reader skipped a line it could not split into the file's columns."""
        if line is not None:
            bisect.insort(self.unparsed_lines, line)
        row = line - self.header_lines if line is not None else None
        self.rejects.append(Reject(row=row, line=line, stage=READ, reason=reason, text=text[:1000]))

    def line_of(self, parsed_index: int) -> int:
        """The line of the parsed row ``parsed_index`` (from 0) of a text file: its place among the lines the
        reader kept, the ones it dropped and the header."""
        line = self.header_lines + 1 + parsed_index
        for dropped in self.unparsed_lines:
            if dropped > line:
                break
            line += 1
        return line

    def add(self, parsed_index: int, stage: str, reason: str, ids: Mapping[str, Any], *, text_file: bool) -> None:
        """A row the reader parsed was rejected (a value, or the model on it)."""
        if text_file:
            line: int | None = self.line_of(parsed_index)
            row = line - self.header_lines
        else:
            line, row = None, self.row_offset + parsed_index + 1
        self.rejects.append(Reject(row=row, line=line, stage=stage, reason=reason[:1000], ids=dict(ids)))

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
