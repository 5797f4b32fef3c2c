"""The watch's state table: every (job state x file states x attempts) combination."""

from __future__ import annotations

import dataclasses

import pytest

from shardline.backends import LostInstance
from shardline.decision.policy import Action, JobStatus, Policy, StepSnapshot, backoff, decide, needs_files, tolerated
from shardline.ledger.records import FileRecord
from shardline.ledger.states import FileStatus
from tests.support.records import POLL_AT, heard

POLICY = Policy(
    max_attempts=3,
    backoff_seconds=60,
    backoff_multiplier=2.0,
    max_failed_files=0,
    max_failed_percent=0.0,
    heartbeat_timeout_seconds=300,
)
S, F, R, P = FileStatus.SUCCEEDED, FileStatus.FAILED, FileStatus.RUNNING, FileStatus.PENDING


def files(*statuses, error_class="PredictionError", attempt=1):
    return tuple(
        FileRecord(
            f"s3://b/in/{i:03d}.parquet",
            st,
            attempt,
            error_class=error_class if st is F else None,
            error_message="boom" if st is F else None,
        )
        for i, st in enumerate(statuses)
    )


def snap(job, fs, attempt=1, shards=(), age=10.0, reason=None):
    return StepSnapshot(
        attempt=attempt,
        job_status=job,
        job_age_seconds=age,
        files=fs,
        shards=shards,
        job_failure_reason=reason,
        now=POLL_AT,
    )


def test_in_progress_with_fresh_heartbeats_waits():
    d = decide(snap(JobStatus.IN_PROGRESS, files(S, R, P), shards=[heard("algo-1", 12)]), POLICY)
    assert d.action is Action.WAIT
    assert "1/3" in d.reason


def test_in_progress_with_every_file_done_still_waits_for_the_upload():
    d = decide(snap(JobStatus.IN_PROGRESS, files(S, S), shards=[heard("algo-1", 1)]), POLICY)
    assert d.action is Action.WAIT


def test_stale_heartbeat_stops_the_job_and_resubmits_only_its_unfinished_files():
    # Each output is uploaded before its file is recorded SUCCEEDED: what the lost job finished is durable and
    # stays, whichever attempt finished it; only the unfinished files go again.
    fs = (*files(S, R, P, attempt=2), FileRecord("s3://b/in/earlier.parquet", S, 1))
    d = decide(snap(JobStatus.IN_PROGRESS, fs, attempt=2, shards=[heard("algo-1", 5), heard("algo-2", 301)]), POLICY)
    assert d.action is Action.RESUBMIT
    assert d.stop_job
    assert d.retry_files == (fs[1].input_key, fs[2].input_key)
    assert "algo-2" in d.reason


def test_an_instance_that_finished_may_fall_silent():
    shards = [heard("algo-1", 900, finished=True), heard("algo-2", 5)]
    assert decide(snap(JobStatus.IN_PROGRESS, files(S, R), shards=shards), POLICY).action is Action.WAIT


def test_no_heartbeat_ever_counts_as_lost_after_the_timeout():
    assert decide(snap(JobStatus.IN_PROGRESS, files(P, P), age=299), POLICY).action is Action.WAIT
    d = decide(snap(JobStatus.IN_PROGRESS, files(P, P), age=301), POLICY)
    assert d.action is Action.RESUBMIT and d.stop_job


# -- a poll of a running step reads no FILE item ------------------------------------------------------------


def unread(job, *, shards=(), age=10.0, cancelled=False, attempt=1):
    """A snapshot whose FILE items were not read (what a poll of a running step takes)."""
    return StepSnapshot(
        attempt=attempt,
        job_status=job,
        job_age_seconds=age,
        files=None,
        shards=shards,
        cancelled=cancelled,
        now=POLL_AT,
    )


def test_a_running_step_with_every_instance_heard_from_needs_no_file_read():
    shards = [
        heard("algo-1", 12, files_assigned=6, files_done=4, files_failed=1),
        heard("algo-2", 3, files_assigned=5, files_done=2),
        heard("algo-3", 900, finished=True, files_assigned=4, files_done=4),
    ]
    for job in (JobStatus.IN_PROGRESS, JobStatus.STOPPING):
        assert not needs_files(unread(job, shards=shards, attempt=2), POLICY)
    d = decide(unread(JobStatus.IN_PROGRESS, shards=shards, attempt=2), POLICY)
    assert d.action is Action.WAIT
    assert d.reason == "job InProgress: attempt 2's 3 instance(s) report 10/15 file(s) finished, 1 failed"
    # The same wait as when the files are read: a decision never changes for having read them.
    assert decide(snap(JobStatus.IN_PROGRESS, files(S, F, R), shards=shards), POLICY).action is Action.WAIT


@pytest.mark.parametrize(
    "snapshot",
    [
        unread(JobStatus.COMPLETED, shards=[heard("algo-1", 1, finished=True)]),
        unread(JobStatus.FAILED),
        unread(JobStatus.STOPPED),
        unread(JobStatus.IN_PROGRESS, shards=[heard("algo-1", 1)], cancelled=True),
        unread(JobStatus.IN_PROGRESS, shards=[heard("algo-1", 1), heard("algo-2", 301)]),  # a stale one
        unread(JobStatus.IN_PROGRESS, age=301),  # no instance ever heard from, past the timeout
    ],
    ids=["completed", "failed", "stopped", "cancelled", "stale", "never-heard"],
)
def test_the_files_are_read_when_the_job_ended_an_instance_went_silent_or_an_operator_cancelled(snapshot):
    assert needs_files(snapshot, POLICY)
    with pytest.raises(ValueError, match="not read"):
        decide(snapshot, POLICY)  # never a decision on files it did not see


def test_a_young_job_with_no_heartbeat_yet_waits_without_reading_files():
    assert not needs_files(unread(JobStatus.IN_PROGRESS, age=299), POLICY)
    assert decide(unread(JobStatus.IN_PROGRESS, age=299), POLICY).action is Action.WAIT


def test_completed_with_all_files_succeeded_advances():
    d = decide(snap(JobStatus.COMPLETED, files(S, S, S)), POLICY)
    assert d.action is Action.ADVANCE
    assert d.retry_files == () and d.failed_files == ()


def test_completed_with_unfinished_files_is_a_lost_shard_and_resubmits_them():
    fs = files(S, R, P, S)
    d = decide(snap(JobStatus.COMPLETED, fs), POLICY)
    assert d.action is Action.RESUBMIT
    assert set(d.retry_files) == {fs[1].input_key, fs[2].input_key}
    assert d.delay_seconds == 60


@pytest.mark.parametrize("job", [JobStatus.FAILED, JobStatus.STOPPED])
def test_failed_or_stopped_job_resubmits_only_what_is_not_done(job):
    fs = (*files(S, R, attempt=2), FileRecord("s3://b/in/earlier.parquet", S, 1))
    d = decide(snap(job, fs, attempt=2, reason="AlgorithmError: exit 137"), POLICY)
    assert d.action is Action.RESUBMIT
    assert d.retry_files == (fs[1].input_key,)  # the files it finished were uploaded as they finished
    assert "exit 137" in d.reason and "2 finished file(s) are kept" in d.reason


def test_out_of_attempts_a_stopped_jobs_finished_files_are_kept_and_its_unfinished_ones_fail():
    fs = files(S, R, attempt=3)
    d = decide(snap(JobStatus.STOPPED, fs, attempt=3, reason="MaxRuntimeInSeconds (60) exceeded"), POLICY)
    assert d.action is Action.FAIL and [f.input_key for f in d.failed_files] == [fs[1].input_key]


def test_transient_failures_are_retried_permanent_ones_are_not():
    transient = files(F)[0]
    corrupt = FileRecord("s3://b/in/bad.parquet", F, 1, error_class="CorruptInputError", error_message="cannot read")
    d = decide(snap(JobStatus.COMPLETED, (transient, corrupt, files(S)[0])), POLICY)
    assert d.action is Action.RESUBMIT
    assert d.retry_files == (transient.input_key,)
    assert d.failed_files == (corrupt,)


def test_backoff_grows_with_each_attempt():
    assert [backoff(POLICY, a) for a in (1, 2, 3)] == [60, 120, 240]
    d = decide(snap(JobStatus.FAILED, files(R), attempt=2), POLICY)
    assert d.delay_seconds == 120


def test_out_of_attempts_past_tolerance_fails_and_lists_every_file():
    fs = files(S, F, R, attempt=3)
    d = decide(snap(JobStatus.COMPLETED, fs, attempt=3), POLICY)
    assert d.action is Action.FAIL
    assert {f.input_key for f in d.failed_files} == {fs[1].input_key, fs[2].input_key}
    unfinished = next(f for f in d.failed_files if f.input_key == fs[2].input_key)
    assert unfinished.error_class == "Unfinished"
    assert "past the tolerance" in d.reason


def test_permanent_failures_within_tolerance_end_partial_without_retrying():
    policy = Policy(3, 60, 2.0, max_failed_files=1, max_failed_percent=0, heartbeat_timeout_seconds=300)
    corrupt = FileRecord("s3://b/in/bad.parquet", F, 1, error_class="CorruptInputError", error_message="cannot read")
    d = decide(snap(JobStatus.COMPLETED, (corrupt, *files(S, S))), policy)
    assert d.action is Action.PARTIAL
    assert d.failed_files == (corrupt,)


def test_percent_tolerance():
    policy = Policy(1, 0, 1.0, max_failed_files=0, max_failed_percent=10.0, heartbeat_timeout_seconds=300)
    assert tolerated(policy, 1, 10)
    assert not tolerated(policy, 2, 10)
    assert decide(snap(JobStatus.COMPLETED, files(F, *([S] * 9))), policy).action is Action.PARTIAL
    assert decide(snap(JobStatus.COMPLETED, files(F, F, *([S] * 8))), policy).action is Action.FAIL


def test_job_failed_after_every_file_succeeded_keeps_them():
    # Every output went up before its file was recorded, and the step's end checks each against S3.
    fs = files(S, S)
    d = decide(snap(JobStatus.FAILED, fs, reason="AlgorithmError: exit 1"), POLICY)
    assert d.action is Action.ADVANCE and not d.retry_files


def test_empty_step_advances():
    assert decide(snap(JobStatus.COMPLETED, ()), POLICY).action is Action.ADVANCE


@pytest.mark.parametrize("job", [JobStatus.IN_PROGRESS, JobStatus.FAILED])
def test_an_instance_that_could_not_start_fails_the_step_at_once_with_its_reason(job):
    broken = heard("algo-2", 3, finished=True, setup_error="no model file under /opt/ml/processing/input/model")
    snapshot = snap(job, files(S, R, P), shards=[heard("algo-1", 3), broken])
    assert needs_files(dataclasses.replace(snapshot, files=None), POLICY)  # its files are read to name them
    d = decide(snapshot, POLICY)
    assert d.action is Action.FAIL  # not RESUBMIT, though two attempts are left: the same model fails again
    assert d.stop_job is (job is JobStatus.IN_PROGRESS)
    assert "algo-2" in d.reason and "no model file under" in d.reason
    assert [(f.status, f.error_class) for f in d.failed_files] == [(R, "SetupError"), (P, "SetupError")]


# -- capacity: SageMaker could not provision the job ----------------------------------------------------------

CAPACITY = "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML"


@pytest.mark.parametrize(
    ("attempt", "uncounted", "job", "reason", "action", "capacity"),
    [
        (1, 0, JobStatus.FAILED, CAPACITY, Action.RESUBMIT, True),
        (3, 0, JobStatus.FAILED, CAPACITY, Action.RESUBMIT, True),  # the last counted attempt: still goes again
        (9, 8, JobStatus.FAILED, CAPACITY, Action.RESUBMIT, True),
        (3, 0, JobStatus.FAILED, "AlgorithmError: exit code 1", Action.FAIL, False),  # a real failure: spent
        (3, 2, JobStatus.FAILED, "AlgorithmError: exit code 1", Action.RESUBMIT, False),  # 1 of 3 counted
        (5, 2, JobStatus.FAILED, "AlgorithmError: exit code 1", Action.FAIL, False),  # 3 of 3 counted
        (3, 0, JobStatus.STOPPED, CAPACITY, Action.FAIL, False),  # only a job that FAILED for capacity
    ],
)
def test_a_capacity_failure_goes_again_uncounted_and_earlier_ones_are_not_counted(
    attempt, uncounted, job, reason, action, capacity
):
    snapshot = dataclasses.replace(
        snap(job, files(S, F, P, R, error_class="TimeoutError", attempt=attempt), attempt=attempt, reason=reason),
        uncounted_attempts=uncounted,
    )
    d = decide(snapshot, POLICY)
    assert (d.action, d.capacity) == (action, capacity)
    if capacity:
        assert "not counted against retry.max_attempts" in d.reason
        # 60 s, doubling with each capacity retry in a row, at most the longest submit wait (900 s)
        assert d.delay_seconds == min(900, 60 * 2**uncounted)
        assert d.retry_files == tuple(sorted(f.input_key for f in snapshot.files if f.status is not S))


def test_after_a_capacity_failure_a_permanent_failure_stays_failed_and_the_message_counts_honestly():
    corrupt = FileRecord("s3://b/in/bad.parquet", F, 1, error_class="CorruptInputError", error_message="cannot read")
    d = decide(snap(JobStatus.FAILED, (*files(S, P), corrupt), reason=CAPACITY), POLICY)
    assert d.action is Action.RESUBMIT and d.capacity
    assert d.retry_files == ("s3://b/in/001.parquet",) and d.failed_files == (corrupt,)
    later = dataclasses.replace(
        snap(JobStatus.FAILED, files(S, P, attempt=3), attempt=3, reason="AlgorithmError: x"), uncounted_attempts=2
    )
    assert "go to attempt 4 (2 counted) of 3" in decide(later, POLICY).reason


@pytest.mark.parametrize("job", [JobStatus.COMPLETED, JobStatus.IN_PROGRESS])
def test_a_step_whose_ledger_record_is_gone_fails_whatever_files_it_still_sees(job):
    """Absence is never success: with its STEP item gone, the files a poll can still see (none, or some) are not the
    files the step planned. It fails, naming the gap, and a job still running is stopped: it can no longer be fenced."""
    gone = "the ledger has no record of step score of run r: was the AWS endpoint's state lost?"
    for seen in (None, (), files(S, S)):
        lost = dataclasses.replace(snap(job, seen), record_missing=gone)
        assert not needs_files(lost, POLICY)
        decision = decide(lost, POLICY)
        assert (decision.action, decision.reason, decision.stop_job) == (Action.FAIL, gone, not job.is_terminal)


# -- an instance the backend saw die while its job goes on ----------------------------------------------------------


def _lost(host: str, *indexes: int, attempt: int = 1):
    inputs = tuple(f"s3://b/in/{i:03d}.parquet" for i in indexes)
    return (attempt, LostInstance(host, "exited with code -9", inputs))


def test_a_dead_instances_unfinished_files_start_as_the_next_attempt_at_once_beside_the_running_job():
    # algo-2 was given files 1, 3 and 5: 1 it finished, 3 and 5 are unfinished. The others' files (0, 2, 4) run on.
    fs = files(R, S, R, R, P, P)
    snapshot = dataclasses.replace(
        snap(JobStatus.IN_PROGRESS, fs, shards=[heard("algo-1", 1)]), lost_instances=(_lost("algo-2", 1, 3, 5),)
    )
    assert needs_files(dataclasses.replace(snapshot, files=None), POLICY)
    d = decide(snapshot, POLICY)
    assert (d.action, d.beside, d.stop_job) == (Action.RESUBMIT, True, False)
    assert d.retry_files == ("s3://b/in/003.parquet", "s3://b/in/005.parquet")
    assert "algo-2 died (exited with code -9) while the job went on" in d.reason and "attempt 2" in d.reason


def test_a_dead_instances_files_a_newer_attempt_took_are_not_taken_again():
    fs = (*files(R, S), FileRecord("s3://b/in/003.parquet", P, 2))  # 003 went to attempt 2 already
    snapshot = dataclasses.replace(
        snap(JobStatus.IN_PROGRESS, fs, attempt=2, shards=[heard("algo-1", 1, attempt=2)]),
        lost_instances=(_lost("algo-2", 1, 3, attempt=1),),
        earlier_job_running="sl-job-a1",
    )
    assert decide(snapshot, POLICY).action is Action.WAIT


def test_with_no_attempt_left_a_dead_instances_files_wait_for_the_job_to_end():
    fs = files(R, R, attempt=3)
    snapshot = dataclasses.replace(
        snap(JobStatus.IN_PROGRESS, fs, attempt=3, shards=[heard("algo-1", 1, attempt=3)]),
        lost_instances=(_lost("algo-2", 1, attempt=3),),
    )
    assert decide(snapshot, POLICY).action is Action.WAIT  # its end fails them, as any unfinished file


def test_an_ended_attempt_waits_while_an_earlier_attempts_job_still_scores_its_own_files():
    fs = (FileRecord("s3://b/in/000.parquet", R, 1), FileRecord("s3://b/in/001.parquet", S, 2))
    snapshot = dataclasses.replace(snap(JobStatus.COMPLETED, fs, attempt=2), earlier_job_running="sl-job-a1")
    d = decide(snapshot, POLICY)
    assert d.action is Action.WAIT and "sl-job-a1 of an earlier attempt still scores its own files" in d.reason
    ended = dataclasses.replace(snapshot, earlier_job_running=None)
    assert decide(ended, POLICY).action is Action.RESUBMIT  # then its unfinished file goes again, as any
