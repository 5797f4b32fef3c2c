"""``shardline``: the on-call command line. See ``shardline --help``.

It reads the same ledger table and backends as the pipelines (found from the specs under
the DAGs folder), so it works against real AWS and the embedded stack alike: boto3's
usual settings (profile, region, ``AWS_ENDPOINT_URL``) decide where.

Each command returns a :class:`Reply`: its value, and how to show that value to a person. One place,
:func:`_command`, prints it (as JSON with ``--json``) and turns an on-call error into its message and
exit code. Start-up stays fast: the AWS client libraries, the service and rich are imported only
when a command runs, never for ``--help``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import shutil
import signal
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shardline import __version__

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from shardline.oncall.preview import PreviewResult
    from shardline.oncall.service import OnCall
    from shardline.oncall.tune import TuneResult
    from shardline.oncall.views import FileView, ResubmitResult, RunRef, RunRow, RunView

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
ENV_DAGS_FOLDER = "SHARDLINE_DAGS_FOLDER"

EPILOG = """\
environment:
  SHARDLINE_DAGS_FOLDER        folder with pipelines/*.yaml (default: $AIRFLOW__CORE__DAGS_FOLDER, else ./dags)
  AWS_PROFILE, AWS_REGION      where the ledger table and jobs live (AWS_ENDPOINT_URL for a local stack)
  SHARDLINE_AIRFLOW_URL        Airflow API server, e.g. http://localhost:8080 (resubmit and cancel need it)
  SHARDLINE_AIRFLOW_TOKEN, or SHARDLINE_AIRFLOW_USERNAME / SHARDLINE_AIRFLOW_PASSWORD
  (or once: `shardline login http://localhost:8080`, which keeps the URL and a token for later commands)

on-call flow:
  shardline runs --pipeline tabular_scoring_hourly        # find the red run
  shardline status tabular_scoring_hourly/RUN_ID          # which step, how many files
  shardline failed tabular_scoring_hourly/RUN_ID          # which files, and why
  shardline report tabular_scoring_hourly/RUN_ID --open   # throughput, cost, drift: the run report
  # fix the cause (the input, the model), then:
  shardline resubmit tabular_scoring_hourly/RUN_ID --step score --all-failed

before launch:
  shardline preview tabular_scoring_hourly --rows 20     # the model on a sample, with the job's settings
  shardline tune tabular_scoring_hourly --rows 200000   # rows/s per workers x threads and batch rows, here
"""


def default_dags_folder() -> Path:
    for candidate in (os.environ.get(ENV_DAGS_FOLDER), os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")):
        if candidate:
            return Path(candidate)
    return Path.cwd() / "dags"


def default_state_dir() -> Path:
    """Where `shardline local` keeps the stack's pid, URL and log: one place per user, so `down` and
    `status` find the stack from any directory ($SHARDLINE_STATE_DIR, else $XDG_STATE_HOME/shardline/local,
    else ~/.local/state/shardline/local)."""
    if os.environ.get("SHARDLINE_STATE_DIR"):
        return Path(os.environ["SHARDLINE_STATE_DIR"])
    base = Path(os.environ["XDG_STATE_HOME"]) if os.environ.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    return base / "shardline" / "local"


# --- printing ----------------------------------------------------------------------------------


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
    rather than dropping shows the operator that the text holds such a character, and which.
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


def _print_json(payload: Any) -> None:
    def plain(value):
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value

    print(json.dumps([plain(v) for v in payload] if isinstance(payload, list) else plain(payload), indent=2))


def _print_lines(lines: list[str]) -> None:
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
    return Reply(lines, functools.partial(_print_lines, lines), code)


# --- messages (pure: tests/oncall/test_messages.py renders each) -------------------------------


def no_runs_text(pipeline: str | None, dags_folder: Path) -> str:
    if pipeline:
        return f"no runs recorded yet for pipeline {pipeline} in its ledger table"
    return f"no runs recorded yet in the ledger tables of the pipelines under {dags_folder}"


def error_text(error_class: str | None, error_message: str | None) -> str:
    """A file's error in one line: class and message, either of which may be missing."""
    return ": ".join(x for x in (error_class, error_message) if x) or "-"


def _pipeline_step(options, pipeline: str, step: str | None):
    """The pipeline's spec and the named step (default: its first); NotFound naming what exists otherwise."""
    from shardline.oncall.errors import NotFound
    from shardline.oncall.service import load_specs

    specs = load_specs(options.dags_folder)
    if pipeline not in specs:
        raise NotFound(preview_no_pipeline(pipeline, options.dags_folder, sorted(specs)))
    names = [s.name for s in specs[pipeline].steps]
    if step and step not in names:
        raise NotFound(preview_no_step(pipeline, step, names))
    return specs[pipeline], step or names[0]


def preview_no_pipeline(pipeline: str, dags_folder: Path, known: list[str]) -> str:
    return (
        f"no pipeline {pipeline!r} in {dags_folder}/pipelines (known: {', '.join(known) or 'none'}); check the "
        "name, or pass --dags-folder with the folder that holds its spec"
    )


def preview_no_step(pipeline: str, step: str, names: list[str]) -> str:
    return f"pipeline {pipeline} has no step {step!r} (steps: {', '.join(names)}); pass one of them as --step"


def aws_error_text(command: str, err: str, env, dags_folder: Path) -> str:
    """AWS refused or could not be reached: where the CLI looked, and what to check."""
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:
        where = (
            f"the endpoint {endpoint} (AWS_ENDPOINT_URL; for the embedded stack, `shardline local status` "
            "says whether it is up)"
        )
    else:
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        where = f"AWS (profile {env.get('AWS_PROFILE') or 'default'}, " + (
            f"region {region})" if region else "the profile's region)"
        )
    return (
        f"shardline {command}: AWS refused or could not be reached: {err}\n"
        f"  it talked to {where}; check AWS_PROFILE / AWS_REGION / AWS_ENDPOINT_URL and the ledger table's name "
        f"in the pipeline specs under {dags_folder}"
    )


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
    room = max(20, console.width - name_width - status_width - airflow_width - 3 * 16 - 12)
    header = f"{'RUN':<{name_width}}  {'STATUS':<{status_width}}  "
    header += f"{'AIRFLOW':<{airflow_width}}  " if with_airflow else ""
    console.print(header + f"{'PARTITION':<16}  {'STARTED':<16}  {'FINISHED':<16}  MESSAGE")
    for name, r in zip(names, rows, strict=True):
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
                f"  {printable(_when(r.partition, False)):<16}  "
                f"{printable(_when(r.started_at, False)):<16}  "
                f"{printable(_when(r.finished_at, False)):<16}  "
                f"{printable(textwrap.shorten(r.message or '', room))}",
            )
        )
    for name, r in zip(names, rows, strict=True):
        if r.disagreement:
            console.print(f"! {name}: {printable(r.disagreement)}")
    if airflow_warning:
        console.print(printable(airflow_warning))


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
    for column in (
        "STEP",
        "STATUS",
        "ATTEMPT",
        "JOB",
        "FILES",
        "OK",
        "FAILED",
        "RUNNING",
        "PENDING",
        "ROWS OUT",
        "ROWS/S",
        "ETA",
    ):
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
            _rate(s.rows_per_second),
            _duration(s.eta_seconds),
        )
    console.print(table)
    for s in view.steps:
        if s.job_name:
            console.print(printable(f"step {s.name}, attempt {s.attempt}: job {s.job_name}"))
    for s in view.steps:
        if s.message and s.status in ("FAILED", "PARTIAL", "CANCELLED"):
            console.print(printable(f"step {s.name}: {s.message}"))
        if s.failed:
            console.print(
                printable(f"  see the {s.failed} failed file(s) and why: shardline failed {view.ref} --step {s.name}")
            )


def show_failed(files: list[FileView], *, ref: RunRef, step: str | None) -> None:
    from rich.table import Table
    from rich.text import Text

    from shardline.planning.naming import resubmit_command

    console = _console()
    if not files:
        console.print(
            printable(
                f"no failed or unfinished files in {ref}" + (f", step {step}" if step else "") + ": nothing to resubmit"
            )
        )
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
    if result.job_name and not dry_run:
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
    data = {
        "step": result.step,
        "model_uri": result.model_uri,
        "sample_uri": result.sample_uri,
        "exit_code": result.exit_code,
        "report": result.report,
    }
    # The sample's values are the input's own: printed escaped, line breaks kept.
    return Reply(
        data,
        functools.partial(print, printable(result.render(), newlines=True), end=""),
        EXIT_OK if result.ok else EXIT_ERROR,
    )


def tune_reply(result: TuneResult) -> Reply:
    data = {
        "step": result.step,
        "model_uri": result.model_uri,
        "input_uri": result.input_uri,
        "sample": result.sample_keys,
        "exit_code": result.exit_code,
        "plot": result.plot,
        "figures": result.figures,
    }
    return Reply(
        data,
        functools.partial(print, printable(result.render(), newlines=True), end=""),
        EXIT_OK if result.ok else EXIT_ERROR,
    )


# --- the command line ----------------------------------------------------------------------------


class _Command(click.Command):
    """A command whose usage line reads ``usage: shardline COMMAND ...``, as the README and scripts quote it."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, " ".join(self.collect_usage_pieces(ctx)), prefix="usage: ")


class _Group(click.Group):
    command_class = _Command

    format_usage = _Command.format_usage

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the on-call flow's order, not the alphabet's

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.epilog:  # as written: its columns line up
            formatter.write_paragraph()
            formatter.write(self.epilog)


class _ShownDefault(click.Option):
    """An option whose help shows its default as it resolves now, from the environment."""

    def get_help_extra(self, ctx: click.Context):
        extra = super().get_help_extra(ctx)
        extra["default"] = str(self.get_default(ctx, call=True))
        return extra


class _IsoDate(click.ParamType):
    name = "DATE"

    def convert(self, value, param, ctx) -> dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            self.fail(f"expected an ISO date or time like 2026-11-22T10:00, got {value!r}", param, ctx)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


@dataclasses.dataclass(frozen=True)
class _Globals:
    dags_folder: Path
    airflow_url: str | None
    airflow_token: str | None

    def oncall(self) -> OnCall:
        """The service over the specs of the DAGs folder, with Airflow when the CLI can find it."""
        from shardline.oncall.airflow_client import find_settings
        from shardline.oncall.service import OnCall

        settings = find_settings(self.airflow_url, self.airflow_token)
        return OnCall.from_folder(self.dags_folder, airflow=settings.client() if settings else None)


@click.group(
    cls=_Group,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="On-call commands for Shardline pipelines: see runs, find what failed and why, resubmit exactly "
    "the failed files, cancel a run, and run the embedded AWS stack.",
)
@click.version_option(__version__, "--version", prog_name="shardline", message="%(prog)s %(version)s")
@click.option(
    "--dags-folder",
    cls=_ShownDefault,
    type=click.Path(path_type=Path),
    default=default_dags_folder,
    show_default=True,
    help="folder holding pipelines/*.yaml",
)
@click.option(
    "--airflow-url", help="Airflow's API server (default: $SHARDLINE_AIRFLOW_URL, else the URL `shardline login` kept)"
)
@click.option(
    "--airflow-token",
    help="a bearer token for it (default: $SHARDLINE_AIRFLOW_TOKEN, else the one `shardline login` kept)",
)
@click.pass_context
def shardline(ctx: click.Context, dags_folder: Path, airflow_url: str | None, airflow_token: str | None) -> None:
    ctx.obj = _Globals(dags_folder, airflow_url, airflow_token)


def _command(name: str, short_help: str, description: str = "", *, with_json: bool = True):
    """Register a command whose body returns a :class:`Reply`: the one place that prints it (as JSON with
    ``--json``) and turns an error into ``shardline NAME: message`` on stderr and its exit code."""

    def register(body: Callable[..., Reply]) -> click.Command:
        @functools.wraps(body)
        def run(*args, as_json: bool = False, **kwargs) -> int:
            from botocore.exceptions import BotoCoreError, ClientError
            from pynamodb.exceptions import PynamoDBException

            from shardline.local.embedded_aws import EmbeddedAwsError
            from shardline.oncall.airflow_client import AirflowApiError
            from shardline.oncall.errors import OnCallError
            from shardline.oncall.preview import PreviewError

            try:
                reply = body(*args, **kwargs)
            except (OnCallError, AirflowApiError, EmbeddedAwsError, PreviewError) as err:
                print(f"shardline {name}: {printable(err)}", file=sys.stderr)
                return getattr(err, "exit_code", EXIT_ERROR)  # a malformed request exits 2, as a usage error does
            except (BotoCoreError, ClientError, PynamoDBException) as err:
                dags_folder = click.get_current_context().find_object(_Globals).dags_folder
                print(aws_error_text(name, printable(err), os.environ, dags_folder), file=sys.stderr)
                return EXIT_ERROR
            if as_json:
                _print_json(reply.data)
            else:
                reply.show()
            return reply.code

        if with_json:
            run = click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")(run)
        return shardline.command(name, short_help=short_help, help=description or short_help)(run)

    return register


_run_argument = click.argument("run", metavar="RUN")


@_command("runs", "list recent runs, newest first")
@click.option("--pipeline", help="only this pipeline")
@click.option("--limit", type=int, default=20, show_default=True, help="how many")
@click.pass_obj
def runs(options: _Globals, pipeline: str | None, limit: int) -> Reply:
    oncall = options.oncall()
    rows = oncall.runs(pipeline, limit)
    return Reply(
        rows,
        functools.partial(
            show_runs, rows, pipeline=pipeline, dags_folder=options.dags_folder, airflow_warning=oncall.airflow_warning
        ),
    )


@_command(
    "status",
    "a run's steps: attempts, file counts, rows/s and ETA",
    "A run's steps: status, attempt and job, file counts, rows out, rows/s and ETA of the running attempt. "
    "RUN is PIPELINE/RUN_ID as `shardline runs` prints it.",
)
@_run_argument
@click.pass_obj
def status(options: _Globals, run: str) -> Reply:
    from shardline.oncall.views import RunRef

    oncall = options.oncall()
    view = oncall.status(RunRef.parse(run))
    return Reply(view, functools.partial(show_status, view, airflow_warning=oncall.airflow_warning))


@_command("failed", "the files that did not succeed: error class, message, attempts")
@_run_argument
@click.option("--step", help="only this step")
@click.pass_obj
def failed(options: _Globals, run: str, step: str | None) -> Reply:
    from shardline.oncall.views import RunRef

    oncall = options.oncall()
    ref = RunRef.parse(run)
    files = oncall.failed(ref, step)
    return Reply(files, functools.partial(show_failed, files, ref=ref, step=step))


@_command(
    "report",
    "fetch a step's run report (HTML) to a local file and print its path",
    "Fetch the run report of a step (throughput per shard, cost per 1M predictions, drift against the previous "
    "successful run, rows in against rows out), which is written beside the step's outputs when the step ends, "
    "to .shardline/reports/PIPELINE/RUN/STEP/report.html under the current directory (or --out), and print "
    "its path. Without --step: every step of the run that has a report. --json prints report.json, the same "
    "data (one object with --step, else a list).",
)
@_run_argument
@click.option("--step", help="only this step (default: every step of the run that has a report)")
@click.option("--open", "open_page", is_flag=True, help="open it in the web browser")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="write it to this file (one step)")
@click.pass_obj
def report(options: _Globals, run: str, step: str | None, open_page: bool, out: Path | None) -> Reply:
    import webbrowser

    from shardline.oncall.views import RunRef

    # --json is the wrapper's option: read here only to fetch report.json as well.
    with_json = bool(click.get_current_context().params.get("as_json"))
    saved = options.oncall().save_reports(RunRef.parse(run), step, root=Path.cwd(), out=out, with_json=with_json)
    if open_page:
        for page in saved:
            if not webbrowser.open(Path(page.path).resolve().as_uri()):
                print(
                    printable(f"shardline report: no web browser to open {page.path} with; open the file yourself"),
                    file=sys.stderr,
                )
    data = [page.report for page in saved]
    return Reply(data[0] if step else data, functools.partial(_print_lines, [page.path for page in saved]))


SELECTIONS = ("--all-failed", "--shard", "--file")


@_command(
    "resubmit",
    "start a new attempt with only the chosen files",
    "Start a new attempt of a step with only the chosen files (never ones that succeeded). When the DAG run "
    "has already finished, its watch task is cleared through Airflow's REST API so the run follows the new "
    "attempt and turns green when it succeeds. Running it twice is safe: a second call finds the attempt "
    "running, or nothing left to resubmit.",
)
@_run_argument
@click.option("--step", required=True, help="the step to resubmit")
@click.option("--all-failed", is_flag=True, help="every file of the step that has not succeeded")
@click.option("--shard", metavar="HOST", help="the unfinished or failed files of one instance (algo-N)")
@click.option(
    "--file",
    "keys",
    metavar="KEY",
    multiple=True,
    help="one file (s3:// URI or key relative to the input prefix); repeatable",
)
@click.option("--dry-run", is_flag=True, help="show what would be resubmitted; change nothing")
@click.option("--force", is_flag=True, help="resubmit even though the step's sensor has not ended")
@click.option(
    "--ledger-only",
    is_flag=True,
    help="leave Airflow out: for a step not run by an Airflow DAG (no DAG run follows the attempt)",
)
@click.pass_obj
def resubmit(
    options: _Globals,
    run: str,
    step: str,
    all_failed: bool,
    shard: str | None,
    keys: tuple[str, ...],
    dry_run: bool,
    force: bool,
    ledger_only: bool,
) -> Reply:
    # Exactly one of the three, as a usage error (exit 2) before anything is read.
    given = [flag for flag, value in zip(SELECTIONS, (all_failed, shard, keys), strict=True) if value]
    if not given:
        raise click.UsageError(f"one of the arguments {' '.join(SELECTIONS)} is required")
    if len(given) > 1:
        raise click.UsageError(f"argument {given[1]}: not allowed with argument {given[0]}")
    from shardline.oncall.views import RunRef

    oncall = options.oncall()
    result = oncall.resubmit(
        RunRef.parse(run),
        step,
        shard=shard,
        files=keys,
        all_failed=all_failed,
        dry_run=dry_run,
        force=force,
        ledger_only=ledger_only,
    )
    return resubmit_reply(result, dry_run=dry_run)


@_command(
    "login",
    "keep Airflow's URL and a token for later commands",
    "Log in to Airflow's API server once: exchange a user and password for a token (or take one with "
    "--token-stdin), check it, and keep the URL and token in ~/.config/shardline/airflow.json (mode 0600; "
    "$XDG_CONFIG_HOME or $SHARDLINE_AIRFLOW_CONFIG moves it). resubmit and cancel then find Airflow without "
    "flags or environment. Secrets are read from standard input or a prompt, never from the command line, "
    "where ps and shell history would keep them.",
    with_json=False,
)
@click.argument("url", metavar="URL")
@click.option("--username", help="the Airflow user (default: ask)")
@click.option("--password-stdin", is_flag=True, help="read the password from standard input")
@click.option(
    "--token-stdin",
    is_flag=True,
    help="read a token you already have from standard input, instead of a user and password",
)
@click.option("--token", hidden=True, help="refused: a token on the command line is visible to other users")
def login(url: str, username: str | None, password_stdin: bool, token_stdin: bool, token: str | None) -> Reply:
    import getpass

    from shardline.oncall.airflow_client import AirflowClient, save_login

    if token is not None:
        raise click.BadParameter(
            "a token on the command line is visible in ps and kept in shell history: pipe it "
            "to `shardline login URL --token-stdin` instead",
            param_hint="--token",
        )
    warning = plain_http_warning(url)
    if warning:
        click.echo(warning, err=True)
    client = AirflowClient(url, source=url)
    if token_stdin:
        token = sys.stdin.readline().strip()
        if not token:
            raise click.BadParameter("no token on standard input", param_hint="--token-stdin")
        client = AirflowClient(url, token=token, source="--token-stdin")
        who = "with the given token"
    else:
        username = username or input("Airflow user: ").strip()
        password = (
            sys.stdin.readline().rstrip("\n") if password_stdin else getpass.getpass(f"password for {username}: ")
        )
        token, who = client.login(username, password), f"as {username}"
    client.dags_page()  # the token works: it reads at least the DAG list
    path = save_login(url, token)
    return lines_reply(
        [
            f"logged in to {client.base_url} {who}; the URL and token are kept in {path} (mode 0600) "
            "for later commands. Airflow's tokens expire ([api_auth] jwt_expiration_time): run "
            f"`shardline login {client.base_url}` again when a command says the token was refused."
        ]
    )


def plain_http_warning(url: str) -> str | None:
    """A warning for plain http:// to a host other than this machine: the password and the token would cross
    the network unencrypted. None for https:// and for loopback (the local stack)."""
    import ipaddress
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme.lower() != "http":
        return None
    host = (parts.hostname or "").lower()
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost" or host.endswith(".localhost")
    if loopback:
        return None
    return (
        f"WARNING: {url} is plain http://: the password and the token cross the network to {host} unencrypted. "
        "Use https:// for an Airflow that is not on this machine"
    )


@_command(
    "rerun",
    "run a finished DAG run's partition again: its failed tasks, or all of it with a new conf",
    "Run a finished DAG run's partition again. Without --conf, its failed tasks and everything after them "
    "are cleared, so the same run plans again with its own conf: after input that landed late, or a model "
    "uploaded since. With --conf (a JSON object of the trigger form's Params), the run is deleted and "
    "triggered again at the same logical date and data interval with that conf, since a run's conf cannot "
    "change and Airflow refuses a second run at one logical date. The conf is checked first.",
)
@_run_argument
@click.option(
    "--conf", "conf_json", metavar="JSON", help='a new conf for the partition, e.g. \'{"model_version": "v2"}\''
)
@click.option("--dry-run", is_flag=True, help="say what would be done; change nothing")
@click.pass_obj
def rerun(options: _Globals, run: str, conf_json: str | None, dry_run: bool) -> Reply:
    from shardline.oncall.views import RunRef

    conf = None
    if conf_json is not None:
        try:
            conf = json.loads(conf_json)
        except ValueError as err:
            raise click.BadParameter(f"not JSON ({err}): give an object such as '{{}}'", param_hint="--conf") from err
        if not isinstance(conf, dict):
            raise click.BadParameter("give a JSON object, such as '{}'", param_hint="--conf")
    return lines_reply(options.oncall().rerun(RunRef.parse(run), conf, dry_run=dry_run))


@_command("cancel", "stop a run's jobs, mark it CANCELLED, fail its DAG run")
@_run_argument
@click.option("--reason", default="cancelled by an operator", show_default=True, help="recorded on the run")
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@click.pass_obj
def cancel(options: _Globals, run: str, reason: str, yes: bool) -> Reply:
    from shardline.oncall.errors import BadRequest
    from shardline.oncall.views import RunRef

    oncall = options.oncall()
    ref = RunRef.parse(run)
    if not yes:
        if not sys.stdin.isatty():
            raise BadRequest(
                f"refusing to cancel {ref} without a terminal to confirm on; pass --yes to cancel it anyway"
            )
        answer = input(printable(f"cancel {ref}: stop its jobs, mark it CANCELLED and fail its DAG run? [y/N] "))
        if answer.strip().lower() not in ("y", "yes"):
            return lines_reply(["not cancelled: nothing was changed"], EXIT_ERROR)
    return lines_reply(oncall.cancel(ref, reason))


@_command(
    "preview",
    "run a step's model on the first rows of one input, locally, before launch",
    "Run a step's model, with exactly the settings its job would use, on the first rows of one input file, "
    "here and now: print the passthrough columns, the features as the model gets them, the predictions and "
    "a summary, and warn on signs of a wrong setup (constant or NaN predictions, lines the script printed, "
    "columns dropped, a script that breaks when batched). Writes nothing.",
)
@click.argument("pipeline", metavar="PIPELINE")
@click.option("--step", help="the step (default: the first)")
@click.option("--rows", type=int, default=20, show_default=True, help="rows of the sample")
@click.option(
    "--input", "input_uri", metavar="URI", help="an s3:// file or prefix to sample (default: the step's input)"
)
@click.option("--model-uri", metavar="URI", help="the model artifact (default: the step's model.uri)")
@click.option("--model-version", help="the model_version Param (default: the spec's model.version)")
@click.option(
    "--logical-date",
    type=_IsoDate(),
    default=None,
    help="the run's logical date for the spec's templates, e.g. 2026-11-22T10:00 (default: now, UTC)",
)
@click.pass_obj
def preview(
    options: _Globals,
    pipeline: str,
    step: str | None,
    rows: int,
    input_uri: str | None,
    model_uri: str | None,
    model_version: str | None,
    logical_date: dt.datetime | None,
) -> Reply:
    """Run a step's model on a sample of its input, locally, with the job's own settings."""
    from shardline.oncall.preview import preview_step, step_uris
    from shardline.orchestration import services

    spec, name = _pipeline_step(options, pipeline, step)
    chosen = spec.step(name)
    params = {"model_version": model_version} if model_version else None
    spec_model_uri, spec_input_uri = step_uris(spec, chosen, logical_date or dt.datetime.now(dt.UTC), params)
    result = preview_step(
        spec,
        chosen.name,
        services.s3_client(spec),
        model_uri=model_uri or spec_model_uri,
        input_uri=input_uri or spec_input_uri,
        rows=rows,
        model_version=model_version,
    )
    return preview_reply(result)


@_command(
    "tune",
    "measure this machine's rows/s per workers x threads and batch rows on a step's inputs",
    "Auto-tune a step, here: fetch its model (verified against the spec's pinned sha256, as the job does) and "
    "the first input files up to --rows rows (the latest run's input prefix from the ledger, or "
    "--input-prefix), then run the worker on them repeatedly (`python -m shardline.worker --tune`): every "
    "split of the cores into workers x threads, then rows per batch doubling until throughput falls (GPU "
    "batch rows on a GPU). Prints rows/s per setting with the spread of the runs, the spec snippet to paste, "
    "and where the plot and the figures went. Figures hold for the machine it runs on: run it on the "
    "instance type the step uses.",
)
@click.argument("pipeline", metavar="PIPELINE")
@click.option("--step", help="the step (default: the first)")
@click.option(
    "--input-prefix",
    metavar="S3URI",
    help="an s3:// prefix of inputs to sample (default: the input prefix of the latest run that planned the step)",
)
@click.option("--rows", type=click.IntRange(min=1), default=200_000, show_default=True, help="rows of the sample")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="where tune.png and tune.json go (default: ./shardline-tune/PIPELINE/STEP)",
)
@click.option(
    "--repeat", type=click.IntRange(min=1), default=2, show_default=True, help="runs of each setting, to show the noise"
)
@click.option(
    "--max-batch-rows",
    type=click.IntRange(min=1),
    default=1 << 20,
    show_default=True,
    help="the largest rows per batch tried",
)
@click.pass_obj
def tune(
    options: _Globals,
    pipeline: str,
    step: str | None,
    input_prefix: str | None,
    rows: int,
    out: Path | None,
    repeat: int,
    max_batch_rows: int,
) -> Reply:
    """Sweep a step's worker settings on a sample of its inputs, locally, and say what to put in the spec."""
    from shardline.oncall.tune import tune_step
    from shardline.orchestration import services

    spec, chosen = _pipeline_step(options, pipeline, step)
    result = tune_step(
        spec,
        chosen,
        services.s3_client(spec),
        input_prefix=input_prefix,
        rows=rows,
        out_dir=out or Path.cwd() / "shardline-tune" / pipeline / chosen,
        extra_args=("--tune-repeat", str(repeat), "--tune-max-batch-rows", str(max_batch_rows)),
        echo=lambda line: print(printable(line), file=sys.stderr),
    )
    return tune_reply(result)


# --- the embedded stack ------------------------------------------------------------------------


def _stack_file(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def _is_moto(pid: int) -> bool:
    """Whether ``pid`` is still the moto_server we started (a pid can be reused after a reboot)."""
    import psutil

    from shardline.local.embedded_aws import is_moto_command

    try:
        return is_moto_command(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _exports(url: str) -> list[str]:
    from shardline.local import embedded_aws

    return [
        "point this shell at it with:",
        *(f"  export {name}={value}" for name, value in embedded_aws.env_for(url).items()),
    ]


def _create_resources(dags_folder: Path) -> list[str]:
    """The buckets and ledger tables every pipeline spec refers to."""
    from shardline.local.provision import apply, make_plan

    return apply(make_plan(dags_folder / "pipelines"))


@_command(
    "local",
    "start or stop the embedded AWS stack (moto_server) for local runs",
    "Start, stop or check the embedded AWS endpoint (moto_server on loopback), with the buckets and ledger "
    "tables the pipeline specs name.",
    with_json=False,
)
@click.argument("action", type=click.Choice(["up", "down", "status"]))
@click.option("--port", type=int, default=None, help="port for moto_server (default: a free one)")
@click.option(
    "--state-dir",
    cls=_ShownDefault,
    type=click.Path(path_type=Path),
    default=default_state_dir,
    show_default=True,
    help="where its pid, endpoint and log are kept",
)
@click.pass_obj
def local(options: _Globals, action: str, port: int | None, state_dir: Path) -> Reply:
    from shardline.local import embedded_aws

    state_file = _stack_file(state_dir)
    if action == "up":
        if state_file.exists():
            state = json.loads(state_file.read_text())
            if embedded_aws.answers(state["url"]):
                return lines_reply(
                    [
                        f"the embedded stack is already up at {state['url']} (pid {state['pid']})",
                        *_exports(state["url"]),
                    ]
                )
        proc, url = embedded_aws.start_moto(state_dir / "moto.log", port=port)
        state_dir.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps({"pid": proc.pid, "url": url}))
        embedded_aws.apply_env(embedded_aws.env_for(url))
        created = _create_resources(options.dags_folder)
        return lines_reply(
            [
                f"embedded AWS endpoint (moto_server) up at {url}, pid {proc.pid}, log {state_dir / 'moto.log'}",
                *(f"  {line}" for line in created),
                *_exports(url),
                "stop it with: shardline local down",
            ]
        )
    if action == "down":
        if not state_file.exists():
            return lines_reply(["no embedded stack recorded as running; nothing to stop"])
        state = json.loads(state_file.read_text())
        said = f"the embedded stack (pid {state['pid']}) had already stopped"
        if _is_moto(state["pid"]):
            try:
                os.killpg(state["pid"], signal.SIGTERM)
                said = f"stopped the embedded stack at {state['url']} (pid {state['pid']})"
            except ProcessLookupError:
                pass
        state_file.unlink()
        return lines_reply([said])
    if not state_file.exists():
        return lines_reply(["the embedded stack is down; start it with: shardline local up"], EXIT_ERROR)
    state = json.loads(state_file.read_text())
    up = embedded_aws.answers(state["url"])
    said = f"embedded stack at {state['url']}: {'up' if up else 'not answering'} (pid {state['pid']})" + (
        "" if up else "; restart it with: shardline local down && shardline local up"
    )
    return lines_reply([said, *(_exports(state["url"]) if up else [])], EXIT_OK if up else EXIT_ERROR)


def main(argv: list[str] | None = None) -> int:
    try:
        code = shardline.main(args=argv, prog_name="shardline", standalone_mode=False)
    except click.ClickException as err:  # a usage error: click says what and how to get help
        err.show()
        return err.exit_code
    except click.Abort:  # Ctrl-C or end of input at a prompt
        print("Aborted!", file=sys.stderr)
        return EXIT_ERROR
    return code if isinstance(code, int) else EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
