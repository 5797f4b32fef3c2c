"""What each task of a pipeline step does, as plain functions over plain data.

Operators and the trigger call these and hold no policy of their own. An attempt is a typed
:class:`shardline.planning.attempt.Attempt`; operators and triggers turn it into XCom and back.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid

import botocore.exceptions

from shardline.decision import fleet
from shardline.decision.policy import UNSAFE_KEY_ERROR, JobStatus
from shardline.errors import GaveUpWaiting, InputRefused, SubmitRefused, error_line
from shardline.ledger.keys import StepRef, run_pk, step_sk
from shardline.ledger.records import settle_parts
from shardline.ledger.states import FileStatus, StepStatus
from shardline.ledger.step_reads import FILE_ATTRIBUTES, read_step
from shardline.ledger.step_writes import (
    continue_attempt,
    ensure_run,
    finish_step,
    record_refused,
    set_run_status,
    start_attempt,
)
from shardline.orchestration import capacity_moves, outputs, partitions, run_report, services
from shardline.orchestration.step_files import latest_attempt, read_step_files
from shardline.planning import naming
from shardline.planning.attempt import CHANGED_BY_CAPACITY, Attempt, PlannedFile
from shardline.planning.inputs import (
    S3Object,
    choose_instance_count,
    list_inputs_and_refusals,
    manifest_body,
    manifest_order,
    parse_s3_uri,
    plan_file_body,
    write_manifest,
    write_plan_file,
)
from shardline.planning.request import build_processing_request
from shardline.spec import PipelineSpec
from shardline.waiting import wait_for

log = logging.getLogger(__name__)


# How the watch's outcome is recorded on the STEP item.
OUTCOME_STATUS = {
    "ADVANCE": StepStatus.SUCCEEDED,
    "PARTIAL": StepStatus.PARTIAL,
    "FAIL": StepStatus.FAILED,
    "TIMEOUT": StepStatus.FAILED,
}


def _new_attempt(
    spec: PipelineSpec,
    base: Attempt,
    number: int,
    objects: list[S3Object],
    *,
    after: int | None = None,
    reopen_cancelled: bool = False,
    replan: bool = False,
    may_take: bool = False,
    parts: dict[str, tuple[str, str]] | None = None,
) -> Attempt:
    """Write attempt ``number``'s ledger records and manifest for ``objects``; return it (not yet submitted).

    ``base``: the step's plan (an earlier attempt, or attempt 1 before its files are known).
    ``after``: the attempt the caller saw as the newest (the ledger write is fenced on it).
    ``replan``: the STEP item holds this attempt already, but its job was never submitted.
    ``may_take``: a plan or an on-call engineer may take the output prefix; the watch's own attempts only renew it.
    ``parts``: an attempt of rejects parts (``base.parts_prefix``): each part's source and the source's ETag.
    """
    step = spec.step(base.step)
    # Before anything is written: two runs never write one output prefix at once (PartitionHeld names the other).
    fence = partitions.hold_for_attempt(spec, base.ref, base.output_prefix, number=number, may_take=may_take)
    instances = choose_instance_count(base.requested_instances, len(objects))
    ordered = manifest_order(objects, instances, step.sharding)
    attempt = base.next(number, [PlannedFile.of(o) for o in ordered])
    bucket, _ = parse_s3_uri(attempt.data_prefix)
    model = services.ledger_model(spec)
    s3 = services.s3_client(spec)
    keys = [(f"s3://{bucket}/{f.key}", f.size) for f in attempt.files]
    # What readers take "planned, not yet claimed" from (step_files): attempt 1 writes no FILE item. Written
    # first, under a name of its own; the fenced STEP update then records it, so a reader never finds the
    # STEP item naming a file not there yet, and a planner that loses the race leaves only an unread file.
    plan_file = attempt.plan_file_uri(uuid.uuid4().hex[:12])
    write_plan_file(s3, plan_file, plan_file_body(attempt.data_prefix, ordered))  # with their ETags
    if replan:
        continue_attempt(model, attempt.ref, number, keys, plan_file=plan_file)
    else:
        start_attempt(
            model,
            attempt.ref,
            number,
            keys,
            plan_json=attempt.plan_json(),
            after=after,
            reopen_cancelled=reopen_cancelled,
            plan_file=plan_file,
            parts=parts,
        )
    partitions.record_fence(spec, attempt.ref, fence)
    if number == 1 and not replan:
        partitions.withdraw_success_marker(spec, attempt.output_prefix)
    write_manifest(s3, attempt.manifest_uri, manifest_body(attempt.data_prefix, [f.key for f in attempt.files]))
    return attempt


def plan(
    spec: PipelineSpec,
    step: str,
    run_id: str,
    *,
    input_prefix: str,
    output_prefix: str,
    model_uri: str,
    instance_count: int,
    model_version: str | None = None,
    metadata_prefix: str | None = None,
    partition: str | None = None,
) -> Attempt | None:
    """List the step's inputs and plan attempt 1. ``None`` when there is nothing to process.

    ``partition``: what the run scores (its data interval's start), recorded on the RUN item."""
    s = spec.step(step)
    started = time.monotonic()
    objects, refused = _step_inputs(spec, step, run_id, input_prefix)
    listed = time.monotonic()
    if not objects:
        log.warning("step %s of run %s: no input under %s; nothing to do", step, run_id, input_prefix)
        return None
    ensure_run(services.ledger_model(spec), spec.pipeline, run_id, partition)
    # Running now: no longer waiting, or run again after it ended (a rerun, from this step on).
    set_run_status(services.ledger_model(spec), spec.pipeline, run_id, StepStatus.RUNNING)
    base = Attempt(
        pipeline=spec.pipeline,
        run_id=run_id,
        step=step,
        number=1,
        input_prefix=_dir(input_prefix),
        output_prefix=_dir(output_prefix),
        model_uri=model_uri,
        model_version=model_version,
        metadata_prefix=_dir(metadata_prefix) if metadata_prefix else None,
        requested_instances=instance_count,
    )
    number, todo, replan = _what_to_plan(spec, base, objects)
    if todo:
        attempt = _new_attempt(spec, base, number, todo, after=number - 1, replan=replan, may_take=True)
        if refused:  # each shows in `shardline failed` with its reason, and counts against the tolerance
            _record_unsafe_keys(spec, attempt, refused)
    else:  # planned before, and every input has succeeded since: adopt that attempt (and hold its prefix again)
        attempt = latest_attempt(spec, StepRef(spec.pipeline, run_id, step))
        partitions.record_fence(spec, attempt.ref, partitions.hold(spec, attempt.ref, attempt.output_prefix))
        log.info("step %s of run %s: every input already succeeded at attempt %d", step, run_id, number)
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
        from shardline.orchestration.upstream import upstream_outputs

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
    from shardline.backends import JobNotFound

    records = read_step(services.ledger_model(spec), base.ref)
    latest = int(records.step.attempt or 0) if records.step else 0
    if latest == 0:
        return 1, objects, False
    bucket, _ = parse_s3_uri(base.input_prefix)
    done = {f.input_key for f in records.files if f.status == FileStatus.SUCCEEDED}
    todo = [o for o in objects if f"s3://{bucket}/{o.key}" not in done]
    try:
        services.backend_for(spec).describe(naming.job_name(base.pipeline, base.run_id, base.step, latest))
    except JobNotFound:
        return latest, todo, True
    return latest + 1, todo, False


def _dir(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


def submit(spec: PipelineSpec, attempt: Attempt) -> Attempt:
    """Start the attempt's job, or adopt the one an earlier try of this task started. Only while the step still
    holds its output prefix (a watch task that queued past its hold's lease finds another run there)."""
    why = partitions.lost(spec, attempt)
    if why:
        raise partitions.PartitionLost(why)
    image, role = services.image_and_role(spec)
    request = build_processing_request(spec, attempt, image_uri=image, role_arn=role, region=services.region(spec))
    backend = services.backend_for(spec)
    try:
        backend.submit(request)
    except botocore.exceptions.ClientError as err:
        error = err.response.get("Error", {})
        if fleet.refusal_of(error.get("Code")) is None:
            raise
        # "Not now", not "not this": the task waits and submits this same attempt again.
        raise SubmitRefused(error["Code"], error.get("Message", ""), attempt.job_name, attempt.to_xcom()) from err
    state = backend.describe(attempt.job_name)
    log.info("job %s (attempt %d of step %s): %s", attempt.job_name, attempt.number, attempt.step, state.status.value)
    return attempt.submitted(state.created_at or time.time())


def stop(spec: PipelineSpec, attempt: Attempt) -> None:
    backend = services.backend_for(spec)
    if not backend.describe(attempt.job_name).status.is_terminal:
        log.warning("stopping job %s", attempt.job_name)
        backend.stop(attempt.job_name)


def resubmit(
    spec: PipelineSpec,
    attempt: Attempt,
    retry_keys: list[str],
    *,
    by_oncall: bool = False,
    sizes: dict[str, int] | None = None,
    capacity: bool = False,
) -> Attempt:
    """Plan and submit the next attempt with only ``retry_keys`` (full s3:// URIs).

    Fenced on ``attempt``: the step must still be at it, so a watch task and an on-call engineer cannot
    both plan the next one (the loser gets StaleOrchestratorError). ``attempt``'s job is stopped,
    and waited for, before the next one is planned: two attempts never run at once.
    ``by_oncall``: a cancelled step may be reopened. ``sizes``: sizes the caller already knows (the listing
    that found inputs landed after planning), so no object is read for them. ``capacity``: SageMaker could not
    provision ``attempt``'s job, so the next one may move to a fallback instance type (``after_capacity_failure``).
    """
    stop_and_wait(spec, attempt)
    base = capacity_moves.after_capacity_failure(spec, attempt) if capacity else attempt
    base, retry_keys, parts = _what_a_retry_takes(spec, base, retry_keys)
    objects = sized_objects(spec, base, retry_keys, known=sizes)
    nxt = _new_attempt(
        spec,
        base,
        attempt.number + 1,
        objects,
        after=attempt.number,
        reopen_cancelled=by_oncall,
        may_take=by_oncall,
        parts=parts,
    )
    return submit(spec, nxt)


def _what_a_retry_takes(
    spec: PipelineSpec, base: Attempt, keys: list[str]
) -> tuple[Attempt, list[str], dict[str, tuple[str, str]] | None]:
    """An attempt reads one prefix: the step's inputs, or one folder of rejects parts. Inputs of the step go first
    (a part not taken now keeps its status; the next ``--rejects`` takes its rows again); else the parts of the
    first key's folder, each with its source and the source's ETag as its FILE item recorded them."""
    folders = {key: naming.rejects_parts_prefix_of(key) for key in keys}
    inputs = [key for key in keys if folders[key] is None]
    dropped = [key for key in keys if folders[key] is not None and (inputs or folders[key] != folders[keys[0]])]
    if dropped:
        log.warning(
            "step %s: %d rejects part(s) not retried with these files, e.g. %s", base.step, len(dropped), dropped[0]
        )
    if inputs or not keys:
        return base.model_copy(update={"parts_prefix": None}), inputs, None
    taken = [key for key in keys if key not in dropped]
    records = read_step_files(spec, base.ref)
    recorded = {f.input_key: (f.part_of, f.source_etag or "") for f in records.files if f.part_of}
    parts = {key: recorded[key] for key in taken if key in recorded}
    return base.model_copy(update={"parts_prefix": folders[keys[0]]}), taken, parts


def submit_parts(
    spec: PipelineSpec, latest: Attempt, parts_prefix: str, objects: list[S3Object], parts: dict[str, tuple[str, str]]
) -> Attempt:
    """Plan and submit the attempt after ``latest`` over rejects parts (``objects``, under ``parts_prefix``), fenced
    on ``latest`` as an on-call resubmission is (:mod:`shardline.orchestration.rejects_parts` picks them)."""
    stop_and_wait(spec, latest)
    base = latest.model_copy(update={"parts_prefix": parts_prefix})
    nxt = _new_attempt(
        spec, base, latest.number + 1, objects, after=latest.number, reopen_cancelled=True, may_take=True, parts=parts
    )
    return submit(spec, nxt)


def sized_objects(
    spec: PipelineSpec, attempt: Attempt, keys: list[str], known: dict[str, int] | None = None
) -> list[S3Object]:
    """The inputs ``keys`` (full s3:// URIs) with their sizes, for the next attempt's plan.

    A later attempt deals its files by size like the first (``sharding: by_size``) and records
    each file's bytes in its plan file, so the sizes matter: they come from the bytes an instance
    read (FILE items), else from the plan files, and from S3 for any neither has.
    """
    bucket, _ = parse_s3_uri(attempt.data_prefix)
    records = read_step_files(spec, attempt.ref, file_attributes=[*FILE_ATTRIBUTES, "bytes_in"])
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


STOP_WAIT_SECONDS = 900.0  # SageMaker takes a minute or two to stop a job


def stop_and_wait(spec: PipelineSpec, attempt: Attempt, timeout: float = STOP_WAIT_SECONDS, poll: float = 5.0) -> None:
    """Stop the attempt's job if it still runs, and return once it has ended.

    Raises :class:`~shardline.errors.GaveUpWaiting` if it has not ended by ``timeout``: the next attempt must not start
    beside it (the task's retry tries again later).
    """
    from shardline.backends import JobNotFound

    backend = services.backend_for(spec)
    try:
        state = backend.describe(attempt.job_name)
    except JobNotFound:
        return
    if state.status.is_terminal:
        return
    log.warning("stopping job %s (attempt %d) before the next attempt starts", attempt.job_name, attempt.number)
    backend.stop(attempt.job_name)
    state = wait_for(
        lambda: backend.describe(attempt.job_name), lambda s: s.status.is_terminal, timeout=timeout, interval=poll
    )
    if not state.status.is_terminal:
        raise GaveUpWaiting(stop_timeout_text(attempt.job_name, state.status.value, timeout))


def stop_timeout_text(job_name: str, status: str, timeout: float) -> str:
    return (
        f"job {job_name} is still {status} {timeout:.0f}s after it was asked to stop, so the next attempt has "
        "not started (two attempts never run at once): the task's retry tries again later; if the job never "
        "stops, check it in the backend's console"
    )


def file_error(error_class: str | None, error_message: str | None) -> str:
    """A file's error in one line: class and message, either of which may be missing."""
    return error_line(error_class, error_message) or "no error recorded"


def report(spec: PipelineSpec, ref: StepRef) -> dict:
    """Reconcile rows in against rows out for every file of a step."""
    step = ref.step
    records = read_step_files(spec, ref)
    files = settle_parts(records.files)  # a file's rejects parts count as the file's rows
    succeeded = [f for f in files if f.status == FileStatus.SUCCEEDED]
    failed = [f for f in files if f.status == FileStatus.FAILED]
    mismatched = [f.input_key for f in succeeded if (f.rows_in or 0) != (f.rows_out or 0) + (f.rows_rejected or 0)]
    return {
        "step": step,
        "files": len(files),
        "succeeded": len(succeeded),
        "failed": len(failed),
        "rows_in": int(sum(f.rows_in or 0 for f in succeeded)),
        "rows_out": int(sum(f.rows_out or 0 for f in succeeded)),
        "rows_rejected": int(sum(f.rows_rejected or 0 for f in succeeded)),
        "attempts": int((records.step.attempt if records.step else 0) or 0),
        "rows_mismatched_files": mismatched,
        "failed_files": [{"input": f.input_key, "error": file_error(f.error_class, f.error_message)} for f in failed],
        "report": report_uri(records.step, ref),
        "reported_at": dt.datetime.now(dt.UTC).isoformat(),
    }


def report_uri(step_item, ref: StepRef) -> str | None:
    """Where a step's run report is (None before its plan exists)."""
    pipeline, run_id, step = ref
    if step_item is None or not step_item.plan_json:
        return None
    return Attempt.from_plan(
        step_item.plan_json, int(step_item.attempt or 1), 0, pipeline=pipeline, run_id=run_id, step=step
    ).report_uri()


def resume(spec: PipelineSpec, attempt: Attempt) -> Attempt:
    """The newest attempt of the step, given the one this task started from.

    A watch task retried after it resubmitted only knows attempt 1 (from XCom); the STEP
    item knows the newest. Its job is adopted, or submitted if the earlier try died
    between planning it and submitting it.
    """
    from shardline.backends import JobNotFound

    records = read_step_files(spec, attempt.ref)
    latest = int(records.step.attempt or 0) if records.step else 0
    if latest <= attempt.number:
        return attempt
    # A capacity fallback's type and count are in the STEP item's plan, which the newest attempt wrote.
    newest = Attempt.from_plan(
        records.step.plan_json, latest, 0, pipeline=attempt.pipeline, run_id=attempt.run_id, step=attempt.step
    )
    attempt = attempt.model_copy(update={name: getattr(newest, name) for name in CHANGED_BY_CAPACITY})
    name = naming.job_name(attempt.pipeline, attempt.run_id, attempt.step, latest)
    try:
        state = services.backend_for(spec).describe(name)
    except JobNotFound:
        unfinished = [f.input_key for f in records.files if f.attempt == latest and not f.status.is_terminal]
        log.warning("attempt %d of step %s was planned but never submitted; submitting it now", latest, attempt.step)
        objects = sized_objects(spec, attempt, unfinished)
        return submit(spec, _new_attempt(spec, attempt, latest, objects, replan=True))
    log.info("resuming at attempt %d (%s, %s)", latest, name, state.status.value)
    files = sum(1 for f in records.files if f.attempt == latest)
    return attempt.model_copy(
        update={"number": latest, "file_count": files, "files": (), "submitted_at": state.created_at or time.time()}
    )


def finish(spec: PipelineSpec, attempt: Attempt, action: str, reason: str) -> StepStatus | None:
    """Record the watch's outcome on the STEP item (and on the RUN item when the step failed).

    Fenced on the attempt: if an on-call engineer resubmitted meanwhile, the newer attempt's state stands.
    """
    status = OUTCOME_STATUS[action]
    unvouched: list[outputs.UnvouchedFile] = []
    seen = None
    lost = partitions.lost(spec, attempt) if status in (StepStatus.SUCCEEDED, StepStatus.PARTIAL) else None
    if lost:  # another run writes the prefix now (this run's hold ran out): this one vouches for nothing there
        status, reason = StepStatus.FAILED, lost
    if status in (StepStatus.SUCCEEDED, StepStatus.PARTIAL):
        seen = outputs.read_outputs(spec, attempt)
        unvouched = outputs.unvouched_outputs(spec, attempt, seen)
        if unvouched:
            status = StepStatus.FAILED
            reason = outputs.unvouched_text(unvouched)
            log.error("step %s: %s", attempt.step, reason)
        elif over := outputs.rejects_over_limit(spec, attempt, seen.records):
            status, reason = StepStatus.FAILED, over
    status, reason = run_report.check_run_report(spec, attempt, status, reason, seen.records if seen else None)
    if status is StepStatus.SUCCEEDED:
        # The last look at the input prefix, after the run report and just before the step is recorded as
        # ended: a file that landed (or was replaced) since the watch's look goes to a next attempt, never under
        # a _SUCCESS that does not cover it.
        late = outputs.late_inputs(spec, attempt)
        if late:
            raise outputs.LateInputsFound(late)
    # A step that lost its prefix has nothing to resubmit: the run that holds it writes it now.
    reason = reason if lost else outcome_message(attempt, status, reason)
    model = services.ledger_model(spec)
    if not finish_step(model, attempt.ref, attempt.number, status, reason):
        log.info("step %s moved on (resubmitted or cancelled); its newer state stands", attempt.step)
        return None
    if unvouched:  # FAILED now, so `failed` shows them and `resubmit --all-failed` takes them
        for number in sorted({u.attempt for u in unvouched}):
            record_refused(
                model,
                attempt.ref,
                number,
                [(u.input_key, 0, u.reason) for u in unvouched if u.attempt == number],
                error_class=outputs.UNVOUCHED_OUTPUT_ERROR,
            )
    if status is StepStatus.FAILED:
        set_run_status(model, attempt.pipeline, attempt.run_id, StepStatus.FAILED, run_outcome_message(attempt, reason))
    if status in (StepStatus.SUCCEEDED, StepStatus.PARTIAL):
        # No file changed since the reading: a step with an unvouched file ended FAILED, and commits nothing.
        outputs.commit_outputs(spec, attempt, status, seen)
    return status


def step_message(spec: PipelineSpec, attempt: Attempt) -> str:
    """The STEP item's message: what its outcome was, and why."""
    control = services.ledger_model(spec).Control
    try:
        item = control.get(run_pk(attempt.pipeline, attempt.run_id), step_sk(attempt.step), consistent_read=True)
    except control.DoesNotExist:
        item = None
    return (item.message if item else None) or f"step {attempt.step} has no recorded outcome"


def outcome_message(attempt: Attempt, status: StepStatus, reason: str) -> str:
    """The STEP item's message for the watch's outcome: a step that did not succeed says how to retry it."""
    if status is StepStatus.SUCCEEDED:
        return reason
    return (
        reason + "; after fixing the cause: " + naming.resubmit_command(attempt.pipeline, attempt.run_id, attempt.step)
    )


def run_outcome_message(attempt: Attempt, step_message: str) -> str:
    """The RUN item's message when one of its steps failed."""
    return f"step {attempt.step} failed: {step_message}"


def record_run_status(
    spec: PipelineSpec, run_id: str, status: StepStatus, message: str, partition: str | None = None
) -> None:
    """A run that ends (skipped or failed) before anything was planned, or waits for its input (RUNNING), is
    still listed, with why."""
    model = services.ledger_model(spec)
    ensure_run(model, spec.pipeline, run_id, partition)
    set_run_status(model, spec.pipeline, run_id, status, message)


def finish_run(spec: PipelineSpec, pipeline: str, run_id: str, status: StepStatus, message: str = "") -> None:
    """Record how the run ended, and release the output prefixes it held."""
    set_run_status(services.ledger_model(spec), pipeline, run_id, status, message)
    partitions.release_run(spec, pipeline, run_id)


def job_status(spec: PipelineSpec, attempt: Attempt) -> JobStatus:
    return services.backend_for(spec).describe(attempt.job_name).status
