"""The one place that polls: a deferrable trigger over the ledger and the backend.

It reads the step's snapshot (a DynamoDB Query plus a job describe, in a thread so the
triggerer's event loop never blocks), asks :func:`shardline.decide.decide`, and fires
as soon as the answer is anything but WAIT. It acts on nothing itself.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from shardline.decide import Action, decide
from shardline.spec import load_spec


class StepTrigger(BaseTrigger):
    def __init__(self, spec_path: str, attempt: dict[str, Any], poll_interval: float = 15.0,
                 deadline: float | None = None):
        super().__init__()
        self.spec_path = spec_path
        self.attempt = attempt
        self.poll_interval = poll_interval
        self.deadline = deadline  # epoch seconds; past it the step times out (and its job is stopped)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("shardline.triggers.StepTrigger", {
            "spec_path": self.spec_path, "attempt": self.attempt, "poll_interval": self.poll_interval,
            "deadline": self.deadline,
        })

    async def run(self):
        from shardline import steps  # AWS clients load in the triggerer, not where DAGs are parsed

        spec = load_spec(Path(self.spec_path))
        policy = steps.policy_for(spec, self.attempt["step"])
        last_reason = None
        while True:
            snap = await asyncio.to_thread(steps.snapshot, spec, self.attempt)
            decision = decide(snap, policy)
            if decision.action is not Action.WAIT:
                yield TriggerEvent(_event(decision, self.attempt))
                return
            if decision.reason != last_reason:  # log changes of state, not every poll
                self.log.info("%s attempt %d: %s", self.attempt["job_name"], self.attempt["attempt"], decision.reason)
                last_reason = decision.reason
            if self.deadline is not None and time.time() > self.deadline:
                yield TriggerEvent({"action": "TIMEOUT", "attempt": self.attempt, "stop_job": True,
                                    "reason": f"step did not finish by its deadline ({decision.reason})"})
                return
            await asyncio.sleep(self.poll_interval)


def _event(decision, attempt: dict) -> dict[str, Any]:
    return {
        "action": decision.action.value,
        "reason": decision.reason,
        "attempt": attempt,
        "retry_files": list(decision.retry_files),
        "failed_files": [
            {"input": f.input_key, "error_class": f.error_class, "error_message": (f.error_message or "")[:500]}
            for f in decision.failed_files
        ],
        "delay_seconds": decision.delay_seconds,
        "stop_job": decision.stop_job,
    }


class BackoffTrigger(BaseTrigger):
    """Waits ``delay_seconds``, then hands ``payload`` back to the task (the resubmission's backoff)."""

    def __init__(self, delay_seconds: float, payload: dict[str, Any]):
        super().__init__()
        self.delay_seconds = delay_seconds
        self.payload = payload

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("shardline.triggers.BackoffTrigger", {"delay_seconds": self.delay_seconds, "payload": self.payload})

    async def run(self):
        await asyncio.sleep(self.delay_seconds)
        yield TriggerEvent(self.payload)
