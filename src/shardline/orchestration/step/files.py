"""A step's files as every reader sees them: its FILE items, and the inputs planned but never claimed.

A step's first attempt writes no FILE item at plan time (``ledger.step_writes.start_attempt``);
an instance's first claim does. So the watch task, the CLI, the page and the run report read the step
through :func:`read_step_files`: the ledger's Query, plus the plan file of each attempt that the
STEP item records (its inputs and sizes, in S3), merged by ``ledger.step_reads.with_unclaimed``.

Each plan file has a name of its own and is never rewritten (a re-plan writes a new one), so plan
files are kept in memory between reads: a trigger polls the same step every few seconds.
"""

from __future__ import annotations

import collections
import threading

from shardline.ledger.keys import StepRef
from shardline.ledger.records import StepRecord
from shardline.ledger.step_reads import FILE_ATTRIBUTES, StepRecords, read_step, with_file_items, with_unclaimed
from shardline.orchestration import services
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import MAX_PLAN_FILE_BYTES, PlanFileError, parse_plan_file, parse_plan_file_versions
from shardline.s3uri import parse_s3_uri

# About 200 bytes of memory a key: 1M keys in all (one 1M-file step, or many small ones), beyond what one read
# needs at once (those are never evicted while it runs).
MAX_CACHED_KEYS = 1_000_000
_cache: collections.OrderedDict[str, list[tuple[str, int]]] = collections.OrderedDict()
_cache_lock = threading.Lock()


def read_step_files(
    spec: services.Source,
    ref: StepRef,
    *,
    file_attributes: list[str] | None = FILE_ATTRIBUTES,
    head: StepRecords | None = None,
) -> StepRecords:
    """The STEP, SHARD and FILE items of a step, with every input planned but not yet claimed added as
    PENDING under the attempt that planned it (``ledger.step_reads.UnclaimedFile``).

    ``head``: the step's STEP and SHARD items read already (``read_step(..., files=False)``); only the
    FILE items are read then.
    """
    model = services.ledger_model(spec)
    if head is None:
        records = read_step(model, ref, file_attributes=file_attributes)
    else:
        records = with_file_items(model, ref, head, file_attributes=file_attributes)
    if records.step is None:
        return records
    return with_unclaimed(records, planned_inputs(spec, records.step))


def planned_inputs(spec: services.Source, step: StepRecord) -> dict[int, list[tuple[str, int]]]:
    """Each attempt's planned inputs (full s3:// URI, size), from the plan files the STEP item records.

    A step planned before plan files records none (its PENDING FILE items say it all). A recorded
    file that is gone (deleted by hand, or by a lifecycle rule on the metadata prefix) is an
    error: without it a file never claimed would vanish from the step and its tolerance.
    """
    files = step.plan_files
    return {attempt: _plan_file(spec, uri, keep=set(files.values())) for attempt, uri in sorted(files.items())}


def planned_etags(spec: services.Source, step: StepRecord) -> dict[int, dict[str, str]]:
    """Each attempt's planned inputs' ETags (full s3:// URI -> ETag), as its plan file recorded them; an input
    planned from another attempt's records has none. Read once, at a step's end (not cached: a poll never
    needs them)."""
    found: dict[int, dict[str, str]] = {}
    for attempt, uri in sorted(step.plan_files.items()):
        versions = parse_plan_file_versions(_plan_file_body(spec, uri), uri)
        found[attempt] = {input_uri: etag for input_uri, _size, etag in versions if etag}
    return found


def _plan_file(spec: services.Source, uri: str, *, keep: set[str]) -> list[tuple[str, int]]:
    with _cache_lock:
        if uri in _cache:
            _cache.move_to_end(uri)
            return _cache[uri]
    inputs = parse_plan_file(_plan_file_body(spec, uri), uri)
    with _cache_lock:
        _cache[uri] = inputs
        total = sum(len(v) for v in _cache.values())
        for old in [u for u in _cache if u not in keep]:
            if total <= MAX_CACHED_KEYS:
                break
            total -= len(_cache.pop(old))
    return inputs


def _plan_file_body(spec: services.Source, uri: str) -> bytes:
    """A plan file's bytes, within the bound a plan file can be; a recorded file that is gone is an error."""
    s3 = services.s3_client(spec)
    bucket, key = parse_s3_uri(uri)
    try:
        found = s3.get_object(Bucket=bucket, Key=key)
        if found.get("ContentLength", 0) > MAX_PLAN_FILE_BYTES:
            found["Body"].close()
            raise PlanFileError(
                f"{uri} is {found['ContentLength'] >> 20} MiB, over the "
                f"{MAX_PLAN_FILE_BYTES >> 20} MiB a plan file can be (a million inputs take about "
                "2 MiB): it is not one the plan task wrote"
            )
        return found["Body"].read(MAX_PLAN_FILE_BYTES + 1)
    except (s3.exceptions.NoSuchKey, s3.exceptions.NoSuchBucket) as err:
        raise PlanFileError(
            f"{uri} is gone: the step's ledger record names it as the list of the inputs one attempt planned, so "
            "the files of that attempt no instance has claimed cannot be counted. Restore it (or keep lifecycle "
            "rules off the metadata prefix's manifests/ folder while a run is in flight)"
        ) from err


def latest_attempt(spec: services.Source, ref: StepRef) -> Attempt | None:
    """The step's newest attempt, rebuilt from the ledger and its plan files (for the CLI and UI)."""
    return attempt_of(read_step_files(spec, ref), ref)


def attempt_of(records: StepRecords, ref: StepRef) -> Attempt | None:
    """The step's newest attempt, rebuilt from its records as :func:`read_step_files` returns them (None before
    its plan exists)."""
    pipeline, run_id, step = ref
    if records.step is None or not records.step.plan_json:
        return None
    number = records.step.attempt or 1
    files = sum(1 for f in records.files if f.attempt == number)
    return Attempt.from_plan(records.step.plan_json, number, files, pipeline=pipeline, run_id=run_id, step=step)
