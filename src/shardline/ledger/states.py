"""Every state a ledger record can hold, declared once.

The worker, the watch task, the CLI and the UI all read these sets instead of
spelling out states in `if` chains.
"""

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
SHARD_TERMINAL = frozenset({ShardStatus.SUCCEEDED, ShardStatus.PARTIAL, ShardStatus.FAILED, ShardStatus.FENCED})
STEP_TERMINAL = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.PARTIAL, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)


SETUP_ERROR = SetupError.__name__  # a SHARD item's error class: the instance could not start (its model, its arguments)
