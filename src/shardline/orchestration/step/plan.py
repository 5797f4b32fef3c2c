"""A step's plan: its inputs listed, the attempt ordered over its instances, and its ledger records, plan file and
manifest written before any job starts. Attempt 1 comes from :func:`plan`; every later attempt from
:func:`new_attempt` too, so a retry is planned the way the first was."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid
from typing import Any

from shardline.backends import JobNotFound
from shardline.decision.policy import UNSAFE_KEY_ERROR
from shardline.errors import InputRefused, TableError
from shardline.ledger.keys import StepRef
from shardline.ledger.states import FileStatus, RunStatus, Succession
from shardline.ledger.step_reads import FILE_ATTRIBUTES, StepRecords, read_step
from shardline.ledger.step_writes import continue_attempt, ensure_run, record_refused, set_run_status, start_attempt
from shardline.orchestration import partitions, services
from shardline.orchestration.step.files import latest_attempt, read_step_files
from shardline.orchestration.step.preview import PreviewDenied, PreviewError, preview_step
from shardline.orchestration.step.upstream import upstream_outputs
from shardline.orchestration.step.watch import InputWatch, input_ready
from shardline.planning import naming
from shardline.planning.attempt import Attempt, PlannedFile
from shardline.planning.inputs import (
    S3Object,
    choose_instance_count,
    list_inputs,
    list_inputs_and_refusals,
    manifest_body,
    manifest_order,
    plan_file_body,
    write_manifest,
    write_plan_file,
)
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)

SIZED_FILE_ATTRIBUTES = [*FILE_ATTRIBUTES, "host", "bytes_in"]  # what sized_objects reads of a step's files


def new_attempt(
    spec: PipelineSpec,
    base: Attempt,
    number: int,
    objects: list[S3Object],
    follows: Succession | None = None,
    *,
    replan: bool = False,
    may_take: bool = False,
    taken_up: bool = False,
) -> Attempt:
    """Write attempt ``number``'s ledger records and manifest for ``objects``; return it (not yet submitted).

    ``base``: the step's plan (an earlier attempt, or attempt 1 before its files are known).
    ``follows``: how it follows the attempt before it (the ledger write is fenced on ``follows.after``; None: the
    attempt before ``number``, as a plan or a watch's own retry follows it).
    ``replan``: the STEP item holds this attempt already, but its job was never submitted.
    ``may_take``: a plan or an on-call engineer may take the output prefix; the watch's own attempts only renew it.
    ``taken_up``: an on-call engineer takes the run up after its watch task ended (``partitions.hold_for_attempt``).
    """
    step = spec.step(base.step)
    # Before anything is written: two runs never write one output prefix at once (PartitionHeld names the other).
    fence = partitions.hold_for_attempt(
        spec, base.ref, base.output_prefix, number=number, may_take=may_take, taken_up=taken_up
    )
    instances = choose_instance_count(base.requested_instances, len(objects))
    ordered = manifest_order(objects, instances, step.sharding)
    attempt = base.next(number, [PlannedFile.of(o) for o in ordered])
    bucket, _ = parse_s3_uri(attempt.data_prefix)
    model = services.ledger_model(spec)
    s3 = services.s3_client(spec)
    keys = [(f"s3://{bucket}/{f.key}", f.size) for f in attempt.files]
    # What readers take "planned, not yet claimed" from (step.files): attempt 1 writes no FILE item. Written
    # first, under a name of its own; the fenced STEP update then records it, so a reader never finds the
    # STEP item naming a file not there yet, and a planner that loses the race leaves only an unread file.
    plan_file = attempt.plan_file_uri(uuid.uuid4().hex[:12])
    write_plan_file(s3, plan_file, plan_file_body(attempt.data_prefix, ordered))  # with their ETags
    if replan:
        continue_attempt(model, attempt.ref, number, keys, plan_file=plan_file)
    else:
        start_attempt(model, attempt.ref, number, keys, attempt.plan_json(), follows=follows, plan_file=plan_file)
    partitions.record_fence(spec, attempt.ref, fence)
    if number == 1 and not replan:
        partitions.withdraw_success_marker(spec, attempt.output_prefix)
    write_manifest(s3, attempt.manifest_uri, manifest_body(attempt.data_prefix, [f.key for f in attempt.files]))
    return attempt


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What a plan task knows of its run, as plain values: the settings its Params rendered, the run's partition and
    Airflow life, and when the partition is complete (``ready_at``: None when nothing is waited for)."""

    run_id: str
    input_prefix: str  # resolved once: the run's input_prefix Param, or the spec's prefix rendered for the run
    output_prefix: str
    model_uri: str
    instance_count: int
    model_version: str | None = None
    metadata_prefix: str | None = None
    partition: str | None = None
    life: int | None = None
    ready_at: dt.datetime | None = None
    table_partition: dict[str, str] | None = None  # output.table.partition rendered for the run (None: no table)


@dataclasses.dataclass(frozen=True)
class Ready:
    """Attempt 1 is planned (or an earlier plan of the run adopted): the watch task submits it."""

    attempt: Attempt


@dataclasses.dataclass(frozen=True)
class WaitUntil:
    """The run's partition is still being written: nothing is listed before ``ready_at`` (its interval's end plus
    ``input.settle_seconds``), whatever ``input.when_missing`` says."""

    ready_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class WaitForMarker:
    """The partition's ready marker is not there yet: the run waits for it up to ``input.wait_timeout_seconds``."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Held:
    """Another run of the partition writes the step's output prefix: the run waits until that one has ended."""

    held: partitions.PartitionHeld


@dataclasses.dataclass(frozen=True)
class Missing:
    """No input (``files``: the ready marker is there, but no file under it): ``input.when_missing`` decides."""

    reason: str
    files: bool = False


Readiness = Ready | WaitUntil | WaitForMarker | Held | Missing


def readiness(
    spec: PipelineSpec, step: str, request: PlanRequest, *, waited: bool, now: dt.datetime | None = None
) -> Readiness:
    """Whether the step of this run can be planned now, and if so plan it: :class:`Ready` with attempt 1, or what it
    waits for. In order: the partition complete (:class:`WaitUntil`), its ready marker there (:class:`WaitForMarker`;
    after the wait, ``waited``, :class:`Missing`), the output prefix free (:class:`Held`), and an input file to
    score (:class:`Missing`). An earlier step's outputs that cannot be read raise
    :class:`~shardline.orchestration.step.upstream.UpstreamError`."""
    s = spec.step(step)
    if request.ready_at is not None and (now or dt.datetime.now(dt.UTC)) < request.ready_at:
        return WaitUntil(request.ready_at)
    if s.input.ready_marker:
        ready, why = input_ready(InputWatch.of(spec, step, request.input_prefix))
        if not ready:
            return Missing(why) if waited else WaitForMarker(why)
    try:
        attempt = plan(spec, step, request)
    except partitions.PartitionHeld as held:
        return Held(held)
    if attempt is None:
        return Missing(f"no input file under {request.input_prefix} (matching {list(s.input.include)})", files=True)
    return Ready(attempt)


@dataclasses.dataclass(frozen=True)
class DryRun:
    """What a dry run found, submitting nothing: the plan in words, the inputs it would score, and the model's
    preview on a sample of the first one (``preview``); or why the model was not previewed (``not_previewed``: the
    caller's role may not read the inputs) or could not be (``error``)."""

    plan: str
    files: int
    preview: Any = None  # step.preview.PreviewResult
    not_previewed: str | None = None
    error: str | None = None


def dry_run(
    spec: PipelineSpec, step: str, input_prefix: str, *, instances: int, model_uri: str, model_version: str
) -> DryRun:
    """List the step's inputs and preview its model on a sample of the first one; submit nothing."""
    s = spec.step(step)
    s3 = services.s3_client(spec)
    objects = list_inputs(s3, input_prefix, s.input.include, s.input.exclude)
    planned = (
        f"dry run: {len(objects)} file(s), {sum(o.size for o in objects) / 2**20:.1f} MiB under "
        f"{input_prefix}; would run {choose_instance_count(instances, len(objects))} instance(s) of "
        f"{s.resources.instance_type}; nothing submitted"
    )
    if not objects:
        return DryRun(planned, 0)
    try:
        preview = preview_step(
            spec, step, s3, model_uri=model_uri, input_uri=input_prefix, objects=objects, model_version=model_version
        )
    except PreviewDenied as err:
        return DryRun(planned, len(objects), not_previewed=str(err))
    except PreviewError as err:
        return DryRun(planned, len(objects), error=str(err))
    return DryRun(planned, len(objects), preview=preview)


def _table_partition(spec: PipelineSpec, step: str, request: PlanRequest) -> dict[str, str] | None:
    """The partition a table step's run commits, its columns' values as rendered; refused when one renders empty
    (every row would land in one nameless partition, and a rerun would replace every run's)."""
    if spec.step(step).output.table is None:
        return None
    values = {name: str(value).strip() for name, value in (request.table_partition or {}).items()}
    wanted = spec.table_partition(step)
    empty = sorted(name for name in wanted if not values.get(name))
    if empty:
        raise TableError(
            f"step {step}: output.table.partition {empty} rendered empty for run {request.run_id}: template each "
            'partition column from the run (e.g. dt: "{{ data_interval_start | ds }}")'
        )
    return {name: values[name] for name in wanted}


def plan(spec: PipelineSpec, step: str, request: PlanRequest) -> Attempt | None:
    """List the step's inputs and plan attempt 1 for the run ``request`` names. ``None`` when there is nothing to
    process. ``request.ready_at`` is not looked at: :func:`readiness` waits for it.

    ``request.partition``: what the run scores (its data interval's start), recorded on the RUN item.
    ``request.life``: the run's Airflow life the plan task runs in (its DAG run's clear_number), recorded with
    RUNNING in one write, so a late failure callback of an earlier life never ends this one."""
    run_id, input_prefix = request.run_id, request.input_prefix
    s = spec.step(step)
    started = time.monotonic()
    objects, refused = _step_inputs(spec, step, run_id, input_prefix)
    listed = time.monotonic()
    if not objects:
        log.warning("step %s of run %s: no input under %s; nothing to do", step, run_id, input_prefix)
        return None
    ensure_run(services.ledger_model(spec), spec.pipeline, run_id, request.partition)
    # Running now: no longer waiting, or run again after it ended (a rerun, from this step on).
    set_run_status(services.ledger_model(spec), spec.pipeline, run_id, RunStatus.RUNNING, life=request.life)
    base = Attempt(
        pipeline=spec.pipeline,
        run_id=run_id,
        step=step,
        number=1,
        input_prefix=_dir(input_prefix),
        output_prefix=_dir(request.output_prefix),
        model_uri=request.model_uri,
        model_version=request.model_version,
        metadata_prefix=_dir(request.metadata_prefix) if request.metadata_prefix else None,
        requested_instances=request.instance_count,
        instance_type=s.resources.instance_type,  # resolved here, once: every later attempt carries its own
        table_partition=_table_partition(spec, step, request),
    )
    number, todo, replan = _what_to_plan(spec, base, objects)
    if todo:
        attempt = new_attempt(spec, base, number, todo, replan=replan, may_take=True)
        if refused:  # each shows in `shardline failed` with its reason, and counts against the tolerance
            _record_unsafe_keys(spec, attempt, refused)
    else:  # planned before, and every input has succeeded since (or its job still runs): adopt that attempt (and hold
        # its prefix again)
        attempt = latest_attempt(spec, StepRef(spec.pipeline, run_id, step))
        partitions.record_fence(spec, attempt.ref, partitions.hold(spec, attempt.ref, attempt.output_prefix))
        log.info("step %s of run %s: adopted attempt %d (its job runs, or every input succeeded)", step, run_id, number)
    timing = {
        "started_at": time.time() - (time.monotonic() - started),
        "list_seconds": round(listed - started, 3),
        "record_seconds": round(time.monotonic() - listed, 3),
    }
    log.info(
        "step %s of run %s: %d file(s), %.1f MiB, %d instance(s), sharding %s; listed in %.1fs, ordered "
        "and recorded (plan file, manifest, ledger) in %.1fs",
        step,
        run_id,
        len(objects),
        sum(o.size for o in objects) / 2**20,
        attempt.instance_count,
        s.sharding,
        timing["list_seconds"],
        timing["record_seconds"],
    )
    return attempt.model_copy(update={"planning": timing})


def _step_inputs(spec: PipelineSpec, step: str, run_id: str, input_prefix: str) -> tuple[list[S3Object], list]:
    """The inputs a step plans, and the keys refused as unsafe paths (each with its reason). Raises
    :class:`~shardline.errors.InputRefused` when every input was refused."""
    s = spec.step(step)
    if s.input.from_step:
        # Exactly what the earlier step committed, per its outputs manifest: never a listing of its prefix.

        upstream = upstream_outputs(spec, step, run_id, input_prefix)
        log.info(
            "step %s of run %s reads the %d output(s) step %s committed (%s)",
            step,
            run_id,
            len(upstream.objects),
            upstream.step,
            upstream.manifest_uri,
        )
        if tolerated := upstream.tolerated_text(step):
            log.warning("%s", tolerated)
        return upstream.objects, []
    objects, refused = list_inputs_and_refusals(
        services.s3_listing_client(spec), input_prefix, s.input.include, s.input.exclude
    )
    if not objects and refused:
        raise InputRefused(
            f"step {step}: every input under {input_prefix} was refused as an unsafe path, e.g. "
            f"{refused[0][0].key} ({refused[0][1]}); rename the objects or exclude them with "
            "input.exclude"
        )
    return objects, refused


def _record_unsafe_keys(spec: PipelineSpec, attempt: Attempt, refused: list) -> None:
    bucket, _ = parse_s3_uri(attempt.input_prefix)
    record_refused(
        services.ledger_model(spec),
        attempt.ref,
        attempt.number,
        [
            (
                f"s3://{bucket}/{o.key}",
                o.size,
                f"not processed: the key is an unsafe path ({reason}); rename the object or exclude it with "
                "input.exclude",
            )
            for o, reason in refused
        ],
        error_class=UNSAFE_KEY_ERROR,
    )


def _what_to_plan(spec: PipelineSpec, base: Attempt, objects: list[S3Object]) -> tuple[int, list[S3Object], bool]:
    """The attempt number to plan, the inputs it takes, and whether it re-plans an attempt never submitted.

    The first plan takes every input. A plan task that runs again (retried, or cleared
    because an upstream step was resubmitted) must not start the step over: it takes only
    the inputs that have not succeeded yet, new ones included, as the next attempt; or the
    same attempt again if that one was never submitted.
    """

    records = read_step(services.ledger_model(spec), base.ref)
    latest = records.step.attempt if records.step else 0
    if latest == 0:
        return 1, objects, False
    bucket, _ = parse_s3_uri(base.input_prefix)
    done = {f.input_key for f in records.files if f.status == FileStatus.SUCCEEDED}
    todo = [o for o in objects if f"s3://{bucket}/{o.key}" not in done]
    name = naming.job_name(base.pipeline, base.run_id, base.step, latest)
    try:
        state = services.backend_for(spec).describe(name)
    except JobNotFound:
        return latest, todo, True
    beside = next(partitions.running_jobs(spec, base.ref, records.step, before=latest), None)
    if beside is not None:
        _, name, state = beside
    if not state.status.is_terminal:
        # One attempt at a time: a plan task run again while attempt `latest` runs (a retry, a cleared task) adopts
        # it; planning the next beside it would have two jobs write the same keys. The watch follows it to its end,
        # and its last look sends inputs that landed since to a next attempt.
        log.warning(
            "step %s of run %s: attempt %d (job %s) is still %s: adopting it, not planning another beside it",
            base.step,
            base.run_id,
            latest,
            name,
            state.status.value,
        )
        return latest, [], False
    return latest + 1, todo, False


def _dir(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


def sized_objects(
    spec: PipelineSpec,
    attempt: Attempt,
    keys: list[str],
    known: dict[str, int] | None = None,
    records: StepRecords | None = None,
) -> list[S3Object]:
    """The inputs ``keys`` (full s3:// URIs) with their sizes, for the next attempt's plan.

    A later attempt deals its files by size like the first (``sharding: by_size``) and records
    each file's bytes in its plan file, so the sizes matter: they come from the bytes an instance
    read (FILE items), else from the plan files, and from S3 for any neither has. ``records``: the step's files
    read already by the caller, with :data:`SIZED_FILE_ATTRIBUTES` (an on-call resubmission reads the step once).
    """
    bucket, _ = parse_s3_uri(attempt.data_prefix)
    if records is None:
        records = read_step_files(spec, attempt.ref, file_attributes=SIZED_FILE_ATTRIBUTES)
    recorded = {
        **records.planned_sizes,
        **{f.input_key: f.bytes_in for f in records.files if f.bytes_in},
        **(known or {}),  # a listing's size is the newest: an input replaced since it was planned is that size now
    }
    s3 = None
    objects = []
    for key in keys:
        size, etag = recorded.get(key, 0), ""
        if not size or key in (known or {}):
            # Landed or changed since planning: its ETag goes in the plan, so a same-size replacement shows.
            s3 = s3 or services.s3_client(spec)
            head = s3.head_object(Bucket=bucket, Key=key[len(f"s3://{bucket}/") :])
            size, etag = head["ContentLength"], (head.get("ETag") or "").strip('"')
        objects.append(S3Object(key[len(f"s3://{bucket}/") :], size, etag))
    return objects
