"""What the step operators say when a task fails, skips or warns: each message names the setting or command
that fixes it. Pure: tests/oncall/test_messages.py renders each."""

from __future__ import annotations

from shardline.decision.policy import Action
from shardline.errors import error_line
from shardline.planning.attempt import Attempt
from shardline.planning.naming import resubmit_command


def _list(failed: list[dict], limit: int = 10) -> str:
    def one(f: dict) -> str:
        error = error_line(f.get("error_class"), f.get("error_message"))
        return f"{f['input']} ({error})" if error else f["input"]

    shown = "; ".join(one(f) for f in failed[:limit])
    more = f"; and {len(failed) - limit} more" if len(failed) > limit else ""
    return (shown + more) or "none"


def step_failed_text(attempt: Attempt, action: Action, reason: str, failed_files: list[dict]) -> str:
    """Why the watch task fails, and the command (or spec field) that fixes it."""
    where = f"step {attempt.step} of {attempt.pipeline} run {attempt.run_id}"
    if action is Action.UNREACHABLE:
        return f"{where}: {reason}"
    fix = resubmit_command(attempt.pipeline, attempt.run_id, attempt.step)
    if action is Action.TIMEOUT:
        return (
            f"{where} failed: {reason}. If the step needs longer, raise max_runtime_seconds in the spec; then "
            f"resubmit what did not finish (the run turns green when it succeeds): {fix}"
        )
    if not failed_files:
        return (
            f"{where} failed: {reason}. Fix the cause, then resubmit what did not finish (the run turns green "
            f"when it succeeds): {fix}"
        )
    return (
        f"{where} failed: {reason}. Failed files: {_list(failed_files)}. Fix the inputs or the model, then "
        f"resubmit just these files (the run turns green when they succeed): {fix}"
    )


def partial_text(step: str, reason: str, failed_files: list[dict], fix: str) -> str:
    return (
        f"step {step} ended PARTIAL: {reason}; failed: {_list(failed_files)}. To retry them after fixing the "
        f"cause: {fix}"
    )


def missing_input_text(
    step: str, ref: str, why: str, action: str, *, waited: bool, wait_seconds: int, chosen: bool, run_type: str
) -> str:
    """What a plan task says when its input is not there: ``action`` is what ``input.when_missing`` chose
    (``chosen``: the spec set it; else the default for ``run_type``)."""
    kind = run_type or "manual"
    default = "" if chosen else f", the default for {'an' if kind[:1] in 'aeiou' else 'a'} {kind} run"
    again = (
        f"once the input is there, `shardline rerun {ref}` plans this run again; input.when_missing and "
        "input.wait_timeout_seconds in the spec choose what a run without input does"
    )
    if action == "skip":
        return f"step {step}: skipped: {why} (input.when_missing: skip)"
    if waited:
        return f"step {step}: waited {wait_seconds}s for its input and gave up: {why}. Nothing was processed; {again}"
    if action == "fail":
        return (
            f"step {step}: {why}, so nothing was processed (input.when_missing: {action}{default}). Check the "
            f"partition's prefix; {again}"
        )
    return f"step {step}: {why}; waiting up to {wait_seconds}s for its input (input.when_missing: wait{default})"


def model_missing_text(step: str, problem: str, ref: str) -> str:
    """A plan that found no model: the same on every try, so no retry; how to run the partition once it is there."""
    return (
        f"step {step}: {problem}. Nothing was planned or submitted: upload the model there and run "
        f'`shardline rerun {ref}`, or `shardline rerun {ref} --conf \'{{"model_version": "..."}}\'` for '
        "another version"
    )


def dry_run_empty_text(input_prefix: str, include: list[str], action: str, wait_seconds: int) -> str:
    """A dry run that found no input: what a real run would have done instead of going green."""
    real = (
        f"a real run would wait up to {wait_seconds}s for it"
        if action == "wait"
        else "a real run would fail the same way"
    )
    return (
        f"dry run: no input file under {input_prefix} (matching {include}), so nothing could be checked; {real} "
        f"(input.when_missing: {action}). Check the partition's prefix, or the Param input_prefix"
    )


def param_problem_text(problem: str, ref: str) -> str:
    """A conf the run cannot use (the spec's check says why): nothing was planned; how to run the partition again."""
    return (
        f"{problem}. Nothing was planned: `shardline rerun {ref} --conf '{{...}}'` runs this partition again "
        "with a valid conf (or change the spec to allow this one)"
    )


def run_failed_text(reason: object) -> str:
    """The ledger's message for a DAG run that failed outside the watch task (say, in planning)."""
    said = f"DAG run failed ({reason})" if reason else "DAG run failed"
    return f"{said}; check the failed task's log in Airflow for why"
