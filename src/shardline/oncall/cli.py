"""``shardline``: the on-call command line. See ``shardline --help``.

It reads the same ledger table and backends as the pipelines (found from the specs under
the DAGs folder), so it works against real AWS and the embedded stack alike: boto3's
usual settings (profile, region, ``AWS_ENDPOINT_URL``) decide where.

The click commands of a run only: each returns a :class:`~shardline.oncall.printing.Reply` (its value, and how
:mod:`~shardline.oncall.printing` shows it to a person), and one place,
:func:`~shardline.oncall.cli_group.command`, prints it (as JSON with ``--json``) and turns an on-call error into its
message and exit code. :mod:`~shardline.oncall.cli_tools` holds the commands for before launch and the machine.
Start-up stays fast: the AWS client libraries, the service and rich are imported only when a command runs, never
for ``--help``.
"""

from __future__ import annotations

import datetime as dt
import functools
import sys
from pathlib import Path

import click

from shardline.oncall import cli_tools  # noqa: F401 - registers preview, tune, local and fleet
from shardline.oncall.cli_base import Globals, IsoDate, JsonObject
from shardline.oncall.cli_group import command, run_argument, run_ref, shardline
from shardline.oncall.errors import BadRequest
from shardline.oncall.messages import plain_http_warning
from shardline.oncall.printing import (
    EXIT_ERROR,
    EXIT_OK,
    Reply,
    approve_reply,
    checks_reply,
    lines_reply,
    print_lines,
    printable,
    resubmit_reply,
    show_failed,
    show_runs,
    show_status,
)
from shardline.oncall.values import FileChoice


@command("runs", "list recent runs, newest first")
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


@command(
    "status",
    "a run's steps: attempts, file counts, rows/s and ETA",
    "A run's steps: status, attempt and job, file counts, rows out, rows/s and ETA of the running attempt. "
    "RUN is PIPELINE/RUN_ID as `shardline runs` prints it.",
)
@run_argument
@click.pass_obj
def status(options: Globals, run: str) -> Reply:
    oncall = options.oncall()
    view = oncall.status(run_ref(run))
    return Reply(view, functools.partial(show_status, view, airflow_warning=oncall.airflow_warning))


@command("failed", "the files that did not succeed: error class, message, attempts")
@run_argument
@click.option("--step", help="only this step")
@click.pass_obj
def failed(options: Globals, run: str, step: str | None) -> Reply:
    oncall = options.oncall()
    ref = run_ref(run)
    view = oncall.failed_view(ref, step)
    # --json stays the list of files it has always been; the note is for a person.
    return Reply(view.files, functools.partial(show_failed, view.files, ref=ref, step=step, note=view.note))


@command(
    "report",
    "fetch a step's run report (HTML) to a local file and print its path",
    "Fetch the run report of a step (throughput per instance, cost per 1M predictions, drift against the previous "
    "successful run, rows in against rows out), which is written beside the step's outputs when the step ends, "
    "to .shardline/reports/PIPELINE/RUN/STEP/report.html under the current directory (or --out), and print "
    "its path. Without --step: every step of the run that has a report. --json prints report.json, the same "
    "data (one object with --step, else a list).",
)
@run_argument
@click.option("--step", help="only this step (default: every step of the run that has a report)")
@click.option("--open", "open_page", is_flag=True, help="open it in the web browser")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="write it to this file (one step)")
@click.pass_obj
def report(options: Globals, run: str, step: str | None, open_page: bool, out: Path | None) -> Reply:
    import webbrowser

    # --json is the wrapper's option: read here only to fetch report.json as well.
    with_json = bool(click.get_current_context().params.get("as_json"))
    saved = options.oncall().save_reports(run_ref(run), step, root=Path.cwd(), out=out, with_json=with_json)
    if open_page:
        for page in saved:
            if not webbrowser.open(Path(page.path).resolve().as_uri()):
                print(
                    printable(f"shardline report: no web browser to open {page.path} with; open the file yourself"),
                    file=sys.stderr,
                )
    data = [page.report for page in saved]
    return Reply(data[0] if step else data, functools.partial(print_lines, [page.path for page in saved]))


@command(
    "checks",
    "every output check of a run against the last partitions', or make a step's baseline",
    "shardline checks RUN: every output check of each step of a run (its spec's checks, and drift.max_psi): pass, "
    "fail or n/a, the value measured, the bound it was held to, the files that drive a failure most, and the same "
    "check's value in the last checks.last successful partitions. Exits 1 while a blocking check holds a step's "
    "outputs back (no _SUCCESS); the ways forward are printed: approve, or fix and rerun.\n\n"
    "shardline checks baseline PIPELINE --step S --from s3://.../predictions.parquet: profile a file (parquet, CSV "
    "or JSON lines: a validation set's predictions and features, say) and keep it as the step's reference for its "
    "PSI checks (checks.reference: baseline), replacing any earlier one.",
)
@click.argument("run", metavar="RUN | baseline")
@click.argument("pipeline", required=False)
@click.option("--step", help="only this step (with baseline: the step, required)")
@click.option("--from", "source", metavar="URI", help="baseline: the file to profile (s3:// URI or a local path)")
@click.pass_obj
def checks(options: Globals, run: str, pipeline: str | None, step: str | None, source: str | None) -> Reply:
    from shardline.planning import naming

    if run == "baseline":
        if not (pipeline and step and source):
            raise click.UsageError("shardline checks baseline PIPELINE --step STEP --from URI")
        import getpass

        made = options.oncall().make_baseline(pipeline, step, source, by=getpass.getuser())
        columns = ", ".join(made["profile"]["outputs"])
        said = f"baseline of {pipeline} step {step}: {made['rows']:,} rows of {source} ({columns})"
        return Reply(made | {"profile": None}, functools.partial(print_lines, [said]))
    if pipeline or source:
        raise click.UsageError("shardline checks RUN [--step STEP] (a second argument or --from: only with baseline)")
    ref = run_ref(run)
    view = options.oncall().checks_view(ref, step)
    held = next((row.step for row in view.blocked if row.step not in view.approvals), step or "STEP")
    ways = naming.checks_ways_forward(ref.pipeline, ref.run_id, held).split("; ", 1)[1]
    return checks_reply(view, "ways forward: " + ways)


@command(
    "approve",
    "accept the outputs a step's blocking checks held back: writes _SUCCESS",
    "Accept the outputs of a step that its blocking output checks held back (its run failed with 'checks: blocked "
    "by ...'): who (your login name), when and why (--reason, required) are recorded in the ledger and the run "
    "report, the run takes its output prefix up again, and the DAG run's watch task is cleared through Airflow's "
    "REST API so the step ends again: green, with its _SUCCESS, and the run goes on. Only that attempt's outputs "
    "are approved: a resubmission or a rerun is checked again.",
)
@run_argument
@click.option("--step", required=True, help="the step whose held-back outputs are accepted")
@click.option("--reason", required=True, help="why the outputs are right as they are (recorded; 10 characters or more)")
@click.pass_obj
def approve(options: Globals, run: str, step: str, reason: str) -> Reply:
    import getpass

    result = options.oncall().approve(run_ref(run), step, reason, by=getpass.getuser())
    return approve_reply(result)


SELECTIONS = ("--all-failed", "--instance", "--file", "--rejects")


@command(
    "resubmit",
    "start a new attempt with only the chosen files",
    "Start a new attempt of a step with only the chosen files (never ones that succeeded; --rejects takes "
    "the rows succeeded files rejected, picked by number from their sources once fixed). When the DAG run "
    "has already finished, its watch task is cleared through Airflow's REST API so the run follows the new "
    "attempt and turns green when it succeeds. Running it twice is safe: a second call finds the attempt "
    "running, or nothing left to resubmit.",
)
@run_argument
@click.option("--step", required=True, help="the step to resubmit")
@click.option("--all-failed", is_flag=True, help="every file of the step that has not succeeded")
@click.option("--rejects", is_flag=True, help="score the rows the step's files rejected again, once fixed in place")
@click.option("--instance", metavar="NAME", help="the unfinished or failed files of one instance (algo-N)")
@click.option("--shard", "shard_alias", hidden=True, help="the old name of --instance")
@click.option(
    "--file",
    "keys",
    metavar="KEY",
    multiple=True,
    help="one file (s3:// URI or key relative to the input prefix); repeatable",
)
@click.option(
    "--budget-usd",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="raise the run's budget to this (after a budget stop); alone, it resubmits every file not succeeded",
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
    instance: str | None,
    shard_alias: str | None,
    keys: tuple[str, ...],
    budget_usd: float | None,
    dry_run: bool,
    force: bool,
    ledger_only: bool,
) -> Reply:
    instance = instance or shard_alias  # --shard, as earlier releases called it, still works
    if budget_usd is not None and not (instance or keys or rejects):
        all_failed = True  # a budget stop's resubmit: the files it left unfinished
    # Exactly one way of choosing, as a usage error (exit 2) before anything is read.
    given = [flag for flag, value in zip(SELECTIONS, (all_failed, instance, keys, rejects), strict=True) if value]
    if len(given) != 1:
        many = f"argument {given[1]}: not allowed with argument {given[0]}" if given else ""
        raise click.UsageError(many or f"one of the arguments {' '.join(SELECTIONS)} is required")
    oncall = options.oncall()
    choice = FileChoice(instance=instance, files=keys, all_failed=all_failed, rejects=rejects)
    result = oncall.resubmit(
        run_ref(run), step, choice, dry_run=dry_run, force=force, ledger_only=ledger_only, budget_usd=budget_usd
    )
    return resubmit_reply(result, dry_run=dry_run)


@command(
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


@command(
    "rerun",
    "run a finished DAG run's partition again: its failed tasks, or all of it with a new conf",
    "Run a finished DAG run's partition again. Without --conf, its failed tasks and everything after them "
    "are cleared, so the same run plans again with its own conf: after input that landed late, or a model "
    "uploaded since. With --conf (a JSON object of the trigger form's Params), the run is deleted and "
    "triggered again at the same logical date and data interval with that conf, since a run's conf cannot "
    "change and Airflow refuses a second run at one logical date. The conf is checked first.",
)
@run_argument
@click.option(
    "--conf", type=JsonObject(), metavar="JSON", help='a new conf for the partition, e.g. \'{"model_version": "v2"}\''
)
@click.option("--dry-run", is_flag=True, help="say what would be done; change nothing")
@click.pass_obj
def rerun(options: Globals, run: str, conf: dict | None, dry_run: bool) -> Reply:
    return lines_reply(options.oncall().rerun(run_ref(run), conf, dry_run=dry_run))


@command(
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


@command("cancel", "stop a run's jobs, mark it CANCELLED, fail its DAG run")
@run_argument
@click.option("--reason", default="cancelled by on-call", show_default=True, help="recorded on the run")
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@click.pass_obj
def cancel(options: Globals, run: str, reason: str, yes: bool) -> Reply:
    oncall = options.oncall()
    ref = run_ref(run)
    if not yes:
        if not sys.stdin.isatty():
            raise BadRequest(
                f"refusing to cancel {ref} without a terminal to confirm on; pass --yes to cancel it anyway"
            )
        answer = input(printable(f"cancel {ref}: stop its jobs, mark it CANCELLED and fail its DAG run? [y/N] "))
        if answer.strip().lower() not in ("y", "yes"):
            return lines_reply(["not cancelled: nothing was changed"], EXIT_ERROR)
    return lines_reply(oncall.cancel(ref, reason))


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


@command(
    "table",
    "a step's output table: its snapshots, each with the run that committed it",
    "shardline table history PIPELINE [--step S]: the Iceberg table a step commits its partitions to "
    "(output.table), newest snapshot first: when, the operation, the run and attempt that committed it, its "
    "partition, and the rows it added, removed and the table then held. A snapshot no run of Shardline wrote (a "
    "compaction, another writer) shows no run.",
)
@click.argument("action", type=click.Choice(["history"]))
@click.argument("pipeline")
@click.option("--step", help="the step whose table (default: the pipeline's only step with one)")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="the newest snapshots only")
@click.pass_obj
def table(options: Globals, action: str, pipeline: str, step: str | None, limit: int) -> Reply:
    import dataclasses

    from shardline.errors import TableError
    from shardline.orchestration import tables

    spec = options.oncall().spec(pipeline)
    with_table = [s.name for s in spec.steps if s.output.table is not None]
    if step is None:
        if len(with_table) != 1:
            raise BadRequest(f"{pipeline}: name the step (--step), one of {with_table or 'none: no step has a table'}")
        step = with_table[0]
    if step not in with_table:
        raise BadRequest(f"{pipeline}: step {step} has no output.table (steps with one: {with_table or 'none'})")
    try:
        rows = tables.history(spec, step)[:limit]
    except TableError as err:
        raise BadRequest(str(err)) from err
    name = spec.step(step).output.table.qualified
    lines = [f"table {name} ({len(rows)} snapshot(s), newest first)"]
    for row in rows:
        who = f"{row.run_id} attempt {row.attempt}" if row.run_id else "(not a Shardline run)"
        lines.append(
            f"  {row.snapshot_id}  {row.committed_at}  {row.operation:<9}  {who}  partition {row.partition or '-'}  "
            f"+{row.rows_added:,} -{row.rows_removed:,} rows, {row.total_rows:,} in all"
        )
    data = {"table": name, "snapshots": [dataclasses.asdict(row) for row in rows]}
    return Reply(data, functools.partial(print_lines, lines))


if __name__ == "__main__":
    raise SystemExit(main())
