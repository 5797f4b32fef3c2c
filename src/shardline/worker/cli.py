"""Command line of the worker: ``python -m shardline.worker``.

Defaults follow the SageMaker Processing contract, so inside a processing job the
command needs no arguments at all.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from shardline import contract
from shardline.ledger.context import LedgerConfigError, LedgerContext
from shardline.ledger.states import FileStatus, ShardStatus
from shardline.worker import __version__, devices, formats
from shardline.worker.errors import (
    EXIT_FENCED,
    EXIT_FILES_FAILED,
    EXIT_OK,
    EXIT_SETUP_ERROR,
    EXIT_TERMINATED,
    SetupError,
)
from shardline.worker.ledger_pump import RETRY_BUDGET_SECONDS, LedgerPump
from shardline.worker.models import prepare_model
from shardline.worker.process import JobSettings
from shardline.worker.runner import FileReport, Hooks, Runner, Stopped
from shardline.worker.sagemaker_script import JSON_LAYOUTS, ScriptProtocol, check_requirements
from shardline.worker.work_units import InputFile, discover_inputs, plan_units

log = logging.getLogger("shardline.worker")

SM_INPUT, SM_MODEL, SM_OUTPUT = contract.DATA_DIR, contract.MODEL_DIR, contract.OUTPUT_DIR
SM_RESOURCE_CONFIG = contract.RESOURCE_CONFIG
MANIFEST_DIR = contract.METADATA_FOLDER

EPILOG = f"""\
exit codes:
  {EXIT_OK}  every file succeeded (or there was nothing to do)
  {EXIT_FILES_FAILED}  some files failed; the others were written (see the manifest)
  {EXIT_SETUP_ERROR}  nothing ran: bad model, bad arguments or an integrity check failed
  {EXIT_FENCED}  a newer attempt owns this step; this instance stopped
  {EXIT_TERMINATED}  stopped by SIGTERM (temporary outputs removed)

environment:
  SHARDLINE_MODEL_SHA256   pinned sha256 of the model artifact (same as --model-sha256)
  SHARDLINE_LEDGER_TABLE   DynamoDB table for file status and heartbeats; with it set,
                           SHARDLINE_PIPELINE, SHARDLINE_RUN_ID, SHARDLINE_STEP and
                           SHARDLINE_ATTEMPT are required. Unset: standalone, no AWS calls.
  AWS_ENDPOINT_URL         endpoint override (the embedded local stack sets it)

Each output is written under a temporary name and renamed when complete, and each
instance writes {MANIFEST_DIR}/attempt-NNNN/manifest-HOST.json (in a pipeline; else
{MANIFEST_DIR}/manifest-HOST.json) under the output dir with per-file rows
and checksums.

example:
  python -m shardline.worker --input-dir data/ --output-dir out/ --model-dir model/ \\
      --passthrough id --workers 2
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shardline.worker",
        description="Run batch inference over every file in an input directory, using every core "
        "(or one worker per GPU), and write one output per input.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    io = p.add_argument_group("locations (SageMaker Processing defaults)")
    io.add_argument("--input-dir", type=Path, default=Path(SM_INPUT), help=f"input files (default {SM_INPUT})")
    io.add_argument("--output-dir", type=Path, default=Path(SM_OUTPUT), help=f"outputs (default {SM_OUTPUT})")
    io.add_argument("--manifest-dir", type=Path, default=None,
                    help=f"where this instance's manifest goes (default: {MANIFEST_DIR}/ under the output dir); "
                         "pipelines with output.metadata_prefix set it, to keep it out of the data prefix")
    io.add_argument("--model-dir", type=Path, default=Path(SM_MODEL),
                    help=f"the model or model.tar.gz (default {SM_MODEL})")
    io.add_argument("--resource-config", type=Path, default=Path(SM_RESOURCE_CONFIG),
                    help=f"host identity (default {SM_RESOURCE_CONFIG}; the hostname when absent)")
    io.add_argument("--host", help="this instance's name, overriding the resource config")
    io.add_argument("--scratch-dir", type=Path, default=Path(tempfile.gettempdir()) / "shardline",
                    help="where model.tar.gz is unpacked (default %(default)s)")

    data = p.add_argument_group("data")
    data.add_argument("--features", type=_columns, default=None,
                      help="comma-separated feature columns (default: every numeric non-passthrough column)")
    data.add_argument("--passthrough", type=_columns, default=(),
                      help="comma-separated columns copied to the output beside the prediction, e.g. id")
    data.add_argument("--output-format", choices=["same", "parquet", "csv", "jsonl"], default="same",
                      help="output format (default: the input's own format and compression)")
    data.add_argument("--probabilities", action="store_true",
                      help="also write proba_<class> columns (classifiers with predict_proba)")
    data.add_argument("--batch-rows", type=_positive, default=65536,
                      help="rows per record batch on CPU (default %(default)s)")
    data.add_argument("--gpu-batch-rows", type=_positive, default=262144,
                      help="rows per record batch on a GPU (default %(default)s)")

    model = p.add_argument_group("model")
    model.add_argument("--model-sha256", default=os.environ.get("SHARDLINE_MODEL_SHA256"),
                       help="refuse the model unless its artifact has this sha256 (env SHARDLINE_MODEL_SHA256)")
    model.add_argument("--allow-nan-predictions", action="store_true",
                       help="write NaN predictions instead of failing the file (spec: model.allow_nan_predictions)")

    script = p.add_argument_group(
        "custom inference.py (SageMaker-style code/inference.py; see README 'Bring your own inference.py')")
    script.add_argument("--content-type", default=None,
                        help="request body given to input_fn: text/csv (default), application/json, "
                             "application/jsonlines or application/x-npy (spec: model.content_type)")
    script.add_argument("--accept", default=None,
                        help="accept type given to output_fn, and how its response is read (default: the content "
                             "type; spec: model.accept)")
    script.add_argument("--batch-strategy", choices=["multi-record", "single-record"], default=None,
                        help="records per call: as many as fit --batch-rows and --max-payload-mb (multi-record, "
                             "default) or one (single-record), like Batch Transform's BatchStrategy "
                             "(spec: model.batch_strategy)")
    script.add_argument("--json-layout", choices=list(JSON_LAYOUTS), default=None,
                        help="application/json bodies: records (default; objects keyed by column name), "
                             "instances ({\"instances\": [[...]]}) or array ([[...]]) (spec: model.json_layout)")
    script.add_argument("--max-payload-mb", type=float, default=None,
                        help="largest request body, like Batch Transform's MaxPayloadInMB (default 6; "
                             "spec: model.max_payload_mb)")
    script.add_argument("--csv-header", action="store_true", default=None,
                        help="start each text/csv body with a header line of column names (spec: model.csv_header)")

    par = p.add_argument_group("parallelism")
    par.add_argument("--workers", type=_positive, default=None,
                     help="worker processes (default: one per core, or one per GPU for GPU models)")
    par.add_argument("--threads-per-worker", type=_positive, default=None,
                     help="native threads per worker (default: cores / workers)")
    par.add_argument("--no-gpu", action="store_true", help="ignore GPUs even if present")
    par.add_argument("--inflight-per-worker", type=_positive, default=2,
                     help="work units queued per worker (default %(default)s)")
    par.add_argument("--max-worker-crashes", type=_positive, default=2,
                     help="a file that kills its worker this many times is failed as poison (default %(default)s)")

    ops = p.add_argument_group("reporting")
    ops.add_argument("--progress-interval", type=float, default=5.0,
                     help="seconds between progress lines (default %(default)s)")
    ops.add_argument("--heartbeat-interval", type=float, default=30.0,
                     help="seconds between ledger heartbeats (default %(default)s)")
    ops.add_argument("--ledger-retry-seconds", type=float, default=RETRY_BUDGET_SECONDS,
                     help="while the ledger's endpoint fails, keep its writes this long before dropping them "
                          "(the files stay unfinished and the sensor retries them; default %(default)s)")
    ops.add_argument("--summary-json", type=Path, help="also write the job summary to this file")
    ops.add_argument("--exit-zero-on-file-failures", action="store_true",
                     help=f"exit {EXIT_OK} instead of {EXIT_FILES_FAILED} when only some files failed. Pipelines set "
                          "it: a SageMaker job that exits non-zero is Failed, and its outputs may not be uploaded, "
                          "while the failed files are already recorded in the ledger and the manifest")
    ops.add_argument("--preview", type=_positive, default=None, metavar="ROWS",
                     help="run the model on the first ROWS rows of the first input file and print the features as "
                          "the model gets them, the predictions and warnings about the setup; writes no output")
    ops.add_argument("--preview-json", type=Path, default=None, help="with --preview: also write it as JSON here")
    ops.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--version", action="version", version=f"shardline-worker {__version__}")
    return p


def _columns(value: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of column names")
    return names


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from err
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {number}")
    return number


def resolve_host(resource_config: Path, override: str | None) -> tuple[str, list[str]]:
    """This instance's name and all hosts of the job, from SageMaker's resourceconfig.json."""
    if override:
        return override, [override]
    if resource_config.is_file():
        config = json.loads(resource_config.read_text())
        return config["current_host"], list(config.get("hosts", [config["current_host"]]))
    host = socket.gethostname()
    return host, [host]


class _LedgerHooks(Hooks):
    """Mirrors file status and heartbeats into the ledger, through the background pump."""

    def __init__(self, ledger, pump: LedgerPump, files_assigned: int, interval: float):
        self.ledger, self.pump = ledger, pump
        self.files_assigned = files_assigned
        self.runner: Runner | None = None  # set once the runner exists; its counter feeds the heartbeat
        self.interval = interval
        self.done = self.failed = 0
        self.next_beat = 0.0
        # The ledger is the commit point of an output: written here, kept only once its SUCCEEDED
        # record has landed (set from the pump's thread; a set add is atomic under the GIL).
        self.outputs: dict[str, str] = {}
        self.committed: set[str] = set()

    def file_started(self, report: FileReport) -> None:
        self.pump.put(lambda: self.ledger.claim_file(report.input), f"claim {report.input}")

    def file_finished(self, report: FileReport) -> None:
        self.done += 1
        self.failed += report.status is FileStatus.FAILED
        outcome = report.ledger_outcome(self.ledger.context.output_key(report.output) if report.output else None)
        if report.output:
            self.outputs[report.input] = report.output

        def finish() -> None:
            self.ledger.finish_file(report.input, outcome)
            self.committed.add(report.input)

        self.pump.put(finish, f"finish {report.input}")

    def withdraw_uncommitted(self, output_dir: Path) -> int:
        """Delete the outputs whose success the ledger never accepted, so they are never uploaded.

        Their files are either owned by a newer attempt (this instance was fenced: a zombie's
        output must not replace the newer attempt's) or still unfinished in the ledger (the
        endpoint was unreachable), and the sensor retries them. Returns how many were withdrawn.
        """
        withdrawn = 0
        for source, output in self.outputs.items():
            if source not in self.committed:
                with contextlib.suppress(FileNotFoundError):
                    (output_dir / output).unlink()
                    withdrawn += 1
        if withdrawn:
            log.warning("withdrew %d output(s) whose success the ledger did not accept (%s); the files stay "
                        "unfinished or belong to a newer attempt, which writes them", withdrawn,
                        self.pump.fenced_reason or f"{self.pump.errors} ledger write(s) failed")
        return withdrawn

    def beat(self, status: ShardStatus) -> None:
        rows = self.runner.rows_done.value if self.runner else 0
        counts = dict(files_assigned=self.files_assigned, files_done=self.done, files_failed=self.failed,
                      rows_done=rows)
        self.pump.put(lambda: self.ledger.heartbeat(status, **counts), "heartbeat")

    def poll(self) -> str | None:
        now = time.monotonic()
        if now >= self.next_beat:
            self.next_beat = now + self.interval
            self.beat(ShardStatus.RUNNING)
        return self.pump.fenced_reason if self.pump.fenced.is_set() else None


def log_format(host: str, context: LedgerContext | None) -> str:
    tag = host if context is None else f"{host} {context.pipeline}/{context.run_id} step={context.step} " \
                                      f"attempt={context.attempt}"
    return f"%(asctime)s %(levelname)s [{tag}] %(message)s"


def configure_logging(level: str, host: str, context: LedgerContext | None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(log_format(host, context)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    logging.getLogger("pynamodb").setLevel(logging.WARNING)


class Terminated(Exception):
    """SIGTERM arrived (SageMaker's StopProcessingJob, or the local backend's stop)."""


def _terminate(signum: int, _frame) -> None:
    raise Terminated(f"received signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Turn SIGTERM into an exception, so the pool is stopped and temp files are swept.
    signal.signal(signal.SIGTERM, _terminate)
    host, hosts = resolve_host(args.resource_config, args.host)
    try:
        context = LedgerContext.from_env(os.environ)
    except LedgerConfigError as err:
        configure_logging(args.log_level, host, None)
        log.error("%s", err)
        return EXIT_SETUP_ERROR
    configure_logging(args.log_level, host, context)
    try:
        return run_job(args, host, hosts, context)
    except SetupError as err:
        log.error("setup failed, nothing was processed: %s", err)
        return EXIT_SETUP_ERROR
    except Terminated as err:
        log.error("stopped: %s. Outputs already renamed into place are complete; no partial output remains.",
                  err)
        return EXIT_TERMINATED


def run_job(args: argparse.Namespace, host: str, hosts: list[str], context: LedgerContext | None) -> int:
    started_wall = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    if not args.input_dir.is_dir():
        raise SetupError(f"input directory {args.input_dir} does not exist; pass --input-dir")
    files, ignored = discover_inputs(args.input_dir)
    if ignored:
        log.warning("ignoring %d file(s) of unknown format, e.g. %s (readable: .parquet, .csv, .jsonl, "
                    "each optionally .gz)", len(ignored), ", ".join(ignored[:3]))
    artifact = prepare_model(args.model_dir, args.model_sha256, args.scratch_dir)
    if not (args.model_sha256 or "").strip():
        log.warning("the model is NOT pinned (no --model-sha256 / SHARDLINE_MODEL_SHA256; its sha256 is %s): "
                    "whoever can write the model's S3 prefix chooses the code this job runs. Pin it in the spec "
                    "with model.sha256 or model.versions", artifact.sha256)
    protocol = script_protocol(args, artifact.kind)
    if artifact.kind == "custom":
        report_requirements(Path(artifact.path))
    if args.preview:
        from shardline.worker.preview import run_preview

        return run_preview(args, files, artifact, protocol, log_format(host, context))
    gpus = [] if args.no_gpu else devices.visible_gpus(os.environ, devices.detect_gpu_count())
    slots = devices.plan_slots(
        cpu_count=devices.cpu_count(), gpus=gpus, model_kind=artifact.kind, workers=args.workers,
        threads_per_worker=args.threads_per_worker, use_gpu=not args.no_gpu,
    )
    args.output_dir.mkdir(parents=True, exist_ok=True)
    removed = _sweep_temp_files(args.output_dir)
    if removed:
        log.info("removed %d incomplete output(s) left by an earlier run", removed)

    ledger = None
    if context:
        from shardline.ledger.job_writes import WorkerLedger  # pynamodb loads only when a ledger is configured

        ledger = WorkerLedger(context, host)
    pump = LedgerPump(retry_budget_seconds=args.ledger_retry_seconds) if ledger else None

    # Parquet footers give exact row counts (for the ETA) and row-group sizes (for splitting).
    metadata = {f.relative_path: _parquet_meta(f) for f in files if f.fmt == "parquet" and not f.gzipped}
    known_rows = None
    if files and len(metadata) == len(files) and all(m is not None for m in metadata.values()):
        known_rows = sum(m[0] for m in metadata.values())
    units = plan_units(files, len(slots), lambda f: (metadata.get(f.relative_path) or (0, []))[1])
    split = sorted({u.file.relative_path for u in units if u.is_split})
    workers_desc = _describe_slots(slots)
    log.info("%d input file(s), %s, %d work unit(s)%s; %s; model %s", len(files), _human_bytes(
        sum(f.size for f in files)), len(units), f" ({len(split)} large file(s) split by row group)" if split
        else "", workers_desc, artifact.kind)

    settings = JobSettings(
        artifact=artifact, output_dir=str(args.output_dir), scratch_dir=str(args.scratch_dir),
        features=args.features, passthrough=args.passthrough, batch_rows=args.batch_rows,
        gpu_batch_rows=args.gpu_batch_rows, output_format=args.output_format,
        probabilities=args.probabilities, protocol=protocol, allow_nan_predictions=args.allow_nan_predictions,
        log_format=log_format(host, context),
    )
    hooks = _LedgerHooks(ledger, pump, len(files), args.heartbeat_interval) if ledger else Hooks()
    runner = Runner(settings, slots, inflight_per_worker=args.inflight_per_worker,
                    max_crashes=args.max_worker_crashes, progress_interval=args.progress_interval,
                    hooks=hooks)
    if ledger:
        hooks.runner = runner

    reports: list[FileReport] = []
    try:
        if units:
            reports = runner.run(units, total_rows=known_rows)
        else:
            log.warning("no input files under %s: nothing to do", args.input_dir)
    except Stopped as err:
        log.error("stopping: %s. Outputs already renamed into place are complete; nothing else was "
                  "written.", err)
        if pump:
            pump.close()
            hooks.withdraw_uncommitted(args.output_dir)
        return EXIT_FENCED
    except SetupError:
        if ledger:
            hooks.beat(ShardStatus.FAILED)
            pump.close()
        raise
    finally:
        _sweep_temp_files(args.output_dir)
        if pump and sys.exc_info()[0] is not None:
            pump.close()  # flush what finished before the error, e.g. on SIGTERM
            hooks.withdraw_uncommitted(args.output_dir)

    seconds = time.monotonic() - started
    failed = [r for r in reports if r.status is FileStatus.FAILED]
    summary = _summary(reports, seconds, slots, artifact, host, hosts, runner, started_wall)
    if ledger:
        hooks.beat(ShardStatus.PARTIAL if failed else ShardStatus.SUCCEEDED)
        pump.close()
        hooks.withdraw_uncommitted(args.output_dir)
        if pump.fenced.is_set():
            return EXIT_FENCED  # no manifest: a newer attempt owns this step's record of the run
        summary["withdrawn_outputs"] = sorted(o for i, o in hooks.outputs.items() if i not in hooks.committed)
    summary["attempt"] = context.attempt if context else None  # the manifest and --summary-json say the same
    manifest_path = _write_manifest(args.manifest_dir or args.output_dir / MANIFEST_DIR, host, summary,
                                    summary["attempt"])
    _log_summary(summary, failed, manifest_path)
    if args.summary_json:
        args.summary_json.parent.mkdir(parents=True, exist_ok=True)
        args.summary_json.write_text(json.dumps(summary, indent=2))
    if failed and args.exit_zero_on_file_failures:
        log.warning("%d file(s) failed; exiting %d as --exit-zero-on-file-failures asks", len(failed), EXIT_OK)
        return EXIT_OK
    return EXIT_FILES_FAILED if failed else EXIT_OK


def script_protocol(args: argparse.Namespace, kind: str) -> ScriptProtocol:
    """The custom-code protocol from the flags (validated: a bad value is a setup error naming the flag)."""
    given = {
        "content_type": args.content_type,
        "accept": args.accept,
        "batch_strategy": args.batch_strategy.replace("-", "_") if args.batch_strategy else None,
        "json_layout": args.json_layout,
        "max_payload_mb": args.max_payload_mb,
        "csv_header": args.csv_header,
    }
    given = {name: value for name, value in given.items() if value is not None}
    protocol = ScriptProtocol(**given)
    if kind != "custom" and given:
        log.warning("%s appl%s only to a custom inference.py; ignored for this %s model",
                    ", ".join(f"--{n.replace('_', '-')}" for n in given), "ies" if len(given) == 1 else "y", kind)
    if kind == "custom":
        log.info("custom inference.py: requests are %s", protocol.describe())
    return protocol


def report_requirements(script: Path) -> None:
    """code/requirements.txt is never installed at run time: say so, and what the image lacks."""
    requirements = script.parent / "requirements.txt"
    if not requirements.is_file():
        return
    unmet = check_requirements(str(script))
    if unmet:
        log.warning("%s is not installed at run time (the worker image is the pinned environment), and the image "
                    "does not meet: %s. Build these into the image (inference_container/Dockerfile) and pin it",
                    requirements, "; ".join(unmet))
    else:
        log.info("%s is not installed at run time; the image already meets every line of it", requirements)


def _sweep_temp_files(output_dir: Path) -> int:
    """Delete temp outputs (never complete by construction) left under the output dir."""
    removed = 0
    for path in output_dir.rglob(f"*{formats.TEMP_MARKER}"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def _parquet_meta(file: InputFile) -> tuple[int, list[int]] | None:
    """(rows, row-group sizes) from a parquet footer; None if unreadable (the worker reports why)."""
    try:
        meta = pq.read_metadata(file.path)
    except (OSError, ValueError):
        return None
    return meta.num_rows, [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]


def _describe_slots(slots: list[devices.WorkerSlot]) -> str:
    gpus = [s for s in slots if s.gpu is not None]
    kind = f"{len(gpus)} GPU worker(s)" if gpus else f"{len(slots)} CPU worker(s)"
    return f"{kind} x {slots[0].threads} thread(s)"


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _summary(reports, seconds, slots, artifact, host, hosts, runner, started_wall) -> dict:
    rows_in = sum(r.rows_in for r in reports)
    rows_out = sum(r.rows_out for r in reports if r.status is FileStatus.SUCCEEDED)
    return {
        "host": host,
        "hosts": hosts,
        "started_at": started_wall.isoformat(),
        "seconds": round(seconds, 3),
        "model": {"kind": artifact.kind, "sha256": artifact.sha256},
        "features": [
            {"source": c.source, "columns": list(c.columns), "unused": list(c.unused), "units": units}
            for c, units in runner.feature_choices.items()
        ],
        "workers": [dataclasses.asdict(s) for s in slots],
        "pool_starts": runner.pool_starts,
        "startup_seconds": None if runner.startup_seconds is None else round(runner.startup_seconds, 3),
        "files": len(reports),
        "succeeded": sum(r.status is FileStatus.SUCCEEDED for r in reports),
        "failed": sum(r.status is FileStatus.FAILED for r in reports),
        "rows_in": rows_in,
        "rows_out": rows_out,
        "rows_per_second": round(rows_in / seconds, 1) if seconds > 0 else 0.0,
        "file_reports": [
            {**dataclasses.asdict(r), "status": r.status.value} for r in reports
        ],
    }


def manifest_path(folder: Path, host: str, attempt: int | None) -> Path:
    """Each attempt's instances write their own manifests under ``folder`` (``<output>/_shardline``, or
    ``--manifest-dir``), so a resubmission never overwrites the record of the files an earlier attempt
    wrote (a worker run outside a pipeline has no attempt)."""
    return (folder / f"attempt-{attempt:04d}" if attempt is not None else folder) / f"manifest-{host}.json"


def _write_manifest(folder: Path, host: str, summary: dict, attempt: int | None) -> Path:
    """Write this instance's manifest atomically: a reader sees the old one or the new one."""
    path = manifest_path(folder, host, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + formats.TEMP_MARKER)
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, path)
    return path


def _log_summary(summary: dict, failed: list[FileReport], manifest_path: Path) -> None:
    log.info(
        "summary: %d file(s): %d succeeded, %d failed | rows in %s, rows out %s | %.1fs, %s rows/s | "
        "startup %s | pool started %d time(s) | manifest %s",
        summary["files"], summary["succeeded"], summary["failed"], f"{summary['rows_in']:,}",
        f"{summary['rows_out']:,}", summary["seconds"], f"{summary['rows_per_second']:,.0f}",
        "n/a" if summary["startup_seconds"] is None else f"{summary['startup_seconds']:.2f}s",
        summary["pool_starts"], manifest_path,
    )
    for report in failed:
        log.error("failed: %s: %s: %s", report.input, report.error_class, report.error_message)
