"""What the `shardline` commands print: the tables and lines a person reads, and JSON with ``--json``.

Each command returns a :class:`Reply` (its value, and how to show it to a person); ``shardline.oncall.cli``
prints it. Everything printed from the ledger, AWS or Airflow goes through :func:`printable`. rich is imported
only when something is printed, so ``--help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
import sys
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console
    from rich.text import Text

    from shardline.oncall.tune import TuneResult
    from shardline.oncall.values import FileView, ResubmitResult, RunRef, RunRow, RunView
    from shardline.orchestration.step.preview import PreviewResult

from shardline.ledger.states import FileStatus
from shardline.oncall.messages import error_text, no_runs_text
from shardline.planning.naming import resubmit_command
from shardline.report.inputs import reject_where

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _console() -> Console:
    from rich.console import Console

    # soft_wrap: long lines (commands to copy) are never broken in the middle.
    width = shutil.get_terminal_size(fallback=(120, 40)).columns  # honours COLUMNS, also when piped
    # markup and emoji off: what is printed comes from the ledger, AWS and Airflow (file keys, error messages
    # that echo input rows), and a key holding "[link=...]" or ":warning:" must print as it is written, not
    # as a link or an icon. Styles are given as Text objects instead.
    return Console(width=max(100, width), highlight=False, soft_wrap=True, markup=False, emoji=False)


def printable(value: object, *, newlines: bool = False) -> str:
    """``value`` as text that cannot drive the terminal: each non-printable character as its Python escape.

    A file key or error message holding ESC (``\\x1b[2J`` clears the screen, ``\\x1b]8;;...`` makes a link),
    a carriage return or a backspace (which overwrite what was printed), or a bidi override (which reorders
    it) would otherwise let whoever wrote it hide or fake output. Escaping (``\\x1b``, ``\\r``, ``\\u202e``)
    rather than dropping shows the on-call engineer that the text holds such a character, and which.
    ``newlines`` keeps line breaks and tabs, for text that is made of lines (a preview's report).
    """
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    keep = "\n\t" if newlines else ""
    return "".join(ch if ch.isprintable() or ch in keep else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
        if seconds >= 60
        else f"{seconds}s"
    )


def _when(iso: str | None, seconds: bool = True) -> str:
    return iso[: 19 if seconds else 16].replace("T", " ") if iso else "-"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k" if value >= 1e3 else f"{value:.0f}"


STATUS_STYLE = {
    "SUCCEEDED": "green",
    "FAILED": "red",
    "PARTIAL": "yellow",
    "CANCELLED": "magenta",
    "RUNNING": "cyan",
    "PLANNED": "cyan",
    "PENDING": "dim",
}


def _styled(status: str | None) -> Text:
    from rich.text import Text

    return Text(printable(status), style=STATUS_STYLE.get(status or "", ""))


def print_json(payload: Any) -> None:
    def plain(value):
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value

    print(json.dumps([plain(v) for v in payload] if isinstance(payload, list) else plain(payload), indent=2))


def print_lines(lines: list[str]) -> None:
    for line in lines:
        print(printable(line))


@dataclasses.dataclass(frozen=True)
class Reply:
    """What a command answered: ``data`` is what ``--json`` prints, ``show`` prints it for a person, and
    ``code`` is the exit status either way."""

    data: Any
    show: Callable[[], None]
    code: int = EXIT_OK


def lines_reply(lines: list[str], code: int = EXIT_OK) -> Reply:
    """A command that says what it did, a line per thing (``--json``: the lines as a list)."""
    return Reply(lines, functools.partial(print_lines, lines), code)


# --- what each command shows a person ------------------------------------------------------------


def show_runs(rows: list[RunRow], *, pipeline: str | None, dags_folder: Path, airflow_warning: str | None) -> None:
    from rich.text import Text

    console = _console()
    if not rows:
        console.print(printable(no_runs_text(pipeline, dags_folder)))
        return
    # Plain columns: the run name is copied into the next command, so it is never shortened; the message
    # gets what width is left (`shardline status RUN` prints it whole).
    names = [printable(f"{r.pipeline}/{r.run_id}") for r in rows]
    name_width = max(len("RUN"), *(len(n) for n in names))
    status_width = max(len("STATUS"), *(len(printable(r.status)) for r in rows))
    # Airflow's DAG run state beside the ledger's, when the CLI can ask; "!" marks a disagreement.
    with_airflow = any(r.airflow_state for r in rows)
    airflow_width = (
        max(len("AIRFLOW"), *(len(printable(r.airflow_state or "-")) + 2 for r in rows)) if with_airflow else 0
    )
    room = console.width - name_width - status_width - airflow_width - 3 * 16 - 12
    # Too narrow a column (long run names, an 80-column terminal): each message goes on a line of its own instead.
    below = room < MIN_MESSAGE_ROOM
    # A command is never cut: the table names it by a number, and it is printed whole under the table.
    commands: list[str] = []
    line = max(MIN_MESSAGE_ROOM, shutil.get_terminal_size(fallback=(120, 40)).columns - 4)  # a message's own line
    # Under its row a message may take two lines.
    messages = [_commands_apart(r.message or "", commands, 2 * line - 8 if below else room) for r in rows]
    header = f"{'RUN':<{name_width}}  {'STATUS':<{status_width}}  "
    header += f"{'AIRFLOW':<{airflow_width}}  " if with_airflow else ""
    header += f"{'PARTITION':<16}  {'STARTED':<16}  {'FINISHED':<16}  " + ("" if below else "MESSAGE")
    console.print(header.rstrip())
    for name, r, message in zip(names, rows, messages, strict=True):
        status = _styled(r.status)
        status.pad_right(status_width - len(status))
        airflow = ""
        if with_airflow:
            airflow = printable(r.airflow_state or "-") + (" !" if r.disagreement else "")
            airflow = f"  {airflow:<{airflow_width}}"
        console.print(
            Text.assemble(
                f"{name:<{name_width}}  ",
                status,
                airflow,
                (
                    f"  {printable(_when(r.partition, False)):<16}  "
                    f"{printable(_when(r.started_at, False)):<16}  "
                    f"{printable(_when(r.finished_at, False)):<16}  " + ("" if below else printable(message))
                ).rstrip(),
            )
        )
        if below and message:
            for part in textwrap.wrap(printable(message), line):
                console.print(f"    {part}")
    for number, command in enumerate(commands, 1):
        console.print(printable(f"[{number}] {command}"))
    for name, r in zip(names, rows, strict=True):
        if r.disagreement:
            console.print(f"! {name}: {printable(r.disagreement)}")
    if airflow_warning:
        console.print(printable(airflow_warning))


_COMMAND = re.compile(r"`(shardline [^`]+)`")
MIN_MESSAGE_ROOM = 40  # characters: a narrower MESSAGE column goes under each row instead


def _commands_apart(message: str, commands: list[str], room: int) -> str:
    """``message`` for a table cell of ``room`` characters: each command in it (`shardline ...`) taken out into
    ``commands`` and named by its number there ([1]), the rest shortened to fit; the numbers always stay."""
    marks = []

    def take(found: re.Match) -> str:
        commands.append(found[1])
        marks.append(f"[{len(commands)}]")
        return marks[-1]

    text = _COMMAND.sub(take, message)
    if len(text) <= room:
        return text
    shown = textwrap.shorten(text, max(10, room - sum(len(m) + 1 for m in marks)))
    return " ".join([shown, *(m for m in marks if m not in shown)])


STATUS_COLUMNS = (
    "STEP", "STATUS", "ATTEMPT", "JOB", "FILES", "OK", "FAILED", "RUNNING", "PENDING", "ROWS OUT", "REJECTED",
    "ROWS/S", "ETA",
)  # fmt: skip


def show_status(view: RunView, *, airflow_warning: str | None) -> None:
    from rich.table import Table
    from rich.text import Text

    console = _console()
    console.print(
        Text.assemble(
            "run ",
            (printable(view.ref), "bold"),
            ": ",
            _styled(view.status),
            printable(
                f", started {_when(view.started_at)}"
                + (f", finished {_when(view.finished_at)}" if view.finished_at else "")
            ),
        )
    )
    if view.message:
        console.print(f"  {printable(view.message)}")
    if view.airflow_state:
        console.print(printable(f"  Airflow: DAG run {view.airflow_state}"))
    if view.disagreement:
        console.print(printable(f"  ! {view.disagreement}"))
    if airflow_warning:
        console.print(f"  {printable(airflow_warning)}")
    table = Table()
    for column in STATUS_COLUMNS:
        table.add_column(column, justify="right" if column not in ("STEP", "STATUS", "JOB") else "left")
    for s in view.steps:
        table.add_row(
            printable(s.name),
            _styled(s.status),
            str(s.attempt),
            printable(s.job_status or "-"),
            str(s.files),
            str(s.succeeded),
            str(s.failed),
            str(s.running),
            str(s.pending),
            f"{s.rows_out:,}",
            f"{s.rows_rejected:,}",
            _rate(s.rows_per_second),
            _duration(s.eta_seconds),
        )
    console.print(table)
    for s in view.steps:
        if s.job_name:
            console.print(printable(f"step {s.name}, attempt {s.attempt}: job {s.job_name}"))
    for s in view.steps:
        # An ended step's message says why it ended; a step still going has one only while it waits (the note a
        # refused or held submit leaves: what it waits for). A success needs no words.
        if s.message and s.status != "SUCCEEDED":
            console.print(printable(f"step {s.name}: {s.message}"))
        if s.table:
            console.print(printable(f"step {s.name}: {table_words(s.table)}"))
        if s.failed:
            console.print(
                printable(f"  see the {s.failed} failed file(s) and why: shardline failed {view.ref} --step {s.name}")
            )
        if s.rows_rejected:
            console.print(
                printable(
                    f"  step {s.name}: rows in {s.rows_in:,} = rows out {s.rows_out:,} + rows rejected "
                    f"{s.rows_rejected:,}; see them and why: shardline failed {view.ref} --step {s.name}"
                )
            )


def table_words(commit: dict) -> str:
    """A step's table commit in one line: the table, the partition, the snapshot and its rows."""
    where = "/".join(f"{k}={v}" for k, v in (commit.get("partition") or {}).items())
    said = "already held its outputs" if commit.get("already") else f"{commit.get('rows_added', 0):,} rows committed"
    return f"table {commit.get('table')} partition {where}: {said} in snapshot {commit.get('snapshot_id')}"


def show_failed(files: list[FileView], *, ref: RunRef, step: str | None, note: str | None = None) -> None:
    """``note``: what is missing when no file is left to resubmit and yet the run ended badly, with the command."""
    from rich.table import Table
    from rich.text import Text

    console = _console()
    rejected = [f for f in files if f.status == FileStatus.SUCCEEDED]
    files = [f for f in files if f.status != FileStatus.SUCCEEDED]
    if rejected:
        _show_rejects(console, rejected, ref)
    if note:
        console.print(printable(note))
    elif not files and not rejected:
        console.print(
            printable(
                f"no failed or unfinished files in {ref}" + (f", step {step}" if step else "") + ": nothing to resubmit"
            )
        )
    if not files:
        return
    table = Table(title=Text(printable(f"files of {ref} that did not succeed")))
    for column in ("STEP", "FILE", "STATUS", "ATTEMPT", "HOST", "ERROR"):
        table.add_column(column, overflow="fold")
    for f in files:
        error = error_text(f.error_class, f.error_message)
        table.add_row(
            printable(f.step),
            printable(f.input_key),
            _styled(f.status),
            str(f.attempt),
            printable(f.host or "-"),
            printable(textwrap.shorten(error, 160)),
        )
    console.print(table)
    for name in sorted({f.step for f in files}):
        console.print(printable(f"after fixing the cause: {resubmit_command(ref.pipeline, ref.run_id, name)}"))


def _show_rejects(console, files: list[FileView], ref: RunRef) -> None:
    """Files that succeeded with rows rejected (tolerance.rows): each rejected row, with where and why."""
    from rich.table import Table
    from rich.text import Text

    total = sum(f.rows_rejected for f in files)
    table = Table(title=Text(printable(f"{total:,} row(s) of {ref} rejected (tolerance.rows)")))
    for column in ("STEP", "FILE", "WHERE", "WHY"):
        table.add_column(column, overflow="fold")
    for f in files:
        for row in f.rejects:
            where = reject_where(row)
            table.add_row(printable(f.step), printable(f.input_key), printable(where), printable(row.get("reason", "")))
        if f.rows_rejected > len(f.rejects) or not f.rejects:
            shown = f"{len(f.rejects)} of {f.rows_rejected:,} shown" if f.rejects else f"{f.rows_rejected:,} rejected"
            table.add_row(printable(f.step), printable(f.input_key), shown, printable(f.error_message or ""))
    console.print(table)
    for f in files:
        if f.rejects_key:
            console.print(printable(f"{f.input_key}: every rejected row is listed in {f.rejects_key}"))


def show_resubmit(result: ResubmitResult, *, dry_run: bool) -> None:
    console = _console()
    plan = result.plan
    if plan.files:
        console.print(printable(f"{len(plan.files)} file(s) of step {plan.step} selected ({plan.reason}):"))
    elif result.action == "take_up":  # with no file to run, "nothing" says why in the line below
        console.print(printable(f"no file of step {plan.step} needs to run again, so nothing is submitted"))
    for key in plan.files[:20]:
        console.print(f"  {printable(key)}")
    if len(plan.files) > 20:
        console.print(f"  ... and {len(plan.files) - 20} more (--json lists them all)")
    if result.job_name and not dry_run and result.waiting:
        console.print(printable(f"planned attempt {result.attempt}; its {result.waiting}"))
    elif result.job_name and not dry_run:
        console.print(printable(f"submitted attempt {result.attempt} as job {result.job_name}"))
    elif result.job_name:
        console.print(printable(f"would submit attempt {result.attempt} as job {result.job_name}"))
    if not result.complete:
        print(printable(f"shardline resubmit: {result.airflow}"), file=sys.stderr)
        return
    console.print(printable(result.airflow))
    if dry_run and result.action != "nothing":
        console.print("to do it, run the same command without --dry-run")
    if (result.job_name or result.action == "take_up") and not dry_run:
        console.print(printable(f"follow it with: shardline status {plan.ref}"))


def resubmit_reply(result: ResubmitResult, *, dry_run: bool) -> Reply:
    """A resubmission left half done exits 1, whichever way it is printed."""
    return Reply(
        result, functools.partial(show_resubmit, result, dry_run=dry_run), EXIT_OK if result.complete else EXIT_ERROR
    )


def preview_reply(result: PreviewResult) -> Reply:
    return _rendered_reply(result)


def tune_reply(result: TuneResult) -> Reply:
    return _rendered_reply(result)


def _rendered_reply(result: PreviewResult | TuneResult) -> Reply:
    """A worker tool's reply: its own report, rendered; as JSON, every field but the rendered text and the worker's
    log. The sample's values are the input's own: printed escaped, line breaks kept."""
    data = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name not in ("text", "log")}
    return Reply(
        data,
        functools.partial(print, printable(result.render(), newlines=True), end=""),
        EXIT_OK if result.ok else EXIT_ERROR,
    )


# --- a run's output checks -----------------------------------------------------------------------------------


def checks_reply(view, ways_forward: str) -> Reply:
    """``shardline checks``: every check of each step, its value, bound and the earlier partitions' values. Exits 1
    while a blocking check holds outputs back (0 once approved, or when none does)."""
    data = {
        "run": view.ref,
        "checks": [
            {"step": row.step, **row.result.model_dump(), "earlier": [list(e) for e in row.earlier]}
            for row in view.rows
        ],
        "approvals": view.approvals,
        "without_report": view.missing,
    }
    held = [row for row in view.blocked if row.step not in view.approvals]
    lines = []
    for step in dict.fromkeys(row.step for row in view.rows):
        rows = [row for row in view.rows if row.step == step]
        blocked = [row for row in held if row.step == step]
        state = f"held back by {len(blocked)} blocking check(s)" if blocked else "nothing held back"
        if step in view.approvals:
            approval = view.approvals[step]
            state = f"approved by {approval.get('by')} at {approval.get('at')}: {approval.get('reason')!r}"
        lines.append(f"step {step}: {state}")
        for row in rows:
            result = row.result
            lines.append(f"  {result.verdict.upper():<4}  {result.level:<8}  {result.line()}")
            if row.earlier:
                lines.append("        earlier: " + ", ".join(f"{run} {shown}" for run, shown in row.earlier))
    lines += [f"step {step}: no run report yet (the step has not ended)" for step in view.missing]
    if held:
        lines.append(ways_forward)
    return Reply(data, functools.partial(print_lines, lines), EXIT_ERROR if held else EXIT_OK)


def approve_reply(result) -> Reply:
    """``shardline approve``: what was recorded and what the DAG run does now; half done exits 1."""
    approval = result.approval
    lines = [
        f"step outputs {approval.words()} (attempt {approval.attempt})",
        f"held back by: {approval.held_back.split('; report:')[0]}",
        result.said,
    ]
    data = {"approval": dataclasses.asdict(approval), "said": result.said, "complete": result.complete}
    return Reply(data, functools.partial(print_lines, lines), EXIT_OK if result.complete else EXIT_ERROR)
