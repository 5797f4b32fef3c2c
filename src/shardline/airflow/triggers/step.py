"""The one place that polls: deferrable triggers over the ledger, the backend and the input.

:class:`StepTrigger` reads the step's snapshot (a job describe and a DynamoDB Query, in a
thread so the triggerer's event loop never blocks), asks :func:`shardline.decision.policy.decide`,
and fires as soon as the answer is anything but WAIT. :class:`InputTrigger` waits for a
step's input to land. They act on nothing themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from shardline.decision.policy import Action, decide
from shardline.planning.attempt import Attempt
from shardline.spec import load_spec

# A trigger that fires within a few seconds of its task deferring races the scheduler: the
# worker's "deferred" exit is reported as a success after the scheduler has already queued
# the resumed try, and Airflow 3.3 then fails that try as "changed externally" (apache/airflow
# #67287, fixed upstream for the scheduled state only). The retry would recover, but a green
# step must not show a failed try, so no event is handed back before this many seconds.
# dag.test() runs triggers in the task's own process, with no scheduler to race: the demo sets 0.
SETTLE_ENV = "SHARDLINE_DEFER_SETTLE_SECONDS"
DEFAULT_SETTLE_SECONDS = 10.0


LOG_EVERY_SECONDS = 60.0  # the most often a waiting trigger logs a line


def settle_until() -> float:
    """The epoch time before which a trigger deferred now hands back no event."""
    return time.time() + float(os.environ.get(SETTLE_ENV, DEFAULT_SETTLE_SECONDS))


async def _settle(not_before: float | None) -> None:
    if not_before is not None and time.time() < not_before:
        await asyncio.sleep(not_before - time.time())


class StepTrigger(BaseTrigger):
    def __init__(self, spec_path: str, attempt: dict[str, Any], poll_interval: float = 15.0,
                 deadline: float | None = None, not_before: float | None = None):
        super().__init__()
        self.spec_path = spec_path
        self.attempt = attempt
        self.poll_interval = poll_interval
        self.deadline = deadline  # epoch seconds; past it the step times out (and its job is stopped)
        self.not_before = not_before  # epoch seconds; no event before it (see SETTLE_SECONDS)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("shardline.airflow.triggers.step.StepTrigger", {
            "spec_path": self.spec_path, "attempt": self.attempt, "poll_interval": self.poll_interval,
            "deadline": self.deadline, "not_before": self.not_before,
        })

    async def run(self):
        from shardline.orchestration import steps  # AWS clients load in the triggerer, not where DAGs are parsed

        spec = load_spec(Path(self.spec_path))
        attempt = Attempt.from_xcom(self.attempt)
        policy = steps.policy_for(spec, attempt.step)
        # As long as the step tolerates a silent instance, it tolerates an unreachable endpoint.
        outage_budget = spec.step(attempt.step).heartbeat_timeout_seconds
        last_reason, last_logged, unreachable_since = None, -float("inf"), None
        while True:
            try:
                snap = await asyncio.to_thread(steps.snapshot, spec, attempt)
            except Exception as err:
                if not steps.is_unreachable(err):
                    raise
                unreachable_since = unreachable_since or time.time()
                down = time.time() - unreachable_since
                if time.monotonic() - last_logged >= LOG_EVERY_SECONDS:
                    self.log.warning("%s: the AWS endpoint is unreachable (%.0fs so far): %s", attempt.job_name,
                                     down, steps.describe_error(err))
                    last_logged, last_reason = time.monotonic(), None
                if down > outage_budget:
                    await _settle(self.not_before)
                    yield TriggerEvent(StepEvent(UNREACHABLE, steps.unreachable_reason(attempt, down, err),
                                                 attempt).to_event())
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            if unreachable_since is not None:
                self.log.info("%s: the AWS endpoint answers again", attempt.job_name)
                unreachable_since = None
            decision = decide(snap, policy)
            if decision.action is not Action.WAIT:
                await _settle(self.not_before)
                yield TriggerEvent(StepEvent.of(decision, attempt).to_event())
                return
            # A change of state, at most once a minute: a 1 s poll of a running job would log every second.
            if decision.reason != last_reason and time.monotonic() - last_logged >= LOG_EVERY_SECONDS:
                self.log.info("%s attempt %d: %s", attempt.job_name, attempt.number, decision.reason)
                last_reason, last_logged = decision.reason, time.monotonic()
            if self.deadline is not None and time.time() > self.deadline:
                await _settle(self.not_before)
                yield TriggerEvent(StepEvent(TIMEOUT, timeout_reason(decision.reason), attempt,
                                             stop_job=True).to_event())
                return
            await asyncio.sleep(self.poll_interval)


def timeout_reason(last: str) -> str:
    """Why a step's watch gave up on an attempt that ran past its deadline (the job is stopped)."""
    return (f"the attempt did not finish by its deadline (the step's max_runtime_seconds plus "
            f"heartbeat_timeout_seconds plus 5 minutes), so its job is stopped; last seen: {last}")


# What the watch ends on besides the policy's own actions.
UNREACHABLE, TIMEOUT = "UNREACHABLE", "TIMEOUT"


@dataclasses.dataclass(frozen=True)
class StepEvent:
    """What :class:`StepTrigger` hands the watch sensor: the decision on one attempt.

    ``action`` is an :class:`Action` other than WAIT, or ``UNREACHABLE`` (the endpoint stayed down
    past the step's heartbeat timeout) or ``TIMEOUT`` (the attempt ran past its deadline). It
    travels as a JSON dict (:meth:`to_event`, :meth:`from_event`): Airflow stores trigger events.
    """

    action: str
    reason: str
    attempt: Attempt
    retry_files: tuple[str, ...] = ()
    failed_files: tuple[dict[str, Any], ...] = ()  # input, error_class, error_message (at most 500 characters)
    delay_seconds: float = 0.0
    stop_job: bool = False

    @classmethod
    def of(cls, decision, attempt: Attempt) -> StepEvent:
        return cls(decision.action.value, decision.reason, attempt, tuple(decision.retry_files),
                   tuple({"input": f.input_key, "error_class": f.error_class,
                          "error_message": (f.error_message or "")[:500]} for f in decision.failed_files),
                   decision.delay_seconds, decision.stop_job)

    def to_event(self) -> dict[str, Any]:
        return {"action": self.action, "reason": self.reason, "attempt": self.attempt.to_xcom(),
                "retry_files": list(self.retry_files), "failed_files": list(self.failed_files),
                "delay_seconds": self.delay_seconds, "stop_job": self.stop_job}

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> StepEvent:
        return cls(event["action"], event["reason"], Attempt.from_xcom(event["attempt"]),
                   tuple(event.get("retry_files") or ()), tuple(event.get("failed_files") or ()),
                   float(event.get("delay_seconds") or 0.0), bool(event.get("stop_job")))


class BackoffTrigger(BaseTrigger):
    """Waits ``delay_seconds``, then hands ``payload`` back to the task (the resubmission's backoff)."""

    def __init__(self, delay_seconds: float, payload: dict[str, Any], not_before: float | None = None):
        super().__init__()
        self.delay_seconds = delay_seconds
        self.payload = payload
        self.not_before = not_before

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("shardline.airflow.triggers.step.BackoffTrigger",
                {"delay_seconds": self.delay_seconds, "payload": self.payload, "not_before": self.not_before})

    async def run(self):
        await asyncio.sleep(self.delay_seconds)
        await _settle(self.not_before)
        yield TriggerEvent(self.payload)


class InputTrigger(BaseTrigger):
    """Waits until a step's input is there (any input file, or the spec's ready marker), or until
    ``deadline`` (epoch seconds); hands back ``{"ready": bool, "reason": str}``. With ``ready_at`` (epoch
    seconds: a scheduled partition's interval end plus its settle time) it looks at nothing before then."""

    def __init__(self, spec_path: str, step: str, input_prefix: str, deadline: float, poll_interval: float = 30.0,
                 not_before: float | None = None, ready_at: float | None = None):
        super().__init__()
        self.spec_path, self.step, self.input_prefix = spec_path, step, input_prefix
        self.deadline, self.poll_interval, self.not_before = deadline, poll_interval, not_before
        self.ready_at = ready_at

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("shardline.airflow.triggers.step.InputTrigger", {
            "spec_path": self.spec_path, "step": self.step, "input_prefix": self.input_prefix,
            "deadline": self.deadline, "poll_interval": self.poll_interval, "not_before": self.not_before,
            "ready_at": self.ready_at})

    async def run(self):
        from shardline.orchestration import steps

        spec = load_spec(Path(self.spec_path))
        if self.ready_at is not None and time.time() < self.ready_at:
            self.log.info("%s: the partition is complete at %s UTC; looking for its input then", self.input_prefix,
                          time.strftime("%H:%M:%S", time.gmtime(self.ready_at)))
            await asyncio.sleep(self.ready_at - time.time())
        while True:
            try:
                ready, reason = await asyncio.to_thread(steps.input_ready, spec, self.step, self.input_prefix)
            except Exception as err:
                if not steps.is_unreachable(err):
                    raise
                ready, reason = False, f"the AWS endpoint was unreachable ({steps.describe_error(err)})"
            if ready:
                await _settle(self.not_before)
                yield TriggerEvent({"ready": True, "reason": reason})
                return
            if time.time() > self.deadline:
                await _settle(self.not_before)
                yield TriggerEvent({"ready": False, "reason": reason})
                return
            await asyncio.sleep(self.poll_interval)
