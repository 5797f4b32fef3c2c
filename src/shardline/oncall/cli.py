"""``shardline``: the on-call command line. See ``shardline --help``.

It reads the same ledger table and backends as the pipelines (found from the specs under
the DAGs folder), so it works against real AWS and the embedded stack alike: boto3's
usual settings (profile, region, ``AWS_ENDPOINT_URL``) decide where.

The click commands only: each returns a :class:`~shardline.oncall.printing.Reply` (its value, and how
:mod:`~shardline.oncall.printing` shows it to a person). One place, :func:`_command`, prints it (as JSON with
``--json``) and turns an on-call error into its message and exit code; `shardline local` is
:mod:`~shardline.oncall.local_stack`. Start-up stays fast: the AWS client libraries, the service and rich are
imported only when a command runs, never for ``--help``.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from shardline import __version__
from shardline.oncall import cli_base, local_stack
from shardline.oncall.cli_base import Globals, Group, IsoDate, JsonObject, ShownDefault, default_dags_folder
from shardline.oncall.messages import aws_error_text, plain_http_warning
from shardline.oncall.printing import (
    EXIT_ERROR,
    EXIT_OK,
    Reply,
    lines_reply,
    preview_reply,
    print_json,
    print_lines,
    printable,
    resubmit_reply,
    show_failed,
    show_runs,
    show_status,
    tune_reply,
)

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
  shardline resubmit tabular_scoring_hourly/RUN_ID --step score --rejects   # rows rejected, mended in place

before launch:
  shardline preview tabular_scoring_hourly --rows 20     # the model on a sample, with the job's settings
  shardline tune tabular_scoring_hourly --rows 200000   # rows/s per workers x threads and batch rows, here
"""


@click.group(
    cls=Group,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="On-call commands for Shardline pipelines: see runs, find what failed and why, resubmit exactly "
    "the failed files, cancel a run, and run the embedded AWS stack.",
)
@click.version_option(__version__, "--version", prog_name="shardline", message="%(prog)s %(version)s")
@click.option(
    "--dags-folder",
    cls=ShownDefault,
    type=click.Path(path_type=Path),
    default=default_dags_folder,
    show_default=True,
    help="folder holding pipelines/*.yaml",
)
@click.option(
    "--airflow-url", help="Airflow's API server (default: $SHARDLINE_AIRFLOW_URL, else the URL `shardline login` kept)"
)
@click.option(
    "--airflow-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="a file holding a bearer token for it (default: $SHARDLINE_AIRFLOW_TOKEN, else the one `shardline login` "
    "kept); a file, never the token itself, since a command line is readable by every user of the machine",
)
@click.option("--airflow-token", hidden=True, help="refused: a token on the command line is visible to other users")
@click.pass_context
def shardline(
    ctx: click.Context,
    dags_folder: Path,
    airflow_url: str | None,
    airflow_token_file: Path | None,
    airflow_token: str | None,
) -> None:
    ctx.obj = Globals(dags_folder, airflow_url, cli_base.airflow_token_from(airflow_token_file, airflow_token))


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
                dags_folder = click.get_current_context().find_object(Globals).dags_folder
                print(aws_error_text(name, printable(err), os.environ, dags_folder), file=sys.stderr)
                return EXIT_ERROR
            if as_json:
                print_json(reply.data)
            else:
                reply.show()
            return reply.code

        if with_json:
            run = click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")(run)
        return shardline.command(name, short_help=short_help, help=description or short_help)(run)

    return register


_run_argument = click.argument("run", metavar="RUN")


def _run_ref(run: str):
    from shardline.oncall.values import RunRef  # when a command runs: --help imports nothing it needs

    return RunRef.parse(run)


@_command("runs", "list recent runs, newest first")
@click.option("--pipeline", help="only this pipeline")
@click.option("--limit", type=int, default=20, show_default=True, help="how many")
@click.pass_obj
def runs(options: Globals, pipeline: str | None, limit: int) -> Reply:
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
def status(options: Globals, run: str) -> Reply:
    oncall = options.oncall()
    view = oncall.status(_run_ref(run))
    return Reply(view, functools.partial(show_status, view, airflow_warning=oncall.airflow_warning))


@_command("failed", "the files that did not succeed: error class, message, attempts")
@_run_argument
@click.option("--step", help="only this step")
@click.pass_obj
def failed(options: Globals, run: str, step: str | None) -> Reply:
    oncall = options.oncall()
    ref = _run_ref(run)
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
def report(options: Globals, run: str, step: str | None, open_page: bool, out: Path | None) -> Reply:
    import webbrowser

    # --json is the wrapper's option: read here only to fetch report.json as well.
    with_json = bool(click.get_current_context().params.get("as_json"))
    saved = options.oncall().save_reports(_run_ref(run), step, root=Path.cwd(), out=out, with_json=with_json)
    if open_page:
        for page in saved:
            if not webbrowser.open(Path(page.path).resolve().as_uri()):
                print(
                    printable(f"shardline report: no web browser to open {page.path} with; open the file yourself"),
                    file=sys.stderr,
                )
    data = [page.report for page in saved]
    return Reply(data[0] if step else data, functools.partial(print_lines, [page.path for page in saved]))


SELECTIONS = ("--all-failed", "--shard", "--file", "--rejects")


@_command(
    "resubmit",
    "start a new attempt with only the chosen files",
    "Start a new attempt of a step with only the chosen files (never ones that succeeded; --rejects takes "
    "the rows succeeded files rejected, picked by number from their sources once fixed). When the DAG run "
    "has already finished, its watch task is cleared through Airflow's REST API so the run follows the new "
    "attempt and turns green when it succeeds. Running it twice is safe: a second call finds the attempt "
    "running, or nothing left to resubmit.",
)
@_run_argument
@click.option("--step", required=True, help="the step to resubmit")
@click.option("--all-failed", is_flag=True, help="every file of the step that has not succeeded")
@click.option("--rejects", is_flag=True, help="score the rows the step's files rejected again, once fixed in place")
@click.option("--shard", metavar="HOST", help="the unfinished or failed files of one instance (algo-N)")
@click.option(
    "--file",
    "keys",
    metavar="KEY",
    multiple=True,
    help="one file (s3:// URI or key relative to the input prefix); repeatable",
)
@click.option("--dry-run", is_flag=True, help="show what would be resubmitted; change nothing")
@click.option("--force", is_flag=True, help="resubmit even though the step's watch task has not ended")
@click.option(
    "--ledger-only",
    is_flag=True,
    help="leave Airflow out: for a step not run by an Airflow DAG (no DAG run follows the attempt)",
)
@click.pass_obj
def resubmit(
    options: Globals,
    run: str,
    step: str,
    all_failed: bool,
    rejects: bool,
    shard: str | None,
    keys: tuple[str, ...],
    dry_run: bool,
    force: bool,
    ledger_only: bool,
) -> Reply:
    # Exactly one way of choosing, as a usage error (exit 2) before anything is read.
    given = [flag for flag, value in zip(SELECTIONS, (all_failed, shard, keys, rejects), strict=True) if value]
    if len(given) != 1:
        many = f"argument {given[1]}: not allowed with argument {given[0]}" if given else ""
        raise click.UsageError(many or f"one of the arguments {' '.join(SELECTIONS)} is required")
    oncall = options.oncall()
    result = oncall.resubmit(
        _run_ref(run),
        step,
        shard=shard,
        files=keys,
        all_failed=all_failed,
        rejects=rejects,
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
    "--conf", type=JsonObject(), metavar="JSON", help='a new conf for the partition, e.g. \'{"model_version": "v2"}\''
)
@click.option("--dry-run", is_flag=True, help="say what would be done; change nothing")
@click.pass_obj
def rerun(options: Globals, run: str, conf: dict | None, dry_run: bool) -> Reply:
    return lines_reply(options.oncall().rerun(_run_ref(run), conf, dry_run=dry_run))


@_command(
    "trigger",
    "score one interval of a scheduled pipeline, named by its start",
    "Trigger a manual run of the interval that starts at --partition (UTC): its logical date is that start and "
    "its data interval that interval, as its scheduled run's would be, so it never takes the logical date of "
    "another interval's scheduled run (a manual run at 11:00 of an hourly pipeline with Airflow's own inference "
    "scores 10:00-11:00 and holds the logical date of the 11:00-12:00 run, which the scheduler then never "
    "creates). A partition that already has a run is refused: `shardline rerun` that run.",
)
@click.argument("pipeline")
@click.option("--partition", type=IsoDate(), required=True, help="the interval's start, e.g. 2026-11-22T10:00")
@click.option("--conf", type=JsonObject(), default="{}", metavar="JSON", help="the trigger form's Params")
@click.option("--dry-run", is_flag=True, help="say what would be done; change nothing")
@click.pass_obj
def trigger(options: Globals, pipeline: str, partition: dt.datetime, conf: dict, dry_run: bool) -> Reply:
    return lines_reply(options.oncall().trigger(pipeline, partition, conf, dry_run=dry_run))


@_command("cancel", "stop a run's jobs, mark it CANCELLED, fail its DAG run")
@_run_argument
@click.option("--reason", default="cancelled by on-call", show_default=True, help="recorded on the run")
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@click.pass_obj
def cancel(options: Globals, run: str, reason: str, yes: bool) -> Reply:
    from shardline.oncall.errors import BadRequest

    oncall = options.oncall()
    ref = _run_ref(run)
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
    type=IsoDate(),
    default=None,
    help="the run's logical date for the spec's templates, e.g. 2026-11-22T10:00 (default: now, UTC)",
)
@click.pass_obj
def preview(
    options: Globals,
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

    spec, name = options.pipeline_step(pipeline, step)
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
    options: Globals,
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

    spec, chosen = options.pipeline_step(pipeline, step)
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
    cls=ShownDefault,
    type=click.Path(path_type=Path),
    default=local_stack.default_state_dir,
    show_default=True,
    help="where its pid, endpoint and log are kept",
)
@click.pass_obj
def local(options: Globals, action: str, port: int | None, state_dir: Path) -> Reply:
    if action == "up":
        return local_stack.up(state_dir, port, options.dags_folder)
    if action == "down":
        return local_stack.down(state_dir)
    return local_stack.status(state_dir)


@_command(
    "fleet",
    "the account's instance quotas (dags/fleet.yaml): what is in use and waiting, or sync their pools",
    "The account's SageMaker instance quotas, declared in dags/fleet.yaml; each is an Airflow pool that admits "
    "the steps on its instance type, highest priority first. `shardline fleet` shows, per instance type, the "
    "instances in use against the quota and the steps running and waiting; `shardline fleet sync` creates or "
    "updates the pools (sagemaker-TYPE, slots = the quota, deferred tasks counted) through Airflow's REST API: run "
    "it after editing the file, as a step whose pool is missing is never scheduled.",
)
@click.argument("action", type=click.Choice(["show", "sync"]), default="show")
@click.option("--dry-run", is_flag=True, help="sync: say what would change; change nothing")
@click.pass_obj
def fleet(options: Globals, action: str, dry_run: bool) -> Reply:
    import dataclasses

    from shardline.oncall.airflow_client import find_settings
    from shardline.oncall.errors import Unavailable
    from shardline.oncall.fleet import fleet_lines, fleet_report, sync_pools, view_json

    settings = find_settings(options.airflow_url, options.airflow_token)
    if settings is None:
        raise Unavailable(
            f"Airflow is not configured, so no pool was {'synced' if action == 'sync' else 'read'}: `shardline "
            "login URL` or SHARDLINE_AIRFLOW_URL gives the CLI access (or create each pool by hand: `airflow pools "
            "set sagemaker-TYPE QUOTA 'Shardline' --include-deferred`)"
        )
    if action == "show":
        views = fleet_report(options.dags_folder, settings.client(), options.oncall().reads, dt.datetime.now(dt.UTC))
        lines = fleet_lines(views) or [f"no quota in {options.dags_folder / 'fleet.yaml'}: no fleet to show"]
        data = [view_json(v) for v in views]
        return Reply(data, functools.partial(print_lines, lines))
    changes = sync_pools(options.dags_folder, settings.client(), dry_run=dry_run)
    lines = [
        f"pool {c.pool}: {c.slots} slot(s), deferred tasks counted ({c.action}"
        + (f"; it had {c.was}" if c.was is not None and c.was != c.slots else "")
        + ")"
        for c in changes
    ] or [f"no quota in {options.dags_folder / 'fleet.yaml'}: no pool to sync"]
    return Reply([dataclasses.asdict(c) for c in changes], functools.partial(print_lines, lines))


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
