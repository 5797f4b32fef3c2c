"""Where processing jobs run. One Protocol; a local emulator and SageMaker implement it.

Both take the same CreateProcessingJob request dict (see ``shardline.requests``), so what
runs locally is exactly what would run on SageMaker.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from shardline.decide import JobStatus


@dataclasses.dataclass(frozen=True)
class JobState:
    name: str
    status: JobStatus
    failure_reason: str | None = None
    created_at: float | None = None  # epoch seconds
    ended_at: float | None = None


class Backend(Protocol):
    def submit(self, request: dict) -> str:
        """Start the job, or adopt it if a job of that name exists already. Returns its name."""

    def describe(self, name: str) -> JobState:
        """The job's current state. Raises JobNotFound for an unknown name."""

    def stop(self, name: str) -> None:
        """Ask the job to stop; a job already ended is left alone."""


class JobNotFound(LookupError):
    pass
