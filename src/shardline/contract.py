"""What the orchestrator and the worker agree on, in the one place both import. Pure: no IO.

SageMaker Processing's container layout (the input, model and output paths under ``/opt/ml/processing``, the
resource config), the names of a job's instances (:func:`host_name`: ``algo-1``, ``algo-2``...), how a manifest's
entries are dealt to them (:func:`deal`: round-robin, entry j to instance j % n, as ``ShardedByS3Key`` deals them),
which names are Shardline's own and never inputs (:func:`is_reserved`: ``_shardline/``, ``_SUCCESS``, hidden
files), and the marker of an output still being written (``.shardline-tmp``: never uploaded, never counted).

Also here: the worker's exit codes (the backends read them), how many rows ``tolerance.rows`` allows
(:func:`rows_allowed`), the input formats by extension, a custom script's JSON layouts, and an instance type's
vCPUs and memory (:func:`instance_vcpus`, :func:`instance_memory_gib`).

The ledger's environment variables are the ledger's own agreement: :class:`shardline.ledger.context.LedgerContext`
reads them in the worker and writes them for a job's request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TypeVar

# SageMaker Processing mounts inputs and collects outputs under this root; the local emulator maps
# it into each instance's directory.
CONTAINER_ROOT = "/opt/ml/processing"
CONTAINER_TMP = "/tmp"  # a local instance's scratch and HOME: its image is read-only, this folder is its own
DATA_DIR = f"{CONTAINER_ROOT}/input/data"
MODEL_DIR = f"{CONTAINER_ROOT}/input/model"
OUTPUT_DIR = f"{CONTAINER_ROOT}/output"
METADATA_DIR = f"{CONTAINER_ROOT}/shardline"  # with output.metadata_prefix: where the instances' manifests go
RESOURCE_CONFIG = "/opt/ml/config/resourceconfig.json"  # the instance's name and the job's hosts
# `shardline preview` / `tune` in the worker image: the sample's folder (tune writes its figures there too).
SAMPLE_DIR = "/opt/ml/sample"

METADATA_FOLDER = "_shardline"  # Shardline's own files beside (or, with metadata_prefix, away from) the outputs
# The tag the orchestrator puts on the files it writes under _shardline/ (manifests, plan files, run reports), as
# an S3 PutObject Tagging value: the template's lifecycle rule expires what carries it (S3 lifecycle rules match a
# key's prefix or its tags, and _shardline/ sits under every output prefix).
METADATA_TAGGING = "shardline-retention=metadata"
SUCCESS_MARKER = "_SUCCESS"  # Hadoop's convention: Spark, Hive and most readers wait for it
TEMP_MARKER = ".shardline-tmp"  # an output still being written: never uploaded, never counted
# The user metadata an uploaded output carries its sha256 (hex) in (x-amz-meta-sha256): the worker sets it, the
# step's end reads it where S3's own checksum is of parts (a multipart upload), not of the whole object.
OUTPUT_SHA256_METADATA = "sha256"

# How a SageMaker-style script's JSON request lays out its rows (the worker's --json-layout): objects keyed by
# column name, {"instances": rows} (TF Serving, the SageMaker containers), {"inputs": rows} (Hugging Face-style
# and many TorchScript handlers), the bare rows, or an object per line under application/json (what Batch Transform
# sends of a JSON lines file split by line with ContentType application/json, as SageMaker's examples do).
JSON_LAYOUTS = ("records", "instances", "inputs", "array", "lines")
# The layouts that wrap the rows in one JSON object, so cannot be one line of JSON lines.
WRAPPED_JSON_LAYOUTS = ("instances", "inputs")
# The layouts an application/jsonlines body may have: an object, or an array, per line.
JSON_LINES_LAYOUTS = ("records", "array")
# input.features (--features) for a model that records no feature names, when the files' columns are
# known to be in training order: take every (numeric) non-passthrough column in the file's order. Never
# the default: a file whose columns move would get wrong numbers and no error.
FEATURES_FILE_ORDER = "file_order"
# An input file's format by its extension (after an optional .gz): what the worker reads it as, and what
# `resubmit --rejects` picks its rows as.
INPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}

T = TypeVar("T")


def rows_allowed(limit: float, rows: int) -> int:
    """How many of ``rows`` may be rejected under ``tolerance.rows``: a count (1 or more), or a fraction below 1 of
    the rows (the worker applies it to each file, the step's end to all of the step's)."""
    if limit <= 0:
        return 0
    # The epsilon: 0.29 * 100 is 28.999999999999996 in floating point, and allows 29.
    return math.floor(limit * rows + 1e-9) if limit < 1 else int(limit)


# The limit a rejects part is scored with (`resubmit --rejects`): each of its rows was rejected once, and its source
# stayed within tolerance.rows with them rejected, so rejecting any again costs nothing it had not lost already; and
# a part whose rows all fail again is rejected row by row, never failed as a file with a wrong setting.
EVERY_ROW = 2**53


def rows_limit_text(limit: float, of: str = "the file's rows") -> str:
    """``tolerance.rows`` in words, as the messages of a file or step over it say it."""
    return f"{limit:g} of {of}" if 0 < limit < 1 else f"{int(limit)} row(s)"


def host_name(index: int) -> str:
    """The name of a job's instance ``index`` (from 0), as SageMaker names them: algo-1, algo-2, ..."""
    return f"algo-{index + 1}"


# The worker's exit codes (``python -m shardline.worker``): the backends read them, so they are part of the contract
# and stay stable.
EXIT_OK = 0  # every file succeeded (or there was nothing to do)
EXIT_FILES_FAILED = 3  # the job ran; some files failed (see the manifest and the ledger)
EXIT_SETUP_ERROR = 4  # nothing ran: bad model, bad arguments, integrity check failed
EXIT_FENCED = 5  # a newer attempt owns this step; this instance stopped as a zombie
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), as a shell reports it
# A worker's own ends: any other exit is an instance that died without ending its work (a signal, a crash).
WORKER_ENDS = frozenset({EXIT_OK, EXIT_FILES_FAILED, EXIT_SETUP_ERROR, EXIT_FENCED})


def host_names(count: int) -> list[str]:
    return [host_name(i) for i in range(count)]


def deal(entries: Sequence[T], instances: int) -> list[list[T]]:
    """What each instance receives from a manifest under ShardedByS3Key: entry j goes to instance j % n."""
    return [list(entries[i::instances]) for i in range(instances)]


def is_reserved(relative_key: str) -> bool:
    """Names that are never inputs: our own bookkeeping (``_shardline/``), ``_SUCCESS`` markers, hidden files."""
    return any(part.startswith(("_", ".")) for part in relative_key.split("/"))


# -- an instance type's size --------------------------------------------------------------------------------

_SIZE = re.compile(r"^ml\.(?P<family>[a-z]+)[0-9][a-z0-9-]*\.(?:(?P<n>\d*)xlarge|(?P<word>medium|large))$")
# GiB of memory per vCPU, by family letter(s): c compute, m general, r memory, t burstable, g and p GPU, x large
# memory. What SageMaker's instances have (a few sizes differ a little: this is a bound for an emulated one).
_GIB_PER_VCPU = {"c": 2.0, "m": 4.0, "r": 8.0, "t": 4.0, "g": 4.0, "p": 7.5, "x": 16.0, "inf": 2.0, "trn": 4.0}


def instance_vcpus(instance_type: str) -> int | None:
    """The vCPUs of a SageMaker instance type, from its size (large: 2, xlarge: 4, Nxlarge: 4N, medium: 2); None
    when it is no instance type (ml.FAMILY.SIZE)."""
    match = _SIZE.match(instance_type)
    if match is None:
        return None
    if match.group("word"):
        return 2
    return 4 * int(match.group("n") or 1)


def instance_memory_gib(instance_type: str) -> float | None:
    """The memory of a SageMaker instance type, about (its vCPUs times its family's GiB per vCPU)."""
    match, vcpus = _SIZE.match(instance_type), instance_vcpus(instance_type)
    if match is None or vcpus is None:
        return None
    return vcpus * _GIB_PER_VCPU.get(match.group("family"), 4.0)


# Where an instance puts each file's profile (report/profile.py) beside its manifest, as soon as the file's output
# goes up: the step's checks read it there when the instance was lost before its manifest went up.
PROFILES_FOLDER = "profiles"
