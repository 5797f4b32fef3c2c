"""Every state a ledger record can hold (``shardline.ledger.states``), and which of them are final."""

from __future__ import annotations

import pytest

from shardline.errors import SetupError
from shardline.ledger.states import (
    FILE_TERMINAL,
    RUN_TERMINAL,
    SETUP_ERROR,
    SHARD_TERMINAL,
    STEP_TERMINAL,
    FileStatus,
    RunStatus,
    ShardStatus,
    StepStatus,
)


@pytest.mark.parametrize(
    ("status", "terminal"),
    [(FileStatus.PENDING, False), (FileStatus.RUNNING, False), (FileStatus.SUCCEEDED, True), (FileStatus.FAILED, True)],
)
def test_a_file_is_done_once_it_succeeded_or_failed(status, terminal):
    assert status.is_terminal is terminal
    assert (status in FILE_TERMINAL) is terminal


def test_only_a_running_shard_or_a_step_still_under_way_is_not_final():
    assert set(ShardStatus) - SHARD_TERMINAL == {ShardStatus.RUNNING}
    assert set(StepStatus) - STEP_TERMINAL == {StepStatus.PLANNED, StepStatus.SUBMITTED, StepStatus.RUNNING}
    # A cancelled step is final: the watch task must not resubmit it.
    assert StepStatus.CANCELLED in STEP_TERMINAL


def test_a_run_has_the_words_of_a_steps_end_and_only_running_is_not_final():
    """A run is never PLANNED or SUBMITTED (its steps are); its other words are a step's, stored as the same names."""
    assert {s.value for s in RunStatus} == {s.value for s in StepStatus} - {"PLANNED", "SUBMITTED"}
    assert set(RunStatus) - RUN_TERMINAL == {RunStatus.RUNNING}
    assert RunStatus.FAILED == StepStatus.FAILED == "FAILED"  # a RUN item written before this enum reads the same


def test_a_state_is_stored_and_compared_as_its_plain_name():
    """The ledger stores the string; a record read back compares equal to the enum, whichever side it is on."""
    assert FileStatus("SUCCEEDED") is FileStatus.SUCCEEDED
    assert StepStatus.PARTIAL == "PARTIAL" and f"{ShardStatus.FENCED}" == "FENCED"
    with pytest.raises(ValueError):
        StepStatus("DONE")


def test_a_shard_that_could_not_start_is_recorded_with_the_setup_errors_class_name():
    assert SETUP_ERROR == SetupError.__name__ == "SetupError"
