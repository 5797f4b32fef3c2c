"""Every state a ledger record can hold, declared once.

The worker, the watch task, the CLI and the UI all read these sets instead of
spelling out states in `if` chains. :class:`Succession` is how an attempt follows the one before it, as its STEP
update is fenced and records it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import StrEnum

from shardline.errors import SetupError


class FileStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in FILE_TERMINAL


class ShardStatus(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # every assigned file succeeded
    PARTIAL = "PARTIAL"  # finished, some files failed
    FAILED = "FAILED"  # fatal setup error: nothing was processed
    FENCED = "FENCED"  # a newer attempt took over; this instance stopped
    STOPPED = "STOPPED"  # its job was stopped (a cancel, a budget, a deadline): what it finished stands


class StepStatus(StrEnum):
    PLANNED = "PLANNED"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    PARTIAL = "PARTIAL"  # ended with failures inside the tolerance
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"  # empty input
    CANCELLED = "CANCELLED"  # stopped by `shardline cancel`; the watch task must not resubmit it


class RunStatus(StrEnum):
    """A run's status on its RUN item: the words of a step's status where they mean the same, and no others (a run is
    never PLANNED or SUBMITTED: its steps are)."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    PARTIAL = "PARTIAL"  # a step ended with failures inside its tolerance
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"  # its plan found no input
    CANCELLED = "CANCELLED"  # `shardline cancel`


RUN_TERMINAL = frozenset(set(RunStatus) - {RunStatus.RUNNING})
FILE_TERMINAL = frozenset({FileStatus.SUCCEEDED, FileStatus.FAILED})
SHARD_TERMINAL = frozenset(
    {ShardStatus.SUCCEEDED, ShardStatus.PARTIAL, ShardStatus.FAILED, ShardStatus.FENCED, ShardStatus.STOPPED}
)
STEP_TERMINAL = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.PARTIAL, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)


# How the message of a step begins when its blocking output checks held its outputs back (FAILED, no _SUCCESS): what
# `shardline approve` accepts, and its fenced write checks.
HELD_BACK = "checks: blocked by"

SETUP_ERROR = SetupError.__name__  # a SHARD item's error class: the instance could not start (its model, its arguments)


@dataclasses.dataclass(frozen=True)
class Succession:
    """How an attempt follows the step's one before it: what its fenced STEP update is conditioned on and records.

    ``after``: the attempt the planner saw as the newest (None: the one before). ``reopen_cancelled``: a cancelled
    step may be reopened (an on-call resubmission). ``parts``: for an attempt that scores rejected rows again, each
    input's source file and the source's ETag (``part_of``, ``source_etag``). ``live_from``: the oldest earlier
    attempt whose job goes on beside this one (its other instances still score their own files); None when every
    earlier attempt's job has ended. ``lost_taken``: the lost instances ("attempt/host") whose unfinished files this
    attempt takes, added to those earlier attempts took while their jobs still run (forgotten once none does)."""

    after: int | None = None
    reopen_cancelled: bool = False
    parts: Mapping[str, tuple[str, str]] | None = None
    live_from: int | None = None
    lost_taken: tuple[str, ...] = ()
