"""How a DAG run ends, from its steps' summaries (pure)."""

from __future__ import annotations

from shardline.decision.policy import Action
from shardline.decision.run_end import run_end
from shardline.decision.summary import StepSummary
from shardline.ledger.states import RunStatus


def _summary(step: str, outcome: str = "ADVANCE", mismatched: tuple[str, ...] = ()) -> StepSummary:
    return StepSummary(step, 1, 1, 0, 10, 10, 0, 1, rows_mismatched_files=mismatched, outcome=Action(outcome))


def test_a_run_of_succeeded_steps_succeeds_and_a_partial_step_makes_it_partial():
    assert run_end([_summary("a"), _summary("b")]).status is RunStatus.SUCCEEDED
    assert run_end([_summary("a"), _summary("b", "PARTIAL")]).status is RunStatus.PARTIAL


def test_rows_out_unlike_rows_in_fail_the_run_naming_the_files_whatever_the_outcomes():
    ended = run_end([_summary("a", "PARTIAL"), _summary("b", mismatched=("s3://b/in/x.parquet",))])
    assert ended.status is RunStatus.FAILED
    assert "rows in != rows out + rows rejected for 1 succeeded file(s): ['s3://b/in/x.parquet']" in ended.message


def test_skipped_steps_count_for_nothing_and_a_run_of_skipped_steps_has_no_status():
    ended = run_end([None, _summary("b")])
    assert (ended.status, ended.steps_reported, ended.steps_skipped) == (RunStatus.SUCCEEDED, 1, 1)
    nothing = run_end([None, None])
    assert nothing.status is None and nothing.message == "every step was skipped: none had input"
