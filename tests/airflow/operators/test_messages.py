"""What the operators say when a task fails, skips or warns (airflow/operators/messages.py): each text names the run
and the command, setting or Param that fixes it. Pure: no AWS. (tests/oncall/test_messages.py checks how every
message of the project reads; these check what each one says.)"""

from __future__ import annotations

from shardline.airflow.operators.messages import (
    dry_run_empty_text,
    missing_input_text,
    model_missing_text,
    param_problem_text,
    partial_text,
    run_failed_text,
    step_failed_text,
)
from shardline.decision.policy import Action
from shardline.planning.attempt import Attempt

ATTEMPT = Attempt(
    pipeline="churn",
    run_id="manual__2026-11-22",
    step="score",
    number=2,
    input_prefix="s3://b/in/",
    output_prefix="s3://b/out/",
    model_uri="s3://b/model.tar.gz",
)
RESUBMIT = "shardline resubmit churn/manual__2026-11-22 --step score --all-failed"
RERUN = "shardline rerun churn/manual__2026-11-22"
WHERE = "step score of churn run manual__2026-11-22"


def failed(n: int) -> list[dict]:
    return [
        {"input": f"s3://b/in/part-{i}.parquet", "error_class": "CorruptInputError", "error_message": "not parquet"}
        for i in range(n)
    ]


def test_a_failed_step_names_its_failed_files_with_their_errors_and_the_resubmit_command():
    text = step_failed_text(ATTEMPT, Action.FAIL, "2 of 4 file(s) failed", failed(2))
    assert text == (
        f"{WHERE} failed: 2 of 4 file(s) failed. Failed files: s3://b/in/part-0.parquet (CorruptInputError: not "
        "parquet); s3://b/in/part-1.parquet (CorruptInputError: not parquet). Fix the inputs or the model, then "
        f"resubmit just these files (the run turns green when they succeed): {RESUBMIT}"
    )
    many = step_failed_text(ATTEMPT, Action.FAIL, "12 of 12 file(s) failed", failed(12))
    assert "part-9.parquet (CorruptInputError: not parquet); and 2 more. Fix" in many and "part-10" not in many
    bare = [{"input": "s3://b/in/x.parquet"}]  # no error recorded: the file alone
    assert "Failed files: s3://b/in/x.parquet. Fix" in step_failed_text(ATTEMPT, Action.FAIL, "failed", bare)


def test_a_step_that_failed_with_no_file_failed_says_to_fix_the_cause_and_resubmit():
    text = step_failed_text(ATTEMPT, Action.FAIL, "cancelled by on-call", [])
    assert text == (
        f"{WHERE} failed: cancelled by on-call. Fix the cause, then resubmit what did not finish (the run turns green "
        f"when it succeeds): {RESUBMIT}"
    )


def test_a_timed_out_step_names_the_setting_to_raise_and_the_resubmit_command():
    text = step_failed_text(ATTEMPT, Action.TIMEOUT, "ran past its deadline", failed(1))
    assert text.startswith(
        f"{WHERE} failed: ran past its deadline. If the step needs longer, raise max_runtime_seconds"
    )
    assert text.endswith(RESUBMIT) and "CorruptInputError" not in text


def test_an_unreachable_step_says_only_why_its_reason_names_the_command():
    reason = f"the ledger was unreachable for 61s; check the endpoint, then {RESUBMIT}"
    assert step_failed_text(ATTEMPT, Action.UNREACHABLE, reason, failed(1)) == f"{WHERE}: {reason}"


def test_a_partial_step_lists_its_failed_files_and_the_fix():
    text = partial_text("score", "1 of 4 file(s) failed, within the tolerance", failed(1), RESUBMIT)
    assert text == (
        "step score ended PARTIAL: 1 of 4 file(s) failed, within the tolerance; failed: s3://b/in/part-0.parquet "
        f"(CorruptInputError: not parquet). To retry them after fixing the cause: {RESUBMIT}"
    )
    assert "failed: none." in partial_text("score", "r", [], RESUBMIT)


def missing(action: str, *, waited: bool = False, chosen: bool = True, run_type: str = "manual") -> str:
    return missing_input_text(
        "score",
        "churn/manual__2026-11-22",
        "no input file under s3://b/in/",
        action,
        waited=waited,
        wait_seconds=3600,
        chosen=chosen,
        run_type=run_type,
    )


def test_a_run_with_no_input_says_what_when_missing_chose_and_how_to_plan_it_again():
    again = f"once the input is there, `{RERUN}` plans this run again"
    assert missing("skip") == "step score: skipped: no input file under s3://b/in/ (input.when_missing: skip)"
    failed_now = missing("fail", chosen=False)
    assert failed_now.startswith(
        "step score: no input file under s3://b/in/, so nothing was processed (input.when_missing: fail, the "
        "default for a manual run). Check the partition's prefix; "
    )
    assert again in failed_now and "input.wait_timeout_seconds in the spec" in failed_now
    assert "(input.when_missing: fail). Check" in missing("fail")  # the spec chose it: no default named
    assert "(input.when_missing: fail, the default for an asset_triggered run)" in missing(
        "fail", chosen=False, run_type="asset_triggered"
    )
    gave_up = missing("wait", waited=True)
    assert gave_up.startswith("step score: waited 3600s for its input and gave up: no input file under s3://b/in/.")
    assert again in gave_up
    assert missing("wait", chosen=False, run_type="scheduled") == (
        "step score: no input file under s3://b/in/; waiting up to 3600s for its input (input.when_missing: wait, "
        "the default for a scheduled run)"
    )


def test_a_missing_model_and_a_bad_conf_each_name_the_rerun_command():
    text = model_missing_text("score", "no model at s3://b/model.tar.gz", "churn/manual__2026-11-22")
    assert text.startswith("step score: no model at s3://b/model.tar.gz. Nothing was planned or submitted")
    assert f"`{RERUN}`" in text and f"""`{RERUN} --conf '{{"model_version": "..."}}'`""" in text
    problem = param_problem_text("Param instance_count 0 must be null", "churn/manual__2026-11-22")
    assert problem.startswith("Param instance_count 0 must be null. Nothing was planned: ")
    assert f"`{RERUN} --conf '{{...}}'`" in problem


def test_a_dry_run_with_no_input_says_what_a_real_run_would_do_and_names_the_param():
    wait = dry_run_empty_text("s3://b/in/", ["*.parquet"], "wait", 600)
    assert wait.startswith("dry run: no input file under s3://b/in/ (matching ['*.parquet']), so nothing could be")
    assert "a real run would wait up to 600s for it (input.when_missing: wait)" in wait
    assert wait.endswith("Check the partition's prefix, or the Param input_prefix")
    assert "a real run would fail the same way (input.when_missing: fail)" in dry_run_empty_text(
        "s3://b/in/", ["*"], "fail", 600
    )


def test_a_run_failed_outside_its_watch_task_points_at_the_failed_tasks_log():
    said = "; check the failed task's log in Airflow for why"
    assert run_failed_text("task_failure") == f"DAG run failed (task_failure){said}"
    assert run_failed_text(None) == run_failed_text("") == f"DAG run failed{said}"
