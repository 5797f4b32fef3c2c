"""A step's files as every reader sees them: its FILE items, and the inputs planned but never claimed.

A step's first attempt writes no FILE item at plan time (``ledger.orchestrator.start_attempt``);
an instance's first claim does. So the sensor, the CLI, the page and the run report read the step through
:func:`read_step_files`: the ledger's Query, plus each attempt's plan file from S3 (its inputs
and sizes), merged by ``ledger.orchestrator.with_unclaimed``.

A submitted attempt's plan file never changes, so plan files are kept in memory between reads
(a trigger polls the same step every few seconds). Only the newest attempt's may be rewritten,
by a re-plan before its job starts, which moves the STEP item's ``started_at``: that time is part
of the newest file's cache key.
"""

from __future__ import annotations

import collections
import threading

from shardline.ledger.orchestrator import FILE_ATTRIBUTES, StepRecords, read_step, with_unclaimed
from shardline.orchestration import services
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import parse_plan_file, parse_s3_uri
from shardline.spec import PipelineSpec

# About 150 MB of keys at most: one 1M-file step, or many small ones.
MAX_CACHED_KEYS = 1_000_000
_cache: collections.OrderedDict[tuple[str, str], list[tuple[str, int]]] = collections.OrderedDict()
_cache_lock = threading.Lock()


def read_step_files(spec: PipelineSpec, pipeline: str, run_id: str, step: str, *,
                    file_attributes: list[str] | None = FILE_ATTRIBUTES) -> StepRecords:
    """The STEP, SHARD and FILE items of a step, with every input planned but not yet claimed added as
    PENDING under the attempt that planned it (``ledger.orchestrator.UnclaimedFile``)."""
    records = read_step(services.ledger_model(spec), pipeline, run_id, step, file_attributes=file_attributes)
    if records.step is None or not records.step.plan_json or not records.step.attempt:
        return records
    return with_unclaimed(records, planned_inputs(spec, records.step, pipeline, run_id, step))


def planned_inputs(spec: PipelineSpec, step_item, pipeline: str, run_id: str, step: str
                   ) -> dict[int, list[tuple[str, int]]]:
    """Each attempt's planned inputs (full s3:// URI, size), read from its plan file.

    An attempt without one is left out: planned by a Shardline that wrote PENDING FILE items
    instead, or a plan task that died before writing it (its retry writes it).
    """
    newest = int(step_item.attempt)
    plan = Attempt.from_plan(step_item.plan_json, newest, 0, pipeline=pipeline, run_id=run_id, step=step)
    planned = {}
    for number in range(1, newest + 1):
        uri = plan.model_copy(update={"number": number}).plan_file_uri
        version = step_item.started_at.isoformat() if number == newest and step_item.started_at else ""
        inputs = _plan_file(spec, uri, version)
        if inputs is not None:
            planned[number] = inputs
    return planned


def _plan_file(spec: PipelineSpec, uri: str, version: str) -> list[tuple[str, int]] | None:
    with _cache_lock:
        if (uri, version) in _cache:
            _cache.move_to_end((uri, version))
            return _cache[(uri, version)]
    s3 = services.s3_client(spec)
    bucket, key = parse_s3_uri(uri)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except (s3.exceptions.NoSuchKey, s3.exceptions.NoSuchBucket):
        return None  # not cached: a plan in progress writes it in a moment
    inputs = parse_plan_file(body, uri)
    with _cache_lock:
        _cache[(uri, version)] = inputs
        while len(_cache) > 1 and sum(len(v) for v in _cache.values()) > MAX_CACHED_KEYS:
            _cache.popitem(last=False)
    return inputs
