"""What a poll of a step reads and decides: the values a trigger carries, and the reads it makes.

A trigger carries JSON values, never a spec path (the triggerer needs no DAGs folder, and a spec
edited mid-run cannot change an attempt while it runs): a :class:`StepWatch` for an attempt (the
AWS settings and the decision policy it started with) and an :class:`InputWatch` for an input
prefix (what counts as its input having landed). Both are built from the spec when the task defers.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from shardline.decision import fleet
from shardline.decision.budget import OverBudget, RunBudget, over_budget
from shardline.decision.policy import Action, Decision, Policy, StepSnapshot, decide, needs_files
from shardline.ledger.keys import StepRef
from shardline.ledger.partitions import standing
from shardline.ledger.record_gaps import record_gap, table_gone, table_gone_text
from shardline.ledger.states import FileStatus, StepStatus
from shardline.ledger.step_reads import StepRecords, read_step
from shardline.orchestration import services
from shardline.orchestration.budget import budget_for
from shardline.orchestration.partitions import running_job_of, running_jobs
from shardline.orchestration.services import AwsSettings
from shardline.orchestration.step.files import read_step_files
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import list_inputs
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec


def policy_for(spec: PipelineSpec, step: str) -> Policy:
    """The decision policy a step's spec sets: its retries, tolerance, heartbeat timeout and runtime limit."""
    s = spec.step(step)
    return Policy(
        max_attempts=s.retry.max_attempts,
        backoff_seconds=s.retry.backoff_seconds,
        backoff_multiplier=s.retry.backoff_multiplier,
        max_failed_files=s.tolerance.max_failed_files,
        max_failed_percent=s.tolerance.max_failed_percent,
        heartbeat_timeout_seconds=s.heartbeat_timeout_seconds,
        max_runtime_seconds=s.max_runtime_seconds,
    )


@dataclasses.dataclass(frozen=True)
class StepWatch:
    """What polling one step's attempts needs: where its ledger and jobs are, and the policy to apply."""

    aws: AwsSettings
    policy: Policy
    budget: RunBudget | None = None  # what the run may spend (None: no budget); read once, when the watch begins

    @classmethod
    def of(cls, spec: PipelineSpec, step: str, attempt: Attempt | None = None) -> StepWatch:
        """The watch of ``step``; of ``attempt``, it holds the attempt's run to its budget (read from the ledger)."""
        try:
            budget = budget_for(spec, attempt) if attempt is not None else None
        except Exception as err:
            if not table_gone(err):
                raise
            budget = None  # the ledger is gone: the snapshot finds it so, and fails the step naming it
        return cls(AwsSettings.of(spec), policy_for(spec, step), budget)

    def to_json(self) -> dict[str, Any]:
        return {
            "aws": self.aws.to_json(),
            "policy": self.policy.to_json(),
            "budget": self.budget.to_json() if self.budget else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepWatch:
        return cls(
            AwsSettings.from_json(data["aws"]),
            Policy.from_json(data["policy"]),
            RunBudget.from_json(data.get("budget")),
        )


@dataclasses.dataclass(frozen=True)
class InputWatch:
    """What says a step's input has landed under ``input_prefix``: its ready marker when the spec names one,
    else any file matching ``include`` and not ``exclude``."""

    aws: AwsSettings
    input_prefix: str
    ready_marker: str | None
    include: tuple[str, ...]
    exclude: tuple[str, ...]

    @classmethod
    def of(cls, spec: PipelineSpec, step: str, input_prefix: str) -> InputWatch:
        s = spec.step(step).input
        return cls(AwsSettings.of(spec), input_prefix, s.ready_marker, tuple(s.include), tuple(s.exclude))

    def to_json(self) -> dict[str, Any]:
        return {
            "aws": self.aws.to_json(),
            "input_prefix": self.input_prefix,
            "ready_marker": self.ready_marker,
            "include": list(self.include),
            "exclude": list(self.exclude),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputWatch:
        return cls(
            AwsSettings.from_json(data["aws"]),
            str(data["input_prefix"]),
            data.get("ready_marker"),
            tuple(data["include"]),
            tuple(data["exclude"]),
        )


@dataclasses.dataclass(frozen=True)
class PartitionWatch:
    """What says whether a run's step may write ``output_prefix`` now (:mod:`shardline.ledger.partitions`)."""

    aws: AwsSettings
    output_prefix: str
    ref: StepRef

    @classmethod
    def of(cls, spec: PipelineSpec, output_prefix: str, ref: StepRef) -> PartitionWatch:
        return cls(AwsSettings.of(spec), output_prefix, ref)

    def to_json(self) -> dict[str, Any]:
        return {"aws": self.aws.to_json(), "output_prefix": self.output_prefix, "ref": list(self.ref)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionWatch:
        return cls(AwsSettings.from_json(data["aws"]), str(data["output_prefix"]), StepRef(*data["ref"]))


@dataclasses.dataclass(frozen=True)
class StepEvent:
    """What :class:`StepTrigger` hands the watch task: the decision on one attempt.

    ``action`` is any :class:`Action` but WAIT. It travels as a JSON dict (:meth:`to_event`,
    :meth:`from_event`): Airflow stores trigger events.
    """

    action: Action
    reason: str
    attempt: Attempt
    retry_files: tuple[str, ...] = ()
    failed_files: tuple[dict[str, Any], ...] = ()  # input, error_class, error_message (at most 500 characters)
    delay_seconds: float = 0.0
    stop_job: bool = False
    policy: Policy | None = None  # the policy the attempt was watched with: the watch task acts on the event by it
    capacity: bool = False  # a RESUBMIT after SageMaker could not provision the job (not counted as an attempt)
    beside: bool = False  # a RESUBMIT of a lost instance's files: the running job goes on beside the next attempt

    @classmethod
    def of(cls, decision, attempt: Attempt, policy: Policy | None = None) -> StepEvent:
        return cls(
            decision.action,
            decision.reason,
            attempt,
            tuple(decision.retry_files),
            tuple(
                {"input": f.input_key, "error_class": f.error_class, "error_message": (f.error_message or "")[:500]}
                for f in decision.failed_files
            ),
            decision.delay_seconds,
            decision.stop_job,
            policy,
            decision.capacity,
            decision.beside,
        )

    def to_event(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "reason": self.reason,
            "attempt": self.attempt.to_xcom(),
            "retry_files": list(self.retry_files),
            "failed_files": list(self.failed_files),
            "delay_seconds": self.delay_seconds,
            "stop_job": self.stop_job,
            "policy": self.policy.to_json() if self.policy else None,
            "capacity": self.capacity,
            "beside": self.beside,
        }

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> StepEvent:
        policy = event.get("policy")
        return cls(
            Action(event["action"]),
            event["reason"],
            Attempt.from_xcom(event["attempt"]),
            tuple(event.get("retry_files") or ()),
            tuple(event.get("failed_files") or ()),
            float(event.get("delay_seconds") or 0.0),
            bool(event.get("stop_job")),
            Policy.from_json(policy) if policy else None,
            bool(event.get("capacity")),
            bool(event.get("beside")),
        )


def partition_free(watch: PartitionWatch) -> tuple[bool, str]:
    """Whether the step may take its output prefix now, and who holds it (or why it is free), in words."""

    model = services.ledger_model(watch.aws)
    holder, free = standing(model, watch.output_prefix, watch.ref, running_job_of(watch.aws))
    return (True, f"{watch.output_prefix}: {free}") if free else (False, f"{watch.output_prefix} is held by {holder}")


def _watch(source: PipelineSpec | StepWatch, attempt: Attempt) -> StepWatch:
    return source if isinstance(source, StepWatch) else StepWatch.of(source, attempt.step, attempt)


def snapshot(source: PipelineSpec | StepWatch, attempt: Attempt, now: float | None = None) -> StepSnapshot:
    """What the backend and the ledger say about the step right now.

    The job is described first, then the ledger read: a job seen ended has made its last write, so
    the ledger read after it is final (read the other way round, a file that finished in between
    would look unfinished, and go again). While the job runs and every instance is heard from, the
    decision is WAIT whatever the files say (``policy.needs_files``): the poll reads the STEP and
    SHARD items only, one Query. The FILE items (and plan files) are read when the decision needs them.

    A STEP item that is gone (or names an older attempt than the one watched) is recorded as the snapshot's
    ``record_missing``: the step's files cannot be counted without it, and the decision fails the step.
    """
    watch = _watch(source, attempt)
    now = now if now is not None else time.time()
    state = services.backend_for(watch.aws).describe(attempt.job_name)
    model = services.ledger_model(watch.aws)
    try:
        head = read_step(model, attempt.ref, files=False)
        gap = record_gap(head.step, attempt.ref, attempt.number)
    except Exception as err:
        if not table_gone(err):
            raise
        head, gap = StepRecords(step=None, files=[], shards=[], requests=1), table_gone_text(model, attempt.ref)
    if gap:
        return dataclasses.replace(_snapshot(attempt, state, head, now, files=False), record_missing=gap)
    beside = _jobs_beside(watch, attempt, state, head)
    over = over_budget(watch.budget, head.shards, attempt.number, now, attempt.submitted_at) if watch.budget else None
    taken = dataclasses.replace(_snapshot(attempt, state, head, now, files=False), **beside)
    if not (over or needs_files(taken, watch.policy)):
        return taken
    records = read_step_files(watch.aws, attempt.ref, head=head)
    if over:
        beside["over_budget"] = _over_budget_reason(over, attempt, records)
    return dataclasses.replace(_snapshot(attempt, state, records, now, files=True), **beside)


def _jobs_beside(watch: StepWatch, attempt: Attempt, state, head: StepRecords) -> dict:
    """The instances the backend saw die while their job goes on (this attempt's job, or an earlier attempt's that
    still runs beside it: ``live_from`` on the STEP item), the first such earlier job that still runs, and the
    heartbeats of every running job's instances but the dead ones (a hung one is seen going stale). Each job is
    described before the step's files are read, so a job seen ended has made its last write."""
    lost = [(attempt.number, instance) for instance in state.lost_instances]
    earlier = None
    live_from = head.step.live_from or attempt.number
    for number, name, seen in running_jobs(watch.aws, attempt.ref, head.step, before=attempt.number):
        earlier = earlier or name
        lost += [(number, instance) for instance in seen.lost_instances]
    # A lost instance whose files a later attempt took (``lost_taken``) decides nothing more: left out, the polls
    # while its job's other instances go on read no FILE item (each would read them all).
    taken = head.step.lost_taken
    untaken = tuple((number, instance) for number, instance in lost if f"{number}/{instance.host}" not in taken)
    if earlier is None:
        return {"lost_instances": untaken, "earlier_job_running": None}
    dead = {(number, instance.host) for number, instance in lost}  # taken or not: its silence is no hang
    watched = [s for s in head.shards if live_from <= s.attempt <= attempt.number and (s.attempt, s.host) not in dead]
    return {"lost_instances": untaken, "earlier_job_running": earlier, "shards": watched}


def _over_budget_reason(over: OverBudget, attempt: Attempt, records: StepRecords) -> str:
    """The stopped step's message: what the run spent, the files and rows done (the ledger's FILE items, not the
    heartbeats', which may be half a minute old), and the command that finishes the rest with a larger budget."""
    files = records.settled
    done = [f for f in files if f.status is FileStatus.SUCCEEDED]
    raised = over.suggested_budget(len(done), len(files))
    command = naming.budget_resubmit_command(attempt.pipeline, attempt.run_id, attempt.step, raised)
    return over.reason(len(done), len(files), sum(f.rows_out for f in done), command)


def _snapshot(attempt: Attempt, state, records, now: float, *, files: bool) -> StepSnapshot:
    cancelled = bool(records.step and records.step.status == StepStatus.CANCELLED)
    return StepSnapshot(
        attempt=attempt.number,
        job_status=state.status,
        job_age_seconds=now - attempt.submitted_at,
        # A file's rejects parts are the file's rows: one that a newer part took again is no file of the step's.
        files=records.settled if files else None,
        shards=[s for s in records.shards if s.attempt == attempt.number],
        job_failure_reason=state.failure_reason,
        cancelled=cancelled,
        ledger_requests=records.requests,
        model_uri=attempt.model_uri,
        uncounted_attempts=attempt.number - attempt.counted_number,
        now=now,
    )


def stop_now(watch: StepWatch, attempt: Attempt) -> None:
    """Stop the attempt's job at once, from the trigger (a step past its budget): the watch task, when it resumes to
    end the step, finds it stopped. Stopping a job that has ended does nothing."""
    backend = services.backend_for(watch.aws)
    if not backend.describe(attempt.job_name).status.is_terminal:
        backend.stop(attempt.job_name)


def decide_now(source: PipelineSpec | StepWatch, attempt: Attempt) -> Decision:
    """One poll, as the trigger makes it: what the step's policy says about its snapshot right now."""
    watch = _watch(source, attempt)
    return decide(snapshot(watch, attempt), watch.policy)


def input_ready(watch: InputWatch) -> tuple[bool, str]:
    """Whether a step's input has landed: its ready marker when the spec names one, else any input
    file the step would read. Returns (ready, what was found or looked for, in words)."""

    s3 = services.s3_client(watch.aws)
    bucket, key = parse_s3_uri(watch.input_prefix)
    if watch.ready_marker:
        marker = f"{key.rstrip('/')}/{watch.ready_marker}" if key else watch.ready_marker
        found = s3.list_objects_v2(Bucket=bucket, Prefix=marker, MaxKeys=1).get("Contents", [])
        if any(o["Key"] == marker for o in found):
            return True, f"s3://{bucket}/{marker} is there"
        return False, f"no s3://{bucket}/{marker} (input.ready_marker) yet"
    if list_inputs(s3, watch.input_prefix, watch.include, watch.exclude):
        return True, f"input files are under {watch.input_prefix}"
    return False, f"no input file under {watch.input_prefix} (matching {list(watch.include)}) yet"


def is_unreachable(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) says the AWS endpoint could not be reached or did not answer."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, BotoConnectionError | HTTPClientError | ConnectionError | TimeoutError):
            return True
        err = err.__cause__ or err.__context__
    return False


# AWS's "slow down" answers to a poll's calls (DynamoDB's and SageMaker's): the next poll asks again.
THROTTLED_CODES = frozenset(
    {"ThrottlingException", "Throttling", "RequestLimitExceeded", "ProvisionedThroughputExceededException"}
)


def is_throttled(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) is AWS asking the caller to slow down (or a passing service error):
    a poll that meets one is taken again at the next poll, however long that goes on."""
    from botocore.exceptions import ClientError

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, ClientError):
            code = err.response.get("Error", {}).get("Code")
            return code in THROTTLED_CODES or fleet.refusal_of(code) not in (None, fleet.SubmitRefusal.QUOTA)
        err = err.__cause__ or err.__context__
    return False


def describe_error(err: BaseException) -> str:
    """The innermost cause of ``err``, in one line."""
    while err.__cause__ is not None:
        err = err.__cause__
    said = str(err).strip()
    return f"{type(err).__name__}: {said}" if said else type(err).__name__


def unreachable_reason(attempt: Attempt, seconds: float, err: BaseException) -> str:
    """Why a step's watch gave up on an endpoint outage, and what the on-call engineer does next."""
    return (
        f"the AWS endpoint (DynamoDB/S3/the job API) was unreachable for {seconds:.0f}s, past the step's "
        f"heartbeat_timeout_seconds (last error: {describe_error(err)}). Nothing was recorded as failed: each "
        f"file keeps the status it last reached, and job {attempt.job_name} may still be running. Once the "
        "endpoint answers again, check with `shardline status "
        f"{attempt.pipeline}/{attempt.run_id}` and resubmit what did not finish (this also lets the DAG "
        "run take the step up again): " + naming.resubmit_command(attempt.pipeline, attempt.run_id, attempt.step)
    )
