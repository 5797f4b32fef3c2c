"""What a step's end checks and commits: that the worker vouches for every output the ledger calls
written, the step's outputs manifest, the ``_SUCCESS`` marker, and the inputs that landed after planning.

Downstream readers trust ``_SUCCESS`` and the outputs manifest, so neither is written for a step whose outputs
are not all there and vouched for, or whose input prefix holds files no attempt planned."""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime as dt
import json
import logging
from concurrent.futures import ThreadPoolExecutor

from shardline import contract
from shardline.decision.policy import LATE_INPUT_ERROR, Decision, Policy, for_late_inputs
from shardline.errors import ShardlineError, UnvouchedOutputError
from shardline.ledger.records import current_parts, stale_parts
from shardline.ledger.states import FileStatus, StepStatus
from shardline.ledger.step_reads import FILE_ATTRIBUTES, StepRecords
from shardline.ledger.step_writes import record_refused
from shardline.orchestration import services, tables
from shardline.orchestration.step import watch
from shardline.orchestration.step.files import planned_etags, read_step_files
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import list_inputs_and_refusals, put_metadata
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec

UNVOUCHED_OUTPUT_ERROR = UnvouchedOutputError.__name__  # a SUCCEEDED file whose object in S3 is missing or another

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StepOutputs:
    """One reading of an ended step: its files (every attribute of their FILE items) and the objects under its
    output prefix, by s3:// URI. The vouching check, the run report and the commit share it, so a step's end
    reads its FILE items and lists its prefix once."""

    records: StepRecords
    listed: dict[str, dict]


def read_outputs(spec: PipelineSpec, attempt: Attempt) -> StepOutputs:
    # Every attribute: the run report reads this same reading (its files' bytes and times).
    records = read_step_files(spec, attempt.ref, file_attributes=None)
    return StepOutputs(records, _listed_outputs(services.s3_client(spec), attempt.output_prefix))


class LateInputsFound(ShardlineError):
    """A step's end looked at its input prefix one last time and found inputs no attempt planned as they are now:
    the step is not done; its watch sends them to a next attempt (``late_inputs_decision``)."""

    def __init__(self, late: dict[str, int]):
        super().__init__(f"{len(late)} input(s) landed or changed after planning, e.g. {sorted(late)[:3]}")
        self.late = late


@dataclasses.dataclass(frozen=True)
class UnvouchedFile:
    input_key: str
    attempt: int
    reason: str


CHECK_THREADS = 16  # HEAD requests in flight at once while a step's end checks its outputs
MAX_INSTANCE_MANIFEST_BYTES = 256 << 20  # a manifest lists each file once: far below this for any real job


def unvouched_outputs(spec: PipelineSpec, attempt: Attempt, seen: StepOutputs | None = None) -> list[UnvouchedFile]:
    """The SUCCEEDED files whose object in S3 is not the one the ledger records, and why.

    The worker records a file SUCCEEDED only once S3 has its output, with the output's size and sha256. Here each
    such object must be there, under the prefix this step writes, with that size and that sha256 (S3's own
    checksum of the body; for a multipart object, the sha256 its uploader stored beside it), and be no other
    file's output. Where the instance's own manifest is there (an instance that ended normally uploads one), it
    must list the same output with the same rows and sha256. So an object that another run of the same
    partition, a zombie of an older attempt or a hand wrote at that key, a missing one, or a ledger item forged
    by anything but the worker never makes a run green.
    """
    seen = seen or read_outputs(spec, attempt)
    succeeded = sorted((f for f in seen.records.files if f.status == FileStatus.SUCCEEDED), key=lambda f: f.input_key)
    if not succeeded:
        return []
    s3 = services.s3_client(spec)
    prefix = attempt.output_prefix.rstrip("/") + "/"
    claimed = collections.Counter(f.output_key for f in succeeded)
    manifests = {
        where: worker_outputs(s3, attempt, *where) for where in sorted({(f.attempt, f.host or "") for f in succeeded})
    }

    def check(f) -> UnvouchedFile | None:
        why = _why_unvouched(s3, f, seen.listed.get(f.output_key or ""), prefix)
        if why is None and claimed[f.output_key] > 1:
            why = f"its output {f.output_key} is recorded for {claimed[f.output_key]} inputs"
        written = manifests[(f.attempt, f.host or "")]
        if why is None and written is not None:
            entry = written.get((f.output_key or "").removeprefix(prefix))
            if (
                entry is None
                or _count(entry.get("rows_out")) != _count(f.rows_out)
                or entry.get("sha256") != f.output_sha256
            ):
                why = f"the manifest of attempt {f.attempt} on {f.host} does not list {f.output_key} as recorded"
        return UnvouchedFile(f.input_key, f.attempt, f"{f.input_key}: {why}") if why else None

    with ThreadPoolExecutor(max_workers=CHECK_THREADS) as pool:
        return [u for u in pool.map(check, succeeded) if u is not None]


def worker_outputs(s3, attempt: Attempt, number: int, host: str) -> dict[str, dict] | None:
    """What one instance's manifest says it wrote, by output path (relative to the output prefix); None when it
    left none (an instance lost mid-job uploads no manifest: its files stand on their objects alone)."""
    from botocore.exceptions import ClientError

    bucket, key = parse_s3_uri(
        naming.worker_manifest_key(
            attempt.output_prefix, attempt.run_id, attempt.step, number, host, attempt.metadata_prefix
        )
    )
    try:
        found = s3.get_object(Bucket=bucket, Key=key)
        if found.get("ContentLength", 0) > MAX_INSTANCE_MANIFEST_BYTES:
            found["Body"].close()
            return {}
        manifest = json.loads(found["Body"].read(MAX_INSTANCE_MANIFEST_BYTES + 1))
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise
    except ValueError:  # not JSON: it vouches for nothing
        return {}
    reports = manifest.get("file_reports") if isinstance(manifest, dict) else None
    if not isinstance(reports, list):
        return {}
    return {
        r["output"]: r
        for r in reports
        if isinstance(r, dict) and r.get("status") == FileStatus.SUCCEEDED and isinstance(r.get("output"), str)
    }


def rejects_over_limit(spec: PipelineSpec, attempt: Attempt, records: StepRecords) -> str | None:
    """Why a step whose files rejected more rows between them than ``tolerance.rows`` allows fails (None: they
    did not). Each file kept within the limit on its own; the step's total is held to it too."""
    limit = spec.step(attempt.step).tolerance.rows
    succeeded = [f for f in records.settled if f.status == FileStatus.SUCCEEDED]
    rejected = sum(f.rows_rejected or 0 for f in succeeded)
    rows = sum(f.rows_in or 0 for f in succeeded)
    if not rejected or rejected <= contract.rows_allowed(limit, rows):
        return None
    worst = sorted(succeeded, key=lambda f: -(f.rows_rejected or 0))[:3]
    shown = ", ".join(f"{f.input_key} ({f.rows_rejected})" for f in worst if f.rows_rejected)
    allows = contract.rows_limit_text(limit, "the rows")
    return (
        f"the step's files rejected {rejected:,} of {rows:,} row(s) between them, more than tolerance.rows allows "
        f"({allows}), e.g. {shown}. No {contract.SUCCESS_MARKER} was written. `shardline failed` lists the rejected "
        "rows; fix them (or the script) and resubmit"
    )


def unvouched_text(unvouched: list[UnvouchedFile]) -> str:
    """Why a step whose outputs are not all vouched for fails, and what happens to those files."""
    return (
        f"{len(unvouched)} file(s) the ledger records as SUCCEEDED have no output in S3 that is the one the worker "
        f"uploaded, e.g. {'; '.join(u.reason for u in unvouched[:3])}. Something other than this run's worker "
        "wrote these outputs or ledger items (another run of the same partition, a job of an older attempt, a "
        "hand: check who can write the ledger table and the output prefix, infra/README.md), or deleted them. "
        f"No {contract.SUCCESS_MARKER} was written, and these files are now FAILED ({UNVOUCHED_OUTPUT_ERROR}), so "
        "a resubmission with --all-failed scores them again"
    )


def _why_unvouched(s3, f, listed: dict | None, prefix: str) -> str | None:
    """Why one SUCCEEDED file's object is not the one its FILE item records (None: it is)."""
    if not f.output_key or not f.output_key.startswith(prefix):
        return f"its recorded output {f.output_key or '(none)'} is not under the step's output prefix {prefix}"
    if listed is None:
        return f"its output {f.output_key} is not in S3"
    if _count(listed.get("Size")) != _count(f.bytes_out):
        return f"the ledger says {f.bytes_out} bytes and S3 holds {listed.get('Size')} at {f.output_key}"
    if not f.output_sha256:
        return f"the ledger records no sha256 for {f.output_key}"
    bucket, key = parse_s3_uri(f.output_key)
    from botocore.exceptions import ClientError

    try:
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return f"its output {f.output_key} is not in S3"
        raise  # a refusal or an outage says nothing of the object: the watch task's retry asks again
    stored = object_sha256(head)
    if stored != f.output_sha256:
        return (
            f"S3 holds another object at {f.output_key} (sha256 {stored or 'not recorded'}) than the one the worker "
            f"uploaded (sha256 {f.output_sha256})"
        )
    return None


def object_sha256(head: dict) -> str | None:
    """An object's sha256 (hex) from its HeadObject answer: S3's own full-object checksum when it has one, else
    the digest its uploader stored in its metadata (a multipart object's checksum is of its parts)."""
    checksum = head.get("ChecksumSHA256") or ""
    if checksum and "-" not in checksum and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
        try:
            return base64.b64decode(checksum).hex()
        except ValueError:
            return None
    return (head.get("Metadata") or {}).get(contract.OUTPUT_SHA256_METADATA)


def _count(value) -> int | None:
    """A row or byte count as recorded, or None when it is not a whole number (which then matches nothing)."""
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _listed_outputs(s3, output_prefix: str) -> dict[str, dict]:
    bucket, key = parse_s3_uri(output_prefix)
    listed: dict[str, dict] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        for item in page.get("Contents", []):
            listed[f"s3://{bucket}/{item['Key']}"] = item
    return listed


def commit_outputs(
    spec: PipelineSpec,
    attempt: Attempt,
    status: StepStatus,
    seen: StepOutputs | None = None,
    look: InputLook | None = None,
) -> dict:
    """Write what downstream readers trust once a step has ended: the step-level manifest of every
    output (its input, attempt, rows, sha256, and S3 ETag and size), and the ``_SUCCESS`` marker when, and
    only when, the step SUCCEEDED (a PARTIAL step has failed files, so it writes none).

    The step's end has decided already (``orchestration/step/end.py: finish``): every SUCCEEDED file's object was
    checked against the ledger, and ``look`` found no late input, so what is committed here is complete.
    ``seen``: the reading that check made (read again when not given). Idempotent: a retried watch task writes
    the same manifest again. Returns the manifest.

    The marker is the fence between the step and inputs still landing: the input prefix is listed once more
    after it is written. An input that landed since ``look`` (between the step's last look and the marker) makes
    this withdraw the marker and raise :class:`LateInputsFound`, so no file that was there before ``_SUCCESS``
    is left unscored under it; a file landing after that listing landed after the marker, which the manifest
    (every input it covers) tells apart.
    """
    seen = seen or read_outputs(spec, attempt)
    manifest = outputs_manifest(attempt, status, seen)
    s3 = services.s3_client(spec)
    manifest_uri = naming.outputs_manifest_key(
        attempt.output_prefix, attempt.run_id, attempt.step, attempt.metadata_prefix
    )
    if status is StepStatus.SUCCEEDED and not manifest["outputs_missing"]:
        # The table's one commit of the partition, before the marker: a failed commit raises, and leaves no
        # _SUCCESS (the step's end records why and how to retry it).
        committed = tables.commit_partition(spec, attempt, manifest["outputs"])
        if committed is not None:
            manifest["table"] = committed.to_json()
    put_metadata(s3, manifest_uri, json.dumps(manifest, indent=1).encode(), "application/json")
    if manifest["outputs_missing"]:
        # Only a step whose end check was skipped gets here: never mark such a prefix complete.
        log.error(
            "step %s: %d output(s) the ledger records as written are missing under %s (e.g. %s), so no %s was written",
            attempt.step,
            len(manifest["outputs_missing"]),
            attempt.output_prefix,
            manifest["outputs_missing"][:3],
            contract.SUCCESS_MARKER,
        )
    elif status is StepStatus.SUCCEEDED:
        _write_success_marker(s3, attempt, manifest, manifest_uri)
        landed = landed_since(spec, attempt, look) if look is not None else {}
        if landed:
            withdraw_own_marker(spec, attempt)
            # The manifest stays this run's, but no longer says the step ended: its next attempt writes it again.
            manifest = {**manifest, "status": StepStatus.RUNNING.value, "landed_after_last_look": sorted(landed)}
            put_metadata(s3, manifest_uri, json.dumps(manifest, indent=1).encode(), "application/json")
            raise LateInputsFound(landed)
    return manifest


def withdraw_own_marker(spec: PipelineSpec, attempt: Attempt) -> bool:
    """Remove the ``_SUCCESS`` marker under the attempt's output prefix if this attempt wrote it (another run's or
    attempt's stands). True when one was removed."""
    marker = success_marker_of(spec, attempt.output_prefix)
    if not marker or (marker.get("run_id"), marker.get("step"), marker.get("attempts")) != (
        attempt.run_id,
        attempt.step,
        attempt.number,
    ):
        return False
    marker_uri = naming.success_marker_key(attempt.output_prefix)
    bucket, key = parse_s3_uri(marker_uri)
    services.s3_client(spec).delete_object(Bucket=bucket, Key=key)
    log.warning("step %s: withdrew %s (attempt %d wrote it)", attempt.step, marker_uri, attempt.number)
    return True


def outputs_manifest(attempt: Attempt, status: StepStatus, seen: StepOutputs) -> dict:
    """The step-level outputs manifest: every succeeded file's output (with its S3 size and ETag), what did not
    succeed, and the outputs the ledger names that S3 lacks."""
    outputs, failed = [], []
    settled = seen.records.settled  # a file's rejects parts count as the file's rows
    shown = {f.input_key for f in settled}
    stale = stale_parts(seen.records.files)  # their rows were scored again with their whole source
    for f in sorted(seen.records.files, key=lambda f: f.input_key):
        if f.input_key in stale or (f.part_of and f.status != FileStatus.SUCCEEDED and f.input_key not in shown):
            continue  # a stale part, or a failed one a newer part took the rows of
        if f.status == FileStatus.SUCCEEDED:
            stored = seen.listed.get(f.output_key or "", {})
            outputs.append(
                {
                    "input": f.input_key,
                    "output": f.output_key,
                    "attempt": f.attempt,
                    "rows_in": int(f.rows_in or 0),
                    "rows_out": int(f.rows_out or 0),
                    "rows_rejected": int(f.rows_rejected or 0),
                    "rejects": f.rejects_key,
                    **({"part_of": f.part_of} if f.part_of else {}),  # a rejects part: more rows of that file
                    "bytes": stored.get("Size"),
                    "sha256": f.output_sha256,
                    "etag": (stored.get("ETag") or "").strip('"') or None,
                }
            )
        else:
            failed.append(
                {"input": f.input_key, "status": f.status, "attempt": f.attempt, "error_class": f.error_class}
            )
    return {
        "pipeline": attempt.pipeline,
        "run_id": attempt.run_id,
        "step": attempt.step,
        "status": status.value,
        "attempts": attempt.number,
        "output_prefix": attempt.output_prefix,
        "files": len(settled),
        "rows_out": sum(o["rows_out"] for o in outputs),
        "rows_rejected": sum(f.rows_rejected or 0 for f in settled if f.status == FileStatus.SUCCEEDED),
        "outputs": outputs,
        "not_succeeded": failed,
        "outputs_missing": [o["output"] for o in outputs if o["bytes"] is None],
        "written_at": dt.datetime.now(dt.UTC).isoformat(),
    }


def _write_success_marker(s3, attempt: Attempt, manifest: dict, manifest_uri: str) -> None:
    bucket, key = parse_s3_uri(naming.success_marker_key(attempt.output_prefix))
    s3.put_object(
        Bucket=bucket,
        Key=key,
        ContentType="application/json",
        Body=json.dumps(
            {
                "pipeline": attempt.pipeline,
                "run_id": attempt.run_id,
                "step": attempt.step,
                "attempts": attempt.number,
                "outputs": len(manifest["outputs"]),
                "rows_out": manifest["rows_out"],
                "manifest": manifest_uri,
                **({"table": manifest["table"]} if manifest.get("table") else {}),
            }
        ).encode(),
    )


def success_marker_of(spec: PipelineSpec, output_prefix: str) -> dict | None:
    """The ``_SUCCESS`` marker under ``output_prefix`` as written (its run, step, attempts and counts), or None when
    there is none."""
    s3 = services.s3_client(spec)
    bucket, key = parse_s3_uri(naming.success_marker_key(output_prefix))
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read(1 << 20)
    except (s3.exceptions.NoSuchKey, s3.exceptions.NoSuchBucket):
        return None
    try:
        found = json.loads(body)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


@dataclasses.dataclass(frozen=True)
class InputLook:
    """One look at a step's input prefix as the step ends: each selected object's (size, ETag) by s3:// URI, and
    those the step has not scored as they are now (``late``: each URI's size)."""

    seen: dict[str, tuple[int, str]]
    late: dict[str, int]


def look_at_inputs(spec: PipelineSpec, attempt: Attempt) -> InputLook | None:
    """Look at the step's input prefix (None for a step that reads an earlier step's outputs: they come from its
    manifest, complete once it has ended). A file is late when it landed after planning, or was scored
    (SUCCEEDED) but its object was replaced under its key since: its size differs from the bytes its instance
    read, or its ETag from the one the plan of the attempt that scored it recorded. Its predictions would be of
    the old content."""
    s = spec.step(attempt.step)
    if s.input.from_step:
        return None
    seen = _list_selected_inputs(spec, attempt)
    records = read_step_files(spec, attempt.ref, file_attributes=[*FILE_ATTRIBUTES, "bytes_in"])
    files = {f.input_key: f for f in records.files}
    etags = planned_etags(spec, records.step) if records.step is not None else {}
    # A source whose rejected rows a part took again (resubmit --rejects) was mended in place: the version the
    # rows were picked from is the one scored.
    picked = {source: parts[-1].source_etag for source, parts in current_parts(records.files).items()}
    late: dict[str, int] = {}
    for uri, (size, etag_now) in seen.items():
        f = files.get(uri)
        if f is None:
            late[uri] = size
        elif uri in picked and picked[uri] and picked[uri] == etag_now:
            continue
        elif f.status == FileStatus.SUCCEEDED:
            etag = etags.get(f.attempt, {}).get(uri, "")
            if (f.bytes_in is not None and f.bytes_in != size) or (etag and etag_now and etag != etag_now):
                late[uri] = size
    return InputLook(seen, late)


def late_inputs(spec: PipelineSpec, attempt: Attempt) -> dict[str, int]:
    """Input files under the step's prefix that this step has not scored as they are now (see
    :func:`look_at_inputs`): each full s3:// URI and its size."""
    look = look_at_inputs(spec, attempt)
    return look.late if look else {}


def landed_since(spec: PipelineSpec, attempt: Attempt, look: InputLook) -> dict[str, int]:
    """Inputs that landed, or were replaced, under the step's prefix since ``look``: one more listing, no ledger
    read (every file ``look`` saw was scored as it was then, or ``look`` would have found it late)."""
    return {
        uri: size
        for uri, (size, etag) in _list_selected_inputs(spec, attempt).items()
        if look.seen.get(uri) != (size, etag)
    }


def _list_selected_inputs(spec: PipelineSpec, attempt: Attempt) -> dict[str, tuple[int, str]]:
    s = spec.step(attempt.step)
    objects, _refused = list_inputs_and_refusals(
        services.s3_listing_client(spec), attempt.input_prefix, s.input.include, s.input.exclude
    )
    bucket, _ = parse_s3_uri(attempt.input_prefix)
    return {f"s3://{bucket}/{o.key}": (o.size, o.etag) for o in objects}


def late_inputs_decision(
    spec: PipelineSpec, attempt: Attempt, policy: Policy | None = None, late: dict[str, int] | None = None
) -> tuple[Decision, dict[str, int]] | None:
    """What a step that is about to end does about inputs that landed after planning (None: there are none),
    and their sizes from the listing (a resubmission then reads no object for them).

    They go to the next attempt; when no attempt is left they are recorded FAILED (``LateInputError``), so
    ``shardline failed`` names them and ``shardline resubmit --all-failed`` takes them, and the step fails.
    """

    late = late if late is not None else late_inputs(spec, attempt)
    if not late:
        return None
    decision = for_late_inputs(
        list(late), attempt.number, policy or watch.policy_for(spec, attempt.step), attempt.input_prefix
    )
    log.warning("step %s: %s", attempt.step, decision.reason)
    if decision.failed_files:
        message = decision.failed_files[0].error_message or ""
        record_refused(
            services.ledger_model(spec),
            attempt.ref,
            attempt.number,
            [(uri, size, message) for uri, size in late.items()],
            error_class=LATE_INPUT_ERROR,
        )
    return decision, late
