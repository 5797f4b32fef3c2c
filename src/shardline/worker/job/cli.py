"""Command line of the worker: ``python -m shardline.worker``.

Defaults follow the SageMaker Processing contract, so inside a processing job the
command needs no arguments at all.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

from shardline import contract
from shardline.contract import (
    EXIT_FENCED,
    EXIT_FILES_FAILED,
    EXIT_OK,
    EXIT_SETUP_ERROR,
    EXIT_TERMINATED,
    FEATURES_FILE_ORDER,
    JSON_LAYOUTS,
)
from shardline.errors import SetupError
from shardline.ledger.context import LedgerConfigError, LedgerContext, StaleAttemptError
from shardline.ledger.states import ShardStatus
from shardline.worker import __version__
from shardline.worker.job.ledger_pump import RETRY_BUDGET_SECONDS
from shardline.worker.pool import forkserver
from shardline.worker.pool.runner import Terminated

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
    _add_locations(p)
    _add_data(p)
    _add_model(p)
    _add_script(p)
    _add_parallelism(p)
    ops = _add_logging_and_summary(p)
    _add_tune(p)
    # --log-level is of the reporting group, added last: the usage line lists the flags in this order.
    ops.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--version", action="version", version=f"shardline-worker {__version__}")
    return p


def _add_locations(p: argparse.ArgumentParser) -> None:
    """Where the inputs, outputs, model and scratch space are: SageMaker Processing's paths by default."""
    io = p.add_argument_group("locations (SageMaker Processing defaults)")
    io.add_argument("--input-dir", type=Path, default=Path(SM_INPUT), help=f"input files (default {SM_INPUT})")
    io.add_argument("--output-dir", type=Path, default=Path(SM_OUTPUT), help=f"outputs (default {SM_OUTPUT})")
    io.add_argument(
        "--manifest-dir",
        type=Path,
        default=None,
        help=f"where this instance's manifest goes (default: {MANIFEST_DIR}/ under the output dir); "
        "pipelines with output.metadata_prefix set it, to keep it out of the data prefix",
    )
    io.add_argument(
        "--model-dir", type=Path, default=Path(SM_MODEL), help=f"the model or model.tar.gz (default {SM_MODEL})"
    )
    io.add_argument(
        "--resource-config",
        type=Path,
        default=Path(SM_RESOURCE_CONFIG),
        help=f"host identity (default {SM_RESOURCE_CONFIG}; the hostname when absent)",
    )
    io.add_argument("--host", help="this instance's name, overriding the resource config")
    io.add_argument(
        "--scratch-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "shardline",
        help="where model.tar.gz is unpacked (default %(default)s)",
    )


def _add_data(p: argparse.ArgumentParser) -> None:
    """How the inputs are read and the outputs written."""
    data = p.add_argument_group("data")
    data.add_argument(
        "--input-format",
        choices=["parquet", "csv", "jsonl"],
        default=None,
        help="read every input as this format (spec: input.format): a file whose name says no format "
        "(part-00000, .txt, .json) is read as it, one whose name says another fails with the reason "
        "(default: each file's format from its name)",
    )
    data.add_argument(
        "--features",
        type=_features,
        default=None,
        help="comma-separated feature columns, in training order (spec: input.features). Needed for "
        "a model that records no feature names; 'file_order' takes each file's numeric "
        "non-passthrough columns in the file's order, with a warning",
    )
    data.add_argument(
        "--input-csv-header",
        choices=["auto", "true", "false"],
        default="auto",
        help="whether input CSV files start with a header line (spec: input.csv_header). auto: they do, and a "
        "first line that reads as numbers is refused as a data line; true: they do, whatever it reads like; "
        "false: none, and --features "
        "names every column of the file by position, passthrough columns included",
    )
    data.add_argument(
        "--passthrough",
        type=_columns,
        default=(),
        help="comma-separated columns copied to the output beside the prediction, e.g. id",
    )
    data.add_argument(
        "--profile-inputs",
        type=_columns,
        default=(),
        help="comma-separated input features whose values each file's profile counts, for the step's checks "
        "(spec: checks.features)",
    )
    data.add_argument(
        "--output-format",
        choices=["same", "parquet", "csv", "jsonl"],
        default="same",
        help="output format (default: the input's own format and compression)",
    )
    data.add_argument(
        "--table-columns",
        type=_table_columns,
        default=None,
        metavar="JSON",
        help='columns added to every output row, as text: the output table\'s partition, e.g. \'{"dt": "2026-12-07"}\' '
        "(spec: output.table; outputs are parquet)",
    )
    data.add_argument(
        "--output-tag",
        type=_output_tag,
        default=None,
        metavar="TAG",
        help="written into each output's name, before its extension (part-00000.TAG.parquet): a table step's run "
        "and attempt, so that no run rewrites a file a table's snapshot references",
    )
    data.add_argument(
        "--probabilities", action="store_true", help="also write proba_<class> columns (classifiers with predict_proba)"
    )
    data.add_argument(
        "--batch-rows", type=_positive, default=65536, help="rows per record batch on CPU (default %(default)s)"
    )
    data.add_argument(
        "--gpu-batch-rows", type=_positive, default=262144, help="rows per record batch on a GPU (default %(default)s)"
    )


def _add_model(p: argparse.ArgumentParser) -> None:
    """The model's pin, and whether a NaN prediction is an answer."""
    model = p.add_argument_group("model")
    model.add_argument(
        "--model-sha256",
        default=os.environ.get("SHARDLINE_MODEL_SHA256"),
        help="refuse the model unless its artifact has this sha256 (env SHARDLINE_MODEL_SHA256)",
    )
    model.add_argument(
        "--tolerate-rows",
        type=_tolerance,
        default=0,
        help="rows each file may reject, with their line numbers and reasons, instead of failing: a count, or a "
        "fraction below 1 (spec: tolerance.rows; default 0: one bad row fails its file)",
    )
    model.add_argument(
        "--allow-nan-predictions",
        action="store_true",
        help="write NaN predictions instead of failing the file (spec: model.allow_nan_predictions)",
    )


def _add_script(p: argparse.ArgumentParser) -> None:
    """How records travel to a custom inference.py and back (the spec's model.* settings)."""
    script = p.add_argument_group(
        "custom inference.py (SageMaker-style code/inference.py; see docs/worker.md, 'Bring your own inference.py')"
    )
    script.add_argument(
        "--content-type",
        default=None,
        help="request body given to input_fn: text/csv (default), application/json, "
        "application/jsonlines or application/x-npy (spec: model.content_type)",
    )
    script.add_argument(
        "--accept",
        default=None,
        help="accept type given to output_fn, and how its response is read (default: "
        "application/json, as SageMaker's inference toolkit; spec: model.accept)",
    )
    script.add_argument(
        "--batch-strategy",
        choices=["multi-record", "single-record"],
        default=None,
        help="records per call: as many as fit --batch-rows and --max-payload-mb (multi-record, "
        "default) or one (single-record), like Batch Transform's BatchStrategy "
        "(spec: model.batch_strategy)",
    )
    script.add_argument(
        "--json-layout",
        choices=list(JSON_LAYOUTS),
        default=None,
        help="application/json bodies: records (default; objects keyed by column name), "
        'instances ({"instances": [[...]]}), inputs ({"inputs": [[...]]}, as Hugging '
        "Face-style handlers read), array ([[...]]) or lines (an object per line, labelled application/json, "
        "as Batch Transform sends a JSON lines file) (spec: model.json_layout)",
    )
    script.add_argument(
        "--max-payload-mb",
        type=float,
        default=None,
        help="largest request body, like Batch Transform's MaxPayloadInMB (default 6; spec: model.max_payload_mb)",
    )
    script.add_argument(
        "--csv-header",
        action="store_true",
        default=None,
        help="start each text/csv body with a header line of column names (spec: model.csv_header)",
    )
    script.add_argument(
        "--derives-features",
        action="store_true",
        default=None,
        help="the script computes the model's features itself from the columns --features names, so those need "
        "not be the names the model recorded (spec: model.derives_features)",
    )


def _add_parallelism(p: argparse.ArgumentParser) -> None:
    """Workers, threads, GPUs, how the pool starts, and when a file is poison."""
    par = p.add_argument_group("parallelism")
    par.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="worker processes (default: one per core, or one per GPU for GPU models)",
    )
    par.add_argument(
        "--threads-per-worker",
        type=_positive,
        default=None,
        help="native threads per worker (default: cores / workers)",
    )
    par.add_argument("--no-gpu", action="store_true", help="ignore GPUs even if present")
    par.add_argument(
        "--start-method",
        choices=["auto", "forkserver", "spawn"],
        default="auto",
        help="how the pool starts its workers. auto (default): CPU workers fork from a forkserver that "
        "loaded the model once, GPU workers spawn; spawn: each worker imports the library and "
        "loads the model itself (slower to start; for a model library that misbehaves after fork)",
    )
    par.add_argument(
        "--inflight-per-worker", type=_positive, default=2, help="work units queued per worker (default %(default)s)"
    )
    par.add_argument(
        "--max-worker-crashes",
        type=_positive,
        default=2,
        help="a file that kills its worker this many times is failed as poison (default %(default)s)",
    )


def _add_logging_and_summary(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Progress, heartbeats, the summary, the exit code, the preview; the group, for --log-level."""
    ops = p.add_argument_group("reporting")
    ops.add_argument(
        "--progress-interval", type=float, default=5.0, help="seconds between progress lines (default %(default)s)"
    )
    ops.add_argument(
        "--heartbeat-interval", type=float, default=30.0, help="seconds between ledger heartbeats (default %(default)s)"
    )
    ops.add_argument(
        "--ledger-retry-seconds",
        type=float,
        default=RETRY_BUDGET_SECONDS,
        help="while the ledger's endpoint fails, keep its writes this long before dropping them "
        "(the files stay unfinished and the watch task retries them; default %(default)s)",
    )
    ops.add_argument("--summary-json", type=Path, help="also write the job summary to this file")
    ops.add_argument(
        "--exit-zero-on-file-failures",
        action="store_true",
        help=f"exit {EXIT_OK} instead of {EXIT_FILES_FAILED} when only some files failed. Pipelines set "
        "it: a SageMaker job that exits non-zero is Failed, and its outputs may not be uploaded, "
        "while the failed files are already recorded in the ledger and the manifest",
    )
    ops.add_argument(
        "--preview",
        type=_positive,
        default=None,
        metavar="ROWS",
        help="run the model on the first ROWS rows of the first input file and print the features as "
        "the model gets them, the predictions and warnings about the setup; writes no output",
    )
    ops.add_argument("--preview-json", type=Path, default=None, help="with --preview: also write it as JSON here")
    return ops


def _add_tune(p: argparse.ArgumentParser) -> None:
    """``--tune`` and its settings."""
    tune = p.add_argument_group("auto-tune (--tune; see docs/auto-tune.md)")
    tune.add_argument(
        "--tune",
        action="store_true",
        help="instead of the job: run the worker repeatedly on a sample of the inputs (the first files "
        "up to --tune-rows rows), sweeping workers x threads and rows per batch (GPU batch rows on "
        "a GPU); print rows/s per setting and the spec snippet to paste; writes no output",
    )
    tune.add_argument(
        "--tune-rows", type=_positive, default=200_000, metavar="N", help="rows of the sample (default %(default)s)"
    )
    tune.add_argument(
        "--tune-out",
        type=Path,
        default=Path("shardline-tune"),
        metavar="DIR",
        help="where the plot (tune.png) and the figures (tune.json) go (default %(default)s)",
    )
    tune.add_argument(
        "--tune-repeat",
        type=_positive,
        default=2,
        metavar="K",
        help="runs of each setting, to show the noise (default %(default)s)",
    )
    tune.add_argument(
        "--tune-max-batch-rows",
        type=_positive,
        default=1 << 20,
        metavar="N",
        help="the largest rows per batch tried (default %(default)s)",
    )
    tune.add_argument("--tune-step", default=None, metavar="NAME", help="the step's name, for the spec snippet")


def _columns(value: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of column names")
    return names


def _table_columns(value: str) -> dict[str, str]:
    import json
    import re

    try:
        columns = json.loads(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a JSON object of column names to text values: {err}") from None
    if not isinstance(columns, dict) or not columns:
        raise argparse.ArgumentTypeError("expected a JSON object of column names to text values")
    for name, text in columns.items():
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,127}", name) or not isinstance(text, str) or not text:
            raise argparse.ArgumentTypeError(f"column {name!r}: expected a lower-case name and a non-empty text value")
    return columns


def _output_tag(value: str) -> str:
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", value):
        raise argparse.ArgumentTypeError("expected letters, digits, _ or - (at most 32)")
    return value


def _tolerance(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1
    if number < 0 or (number >= 1 and not number.is_integer()):
        raise argparse.ArgumentTypeError("expected a count of rows (0, 1, 2, ...) or a fraction below 1")
    return number


def _features(value: str) -> tuple[str, ...] | str:
    return FEATURES_FILE_ORDER if value.strip() == FEATURES_FILE_ORDER else _columns(value)


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


def log_format(host: str, context: LedgerContext | None) -> str:
    tag = (
        host
        if context is None
        else f"{host} {context.pipeline}/{context.run_id} step={context.step} attempt={context.attempt}"
    )
    return f"%(asctime)s %(levelname)s [{tag}] %(message)s"


def configure_logging(level: str, host: str, context: LedgerContext | None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(log_format(host, context)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    logging.getLogger("pynamodb").setLevel(logging.WARNING)


def _terminate(signum: int, _frame) -> None:
    raise Terminated(f"received signal {signal.Signals(signum).name}")


def record_setup_error(context: LedgerContext, host: str, error: str) -> None:
    """Tell the ledger why this instance could not start, so the step fails at once with the reason (the same
    model fails the same way on every attempt). Best effort: the exit code says it anyway."""
    from botocore.exceptions import BotoCoreError
    from pynamodb.exceptions import PynamoDBException

    from shardline.ledger.job_writes import WorkerLedger

    try:
        WorkerLedger(context, host).heartbeat(
            ShardStatus.FAILED, files_assigned=0, files_done=0, files_failed=0, rows_done=0, setup_error=error
        )
    except (PynamoDBException, BotoCoreError, StaleAttemptError) as err:  # the exit code still tells
        log.warning("could not record the setup error in the ledger: %s", err)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not (args.preview or args.tune):
        # First, before this process imports pyarrow and the rest: the forkserver's own imports (the
        # model's library among them) then run beside ours, on the other core.
        forkserver.start_early(
            model_dir=args.model_dir,
            pinned_sha256=args.model_sha256,
            start_method=args.start_method,
            use_gpu=not args.no_gpu,
        )
    from shardline.worker.job.run import run_job

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
        return run_job(args, host, hosts, context, log_format(host, context))
    except SetupError as err:
        log.error("setup failed, nothing was processed: %s", err)
        if context is not None and not (args.preview or args.tune) and err.permanent:
            record_setup_error(context, host, str(err))
        return EXIT_SETUP_ERROR
    except Terminated as err:
        log.error("stopped: %s. Outputs already renamed into place are complete; no partial output remains.", err)
        return EXIT_TERMINATED
