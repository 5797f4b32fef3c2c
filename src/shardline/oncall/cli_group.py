"""The `shardline` command group: its help, its global options, and :func:`command`, the one place that prints a
command's :class:`~shardline.oncall.printing.Reply` (as JSON with ``--json``) and turns an on-call error into its
message and exit code. The commands are in :mod:`~shardline.oncall.cli` (a run's) and
:mod:`~shardline.oncall.cli_tools` (before launch, and the local stack and fleet)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from shardline import __version__
from shardline.local.embedded_aws import EmbeddedAwsError
from shardline.oncall import cli_base
from shardline.oncall.cli_base import Globals, Group, ShownDefault, default_dags_folder
from shardline.oncall.errors import OnCallError
from shardline.oncall.messages import aws_error_text
from shardline.oncall.printing import EXIT_ERROR, Reply, print_json, printable
from shardline.oncall.values import RunRef

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


def command(name: str, short_help: str, description: str = "", *, with_json: bool = True):
    """Register a command whose body returns a :class:`Reply`: the one place that prints it (as JSON with
    ``--json``) and turns an error into ``shardline NAME: message`` on stderr and its exit code."""

    def register(body: Callable[..., Reply]) -> click.Command:
        @functools.wraps(body)
        def run(*args, as_json: bool = False, **kwargs) -> int:
            from botocore.exceptions import BotoCoreError, ClientError
            from pynamodb.exceptions import PynamoDBException

            from shardline.oncall.airflow_client import AirflowApiError
            from shardline.orchestration.step.preview import PreviewError

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


run_argument = click.argument("run", metavar="RUN")


def run_ref(run: str):
    return RunRef.parse(run)
