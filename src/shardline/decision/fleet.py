"""A fleet within the account's SageMaker quotas: what AWS's ordinary refusals mean, as pure decisions.

Three answers are not failures of a step, only of the moment:

- at submit, ``ResourceLimitExceeded`` (the account's instance quota for the type is in use),
  ``ThrottlingException`` (too many API calls) and ``ServiceUnavailable``/``InternalFailure``: the submit
  waits (:func:`submit_wait`, jittered exponential backoff) and tries again. The wait is not an attempt;
- a job that ends with ``CapacityError`` (SageMaker could not provision the instances): its files go again,
  not counted against ``retry.max_attempts``, on the step's next instance type when it has fallbacks
  (:func:`capacity_choice`, the instance count re-planned by vCPUs).

Admission (how many instances of a type may run at once) is Airflow's: one pool per instance type
(:func:`pool_name`), its slots the quota; a step's tasks hold ``instance_count`` slots, and a spec's
``priority`` is their priority weight (:data:`PRIORITY_WEIGHTS`).

Pure: no IO, no clock, no randomness (the jitter is an argument), so every rule is table-tested.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any

from shardline import contract
from shardline.errors import InvalidArgument

# -- at submit ------------------------------------------------------------------------------------------


class SubmitRefusal(enum.StrEnum):
    """The error codes of CreateProcessingJob that say "not now" rather than "not this request"."""

    QUOTA = "ResourceLimitExceeded"
    THROTTLED = "ThrottlingException"
    UNAVAILABLE = "ServiceUnavailable"
    INTERNAL = "InternalFailure"
    DAILY_BUDGET = "OverDailyBudget"  # not AWS's: the pipeline's budget.daily_usd, with on_exceed: wait


# What each refusal is waited out as, in words for the log and the page.
_WHY = {
    SubmitRefusal.QUOTA: "the account's quota of this instance type is in use",
    SubmitRefusal.THROTTLED: "SageMaker throttled the request",
    SubmitRefusal.UNAVAILABLE: "SageMaker was unavailable",
    SubmitRefusal.INTERNAL: "SageMaker had an internal failure",
    SubmitRefusal.DAILY_BUDGET: "the pipeline's daily budget (budget.daily_usd) cannot admit its quote",
}

SUBMIT_WAIT_FIRST_SECONDS = 30.0  # the first wait after a refusal
SUBMIT_WAIT_MAX_SECONDS = 900.0  # no wait is longer: a quota frees as jobs end, within minutes
# A quota can be in use for hours (a backfill holds it): the submit waits this long in all before the task fails.
SUBMIT_WAIT_GIVE_UP_SECONDS = 24 * 3600.0


@dataclasses.dataclass(frozen=True)
class SubmitWait:
    """Wait ``delay_seconds``, then submit again: the ``refusals``-th refusal in a row, for ``reason``."""

    refusal: SubmitRefusal
    delay_seconds: float
    refusals: int
    reason: str


def refusal_of(code: str | None) -> SubmitRefusal | None:
    """The refusal an AWS error code is, or None when the code is a real failure of the request."""
    try:
        return SubmitRefusal(code or "")
    except ValueError:
        return None


def submit_wait(
    code: str | None,
    message: str,
    refusals: int,
    jitter: float,
    *,
    waited_seconds: float = 0.0,
    first_seconds: float = SUBMIT_WAIT_FIRST_SECONDS,
    max_seconds: float = SUBMIT_WAIT_MAX_SECONDS,
    give_up_seconds: float = SUBMIT_WAIT_GIVE_UP_SECONDS,
) -> SubmitWait | None:
    """How long to wait after the ``refusals``-th refusal in a row (1 for the first) with ``code``; None when
    the code is no refusal (the submit fails as it would have), or the submit has waited ``give_up_seconds``.

    The wait doubles from ``first_seconds`` up to ``max_seconds``, and ``jitter`` (in [0, 1), drawn by the
    caller) takes it anywhere in its upper half: steps refused together do not come back together, and none
    comes back sooner than half its wait.
    """
    refusal = refusal_of(code)
    if refusal is None or waited_seconds >= give_up_seconds:
        return None
    if refusals < 1 or not 0.0 <= jitter < 1.0:
        raise InvalidArgument(f"refusals must be >= 1 and jitter in [0, 1), not {refusals} and {jitter}")
    ceiling = min(max_seconds, first_seconds * 2 ** (refusals - 1))
    delay = ceiling / 2 + jitter * ceiling / 2
    reason = f"{_WHY[refusal]} ({refusal.value}: {message.strip() or 'no message'})"
    return SubmitWait(refusal, delay, refusals, reason)


def submit_wait_text(job_name: str, wait: SubmitWait) -> str:
    """The log line and the page's words for a waiting submit."""
    return (
        f"job {job_name} not submitted yet: {wait.reason}. Refusal {wait.refusals} in a row: submitting again "
        f"in {wait.delay_seconds:.0f}s. This wait is not an attempt and fails nothing"
    )


# -- at a job's end: capacity ---------------------------------------------------------------------------

CAPACITY_ERROR = "CapacityError"  # how SageMaker's FailureReason starts when it could not provision the instances


def is_capacity_failure(failure_reason: str | None) -> bool:
    """Whether a job ended because SageMaker could not provision its instances (not for anything it ran)."""
    return bool(failure_reason) and failure_reason.lstrip().startswith(CAPACITY_ERROR)


def vcpus(instance_type: str) -> int:
    """The vCPUs of a SageMaker instance type, from its size (large: 2, xlarge: 4, Nxlarge: 4N, medium: 2)."""
    found = contract.instance_vcpus(instance_type)
    if found is None:
        raise InvalidArgument(
            f"{instance_type!r} is not a SageMaker instance type (ml.FAMILY.SIZE, e.g. ml.c5.2xlarge): "
            "check resources.instance_type and resources.fallback_instance_types"
        )
    return found


@dataclasses.dataclass(frozen=True)
class CapacityChoice:
    """Where a step's files go after a capacity failure: the instance type and count of its next job."""

    instance_type: str
    instance_count: int
    reason: str


def capacity_choice(
    instance_types: tuple[str, ...], planned_count: int, capacity_failures: dict[str, int], *, tries_per_type: int = 2
) -> CapacityChoice:
    """The instance type (and count) of the job that follows a capacity failure.

    ``instance_types``: the step's type, then its ``resources.fallback_instance_types`` in order;
    ``planned_count``: the instances planned on the first type; ``capacity_failures``: how many jobs of this step
    each type has failed for capacity so far. A type is tried ``tries_per_type`` times before the next; after the
    last, the round starts again at the first (capacity comes back; the run never fails for it). The count keeps
    the step's vCPUs: ``ceil(planned_count * vcpus(first) / vcpus(type))``.
    """
    if not instance_types or planned_count < 1 or tries_per_type < 1:
        raise InvalidArgument("capacity_choice needs an instance type, a planned count >= 1 and tries >= 1")
    spent = [capacity_failures.get(t, 0) for t in instance_types]
    fresh = next((i for i, n in enumerate(spent) if n < tries_per_type), None)
    if fresh is None:  # every type failed its tries: go round again, from the one failed least
        fresh = min(range(len(instance_types)), key=lambda i: (spent[i], i))
    chosen = instance_types[fresh]
    count = math.ceil(planned_count * vcpus(instance_types[0]) / vcpus(chosen))
    failed_on = ", ".join(f"{t} {n}x" for t, n in zip(instance_types, spent, strict=True) if n)
    moved = chosen != instance_types[0]
    reason = (
        f"SageMaker could not provision the instances ({CAPACITY_ERROR}; so far: {failed_on or 'none'}): the files "
        f"go again on {count} {chosen}"
        + (
            f" (resources.fallback_instance_types: {count * vcpus(chosen)} vCPUs for the "
            f"{planned_count * vcpus(instance_types[0])} planned)"
            if moved
            else ""
        )
        + "; this is not counted against retry.max_attempts"
    )
    return CapacityChoice(chosen, count, reason)


# -- admission ------------------------------------------------------------------------------------------

POOL_PREFIX = "sagemaker-"  # an Airflow pool per instance type: sagemaker-ml.c5.2xlarge
PRIORITY_WEIGHTS = {"high": 100, "normal": 10, "low": 1}  # a spec's priority, as Airflow's priority_weight


def pool_name(instance_type: str) -> str:
    """The Airflow pool that admits steps on ``instance_type``: its slots are the account's quota of it."""
    return POOL_PREFIX + instance_type


@dataclasses.dataclass(frozen=True)
class Admission:
    """How Airflow admits one step's watch task (it holds the step's instances from submit to end): within the
    account's ``quota`` of its instance type, through the type's pool, and within the step's own ``cap``
    (resources.max_concurrent_instances), through the task's concurrency. Pure: the DAG factory builds it from the
    spec and ``dags/fleet.yaml``; the tasks and the views read it."""

    instance_type: str
    instances: int  # the spec's resources.instance_count: the slots the watch holds
    quota: int | None = None  # the type's quota in fleet.yaml; None: no pool admits the step
    cap: int | None = None  # resources.max_concurrent_instances; None: no cap

    @property
    def counted(self) -> bool:
        """Whether anything counts the step's instances (a pool, or its cap)."""
        return self.quota is not None or self.cap is not None

    @property
    def max_instances(self) -> int | None:
        """The most instances a run may ask for (the instance_count Param): the slots the watch was admitted by, or
        None when nothing counts them (a run may ask for fewer instances, never more)."""
        return self.instances if self.counted else None

    def task_arguments(self) -> dict[str, Any]:
        """The watch task's Airflow arguments: its pool and slots, and how many of the step's tasks may run at once
        over all the pipeline's runs (deferred ones count)."""
        arguments: dict[str, Any] = {}
        if self.cap is not None:
            arguments["max_active_tis_per_dag"] = self.cap // self.instances
        if self.quota is not None:
            arguments |= {"pool": pool_name(self.instance_type), "pool_slots": self.instances}
        return arguments

    def to_json(self) -> dict[str, Any]:
        """The admission as the step's tasks carry it (a value, rendered to words where it is shown)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Admission:
        return cls(str(data["instance_type"]), int(data["instances"]), data.get("quota"), data.get("cap"))

    def waiting_text(self) -> str:
        """What a planned step says (on its STEP item: `shardline status`, the page) until Airflow admits it;
        empty when nothing holds it back."""
        if not self.counted:
            return ""
        return admission_text(self.instance_type, self.instances, self.quota, self.cap)


def admission_text(instance_type: str, needed: int, quota: int | None, cap: int | None = None) -> str:
    """What a planned step says (on its STEP item: `shardline status`, the page) until Airflow admits it: within
    the account's ``quota`` of the type (its pool), and the step's own ``cap`` (resources.max_concurrent_instances)."""
    limits = []
    if quota is not None:
        pool = pool_name(instance_type)
        limits.append(f"the account's quota of {quota} (pool {pool}, quotas.{instance_type} in dags/fleet.yaml)")
    if cap is not None:
        limits.append(f"the step's resources.max_concurrent_instances of {cap}")
    where = "`shardline fleet` shows the steps holding them and those waiting" if quota is not None else ""
    return f"waiting for {needed} {instance_type} instance(s) within {' and '.join(limits)}" + (
        f"; {where}" if where else ""
    )


# -- while a planned step waits -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Waiting:
    """Why a planned step's job is not running yet, as the STEP item records it: Airflow has not admitted its watch
    task yet (``admission``), or AWS said "not now" to its job's submit (``submit``), which goes again at
    ``retry_at`` (epoch seconds). A value; the views render it with :meth:`text`, where it is shown."""

    admission: Admission | None = None
    submit: SubmitWait | None = None
    job_name: str | None = None
    retry_at: float | None = None

    def text(self) -> str:
        if self.submit is not None:
            return submit_wait_text(self.job_name or "?", self.submit)
        return self.admission.waiting_text() if self.admission is not None else ""

    def to_data(self) -> dict[str, Any]:
        """Plain data (what `shardline status --json` gives under the step's ``waiting``)."""
        data: dict[str, Any] = {"job_name": self.job_name, "retry_at": self.retry_at}
        if self.admission is not None:
            data["admission"] = self.admission.to_json()
        if self.submit is not None:
            data["submit"] = {**dataclasses.asdict(self.submit), "refusal": self.submit.refusal.value}
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_data(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Waiting | None:
        """The recorded wait, or None when nothing waits (or what is recorded is not one: a view never fails on
        a note)."""
        try:
            data = json.loads(text) if text else None
            if not isinstance(data, dict):
                return None
            admission = Admission.from_json(data["admission"]) if data.get("admission") else None
            submit = data.get("submit")
            if submit:
                submit = SubmitWait(
                    SubmitRefusal(submit["refusal"]),
                    float(submit["delay_seconds"]),
                    int(submit["refusals"]),
                    str(submit["reason"]),
                )
            retry_at = data.get("retry_at")
            return cls(admission, submit or None, data.get("job_name"), float(retry_at) if retry_at else None)
        except (ValueError, KeyError, TypeError):
            return None
