"""What a resubmit command does, decided before anything changes (``decision.resubmit.choose_next``). Pure:
every case of the on-call loop that once half-worked is pinned here."""

from __future__ import annotations

from shardline.decision.resubmit import Next, choose_next


def choose(*, job_running=False, step="FAILED", watch="failed", files=1, force=False):
    return choose_next(
        attempt=2,
        job="sl-p-2",
        job_running=job_running,
        step_status=step,
        watch_state=watch,
        files=files,
        force=force,
        watch="watch_score",
    )


def test_a_failed_step_gets_a_new_attempt_and_its_finished_watch_task_is_cleared():
    got = choose()
    assert (got.next, got.clear_watch) == (Next.SUBMIT, True)


def test_a_running_attempt_that_a_watch_task_follows_is_left_alone_even_with_force():
    for force in (False, True):
        got = choose(job_running=True, step="RUNNING", watch="deferred", force=force)
        assert (got.next, got.clear_watch) == (Next.NOTHING, False)
        assert "still running" in got.reason


def test_a_half_done_resubmission_is_completed_by_clearing_the_watch_task_not_by_a_new_attempt():
    # An earlier resubmit submitted attempt 2, then could not clear watch_score: nothing follows attempt 2.
    got = choose(job_running=True, step="PLANNED", watch="failed")
    assert (got.next, got.clear_watch) == (Next.TAKE_UP, True)
    # Attempt 2 has since succeeded with no watch task to record it: clearing it lets the run turn green.
    got = choose(step="PLANNED", watch="failed", files=0)
    assert (got.next, got.clear_watch) == (Next.TAKE_UP, True)
    # Attempt 2 has ended with files left over: they go again, and the watch task is cleared.
    got = choose(step="RUNNING", watch="failed", files=3)
    assert (got.next, got.clear_watch) == (Next.SUBMIT, True)


def test_while_the_watch_task_is_in_charge_a_plain_resubmit_is_refused_and_force_needs_no_clear():
    got = choose(step="RUNNING", watch="deferred")
    assert got.next is Next.REFUSE and "--force" in got.reason and "deferred" in got.reason
    got = choose(step="RUNNING", watch="up_for_retry", force=True)
    assert (got.next, got.clear_watch) == (Next.SUBMIT, False)


def test_a_forced_attempt_that_succeeded_unwatched_turns_the_run_green_instead_of_nothing_to_resubmit():
    got = choose(step="SUCCEEDED", watch="failed", files=0, force=True)
    assert (got.next, got.clear_watch) == (Next.TAKE_UP, True)
    got = choose(step="SUCCEEDED", watch="success", files=0)
    assert (got.next, got.clear_watch) == (Next.NOTHING, False)
    assert got.reason == "nothing to resubmit: every file of the step has succeeded"


def test_without_airflow_ledger_only_submits_and_clears_nothing():
    assert (choose(watch=None).next, choose(watch=None).clear_watch) == (Next.SUBMIT, False)
    assert choose(step="PLANNED", watch=None, files=0).next is Next.NOTHING
    assert choose(job_running=True, step="RUNNING", watch=None).next is Next.NOTHING
