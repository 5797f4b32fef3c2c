"""The watch's policy: given what the ledger and the backend say, what happens next.

Pure: no IO, no clock reads (``now`` is an argument), so the whole state table is
unit-tested with plain data. The trigger gathers a :class:`StepSnapshot`; the watch task
acts on the :class:`Decision`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

from shardline.backends import JobStatus, LostInstance
from shardline.decision.fleet import SUBMIT_WAIT_MAX_SECONDS, is_capacity_failure
from shardline.errors import InvalidArgument, LateInputError, UnsafeKeyError, is_permanent_file_failure
from shardline.ledger.records import FileRecord, ShardRecord
from shardline.ledger.states import SETUP_ERROR, FileStatus


class Action(enum.StrEnum):
    """What the watch decides about a step's attempt: the one outcome vocabulary, from the trigger's event to the
    STEP item's status (``orchestration.step.end``)."""

    WAIT = "WAIT"
    ADVANCE = "ADVANCE"  # every file succeeded and the job is done
    PARTIAL = "PARTIAL"  # done; the failures are within the tolerance
    RESUBMIT = "RESUBMIT"  # a new attempt for the failed or unfinished files
    FAIL = "FAIL"
    TIMEOUT = "TIMEOUT"  # the attempt ran past its deadline: its job is stopped and the step fails
    UNREACHABLE = "UNREACHABLE"  # the endpoint stayed down past the outage budget: nothing can be recorded

    @property
    def is_done(self) -> bool:
        """The step's job is done and its outputs are there to commit (all files, or within the tolerance)."""
        return self in (Action.ADVANCE, Action.PARTIAL)


UNSAFE_KEY_ERROR = UnsafeKeyError.__name__  # recorded by the planner for a key no download could write safely


@dataclasses.dataclass(frozen=True)
class Policy:
    max_attempts: int
    backoff_seconds: float
    backoff_multiplier: float
    max_failed_files: int
    max_failed_percent: float
    heartbeat_timeout_seconds: float
    max_runtime_seconds: float = 3600.0  # the job's own limit (the spec's max_runtime_seconds)

    def to_json(self) -> dict[str, float]:
        """The policy as JSON values: a trigger carries the policy its attempt started with."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, float]) -> Policy:
        return cls(
            int(data["max_attempts"]),
            float(data["backoff_seconds"]),
            float(data["backoff_multiplier"]),
            int(data["max_failed_files"]),
            float(data["max_failed_percent"]),
            float(data["heartbeat_timeout_seconds"]),
            float(data["max_runtime_seconds"]),
        )


# After the job's own limit and the heartbeat timeout, the time SageMaker takes to end a job it stops.
DEADLINE_GRACE_SECONDS = 300


def attempt_deadline(policy: Policy, watched_from: float) -> float:
    """When the watch gives up on an attempt watched from ``watched_from`` (epoch seconds) and stops its job:
    the job's MaxRuntime, plus the time a silent instance takes to be noticed, plus the grace to end it."""
    return watched_from + policy.max_runtime_seconds + policy.heartbeat_timeout_seconds + DEADLINE_GRACE_SECONDS


def deadline_reason(policy: Policy, last_seen: str) -> str:
    """Why the watch gave up on an attempt past its :func:`attempt_deadline` (its job is stopped)."""
    return (
        f"the attempt did not finish by its deadline ({policy.max_runtime_seconds:.0f}s of max_runtime_seconds "
        f"plus {policy.heartbeat_timeout_seconds:.0f}s of heartbeat_timeout_seconds plus "
        f"{DEADLINE_GRACE_SECONDS}s to stop it), so its job is stopped; last seen: {last_seen}"
    )


@dataclasses.dataclass(frozen=True)
class StepSnapshot:
    """What one poll saw. ``files`` is None when they were not read: while the job runs and every
    instance is heard from, the decision is WAIT whatever they say (:func:`needs_files`), so a poll
    reads the STEP and SHARD items only, one request however many files the step has."""

    attempt: int
    job_status: JobStatus
    job_age_seconds: float  # since this attempt's job was submitted
    files: Sequence[FileRecord] | None
    shards: Sequence[ShardRecord] = ()  # the attempt's instances' SHARD items
    job_failure_reason: str | None = None
    cancelled: bool = False  # an on-call engineer ran `shardline cancel`
    # Why the step stops: its run spent past its budget (decision.budget.OverBudget's reason); None within it.
    over_budget: str | None = None
    ledger_requests: int = 0  # the DynamoDB requests the poll made (what it cost; no input to the policy)
    model_uri: str | None = None  # the attempt's model: an instance's setup error names it
    # Attempts before this one that followed a capacity failure: retry.max_attempts does not count them.
    uncounted_attempts: int = 0
    # Why the ledger cannot vouch for this attempt (its STEP item gone, or older than the attempt): the step fails,
    # whatever the files it can still see say (``ledger.record_gaps.record_gap``).
    record_missing: str | None = None
    # Instances the backend saw die while their job goes on, each with the attempt its job runs (this one's, or an
    # earlier attempt's whose job goes on beside it).
    lost_instances: tuple[tuple[int, LostInstance], ...] = ()
    # The job of an earlier attempt that still runs beside this one (its other instances score their own files).
    earlier_job_running: str | None = None
    now: float = dataclasses.field(kw_only=True)  # when the poll was taken (epoch seconds): heartbeats age from it

    def setup_error(self, shard: ShardRecord) -> str | None:
        """Why ``shard`` could not start, with the attempt's model; None when it started."""
        if shard.setup_error is None:
            return None
        return f"{shard.setup_error} (model {self.model_uri})" if self.model_uri else shard.setup_error


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    retry_files: tuple[str, ...] = ()
    failed_files: tuple[FileRecord, ...] = ()
    delay_seconds: float = 0.0
    stop_job: bool = False  # the current job must be stopped before anything else
    capacity: bool = False  # a RESUBMIT after SageMaker could not provision the job: not counted as an attempt
    beside: bool = False  # a RESUBMIT of a lost instance's files: the running job goes on beside the next attempt


def backoff(policy: Policy, attempt: int) -> float:
    """Delay before attempt ``attempt + 1``."""
    return policy.backoff_seconds * policy.backoff_multiplier ** max(0, attempt - 1)


def tolerated(policy: Policy, failed: int, total: int) -> bool:
    allowed = max(policy.max_failed_files, math.floor(total * policy.max_failed_percent / 100.0))
    return failed <= allowed


def _silent_instances(snapshot: StepSnapshot, policy: Policy) -> tuple[list[ShardRecord], bool]:
    """The attempt's instances whose heartbeat is older than the timeout, and whether none was ever heard."""
    timeout = policy.heartbeat_timeout_seconds
    stale = [s for s in snapshot.shards if not s.finished and s.heartbeat_age(snapshot.now) > timeout]
    silent = not snapshot.shards and snapshot.job_age_seconds > policy.heartbeat_timeout_seconds
    return stale, silent


def needs_files(snapshot: StepSnapshot, policy: Policy) -> bool:
    """Whether the decision on this snapshot depends on the step's files (``snapshot.files`` may be None).

    It does not while the job runs (or stops) with every instance heard from: that is WAIT, whatever
    the files say. So a poll of a running step reads no FILE item, and a step's FILE items are read
    when its job has ended, an instance went silent, or an on-call engineer cancelled it.
    """
    job = snapshot.job_status
    if snapshot.record_missing:
        return False  # the step fails on that alone
    if snapshot.cancelled or snapshot.over_budget or not (job is JobStatus.IN_PROGRESS or job is JobStatus.STOPPING):
        return True
    if any(s.setup_error for s in snapshot.shards) or snapshot.lost_instances:
        return True
    stale, silent = _silent_instances(snapshot, policy)
    return job is JobStatus.IN_PROGRESS and bool(stale or silent)


def _running_reason(snapshot: StepSnapshot) -> str:
    """A running step's progress as its instances' last heartbeats count it (no FILE item read)."""
    shards = snapshot.shards
    if not shards:
        return f"job {snapshot.job_status.value}: no instance of attempt {snapshot.attempt} has sent a heartbeat yet"
    assigned = sum(s.files_assigned for s in shards)
    done = sum(s.files_done for s in shards)
    failed = sum(s.files_failed for s in shards)
    return (
        f"job {snapshot.job_status.value}: attempt {snapshot.attempt}'s {len(shards)} instance(s) report "
        f"{done}/{assigned} file(s) finished" + (f", {failed} failed" if failed else "")
    )


def decide(snapshot: StepSnapshot, policy: Policy) -> Decision:
    if snapshot.record_missing:
        # Absence is never success: the files it can still see are not the files the step planned.
        return Decision(Action.FAIL, snapshot.record_missing, stop_job=not snapshot.job_status.is_terminal)
    if snapshot.files is None:
        if needs_files(snapshot, policy):
            raise InvalidArgument("this snapshot's decision depends on the step's files, and they were not read")
        return Decision(Action.WAIT, _running_reason(snapshot))
    files = snapshot.files
    succeeded = [f for f in files if f.status is FileStatus.SUCCEEDED]
    failed = [f for f in files if f.status is FileStatus.FAILED]
    unfinished = [f for f in files if not f.status.is_terminal]
    total = len(files)
    job = snapshot.job_status

    if snapshot.cancelled:
        return Decision(
            Action.FAIL,
            f"cancelled by on-call (`shardline cancel`) with {len(succeeded)}/{total} files succeeded",
            failed_files=tuple(failed),
            stop_job=not job.is_terminal,
        )
    if snapshot.over_budget and (not job.is_terminal or failed or unfinished):
        # Spending on (or retrying) past the budget is what it is there to stop; a job that has finished every file
        # has spent its money already, and ends as it would.
        return Decision(Action.FAIL, snapshot.over_budget, failed_files=tuple(failed), stop_job=not job.is_terminal)
    broken = [s for s in snapshot.shards if s.setup_error]
    if broken:
        # The model (or the job's arguments) cannot be set up: every attempt would fail the same way.
        first = broken[0]
        why = snapshot.setup_error(first)
        return Decision(
            Action.FAIL,
            f"instance {first.host} of attempt {snapshot.attempt} could not start, so "
            f"nothing was processed: {why}. This is not retried: fix the "
            "model (model.uri, the Param model_version) or the step's settings",
            failed_files=tuple(dataclasses.replace(f, error_class=SETUP_ERROR, error_message=why) for f in unfinished),
            stop_job=not job.is_terminal,
        )
    beside = _with_jobs_beside(snapshot, policy, failed, unfinished, total, len(succeeded))
    if beside is not None:
        return beside
    if job is JobStatus.FAILED and is_capacity_failure(snapshot.job_failure_reason):
        return _after_capacity_failure(snapshot, policy, failed, unfinished)
    if job is JobStatus.IN_PROGRESS or job is JobStatus.STOPPING:
        stale, silent = _silent_instances(snapshot, policy)
        if job is JobStatus.IN_PROGRESS and unfinished and (stale or silent):
            # The job is stopped. What it finished is in S3 already (an instance uploads each output before its
            # file is recorded SUCCEEDED): only its unfinished files go again.
            return _retry_or_finish(
                snapshot,
                policy,
                failed,
                unfinished,
                total,
                why=_silence(stale, policy.heartbeat_timeout_seconds),
                stop_job=True,
            )
        return Decision(Action.WAIT, f"job {job.value}: {len(succeeded)}/{total} files succeeded")

    if len(succeeded) == total and job is JobStatus.COMPLETED:
        return Decision(Action.ADVANCE, _all_succeeded(total))
    # A job that did not complete (stopped, failed, an instance lost) keeps what it finished: each SUCCEEDED
    # file's output was uploaded before it was recorded, and the step's end checks every one against S3.
    why = f"job {job.value}" + (f" ({snapshot.job_failure_reason})" if snapshot.job_failure_reason else "")
    if succeeded:
        why += f"; its {len(succeeded)} finished file(s) are kept"
    return _retry_or_finish(snapshot, policy, failed, unfinished, total, why=why)


def _with_jobs_beside(
    snapshot: StepSnapshot, policy: Policy, failed: list, unfinished: list, total: int, succeeded: int
) -> Decision | None:
    """What a lost instance, or an earlier attempt's job still running beside this one, decides (None: nothing).

    The backend saw an instance die while its job goes on: its unfinished files start now as the next attempt, and
    the job's other instances go on with theirs (each file is fenced by its own FILE item). While an earlier job
    still runs, an ended attempt waits for it, unless one of its instances hangs (then it is stopped)."""
    job = snapshot.job_status
    counted = snapshot.attempt - snapshot.uncounted_attempts
    if (lost := _lost_files(snapshot, unfinished)) and counted < policy.max_attempts:
        hosts = sorted({host for host, _ in lost.values()})
        why = "; ".join(sorted({reason for _, reason in lost.values()}))
        return Decision(
            Action.RESUBMIT,
            f"instance(s) {', '.join(hosts)} died ({why}) while the job went on: their {len(lost)} unfinished "
            f"file(s) start now as attempt {snapshot.attempt + 1} of {policy.max_attempts}, beside the job's other "
            "instances",
            retry_files=tuple(sorted(lost)),
            beside=True,
        )
    if snapshot.earlier_job_running and job.is_terminal:
        stale, _ = _silent_instances(snapshot, policy)
        if stale and unfinished:  # an instance of the earlier job hangs: that job is stopped, its files go again
            why = _silence(stale, policy.heartbeat_timeout_seconds)
            return _retry_or_finish(snapshot, policy, failed, unfinished, total, why=why, stop_job=True)
        return Decision(
            Action.WAIT,
            f"job {snapshot.earlier_job_running} of an earlier attempt still scores its own files "
            f"({succeeded}/{total} files succeeded)",
        )
    return None


def _lost_files(snapshot: StepSnapshot, unfinished: Sequence[FileRecord]) -> dict[str, tuple[str, str]]:
    """The unfinished files a lost instance was given, by input key, each with that instance and why it is lost: a
    file a later attempt took since is that attempt's, not the lost instance's."""
    given = {
        (number, uri): (instance.host, instance.reason)
        for number, instance in snapshot.lost_instances
        for uri in instance.inputs
    }
    return {
        f.input_key: given[(int(f.attempt or 0), f.input_key)]
        for f in unfinished
        if (int(f.attempt or 0), f.input_key) in given
    }


def capacity_backoff(policy: Policy, earlier_capacity_retries: int) -> float:
    """The wait before a capacity retry: capacity comes back in minutes, so each retry in a row waits longer,
    from ``retry.backoff_seconds`` up to the longest wait of a refused submit."""
    return min(SUBMIT_WAIT_MAX_SECONDS, policy.backoff_seconds * policy.backoff_multiplier**earlier_capacity_retries)


def _after_capacity_failure(snapshot: StepSnapshot, policy: Policy, failed: list, unfinished: list) -> Decision:
    """SageMaker had no instances to give: nothing ran, so nothing is spent. The files go again (on the step's
    next instance type, if it has fallbacks), whatever retry.max_attempts says; permanent failures stay failed."""
    permanent = [f for f in failed if is_permanent_file_failure(f.error_class)]
    retry = [*unfinished, *[f for f in failed if not is_permanent_file_failure(f.error_class)]]
    return Decision(
        Action.RESUBMIT,
        f"job Failed ({snapshot.job_failure_reason}): its {len(retry)} file(s) go again, not counted against "
        "retry.max_attempts",
        retry_files=tuple(sorted(f.input_key for f in retry)),
        failed_files=tuple(permanent),
        delay_seconds=capacity_backoff(policy, snapshot.uncounted_attempts),
        capacity=True,
    )


def _silence(stale: Sequence[ShardRecord], timeout: float) -> str:
    """Why the job is taken for lost: which instances went silent, and the spec field that bounds it."""
    if stale:
        return (
            f"no heartbeat from {', '.join(s.host for s in stale)} for over {timeout:.0f}s (heartbeat_timeout_seconds)"
        )
    return f"no instance sent a heartbeat within {timeout:.0f}s of the job's start (heartbeat_timeout_seconds)"


def _all_succeeded(total: int) -> str:
    return "its 1 file succeeded" if total == 1 else f"all {total} files succeeded"


def _retry_or_finish(snapshot, policy, failed, unfinished, total, *, why: str, stop_job: bool = False) -> Decision:
    # Failures that the same input will reproduce: retrying them only burns an attempt.
    transient = [f for f in failed if not is_permanent_file_failure(f.error_class)]
    permanent = [f for f in failed if is_permanent_file_failure(f.error_class)]
    retry = [*unfinished, *transient]
    counted = snapshot.attempt - snapshot.uncounted_attempts  # what retry.max_attempts counts
    if retry and counted < policy.max_attempts:
        return Decision(
            Action.RESUBMIT,
            f"{why}: {len(unfinished)} unfinished and {len(transient)} transiently failed file(s) go to attempt "
            f"{snapshot.attempt + 1}"
            + (f" ({counted + 1} counted)" if snapshot.uncounted_attempts else "")
            + f" of {policy.max_attempts}",
            retry_files=tuple(sorted(f.input_key for f in retry)),
            failed_files=tuple(permanent),
            delay_seconds=backoff(policy, counted),
            stop_job=stop_job,
        )
    # Out of attempts (or nothing worth retrying): whatever is not SUCCEEDED now counts as failed.
    lost = tuple(
        dataclasses.replace(
            f,
            error_class=f.error_class or "Unfinished",
            error_message=f.error_message
            or f"not finished by attempt {snapshot.attempt}, the last that retry.max_attempts allows",
        )
        for f in retry
    )
    all_failed = (*permanent, *lost)
    if not all_failed:
        return Decision(Action.ADVANCE, _all_succeeded(total), stop_job=stop_job)
    within = tolerated(policy, len(all_failed), total)
    action = Action.PARTIAL if within else Action.FAIL
    budget = (
        f"tolerance of {policy.max_failed_files} file(s) or {policy.max_failed_percent:g}% "
        "(tolerance.max_failed_files, tolerance.max_failed_percent)"
    )
    return Decision(
        action,
        f"{why}: {len(all_failed)} of {total} file(s) failed after {snapshot.attempt} attempt(s), "
        f"{'within' if within else 'past'} the {budget}",
        failed_files=all_failed,
        stop_job=stop_job,
    )


LATE_INPUT_ERROR = LateInputError.__name__  # recorded for an input that landed after planning, when no attempt is left


def for_late_inputs(late_keys: Sequence[str], attempt: int, policy: Policy, input_prefix: str) -> Decision:
    """A step whose files all ended, but whose prefix now holds inputs no attempt planned (they landed after
    the plan was made): they go to the next attempt, or, when ``retry.max_attempts`` is spent, the step fails
    naming them. Never ADVANCE: ``_SUCCESS`` must not cover a partition that has more files than were scored."""
    keys = tuple(sorted(late_keys))
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    why = f"{len(keys)} input file(s) landed under {input_prefix} after the step was planned ({shown})"
    if attempt < policy.max_attempts:
        return Decision(
            Action.RESUBMIT, f"{why}: they go to attempt {attempt + 1} of {policy.max_attempts}", retry_files=keys
        )
    message = (
        f"landed under the input prefix after the step was planned, and attempt {attempt} was the last "
        "that retry.max_attempts allows; resubmit it, or hold the run back until its input is complete "
        "(input.settle_seconds, input.ready_marker)"
    )
    return Decision(
        Action.FAIL,
        f"{why}, and attempt {attempt} was the last that retry.max_attempts allows",
        failed_files=tuple(
            FileRecord(k, FileStatus.FAILED, attempt, error_class=LATE_INPUT_ERROR, error_message=message) for k in keys
        ),
    )
