"""What an on-call resubmission does (:func:`choose_next`), decided before anything changes.

Pure, over plain values: the latest attempt's job, the ledger's step status and the Airflow watch task's
state (a string, or ``None`` when Airflow is not asked). The on-call service reads them, asks here, and acts.
"""

from __future__ import annotations

import dataclasses
import enum

from shardline.ledger.states import STEP_TERMINAL, StepStatus

# Task instance states in which the task will not run again unless it is cleared.
FINISHED_TASK_STATES = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})


class Next(enum.StrEnum):
    """What a resubmit command does, chosen by :func:`choose_next` before anything changes."""

    SUBMIT = "submit"  # start attempt N+1 with the chosen files
    TAKE_UP = "take_up"  # submit nothing; clear the watch task so the DAG run takes the step up again
    NOTHING = "nothing"  # submit nothing, clear nothing: all is in hand or done
    REFUSE = "refuse"  # the step's watch task is in charge; wait for it, or pass --force


@dataclasses.dataclass(frozen=True)
class NextStep:
    next: Next
    clear_watch: bool  # clear the DAG run's watch task (after submitting, or instead of it)
    reason: str


def task_state(state: str | None) -> str:
    """An Airflow task state in words (a task instance Airflow has not scheduled yet has none)."""
    return "not started yet (no state)" if state in (None, "none") else state


def _ended_without_files(step_status: str | None) -> str:
    """Why a step that ended leaves no chosen file to resubmit, in words that hold for its status."""
    if step_status == StepStatus.SUCCEEDED:
        return "every file of the step has succeeded"
    if step_status == StepStatus.SKIPPED:
        return "the step was SKIPPED, so it has no files"
    return f"the step ended {step_status} and no chosen file is left to run"


# Where a key the planner refused (an unsafe path) is dealt with: it is never resubmitted.
_UNSAFE_HINT = (
    "`shardline failed` lists the files that did not succeed, and why (a key refused as an unsafe path "
    "never runs: rename the object or exclude it with input.exclude)"
)


def choose_next(
    *,
    attempt: int,
    job: str,
    job_running: bool,
    step_status: str | None,
    watch_state: str | None,
    files: int,
    force: bool,
    watch: str,
) -> NextStep:
    """What a resubmission does, from the latest attempt's job, the ledger's step status and the
    Airflow watch task's state (``None``: Airflow is not asked). Pure, so every case is tested.

    A watch task that has not finished is in charge of the step: it follows newer attempts and
    retries on its own. One that has finished while the ledger shows the step unfinished, or
    finished in a way the ledger has since overtaken, left the DAG run behind: clearing it lets the
    run take the step up again (this also completes a resubmission whose clear failed).
    """
    watch_in_charge = watch_state is not None and watch_state not in FINISHED_TASK_STATES
    if job_running:
        return _while_running(attempt, job, watch, watch_state, watch_in_charge)
    if step_status not in STEP_TERMINAL:
        return _not_recorded(attempt, watch, watch_state, watch_in_charge, files=files, force=force)
    return _after_the_step_ended(step_status, watch, watch_state, files)


def _while_running(attempt: int, job: str, watch: str, watch_state: str | None, watch_in_charge: bool) -> NextStep:
    """The latest attempt's job still runs: nothing to submit; at most, let the DAG run follow it again."""
    if watch_in_charge or watch_state is None:
        follows = f" and its watch task ({watch}, {task_state(watch_state)}) follows it" if watch_in_charge else ""
        return NextStep(
            Next.NOTHING,
            False,
            f"attempt {attempt} ({job}) is still running{follows}: nothing to "
            "resubmit while it runs; wait for it to end (`shardline status` "
            "shows its progress)",
        )
    return NextStep(
        Next.TAKE_UP,
        True,
        f"attempt {attempt} ({job}) is running, but the DAG run's {watch} has "
        f"ended ({watch_state}), so nothing in Airflow follows it: clearing "
        f"{watch} lets the DAG run follow it again",
    )


def _not_recorded(
    attempt: int, watch: str, watch_state: str | None, watch_in_charge: bool, *, files: int, force: bool
) -> NextStep:
    """The job has ended, and the ledger does not show the step ended yet: its outcome is not recorded."""
    if watch_in_charge:
        if force and files:
            return NextStep(
                Next.SUBMIT, False, f"--force: {watch} is {task_state(watch_state)} and follows the new attempt"
            )
        waiting = (
            f"attempt {attempt} has ended, but its watch task ({watch}, now {task_state(watch_state)}) has "
            "not recorded the outcome yet; it resubmits on its own while retry.max_attempts allows"
        )
        if force:
            return NextStep(
                Next.REFUSE,
                False,
                f"{waiting}, and no chosen file is left to resubmit: wait for "
                "it (`shardline status` shows when it has)",
            )
        return NextStep(
            Next.REFUSE,
            False,
            f"{waiting}. Wait for it (`shardline status` shows when it has), or pass --force to resubmit now",
        )
    if files:
        return NextStep(
            Next.SUBMIT, watch_state is not None, f"attempt {attempt} has ended and no watch task recorded its outcome"
        )
    if watch_state is None:
        return NextStep(Next.NOTHING, False, "nothing to resubmit: every chosen file has succeeded")
    return NextStep(
        Next.TAKE_UP,
        True,
        f"every chosen file has succeeded, but no watch task recorded attempt "
        f"{attempt}'s outcome: clearing {watch} lets the DAG run record it "
        "and go on",
    )


def _after_the_step_ended(step_status: str | None, watch: str, watch_state: str | None, files: int) -> NextStep:
    """The ledger shows the step ended: its chosen files go again, or the DAG run is taken up, or nothing."""
    if files:
        return NextStep(Next.SUBMIT, watch_state is not None, f"the step ended {step_status}")
    if (
        step_status in (StepStatus.SUCCEEDED, StepStatus.PARTIAL)
        and watch_state in FINISHED_TASK_STATES
        and watch_state != "success"
    ):
        return NextStep(
            Next.TAKE_UP,
            True,
            f"{_ended_without_files(step_status)}, but the DAG run's {watch} ended "
            f"{watch_state} before the last attempt did: clearing it lets the run "
            "turn green",
        )
    if step_status in (StepStatus.SUCCEEDED, StepStatus.SKIPPED):
        return NextStep(Next.NOTHING, False, f"nothing to resubmit: {_ended_without_files(step_status)}")
    return NextStep(Next.NOTHING, False, f"nothing to resubmit: {_ended_without_files(step_status)}; {_UNSAFE_HINT}")
