"""The one place that polls: deferrable triggers over the ledger, the backend and the input.

:class:`StepTrigger` reads the step's snapshot (a job describe and a DynamoDB Query, in a
thread so the triggerer's event loop never blocks), asks :func:`shardline.decision.policy.decide`,
and fires as soon as the answer is anything but WAIT. :class:`InputTrigger` waits for a
step's input to land. They act on nothing themselves, and carry JSON values only
(:mod:`shardline.orchestration.step.watch`): no spec path, so no spec is read after the task defers.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from shardline.decision.policy import Action, deadline_reason, decide
from shardline.planning.attempt import Attempt

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
    """Polls one attempt until the decision policy says anything but WAIT, the endpoint stays unreachable past
    the step's heartbeat timeout, or ``deadline`` passes.

    It carries JSON values only: the attempt, and the :class:`~shardline.orchestration.step.watch.StepWatch` (AWS
    settings and decision policy) taken from the spec when the task deferred. It never reads the spec, so the
    triggerer needs no DAGs folder and an attempt keeps its policy if the spec is edited while it runs.
    """

    def __init__(
        self,
        attempt: dict[str, Any],
        watch: dict[str, Any],
        poll_interval: float = 15.0,
        deadline: float | None = None,
        not_before: float | None = None,
    ):
        super().__init__()
        self.attempt = attempt
        self.watch = watch
        self.poll_interval = poll_interval
        self.deadline = deadline  # epoch seconds (decision.policy.attempt_deadline); past it the job is stopped
        self.not_before = not_before  # epoch seconds; no event before it (see SETTLE_SECONDS)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "shardline.airflow.triggers.step.StepTrigger",
            {
                "attempt": self.attempt,
                "watch": self.watch,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "not_before": self.not_before,
            },
        )

    async def run(self):
        from shardline.orchestration.step import watch as polls  # AWS clients load in the triggerer, not at DAG parse
        from shardline.orchestration.step.watch import StepEvent, StepWatch

        watch = StepWatch.from_json(self.watch)
        attempt = Attempt.from_xcom(self.attempt)
        # As long as the step tolerates a silent instance, it tolerates an unreachable endpoint.
        outage_budget = watch.policy.heartbeat_timeout_seconds
        last_reason, last_logged, unreachable_since = None, -float("inf"), None

        def ended(action: Action, why: str) -> TriggerEvent:  # the trigger's own ends: its job stops on a TIMEOUT
            timed_out = action is Action.TIMEOUT
            return TriggerEvent(StepEvent(action, why, attempt, stop_job=timed_out, policy=watch.policy).to_event())

        while True:
            try:
                snap = await asyncio.to_thread(polls.snapshot, watch, attempt)
            except Exception as err:
                if polls.is_throttled(err):  # AWS is there and asks to slow down: the next poll asks again
                    if time.monotonic() - last_logged >= LOG_EVERY_SECONDS:
                        self.log.warning("%s: a poll was throttled: %s", attempt.job_name, polls.describe_error(err))
                        last_logged, last_reason = time.monotonic(), None
                    if self.deadline is None or time.time() <= self.deadline:
                        await asyncio.sleep(self.poll_interval)
                        continue
                    # Past the deadline, throttled or not, the attempt is given up on (its job is stopped).
                    await _settle(self.not_before)
                    why = deadline_reason(watch.policy, f"a poll throttled ({polls.describe_error(err)})")
                    yield ended(Action.TIMEOUT, why)
                    return
                if not polls.is_unreachable(err):
                    raise
                unreachable_since = unreachable_since or time.time()
                down = time.time() - unreachable_since
                if time.monotonic() - last_logged >= LOG_EVERY_SECONDS:
                    self.log.warning(
                        "%s: the AWS endpoint is unreachable (%.0fs so far): %s",
                        attempt.job_name,
                        down,
                        polls.describe_error(err),
                    )
                    last_logged, last_reason = time.monotonic(), None
                if down > outage_budget:
                    await _settle(self.not_before)
                    yield ended(Action.UNREACHABLE, polls.unreachable_reason(attempt, down, err))
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            if unreachable_since is not None:
                self.log.info("%s: the AWS endpoint answers again", attempt.job_name)
                unreachable_since = None
            decision = decide(snap, watch.policy)
            if decision.action is not Action.WAIT:
                if decision.stop_job and snap.over_budget:
                    # Every second until the task resumes to stop it is spent past the budget: stopped here, now.
                    await asyncio.to_thread(polls.stop_now, watch, attempt)
                await _settle(self.not_before)
                yield TriggerEvent(StepEvent.of(decision, attempt, watch.policy).to_event())
                return
            # A change of state, at most once a minute: a 1 s poll of a running job would log every second.
            if decision.reason != last_reason and time.monotonic() - last_logged >= LOG_EVERY_SECONDS:
                self.log.info("%s attempt %d: %s", attempt.job_name, attempt.number, decision.reason)
                last_reason, last_logged = decision.reason, time.monotonic()
            if self.deadline is not None and time.time() > self.deadline:
                await _settle(self.not_before)
                yield ended(Action.TIMEOUT, deadline_reason(watch.policy, decision.reason))
                return
            await asyncio.sleep(self.poll_interval)


class BackoffTrigger(BaseTrigger):
    """Waits ``delay_seconds``, then hands ``payload`` back to the task (the resubmission's backoff)."""

    def __init__(self, delay_seconds: float, payload: dict[str, Any], not_before: float | None = None):
        super().__init__()
        self.delay_seconds = delay_seconds
        self.payload = payload
        self.not_before = not_before

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "shardline.airflow.triggers.step.BackoffTrigger",
            {"delay_seconds": self.delay_seconds, "payload": self.payload, "not_before": self.not_before},
        )

    async def run(self):
        await asyncio.sleep(self.delay_seconds)
        await _settle(self.not_before)
        yield TriggerEvent(self.payload)


class InputTrigger(BaseTrigger):
    """Waits until a step's input is there (any input file, or the spec's ready marker: the
    :class:`~shardline.orchestration.step.watch.InputWatch` it carries says which), or until ``deadline`` (epoch
    seconds); hands back ``{"ready": bool, "reason": str}``. With ``ready_at`` (epoch seconds: a scheduled
    partition's interval end plus its settle time) it looks at nothing before then."""

    def __init__(
        self,
        watch: dict[str, Any],
        deadline: float,
        poll_interval: float = 30.0,
        not_before: float | None = None,
        ready_at: float | None = None,
    ):
        super().__init__()
        self.watch = watch
        self.deadline, self.poll_interval, self.not_before = deadline, poll_interval, not_before
        self.ready_at = ready_at

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "shardline.airflow.triggers.step.InputTrigger",
            {
                "watch": self.watch,
                "deadline": self.deadline,
                "poll_interval": self.poll_interval,
                "not_before": self.not_before,
                "ready_at": self.ready_at,
            },
        )

    async def run(self):
        from shardline.orchestration.step import watch as polls
        from shardline.orchestration.step.watch import InputWatch

        watch = InputWatch.from_json(self.watch)
        if self.ready_at is not None and time.time() < self.ready_at:
            self.log.info(
                "%s: the partition is complete at %s UTC; looking for its input then",
                watch.input_prefix,
                time.strftime("%H:%M:%S", time.gmtime(self.ready_at)),
            )
            await asyncio.sleep(self.ready_at - time.time())
        while True:
            try:
                ready, reason = await asyncio.to_thread(polls.input_ready, watch)
            except Exception as err:
                if not polls.is_unreachable(err):
                    raise
                ready, reason = False, f"the AWS endpoint was unreachable ({polls.describe_error(err)})"
            if ready:
                await _settle(self.not_before)
                yield TriggerEvent({"ready": True, "reason": reason})
                return
            if time.time() > self.deadline:
                await _settle(self.not_before)
                yield TriggerEvent({"ready": False, "reason": reason})
                return
            await asyncio.sleep(self.poll_interval)


class PartitionTrigger(BaseTrigger):
    """Waits until a run's step may write its output prefix: the run that holds it ended or released it, or its
    lease ran out (the :class:`~shardline.orchestration.step.watch.PartitionWatch` it carries says which prefix and
    step); hands back ``{"free": True, "reason": str}``. Logs who holds it at most once a minute. With
    ``recheck_seconds``, it hands back ``{"free": False, "recheck": True, "reason": str}`` after that long, so the task
    can ask Airflow whether the holding run still exists (a trigger cannot)."""

    def __init__(
        self,
        watch: dict[str, Any],
        poll_interval: float = 30.0,
        not_before: float | None = None,
        recheck_seconds: float | None = None,
    ):
        super().__init__()
        self.watch, self.poll_interval, self.not_before = watch, poll_interval, not_before
        self.recheck_seconds = recheck_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "shardline.airflow.triggers.step.PartitionTrigger",
            {
                "watch": self.watch,
                "poll_interval": self.poll_interval,
                "not_before": self.not_before,
                "recheck_seconds": self.recheck_seconds,
            },
        )

    async def run(self):
        from shardline.orchestration.step import watch as polls
        from shardline.orchestration.step.watch import PartitionWatch

        watch = PartitionWatch.from_json(self.watch)
        logged = 0.0
        recheck_at = time.monotonic() + self.recheck_seconds if self.recheck_seconds is not None else None
        while True:
            try:
                free, reason = await asyncio.to_thread(polls.partition_free, watch)
            except Exception as err:
                if not (polls.is_unreachable(err) or polls.is_throttled(err)):
                    raise
                free, reason = False, f"the AWS endpoint did not answer ({polls.describe_error(err)})"
            if free:
                await _settle(self.not_before)
                yield TriggerEvent({"free": True, "reason": reason})
                return
            if recheck_at is not None and time.monotonic() >= recheck_at:
                yield TriggerEvent({"free": False, "recheck": True, "reason": reason})
                return
            if time.monotonic() - logged >= LOG_EVERY_SECONDS:
                self.log.info("%s; waiting for it", reason)
                logged = time.monotonic()
            await asyncio.sleep(self.poll_interval)
