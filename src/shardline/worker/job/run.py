"""One instance's job: find its files, load the model, run them over the pool, report.

:func:`run_job` is what ``python -m shardline.worker`` runs once its arguments are parsed and
its logging is set up (``worker/job/cli.py``); the pool itself is ``worker/pool/runner.py``, the
summary and manifest ``worker/job/summary.py``, the ledger's side ``worker/job/ledger_hooks.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import time
from pathlib import Path

from shardline import contract
from shardline.contract import EXIT_FENCED, EXIT_FILES_FAILED, EXIT_OK
from shardline.errors import SetupError
from shardline.ledger.context import LedgerContext
from shardline.ledger.states import FileStatus, ShardStatus
from shardline.worker import STARTED_AT
from shardline.worker.io import formats
from shardline.worker.io.work_units import InputFile, WorkUnit, discover_inputs, plan_units
from shardline.worker.job.ledger_hooks import LedgerHooks
from shardline.worker.job.summary import (
    build_summary,
    describe_slots,
    human_bytes,
    log_summary,
    process_started_at,
    write_manifest,
)
from shardline.worker.job.uploads import OutputUploader
from shardline.worker.model.loading import ModelArtifact, check_probabilities, prepare_model
from shardline.worker.model.script_codec import ScriptProtocol
from shardline.worker.model.script_runner import check_requirements
from shardline.worker.pool import devices
from shardline.worker.pool.process import JobSettings
from shardline.worker.pool.runner import FileResult, Hooks, PoolOptions, Runner, Stopped, Terminated
from shardline.worker.tools.preview import run_preview
from shardline.worker.tools.tune import run_tune

log = logging.getLogger("shardline.worker")


def run_job(
    args: argparse.Namespace, host: str, hosts: list[str], context: LedgerContext | None, log_format: str
) -> int:
    """Run every input file of this instance and return the worker's exit code."""
    launched_at = process_started_at()
    started_wall = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    files, artifact, protocol = _inputs_and_model(args, context)
    if args.preview:
        readable = [f for f in files if not f.refusal]
        if files and not readable:
            raise SetupError(f"no input file to preview can be read: {files[0].refusal}")
        return run_preview(args, readable, job_settings(args, artifact, protocol, log_format))
    if args.tune:
        return run_tune(args, files, artifact, job_settings(args, artifact, protocol, log_format))
    gpus = [] if args.no_gpu else devices.visible_gpus(os.environ, devices.detect_gpu_count())
    slots = devices.plan_slots(
        cpu_count=devices.cpu_count(),
        gpus=gpus,
        model_kind=artifact.kind,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        use_gpu=not args.no_gpu,
    )
    settings = job_settings(args, artifact, protocol, log_format)
    runner = Runner(settings, slots, PoolOptions.from_args(args))
    if files:
        # The workers load the model while this process reads the footers and opens the ledger.
        runner.start()
    try:
        units, known_rows, hooks = _prepare(args, files, slots, artifact.kind, context, host)
    except BaseException:
        runner.close()
        raise
    runner.hooks = hooks
    if isinstance(hooks, LedgerHooks):
        hooks.runner = runner

    results = _run_units(args, runner, units, known_rows, hooks)
    if results is None:
        return EXIT_FENCED  # told to stop: the log says why
    if hooks.fenced:
        return EXIT_FENCED  # no manifest: a newer attempt owns this step's record of the run

    summary = build_summary(
        results,
        seconds=time.monotonic() - started,
        slots=slots,
        artifact=artifact,
        host=host,
        hosts=hosts,
        runner=runner,
        started_wall=started_wall,
        launched_at=launched_at,
    )
    return _sum_up(args, summary, results, hooks, context, host)


def headerless_csv_names(args: argparse.Namespace) -> tuple[str, ...] | None:
    """For CSV files without a header line (--input-csv-header false): their columns' names by position, which
    --features gives, passthrough columns included. ``args.features`` then keeps only the model's features."""
    if args.input_csv_header != "false":
        return None
    names = args.features
    if not isinstance(names, tuple):
        raise SetupError(
            "input.csv_header is false (--input-csv-header false), so nothing in the files names their columns: "
            "name them, in order, with input.features (--features a,b,c; file_order has no names to take)"
        )
    strays = [name for name in args.passthrough if name not in names]
    if strays:
        raise SetupError(
            f"passthrough column(s) {', '.join(strays)} are not in input.features, which names a headerless CSV's "
            "columns by position: list them there too, in their places"
        )
    args.features = tuple(name for name in names if name not in args.passthrough)
    if not args.features:
        raise SetupError("input.features names only passthrough columns: name the model's features too")
    return names


def _inputs_and_model(
    args: argparse.Namespace, context: LedgerContext | None
) -> tuple[list[InputFile], ModelArtifact, ScriptProtocol]:
    """This instance's input files, its verified model, and how a custom script gets its records."""
    if not args.input_dir.is_dir():
        raise SetupError(f"input directory {args.input_dir} does not exist; pass --input-dir")
    # In a pipeline every file in the input dir was planned for this instance, so one the worker
    # cannot read fails with its reason instead of being skipped (and retried as never claimed).
    args.csv_names = headerless_csv_names(args)
    files, ignored = discover_inputs(
        args.input_dir,
        args.input_format,
        refuse_unknown=context is not None,
        csv_names=args.csv_names,
        trust_header=args.input_csv_header == "true",
    )
    if ignored:
        log.warning(
            "ignoring %d file(s) of unknown format, e.g. %s (readable: .parquet, .csv, .jsonl, "
            "each optionally .gz; or name the format with --input-format)",
            len(ignored),
            ", ".join(ignored[:3]),
        )
    artifact = prepare_model(args.model_dir, args.model_sha256, args.scratch_dir)
    if not (args.model_sha256 or "").strip():
        log.warning(
            "the model is NOT pinned (no --model-sha256 / SHARDLINE_MODEL_SHA256; its sha256 is %s): "
            "whoever can write the model's S3 prefix chooses the code this job runs. Pin it in the spec "
            "with model.sha256 or model.versions",
            artifact.sha256,
        )
    check_probabilities(artifact.kind, args.probabilities)  # here, before any worker starts
    protocol = script_protocol(args, artifact.kind)
    if artifact.kind == "custom":
        warn_of_requirements(Path(artifact.path))
    return files, artifact, protocol


def _run_units(
    args: argparse.Namespace, runner: Runner, units: list[WorkUnit], known_rows: int | None, hooks: Hooks
) -> list[FileResult] | None:
    """Run the units over the pool: each file's report, or None when the job was told to stop."""
    results: list[FileResult] = []
    # Leaving this block flushes the ledger's writes and withdraws the outputs it refused, on every path.
    with hooks:
        try:
            if units:
                results = runner.run(units, total_rows=known_rows)
            else:
                log.warning("no input files under %s: nothing to do", args.input_dir)
        except Stopped as err:
            log.error("stopping: %s. Outputs already renamed into place are complete; nothing else was written.", err)
            return None
        except Terminated:
            hooks.beat(ShardStatus.STOPPED)  # its last heartbeat, flushed on the way out: when its bill ends
            raise
        except SetupError:
            hooks.beat(ShardStatus.FAILED)
            raise
        finally:
            sweep_temp_files(args.output_dir)
        hooks.drain()  # an output that could not go up has failed its file by now
        failed = [r for r in results if r.status is FileStatus.FAILED]
        hooks.beat(ShardStatus.PARTIAL if failed else ShardStatus.SUCCEEDED)
    return results


def _sum_up(
    args: argparse.Namespace,
    summary: dict,
    results: list[FileResult],
    hooks: Hooks,
    context: LedgerContext | None,
    host: str,
) -> int:
    """Write the manifest (and --summary-json), log the summary, and return the exit code."""
    failed = [r for r in results if r.status is FileStatus.FAILED]
    withdrawn = hooks.withdrawn_outputs()
    if withdrawn is not None:
        summary["withdrawn_outputs"] = withdrawn
    summary["attempt"] = context.attempt if context else None  # the manifest and --summary-json say the same
    manifest = write_manifest(
        args.manifest_dir or args.output_dir / contract.METADATA_FOLDER, host, summary, summary["attempt"]
    )
    if isinstance(hooks, LedgerHooks) and (uploaded := hooks.put_manifest(manifest)):
        manifest = uploaded
    log_summary(summary, failed, manifest)
    if args.summary_json:
        args.summary_json.parent.mkdir(parents=True, exist_ok=True)
        args.summary_json.write_text(json.dumps(summary, indent=2))
    if failed and args.exit_zero_on_file_failures:
        log.warning("%d file(s) failed; exiting %d as --exit-zero-on-file-failures asks", len(failed), EXIT_OK)
        return EXIT_OK
    return EXIT_FILES_FAILED if failed else EXIT_OK


def job_settings(
    args: argparse.Namespace, artifact: ModelArtifact, protocol: ScriptProtocol, log_format: str
) -> JobSettings:
    """What every pool process of this job is told (``--tune`` builds its runs from the same)."""
    return JobSettings(
        artifact=artifact,
        output_dir=str(args.output_dir),
        scratch_dir=str(args.scratch_dir),
        features=args.features,
        features_by_position=args.csv_names is not None,
        passthrough=args.passthrough,
        batch_rows=args.batch_rows,
        gpu_batch_rows=args.gpu_batch_rows,
        output_format="parquet" if args.table_columns else args.output_format,
        table_columns=args.table_columns or {},
        output_tag=args.output_tag,
        probabilities=args.probabilities,
        protocol=protocol,
        allow_nan_predictions=args.allow_nan_predictions,
        tolerate_rows=args.tolerate_rows,
        profile_inputs=args.profile_inputs,
        log_format=log_format,
    )


def _prepare(
    args: argparse.Namespace,
    files: list[InputFile],
    slots: list[devices.WorkerSlot],
    kind: str,
    context: LedgerContext | None,
    host: str,
) -> tuple[list[WorkUnit], int | None, Hooks]:
    """The work units, the rows they hold when every footer says, and the hooks of the ledger (if any)."""
    args.output_dir.mkdir(parents=True, exist_ok=True)
    removed = sweep_temp_files(args.output_dir)
    if removed:
        log.info("removed %d incomplete output(s) left by an earlier run", removed)
    # Parquet footers give exact row counts (for the ETA) and row-group sizes (for splitting).
    metadata = {f.relative_path: formats.parquet_meta(f) for f in files if f.fmt == "parquet" and not f.gzipped}
    known_rows = None
    if files and len(metadata) == len(files) and all(m is not None for m in metadata.values()):
        known_rows = sum(m[0] for m in metadata.values())
    units = plan_units(files, len(slots), lambda f: (metadata.get(f.relative_path) or (0, []))[1])
    split = sorted({u.file.relative_path for u in units if u.is_split})
    log.info(
        "%d input file(s), %s, %d work unit(s)%s; %s; model %s",
        len(files),
        human_bytes(sum(f.size for f in files)),
        len(units),
        f" ({len(split)} large file(s) split by row group)" if split else "",
        describe_slots(slots),
        kind,
    )
    hooks = Hooks()
    if context:
        from shardline.ledger.job_writes import WorkerLedger  # pynamodb loads only when a ledger is configured
        from shardline.ledger.requests import RequestCounter

        uploader, requests = None, RequestCounter()  # the instance's AWS requests, recorded with its heartbeats
        if context.output_uri.startswith("s3://"):
            # Each output goes up as its file finishes, before the ledger calls it SUCCEEDED.
            uploader = OutputUploader(args.output_dir, context.output_uri, kms_key_id=context.output_kms_key_id or None)
            requests.watch(uploader.client)
        started = dt.datetime.fromtimestamp(STARTED_AT, dt.UTC)
        hooks = LedgerHooks(
            WorkerLedger(context, host, started_at=started, requests=requests),
            files_assigned=len(files),
            heartbeat_interval=args.heartbeat_interval,
            retry_budget_seconds=args.ledger_retry_seconds,
            output_dir=args.output_dir,
            uploader=uploader,
        )
    return units, known_rows, hooks


def script_protocol(args: argparse.Namespace, kind: str) -> ScriptProtocol:
    """The custom-code protocol from the flags (validated: a bad value is a setup error naming the flag)."""
    given = {
        "content_type": args.content_type,
        "accept": args.accept,
        "batch_strategy": args.batch_strategy.replace("-", "_") if args.batch_strategy else None,
        "json_layout": args.json_layout,
        "max_payload_mb": args.max_payload_mb,
        "csv_header": args.csv_header,
        "derives_features": args.derives_features,
    }
    given = {name: value for name, value in given.items() if value is not None}
    protocol = ScriptProtocol(**given)
    if kind != "custom" and given:
        log.warning(
            "%s appl%s only to a custom inference.py; ignored for this %s model",
            ", ".join(f"--{n.replace('_', '-')}" for n in given),
            "ies" if len(given) == 1 else "y",
            kind,
        )
    if kind == "custom":
        log.info("custom inference.py: requests are %s", protocol.describe())
    return protocol


def warn_of_requirements(script: Path) -> None:
    """code/requirements.txt is never installed at run time: say so, and what the image lacks."""
    requirements = script.parent / "requirements.txt"
    if not requirements.is_file():
        return
    unmet = check_requirements(str(script))
    if unmet:
        log.warning(
            "%s is not installed at run time (the worker image is the pinned environment), and the image "
            "does not meet: %s. Build these into the image (inference_container/Dockerfile) and pin it",
            requirements,
            "; ".join(unmet),
        )
    else:
        log.info("%s is not installed at run time; the image already meets every line of it", requirements)


def sweep_temp_files(output_dir: Path) -> int:
    """Delete temp outputs (never complete by construction) left under the output dir."""
    removed = 0
    for path in output_dir.rglob(f"*{formats.TEMP_MARKER}"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
