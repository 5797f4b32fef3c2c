"""What a step's end checks and commits: that the worker vouches for every output the ledger calls
written, the step's outputs manifest, the ``_SUCCESS`` marker, and the inputs that landed after planning.

Downstream readers trust ``_SUCCESS`` and the outputs manifest, so neither is written for a step whose outputs
are not all there and vouched for, or whose input prefix holds files no attempt planned."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging

from shardline import contract
from shardline.decision.policy import Decision, Policy
from shardline.errors import UnvouchedOutputError
from shardline.ledger.states import FileStatus, StepStatus
from shardline.ledger.step_reads import StepRecords
from shardline.ledger.step_writes import record_refused
from shardline.orchestration import services, watch
from shardline.orchestration.step_files import read_step_files
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import list_inputs_and_refusals, parse_s3_uri, put_metadata
from shardline.spec import PipelineSpec

UNVOUCHED_OUTPUT_ERROR = UnvouchedOutputError.__name__  # a SUCCEEDED file its instance's manifest does not vouch for

log = logging.getLogger(__name__)


MAX_INSTANCE_MANIFEST_BYTES = 256 << 20  # a manifest lists each file once: far below this for any real job


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


@dataclasses.dataclass(frozen=True)
class UnvouchedFile:
    input_key: str
    attempt: int
    reason: str


def unvouched_outputs(spec: PipelineSpec, attempt: Attempt, seen: StepOutputs | None = None) -> list[UnvouchedFile]:
    """The SUCCEEDED files whose ledger item the worker's own output manifest does not vouch for, and why.

    The worker that wrote a file records it in its instance's manifest (``_shardline/attempt-N/manifest-HOST.json``):
    the input, the output's path, rows and bytes. A FILE item counts only when the manifest of its attempt and
    host lists the same output for the same input with the same rows, and the object under the output prefix
    has that size. So a ledger item
    forged by anything but the worker (another job's role, a hand edit) never makes a run green. An output
    whose object is missing is left to :func:`commit_outputs`, which names it and writes no ``_SUCCESS``.
    """
    seen = seen or read_outputs(spec, attempt)
    succeeded = [f for f in seen.records.files if f.status == FileStatus.SUCCEEDED]
    if not succeeded:
        return []
    s3, listed = services.s3_client(spec), seen.listed
    manifests: dict[tuple[int, str], dict[str, dict] | None] = {}
    prefix = attempt.output_prefix.rstrip("/") + "/"
    problems = []
    for f in sorted(succeeded, key=lambda f: f.input_key):
        stored = listed.get(f.output_key or "")
        if stored is None:
            continue  # missing: commit_outputs names it
        where = (f.attempt, f.host or "")
        if where not in manifests:
            manifests[where] = _worker_outputs(s3, attempt, *where)
        written = (manifests[where] or {}).get((f.output_key or "").removeprefix(prefix))
        why = None
        if manifests[where] is None:
            why = f"no readable manifest of attempt {where[0]} on {where[1] or 'no host'}"
        elif written is None:
            why = f"no output {f.output_key} in the manifest of attempt {where[0]} on {where[1] or 'no host'}"
        elif not f.input_key.endswith("/" + str(written.get("input"))):
            # The worker names its input relative to where SageMaker put it: a suffix of the input's key.
            why = f"the worker wrote {f.output_key} for another input, {written.get('input')}"
        elif _count(written.get("rows_out")) != _count(f.rows_out) or _count(written.get("bytes_out")) != _count(
            stored.get("Size")
        ):
            why = (
                f"the ledger says {_count(f.rows_out)} rows and S3 holds {stored.get('Size')} bytes, the worker "
                f"wrote {written.get('rows_out')} rows, {written.get('bytes_out')} bytes"
            )
        if why:
            problems.append(UnvouchedFile(f.input_key, where[0], f"{f.input_key}: {why}"))
    return problems


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


def _worker_outputs(s3, attempt: Attempt, number: int, host: str) -> dict[str, dict] | None:
    """What one instance's manifest says it wrote, by output path (relative to the output prefix); None when
    there is no such manifest."""
    bucket, key = parse_s3_uri(naming.worker_manifest_key(attempt.output_prefix, number, host, attempt.metadata_prefix))
    from botocore.exceptions import ClientError

    try:
        found = s3.get_object(Bucket=bucket, Key=key)
        if found.get("ContentLength", 0) > MAX_INSTANCE_MANIFEST_BYTES:
            found["Body"].close()
            return None
        manifest = json.loads(found["Body"].read(MAX_INSTANCE_MANIFEST_BYTES + 1))
    except (ClientError, ValueError):  # missing, unreadable or not JSON: vouches for nothing
        return None
    reports = manifest.get("file_reports") if isinstance(manifest, dict) else None
    if not isinstance(reports, list):
        return None
    return {
        r["output"]: r
        for r in reports
        if isinstance(r, dict) and r.get("status") == FileStatus.SUCCEEDED and isinstance(r.get("output"), str)
    }


def commit_outputs(spec: PipelineSpec, attempt: Attempt, status: StepStatus, seen: StepOutputs | None = None) -> dict:
    """Write what downstream readers trust once a step has ended: the step-level manifest of every
    output (its input, attempt, rows and S3 ETag and size), and the ``_SUCCESS`` marker when, and
    only when, the step SUCCEEDED (a PARTIAL step has failed files, so it writes none).

    ``seen``: the reading the vouching check made (read again when not given). Idempotent: a retried watch
    task writes the same manifest again. Returns the manifest.
    """
    seen = seen or read_outputs(spec, attempt)
    manifest = outputs_manifest(attempt, status, seen)
    # The last look at the input prefix before _SUCCESS: the sensor looked when the step ended, and a file may
    # have landed while the run report was written.
    if not manifest["outputs_missing"] and status is StepStatus.SUCCEEDED:
        manifest["inputs_not_planned"] = sorted(late_inputs(spec, attempt))
    s3 = services.s3_client(spec)
    manifest_uri = naming.outputs_manifest_key(
        attempt.output_prefix, attempt.run_id, attempt.step, attempt.metadata_prefix
    )
    put_metadata(s3, manifest_uri, json.dumps(manifest, indent=1).encode(), "application/json")
    missing, late = manifest["outputs_missing"], manifest["inputs_not_planned"]
    if missing:
        # The ledger says SUCCEEDED but the object is not there: never mark such a prefix complete.
        log.error(
            "step %s: %d output(s) the ledger records as written are missing under %s (e.g. %s), so no %s "
            "was written; the outputs manifest lists them under outputs_missing: check the job's log for "
            "failed uploads and the write access to that prefix",
            attempt.step,
            len(missing),
            attempt.output_prefix,
            missing[:3],
            contract.SUCCESS_MARKER,
        )
    elif late:
        log.error(
            "step %s: %d input(s) landed under %s after the step's last look, e.g. %s, so no %s was written: "
            "this run did not score them; `shardline rerun %s/%s --conf '{}'` scores the whole partition "
            "again",
            attempt.step,
            len(late),
            attempt.input_prefix,
            late[:3],
            contract.SUCCESS_MARKER,
            attempt.pipeline,
            attempt.run_id,
        )
    elif status is StepStatus.SUCCEEDED:
        _write_success_marker(s3, attempt, manifest, manifest_uri)
    return manifest


def outputs_manifest(attempt: Attempt, status: StepStatus, seen: StepOutputs) -> dict:
    """The step-level outputs manifest: every succeeded file's output (with its S3 size and ETag), what did not
    succeed, and the outputs the ledger names that S3 lacks. ``inputs_not_planned`` is filled by the commit."""
    outputs, failed = [], []
    for f in sorted(seen.records.files, key=lambda f: f.input_key):
        if f.status == FileStatus.SUCCEEDED:
            stored = seen.listed.get(f.output_key or "", {})
            outputs.append(
                {
                    "input": f.input_key,
                    "output": f.output_key,
                    "attempt": f.attempt,
                    "rows_in": int(f.rows_in or 0),
                    "rows_out": int(f.rows_out or 0),
                    "bytes": stored.get("Size"),
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
        "files": len(seen.records.files),
        "rows_out": sum(o["rows_out"] for o in outputs),
        "outputs": outputs,
        "not_succeeded": failed,
        "outputs_missing": [o["output"] for o in outputs if o["bytes"] is None],
        "inputs_not_planned": [],
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
            }
        ).encode(),
    )


def late_inputs(spec: PipelineSpec, attempt: Attempt) -> dict[str, int]:
    """Input files under the step's prefix that no attempt of it planned (they landed after planning): each
    full s3:// URI and its size."""
    s = spec.step(attempt.step)
    if s.input.from_step:
        return {}  # an earlier step's outputs are read from its manifest, complete once it has ended
    objects, _refused = list_inputs_and_refusals(
        services.s3_listing_client(spec), attempt.input_prefix, s.input.include, s.input.exclude
    )
    known = {f.input_key for f in read_step_files(spec, attempt.ref).files}
    bucket, _ = parse_s3_uri(attempt.input_prefix)
    listed = {f"s3://{bucket}/{o.key}": o.size for o in objects}
    return {uri: size for uri, size in listed.items() if uri not in known}


def late_inputs_decision(
    spec: PipelineSpec, attempt: Attempt, policy: Policy | None = None
) -> tuple[Decision, dict[str, int]] | None:
    """What a step that is about to end does about inputs that landed after planning (None: there are none),
    and their sizes from the listing (a resubmission then reads no object for them).

    They go to the next attempt; when no attempt is left they are recorded FAILED (``LateInputError``), so
    ``shardline failed`` names them and ``shardline resubmit --all-failed`` takes them, and the step fails.
    """
    from shardline.decision.policy import LATE_INPUT_ERROR, for_late_inputs

    late = late_inputs(spec, attempt)
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
