"""``shardline``: the on-call command line. See ``shardline --help``.

It reads the same ledger table and backends as the pipelines (found from the specs under
the DAGs folder), so it works against real AWS and the embedded stack alike: boto3's
usual settings (profile, region, ``AWS_ENDPOINT_URL``) decide where.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import textwrap
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

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
  # fix the cause (the input, the model), then:
  shardline resubmit tabular_scoring_hourly/RUN_ID --step score --all-failed

before launch:
  shardline preview tabular_scoring_hourly --rows 20     # the model on a sample, with the job's settings
"""


def _console() -> Console:
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
    return "".join(ch if ch.isprintable() or ch in keep else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _when(iso: str | None, seconds: bool = True) -> str:
    return iso[:19 if seconds else 16].replace("T", " ") if iso else "-"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k" if value >= 1e3 else f"{value:.0f}"


STATUS_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "PARTIAL": "yellow", "CANCELLED": "magenta",
                "RUNNING": "cyan", "PLANNED": "cyan", "PENDING": "dim"}


def _styled(status: str | None) -> Text:
    return Text(printable(status), style=STATUS_STYLE.get(status or "", ""))


def _print_json(payload) -> None:
    def plain(value):
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value

    print(json.dumps([plain(v) for v in payload] if isinstance(payload, list) else plain(payload), indent=2))


# --- messages (pure: tests/oncall/test_messages.py renders each) -------------------------------


def no_runs_text(pipeline: str | None, dags_folder: Path) -> str:
    if pipeline:
        return f"no runs recorded yet for pipeline {pipeline} in its ledger table"
    return f"no runs recorded yet in the ledger tables of the pipelines under {dags_folder}"


def error_text(error_class: str | None, error_message: str | None) -> str:
    """A file's error in one line: class and message, either of which may be missing."""
    return ": ".join(x for x in (error_class, error_message) if x) or "-"


def preview_no_pipeline(pipeline: str, dags_folder: Path, known: list[str]) -> str:
    return (f"shardline preview: no pipeline {pipeline!r} in {dags_folder}/pipelines (known: "
            f"{', '.join(known) or 'none'}); check the name, or pass --dags-folder with the folder that holds its "
            "spec")


def preview_no_step(pipeline: str, step: str, names: list[str]) -> str:
    return (f"shardline preview: pipeline {pipeline} has no step {step!r} (steps: {', '.join(names)}); pass one of "
            "them as --step")


def aws_error_text(command: str, err: str, env, dags_folder: Path) -> str:
    """AWS refused or could not be reached: where the CLI looked, and what to check."""
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:
        where = (f"the endpoint {endpoint} (AWS_ENDPOINT_URL; for the embedded stack, `shardline local status` "
                 "says whether it is up)")
    else:
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        where = (f"AWS (profile {env.get('AWS_PROFILE') or 'default'}, "
                 + (f"region {region})" if region else "the profile's region)"))
    return (f"shardline {command}: AWS refused or could not be reached: {err}\n"
            f"  it talked to {where}; check AWS_PROFILE / AWS_REGION / AWS_ENDPOINT_URL and the ledger table's name "
            f"in the pipeline specs under {dags_folder}")


# --- commands --------------------------------------------------------------------------------


def cmd_runs(oncall, args) -> int:
    rows = oncall.runs(args.pipeline, args.limit)
    if args.json:
        _print_json(rows)
        return EXIT_OK
    console = _console()
    if not rows:
        console.print(printable(no_runs_text(args.pipeline, args.dags_folder)))
        return EXIT_OK
    # Plain columns: the run name is copied into the next command, so it is never shortened; the message
    # gets what width is left (`shardline status RUN` prints it whole).
    names = [printable(f"{r.pipeline}/{r.run_id}") for r in rows]
    name_width = max(len("RUN"), *(len(n) for n in names))
    status_width = max(len("STATUS"), *(len(printable(r.status)) for r in rows))
    # Airflow's DAG run state beside the ledger's, when the CLI can ask; "!" marks a disagreement.
    with_airflow = any(r.airflow_state for r in rows)
    airflow_width = max(len("AIRFLOW"), *(len(printable(r.airflow_state or "-")) + 2 for r in rows)) \
        if with_airflow else 0
    room = max(20, console.width - name_width - status_width - airflow_width - 2 * 16 - 10)
    header = f"{'RUN':<{name_width}}  {'STATUS':<{status_width}}  "
    header += f"{'AIRFLOW':<{airflow_width}}  " if with_airflow else ""
    console.print(header + f"{'STARTED':<16}  {'FINISHED':<16}  MESSAGE")
    for name, r in zip(names, rows, strict=True):
        status = _styled(r.status)
        status.pad_right(status_width - len(status))
        airflow = ""
        if with_airflow:
            airflow = printable(r.airflow_state or "-") + (" !" if r.disagreement else "")
            airflow = f"  {airflow:<{airflow_width}}"
        console.print(Text.assemble(f"{name:<{name_width}}  ", status, airflow,
                                    f"  {printable(_when(r.started_at, False)):<16}  "
                                    f"{printable(_when(r.finished_at, False)):<16}  "
                                    f"{printable(textwrap.shorten(r.message or '', room))}"))
    for name, r in zip(names, rows, strict=True):
        if r.disagreement:
            console.print(f"! {name}: {printable(r.disagreement)}")
    if oncall.airflow_warning:
        console.print(printable(oncall.airflow_warning))
    return EXIT_OK


def cmd_status(oncall, args) -> int:
    from shardline.oncall.service import RunRef

    view = oncall.status(RunRef.parse(args.run))
    if args.json:
        _print_json(view)
        return EXIT_OK
    console = _console()
    console.print(Text.assemble("run ", (printable(view.ref), "bold"), ": ", _styled(view.status),
                                printable(f", started {_when(view.started_at)}"
                                          + (f", finished {_when(view.finished_at)}" if view.finished_at else ""))))
    if view.message:
        console.print(f"  {printable(view.message)}")
    if view.airflow_state:
        console.print(printable(f"  Airflow: DAG run {view.airflow_state}"))
    if view.disagreement:
        console.print(printable(f"  ! {view.disagreement}"))
    if oncall.airflow_warning:
        console.print(f"  {printable(oncall.airflow_warning)}")
    table = Table()
    for column in ("STEP", "STATUS", "ATTEMPT", "JOB", "FILES", "OK", "FAILED", "RUNNING", "PENDING", "ROWS OUT",
                   "ROWS/S", "ETA"):
        table.add_column(column, justify="right" if column not in ("STEP", "STATUS", "JOB") else "left")
    for s in view.steps:
        table.add_row(printable(s.name), _styled(s.status), str(s.attempt), printable(s.job_status or "-"),
                      str(s.files), str(s.succeeded), str(s.failed), str(s.running), str(s.pending),
                      f"{s.rows_out:,}", _rate(s.rows_per_second), _duration(s.eta_seconds))
    console.print(table)
    for s in view.steps:
        if s.job_name:
            console.print(printable(f"step {s.name}, attempt {s.attempt}: job {s.job_name}"))
    for s in view.steps:
        if s.message and s.status in ("FAILED", "PARTIAL", "CANCELLED"):
            console.print(printable(f"step {s.name}: {s.message}"))
        if s.failed:
            console.print(printable(f"  see the {s.failed} failed file(s) and why: shardline failed {view.ref} "
                                    f"--step {s.name}"))
    return EXIT_OK


def cmd_failed(oncall, args) -> int:
    from shardline.oncall.service import RunRef
    from shardline.planning.naming import resubmit_command

    ref = RunRef.parse(args.run)
    files = oncall.failed(ref, args.step)
    if args.json:
        _print_json(files)
        return EXIT_OK
    console = _console()
    if not files:
        console.print(printable(f"no failed or unfinished files in {ref}"
                                + (f", step {args.step}" if args.step else "") + ": nothing to resubmit"))
        return EXIT_OK
    table = Table(title=Text(printable(f"files of {ref} that did not succeed")))
    for column in ("STEP", "FILE", "STATUS", "ATTEMPT", "HOST", "ERROR"):
        table.add_column(column, overflow="fold")
    for f in files:
        error = error_text(f.error_class, f.error_message)
        table.add_row(printable(f.step), printable(f.input_key), _styled(f.status), str(f.attempt),
                      printable(f.host or "-"), printable(textwrap.shorten(error, 160)))
    console.print(table)
    for step in sorted({f.step for f in files}):
        console.print(printable(f"after fixing the cause: {resubmit_command(ref.pipeline, ref.run_id, step)}"))
    return EXIT_OK


def cmd_resubmit(oncall, args) -> int:
    from shardline.oncall.service import RunRef

    ref = RunRef.parse(args.run)
    result = oncall.resubmit(ref, args.step, shard=args.shard, files=args.file or (), all_failed=args.all_failed,
                             dry_run=args.dry_run, force=args.force, ledger_only=args.ledger_only)
    code = EXIT_OK if result.complete else EXIT_ERROR
    if args.json:
        _print_json(result)
        return code
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
    if result.job_name and not args.dry_run:
        console.print(printable(f"submitted attempt {result.attempt} as job {result.job_name}"))
    elif result.job_name:
        console.print(printable(f"would submit attempt {result.attempt} as job {result.job_name}"))
    if not result.complete:
        print(printable(f"shardline resubmit: {result.airflow}"), file=sys.stderr)
        return code
    console.print(printable(result.airflow))
    if args.dry_run and result.action != "nothing":
        console.print("to do it, run the same command without --dry-run")
    if (result.job_name or result.action == "take_up") and not args.dry_run:
        console.print(printable(f"follow it with: shardline status {ref}"))
    return code


def cmd_login(args) -> int:
    import getpass

    from shardline.oncall.airflow_client import AirflowClient, save_login

    client = AirflowClient(args.url, source=args.url)
    if args.token:
        client = AirflowClient(args.url, token=args.token, source="--token")
        token, who = args.token, "with the given token"
    else:
        username = args.username or input("Airflow user: ").strip()
        password = sys.stdin.readline().rstrip("\n") if args.password_stdin else getpass.getpass(
            f"password for {username}: ")
        token, who = client.login(username, password), f"as {username}"
    client.dags_page()  # the token works: it reads at least the DAG list
    path = save_login(args.url, token)
    print(printable(f"logged in to {client.base_url} {who}; the URL and token are kept in {path} (mode 0600) for "
                    "later commands. Airflow's tokens expire ([api_auth] jwt_expiration_time): run `shardline login "
                    f"{client.base_url}` again when a command says the token was refused."))
    return EXIT_OK


def cmd_cancel(oncall, args) -> int:
    from shardline.oncall.service import RunRef

    ref = RunRef.parse(args.run)
    if not args.yes:
        if not sys.stdin.isatty():
            print(printable(f"shardline cancel: refusing to cancel {ref} without a terminal to confirm on; "
                            "pass --yes to cancel it anyway"), file=sys.stderr)
            return EXIT_USAGE
        answer = input(printable(f"cancel {ref}: stop its jobs, mark it CANCELLED and fail its DAG run? [y/N] "))
        if answer.strip().lower() not in ("y", "yes"):
            print("not cancelled: nothing was changed")
            return EXIT_ERROR
    for line in oncall.cancel(ref, args.reason):
        print(printable(line))
    return EXIT_OK


# --- the embedded stack ------------------------------------------------------------------------


def cmd_preview(args) -> int:
    """Run a step's model on a sample of its input, locally, with the job's own settings."""
    import datetime as dt

    from shardline.oncall.preview import step_uris
    from shardline.oncall.service import load_specs
    from shardline.orchestration import services

    specs = load_specs(args.dags_folder)
    if args.pipeline not in specs:
        print(printable(preview_no_pipeline(args.pipeline, args.dags_folder, sorted(specs))), file=sys.stderr)
        return EXIT_ERROR
    spec = specs[args.pipeline]
    names = [s.name for s in spec.steps]
    if args.step and args.step not in names:
        print(printable(preview_no_step(args.pipeline, args.step, names)), file=sys.stderr)
        return EXIT_ERROR
    step = spec.step(args.step or names[0])
    logical_date = args.logical_date or dt.datetime.now(dt.UTC)
    params = {"model_version": args.model_version} if args.model_version else None
    model_uri, input_uri = step_uris(spec, step, logical_date, params)
    from shardline.oncall.preview import preview_step

    result = preview_step(spec, step.name, services.s3_client(spec), model_uri=args.model_uri or model_uri,
                          input_uri=args.input or input_uri, rows=args.rows, model_version=args.model_version)
    if args.json:
        _print_json({"step": result.step, "model_uri": result.model_uri, "sample_uri": result.sample_uri,
                     "exit_code": result.exit_code, "report": result.report})
    else:
        print(printable(result.render(), newlines=True), end="")  # the sample's values are the input's own
    return EXIT_OK if result.ok else EXIT_ERROR


def default_state_dir() -> Path:
    """Where `shardline local` keeps the stack's pid, URL and log: one place per user, so `down` and
    `status` find the stack from any directory ($SHARDLINE_STATE_DIR, else $XDG_STATE_HOME/shardline/local,
    else ~/.local/state/shardline/local)."""
    if os.environ.get("SHARDLINE_STATE_DIR"):
        return Path(os.environ["SHARDLINE_STATE_DIR"])
    base = Path(os.environ["XDG_STATE_HOME"]) if os.environ.get("XDG_STATE_HOME") else \
        Path.home() / ".local" / "state"
    return base / "shardline" / "local"


def _stack_file(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def _is_moto(pid: int) -> bool:
    """Whether ``pid`` is still the moto_server we started (a pid can be reused after a reboot)."""
    import psutil

    try:
        return any("moto_server" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def cmd_local(args) -> int:
    from shardline.local import embedded_aws

    state_dir: Path = args.state_dir
    state_file = _stack_file(state_dir)
    if args.action == "up":
        if state_file.exists():
            state = json.loads(state_file.read_text())
            if embedded_aws.answers(state["url"]):
                print(f"the embedded stack is already up at {state['url']} (pid {state['pid']})")
                _print_exports(state["url"])
                return EXIT_OK
        proc, url = embedded_aws.start_moto(state_dir / "moto.log", port=args.port)
        state_dir.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps({"pid": proc.pid, "url": url}))
        env = embedded_aws.env_for(url)
        embedded_aws.apply_env(env)
        created = _create_resources(args.dags_folder)
        print(f"embedded AWS endpoint (moto_server) up at {url}, pid {proc.pid}, log {state_dir / 'moto.log'}")
        for line in created:
            print(f"  {line}")
        _print_exports(url)
        print("stop it with: shardline local down")
        return EXIT_OK
    if args.action == "down":
        if not state_file.exists():
            print("no embedded stack recorded as running; nothing to stop")
            return EXIT_OK
        state = json.loads(state_file.read_text())
        if not _is_moto(state["pid"]):
            print(f"the embedded stack (pid {state['pid']}) had already stopped")
        else:
            try:
                os.killpg(state["pid"], signal.SIGTERM)
                print(f"stopped the embedded stack at {state['url']} (pid {state['pid']})")
            except ProcessLookupError:
                print(f"the embedded stack (pid {state['pid']}) had already stopped")
        state_file.unlink()
        return EXIT_OK
    # status
    if state_file.exists():
        state = json.loads(state_file.read_text())
        up = embedded_aws.answers(state["url"])
        print(f"embedded stack at {state['url']}: {'up' if up else 'not answering'} (pid {state['pid']})"
              + ("" if up else "; restart it with: shardline local down && shardline local up"))
        if up:
            _print_exports(state["url"])
        return EXIT_OK if up else EXIT_ERROR
    print("the embedded stack is down; start it with: shardline local up")
    return EXIT_ERROR


def _print_exports(url: str) -> None:
    from shardline.local import embedded_aws

    print("point this shell at it with:")
    for name, value in embedded_aws.env_for(url).items():
        print(f"  export {name}={value}")


def _create_resources(dags_folder: Path) -> list[str]:
    """The buckets and ledger tables every pipeline spec refers to."""
    from shardline.local.provision import apply, make_plan

    return apply(make_plan(dags_folder / "pipelines"))


# --- parser ------------------------------------------------------------------------------------


def default_dags_folder() -> Path:
    for candidate in (os.environ.get("SHARDLINE_DAGS_FOLDER"), os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")):
        if candidate:
            return Path(candidate)
    return Path.cwd() / "dags"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardline", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="On-call commands for Shardline pipelines: see runs, find what failed and why, resubmit "
                    "exactly the failed files, cancel a run, and run the embedded AWS stack.",
    )
    from shardline import __version__

    parser.add_argument("--version", action="version", version=f"shardline {__version__}")
    parser.add_argument("--dags-folder", type=Path, default=default_dags_folder(),
                        help="folder holding pipelines/*.yaml (default: %(default)s)")
    parser.add_argument("--airflow-url", help="Airflow's API server (default: $SHARDLINE_AIRFLOW_URL, else the URL "
                                              "`shardline login` kept)")
    parser.add_argument("--airflow-token", help="a bearer token for it (default: $SHARDLINE_AIRFLOW_TOKEN, else "
                                                "the one `shardline login` kept)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, description: str = "") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=description or help_text,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return p

    p = command("runs", "list recent runs, newest first")
    p.add_argument("--pipeline", help="only this pipeline")
    p.add_argument("--limit", type=int, default=20, help="how many (default: %(default)s)")
    p.set_defaults(handler=cmd_runs)

    p = command("status", "a run's steps: attempts, file counts, rows/s and ETA",
                "A run's steps: status, attempt and job, file counts, rows out, rows/s and ETA of the running "
                "attempt. RUN is PIPELINE/RUN_ID as `shardline runs` prints it.")
    p.add_argument("run", metavar="RUN", help="PIPELINE/RUN_ID")
    p.set_defaults(handler=cmd_status)

    p = command("failed", "the files that did not succeed: error class, message, attempts")
    p.add_argument("run", metavar="RUN", help="PIPELINE/RUN_ID")
    p.add_argument("--step", help="only this step")
    p.set_defaults(handler=cmd_failed)

    p = command("resubmit", "start a new attempt with only the chosen files",
                "Start a new attempt of a step with only the chosen files (never ones that succeeded). When the "
                "DAG run has already finished, its watch task is cleared through Airflow's REST API so the run "
                "follows the new attempt and turns green when it succeeds. Running it twice is safe: a second "
                "call finds the attempt running, or nothing left to resubmit.")
    p.add_argument("run", metavar="RUN", help="PIPELINE/RUN_ID")
    p.add_argument("--step", required=True, help="the step to resubmit")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--all-failed", action="store_true", help="every file of the step that has not succeeded")
    which.add_argument("--shard", metavar="HOST", help="the unfinished or failed files of one instance (algo-N)")
    which.add_argument("--file", metavar="KEY", action="append",
                       help="one file (s3:// URI or key relative to the input prefix); repeatable")
    p.add_argument("--dry-run", action="store_true", help="show what would be resubmitted; change nothing")
    p.add_argument("--force", action="store_true", help="resubmit even though the step's sensor has not ended")
    p.add_argument("--ledger-only", action="store_true",
                   help="leave Airflow out: for a step not run by an Airflow DAG (no DAG run follows the attempt)")
    p.set_defaults(handler=cmd_resubmit)

    p = sub.add_parser("login", help="keep Airflow's URL and a token for later commands",
                       description="Log in to Airflow's API server once: exchange a user and password for a token "
                                   "(or take one with --token), check it, and keep the URL and token in "
                                   "~/.config/shardline/airflow.json (mode 0600; $XDG_CONFIG_HOME or "
                                   "$SHARDLINE_AIRFLOW_CONFIG moves it). resubmit and cancel then find Airflow "
                                   "without flags or environment.")
    p.add_argument("url", metavar="URL", help="the API server, e.g. http://localhost:8080")
    p.add_argument("--username", help="the Airflow user (default: ask)")
    p.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    p.add_argument("--token", help="a token you already have, instead of a user and password")
    p.set_defaults(handler=None)

    p = command("cancel", "stop a run's jobs, mark it CANCELLED, fail its DAG run")
    p.add_argument("run", metavar="RUN", help="PIPELINE/RUN_ID")
    p.add_argument("--reason", default="cancelled by an operator", help="recorded on the run")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(handler=cmd_cancel)

    p = command("preview", "run a step's model on the first rows of one input, locally, before launch",
                "Run a step's model, with exactly the settings its job would use, on the first rows of one input "
                "file, here and now: print the passthrough columns, the features as the model gets them, the "
                "predictions and a summary, and warn on signs of a wrong setup (constant or NaN predictions, "
                "lines the script printed, columns dropped, a script that breaks when batched). Writes nothing.")
    p.add_argument("pipeline", metavar="PIPELINE")
    p.add_argument("--step", help="the step (default: the first)")
    p.add_argument("--rows", type=int, default=20, help="rows of the sample (default: %(default)s)")
    p.add_argument("--input", metavar="URI", help="an s3:// file or prefix to sample (default: the step's input)")
    p.add_argument("--model-uri", metavar="URI", help="the model artifact (default: the step's model.uri)")
    p.add_argument("--model-version", help="the model_version Param (default: the spec's model.version)")
    p.add_argument("--logical-date", type=_iso_date, default=None,
                   help="the run's logical date for the spec's templates, e.g. 2026-11-22T10:00 (default: now, UTC)")
    p.set_defaults(handler=cmd_preview)

    p = sub.add_parser("local", help="start or stop the embedded AWS stack (moto_server) for local runs",
                       description="Start, stop or check the embedded AWS endpoint (moto_server on loopback), "
                                   "with the buckets and ledger tables the pipeline specs name.")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--port", type=int, default=None, help="port for moto_server (default: a free one)")
    p.add_argument("--state-dir", type=Path, default=default_state_dir(),
                   help="where its pid, endpoint and log are kept (default: %(default)s)")
    p.set_defaults(handler=None)
    return parser


def _iso_date(value: str):
    import datetime as dt

    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected an ISO date or time like 2026-11-22T10:00, got {value!r}") from err
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from botocore.exceptions import BotoCoreError, ClientError
    from pynamodb.exceptions import PynamoDBException

    from shardline.local.embedded_aws import EmbeddedAwsError
    from shardline.oncall.airflow_client import AirflowApiError, find_settings
    from shardline.oncall.preview import PreviewError
    from shardline.oncall.service import OnCall, OnCallError

    try:
        if args.command == "local":
            return cmd_local(args)
        if args.command == "preview":
            return cmd_preview(args)
        if args.command == "login":
            return cmd_login(args)
        settings = find_settings(args.airflow_url, args.airflow_token)
        oncall = OnCall.from_folder(args.dags_folder, airflow=settings.client() if settings else None)
        return args.handler(oncall, args)
    except (OnCallError, AirflowApiError, EmbeddedAwsError, PreviewError) as err:
        print(f"shardline {args.command}: {printable(err)}", file=sys.stderr)
        return getattr(err, "exit_code", EXIT_ERROR)  # a malformed request exits 2, as a usage error does
    except (BotoCoreError, ClientError, PynamoDBException) as err:
        print(aws_error_text(args.command, printable(err), os.environ, args.dags_folder), file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
