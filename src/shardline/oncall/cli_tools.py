"""The `shardline` commands for before launch and for the machine: ``preview``, ``tune``, ``local`` (the embedded
AWS stack, :mod:`~shardline.oncall.local_stack`) and ``fleet``."""

from __future__ import annotations

import datetime as dt
import functools
import sys
from pathlib import Path

import click

from shardline.oncall import local_stack
from shardline.oncall.cli_base import Globals, IsoDate, ShownDefault
from shardline.oncall.cli_group import command
from shardline.oncall.errors import Unavailable
from shardline.oncall.printing import Reply, preview_reply, print_lines, printable, tune_reply


def a_pipelines_step(command_function):
    """PIPELINE and ``--step``: which step of which pipeline's spec a tool runs, the first step by default."""
    command_function = click.option("--step", help="the step (default: the first)")(command_function)
    return click.argument("pipeline", metavar="PIPELINE")(command_function)


@command(
    "preview",
    "run a step's model on the first rows of one input, locally, before launch",
    "Run a step's model, with exactly the settings its job would use, on the first rows of one input file, "
    "here and now: print the passthrough columns, the features as the model gets them, the predictions and "
    "a summary, and warn on signs of a wrong setup (constant or NaN predictions, lines the script printed, "
    "columns dropped, a script that breaks when batched). Writes nothing.",
)
@a_pipelines_step
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
    from shardline.orchestration import services
    from shardline.orchestration.step.preview import preview_step, step_uris

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


@command(
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
@a_pipelines_step
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


@command(
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


@command(
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
    from shardline.oncall.fleet import fleet_lines, fleet_report, sync_pools, view_json

    settings = find_settings(options.airflow_url, options.airflow_token)
    if settings is None:
        raise Unavailable(
            f"Airflow is not configured, so no pool was {'synced' if action == 'sync' else 'read'}: `shardline "
            "login URL` or SHARDLINE_AIRFLOW_URL gives the CLI access (or create each pool by hand: `airflow pools "
            "set sagemaker-TYPE QUOTA 'Shardline' --include-deferred`)"
        )
    if action == "show":
        views = fleet_report(options.dags_folder, settings.client(), options.oncall(), dt.datetime.now(dt.UTC))
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


@command(
    "quote",
    "what a pipeline's partitions will cost, before they run: a range and an expected figure",
    "Quote the runs of a pipeline before launch: list each partition's inputs as the plan task would (their rows "
    "from parquet footers; text inputs' from their bytes), choose the instances as the plan would, and estimate "
    "each step's instance-hours from the rates the same model version reached on the same instance type in the "
    "pipeline's newest successful runs (the ledger and their run reports). Without such runs it measures a short "
    "sample run of the step's worker settings here, and says so. Prints dollars, instance-hours and cost per 1M "
    "predictions as a range and an expected figure, per partition and step and in all, and which runs the "
    "figures came from. Default: the schedule's latest whole interval.",
)
@click.argument("pipeline", metavar="PIPELINE")
@click.option("--partition", type=IsoDate(), default=None, help="one partition: its interval's start")
@click.option("--from", "since", type=IsoDate(), default=None, help="every partition starting at or after this")
@click.option("--to", "until", type=IsoDate(), default=None, help="... and before this")
@click.option("--input-prefix", metavar="S3URI", help="an unscheduled pipeline's input (its first step's)")
@click.option("--model-version", help="the model_version Param (default: the spec's model.version)")
@click.option("--instance-count", type=click.IntRange(min=1), default=None, help="the instance_count Param")
@click.option("--no-sample", is_flag=True, help="quote from history only: never run a sample here")
@click.pass_obj
def quote(
    options: Globals,
    pipeline: str,
    partition: dt.datetime | None,
    since: dt.datetime | None,
    until: dt.datetime | None,
    input_prefix: str | None,
    model_version: str | None,
    instance_count: int | None,
    no_sample: bool,
) -> Reply:
    """Quote a pipeline's partitions before they run."""
    from shardline.oncall.errors import BadRequest
    from shardline.oncall.tune import sample_rates
    from shardline.orchestration import quote as quoting
    from shardline.spec import SpecError, data_interval, intervals_between

    spec, _ = options.pipeline_step(pipeline, None)
    scheduled = spec.schedule not in (None, "@once")
    if partition and (since or until):
        raise BadRequest("give --partition, or --from and --to, not both")
    if bool(since) != bool(until):
        raise BadRequest("--from and --to go together")
    if not scheduled:
        if partition or since:
            raise BadRequest(f"{pipeline} has no schedule, so no partitions: quote its run of --input-prefix")
        partitions: list = [None]
    elif since:
        partitions = [start for start, _ in intervals_between(spec.schedule, since, until)]
        if not partitions:
            window = f"{since:%Y-%m-%dT%H:%M} to {until:%Y-%m-%dT%H:%M}"
            raise BadRequest(f"no interval of {spec.schedule} starts from {window}")
    else:
        partitions = [partition or data_interval(spec.schedule, dt.datetime.now(dt.UTC))[0]]
    try:
        found = quoting.quote(
            spec,
            partitions,
            model_version=model_version,
            input_prefix=input_prefix,
            instance_count=instance_count,
            sampler=None if no_sample else sample_rates,
        )
    except (quoting.QuoteError, SpecError) as err:
        raise BadRequest(str(err)) from err
    return Reply(quoting.quote_data(found), functools.partial(print_lines, quoting.quote_lines(found)))
