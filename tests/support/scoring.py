"""What an instance writes for one input file, done with the worker's own writers and no job: its output uploaded by
the worker's uploader (S3 keeps its SHA-256 checksum, the object's metadata its sha256), and its FILE item claimed and
finished by the worker's ledger writer. For tests of a step's end that need a scored step in seconds."""

from __future__ import annotations

import hashlib
from pathlib import Path

import boto3

from shardline.ledger.context import LedgerContext
from shardline.ledger.job_writes import FinishedFile, WorkerLedger
from shardline.ledger.states import FileStatus
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec
from shardline.worker.job.uploads import OutputUploader

HOST = "algo-1"
ROWS = 7  # the rows each scored file records, in and out


def unloaded_model(folder: Path) -> Path:
    """A model folder for :func:`tests.support.pipelines.stage_step` when no job runs: packed, never loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.json").write_text("{}")
    return folder


def output_body(name: str) -> bytes:
    """The bytes of ``name``'s output (not a real prediction file: nothing here reads it as one)."""
    return f"predictions of {name}\n".encode() * ROWS


def worker_ledger(spec: PipelineSpec, attempt: Attempt, host: str = HOST) -> WorkerLedger:
    """The ledger writer an instance of ``attempt`` uses."""
    context = LedgerContext(
        table=spec.ledger_table,
        pipeline=attempt.pipeline,
        run_id=attempt.run_id,
        step=attempt.step,
        attempt=attempt.number,
        input_uri=attempt.input_prefix,
        output_uri=attempt.output_prefix,
    )
    return WorkerLedger(context, host)


def upload_output(attempt: Attempt, name: str, body: bytes, folder: Path):
    """Upload ``body`` as ``name``'s output under the attempt's output prefix, as the worker does; its Uploaded."""
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(body)
    uploader = OutputUploader(folder, attempt.output_prefix, client=boto3.client("s3"))
    return uploader.upload(name, hashlib.sha256(body).hexdigest())


def score_file(
    spec: PipelineSpec,
    attempt: Attempt,
    name: str,
    folder: Path,
    *,
    bytes_in: int,
    body: bytes | None = None,
    **recorded,
) -> None:
    """Score input ``name`` (relative to the input prefix) as SUCCEEDED: upload its output, then record it.
    ``bytes_in``: the input's size as the instance read it. ``recorded``: :class:`FinishedFile` fields that say
    otherwise than the upload did (a ledger item that is not the worker's)."""
    body = output_body(name) if body is None else body
    uploaded = upload_output(attempt, name, body, folder / f"upload-{attempt.run_id}-{attempt.number}")
    ledger = worker_ledger(spec, attempt)
    ledger.claim_file(name)
    figures = {
        "status": FileStatus.SUCCEEDED,
        "rows_in": ROWS,
        "rows_out": ROWS,
        "bytes_in": bytes_in,
        "bytes_out": len(body),
        "output_key": uploaded.key,
        "sha256": uploaded.sha256,
        **recorded,
    }
    ledger.finish_file(name, FinishedFile(**figures))


def fail_file(spec: PipelineSpec, attempt: Attempt, name: str, error_class: str = "ModelError") -> None:
    """Record input ``name`` FAILED, as an instance whose model raised on it does."""
    ledger = worker_ledger(spec, attempt)
    ledger.claim_file(name)
    ledger.finish_file(name, FinishedFile(FileStatus.FAILED, error_class=error_class, error_message="it broke"))
