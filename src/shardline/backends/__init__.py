"""Where processing jobs run. One Protocol; a local emulator and SageMaker implement it.

Both take the same CreateProcessingJob request dict (see :mod:`shardline.planning.request`), so what
runs locally is exactly what would run on SageMaker.

This module holds the :class:`Backend` Protocol, a job's state (:class:`JobState`, :class:`JobStatus`) and
:class:`JobNotFound`, all pure. The backends:

- :mod:`.sagemaker`: SageMaker Processing through boto3, the request sent as is.
- :mod:`.local`: the emulator. Each job gets a folder; its state lives on disk, so any process can describe or
  stop it.
- :mod:`.local_supervisor`: one emulated job's process. It deals the inputs, runs one worker per instance and
  records the job's end.
- :mod:`.local_container`: a job's instances as containers of the request's image, on an internal Docker network
  with no route out of its own.
- :mod:`.local_fleet`: the emulated account: instance quotas, injected refusals and capacity errors, an instance
  start-up time, and its own record of the instances in use.
- :mod:`.local_runner`: a runner under a uid of its own that claims the jobs Airflow's processes leave (compose's
  ``job-runner`` service).
- :mod:`.local_credentials`: the job role's session a local job holds when its endpoints are AWS itself.
- :mod:`.local_egress`: the containers' one way out against AWS itself: tunnels to AWS's endpoints alone.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol

from shardline.errors import ShardlineError


class JobStatus(enum.StrEnum):
    """A backend job's state, in SageMaker's words (the local backend uses the same)."""

    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"

    @property
    def is_terminal(self) -> bool:
        return self in {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED}


@dataclasses.dataclass(frozen=True)
class JobState:
    name: str
    status: JobStatus
    failure_reason: str | None = None
    created_at: float | None = None  # epoch seconds
    ended_at: float | None = None
    instance_type: str | None = None  # what the job's instances are (its request's), for pricing what ran
    # Instances the backend saw die while the job goes on (a killed process: the local backend's), each with the
    # inputs it was given (s3:// URIs) and why it is taken for lost. SageMaker ends the whole job instead: none.
    lost_instances: tuple[LostInstance, ...] = ()


@dataclasses.dataclass(frozen=True)
class LostInstance:
    """One instance of a running job that the backend saw die, and the inputs (s3:// URIs) it was given."""

    host: str
    reason: str
    inputs: tuple[str, ...]


class Backend(Protocol):
    def submit(self, request: dict) -> str:
        """Start the job, or adopt it if a job of that name exists already. Returns its name."""

    def describe(self, name: str) -> JobState:
        """The job's current state. Raises JobNotFound for an unknown name."""

    def stop(self, name: str) -> None:
        """Ask the job to stop; a job already ended is left alone."""


class JobNotFound(ShardlineError, LookupError):
    """The backend knows no job of that name (never submitted, or gone past its retention)."""
