"""The orchestrator's side of the ledger on moto_server: plans, fenced attempts, Query-only reads."""

from __future__ import annotations

import pytest

from shardline.ledger.context import StaleAttemptError
from shardline.ledger.job_writes import FinishedFile, LedgerContext, WorkerLedger
from shardline.ledger.keys import StepRef
from shardline.ledger.states import FileStatus, StepStatus, Succession
from shardline.ledger.step_reads import read_step, with_unclaimed
from shardline.ledger.step_writes import cancel_step, continue_attempt, ensure_run, finish_step, start_attempt
from shardline.ledger.table import bind_ledger


def test_plan_then_worker_updates_then_read(ledger_table):
    model = bind_ledger(ledger_table)
    ensure_run(model, "p", "run-1")
    ensure_run(model, "p", "run-1")  # idempotent
    keys = [(f"s3://raw/in/part-{i:03d}.parquet", 100 + i) for i in range(60)]
    start_attempt(model, StepRef("p", "run-1", "score"), 1)
    assert read_step(model, StepRef("p", "run-1", "score")).files == []  # the plan writes no FILE item

    ctx = LedgerContext(
        table=ledger_table, pipeline="p", run_id="run-1", step="score", attempt=1, input_uri="s3://raw/in/"
    )
    worker = WorkerLedger(ctx, "algo-1")
    worker.claim_file("part-000.parquet")  # the claim creates the item
    worker.finish_file("part-000.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=5, rows_out=5))
    worker.claim_file("part-001.parquet")
    worker.finish_file(
        "part-001.parquet",
        FinishedFile(FileStatus.FAILED, error_class="CorruptInputError", error_message="cannot read"),
    )

    records = read_step(model, StepRef("p", "run-1", "score"))
    assert records.step.attempt == 1
    assert records.requests == 2  # one page for the step and its shards, one of files
    assert [f.input_key for f in records.files] == [keys[0][0], keys[1][0]]
    seen = with_unclaimed(records, {1: keys})  # what the plan file adds: the other 58, PENDING
    statuses = {f.input_key: f.status for f in seen.files}
    assert len(statuses) == 60
    assert statuses["s3://raw/in/part-000.parquet"] == "SUCCEEDED"
    assert statuses["s3://raw/in/part-001.parquet"] == "FAILED"
    assert sum(s == "PENDING" for s in statuses.values()) == 58
    assert [f.input_key for f in seen.files] == [k for k, _ in keys]  # in key order, as the Query returns them
    assert seen.planned_sizes["s3://raw/in/part-059.parquet"] == 159 and len(seen.planned_sizes) == 60


def test_a_retry_fences_its_files_over_parallel_batches_and_a_replan_writes_nothing_twice(ledger_table):
    """Attempt 1 writes no FILE item; a retry writes one PENDING item per file, so that an instance of an older
    attempt still running cannot finish it (its output is withdrawn); a re-plan rewrites only what is PENDING."""
    model = bind_ledger(ledger_table)
    keys = [(f"s3://raw/in/dt=1/part-{i:04d}.parquet", 1000 + i) for i in range(260)]  # 11 calls over 8 threads
    assert start_attempt(model, StepRef("p", "run-6", "score"), 1, keys) == 0
    assert list(model.query("RUN#p#run-6", model.sk.startswith("FILE#score#"))) == []
    assert start_attempt(model, StepRef("p", "run-6", "score"), 2, keys) == 260
    files = list(model.query("RUN#p#run-6", model.sk.startswith("FILE#score#")))
    assert sorted((f.input_key, int(f.bytes_in), f.status, int(f.attempt)) for f in files) == [
        (key, size, "PENDING", 2) for key, size in keys
    ]
    assert all(f.sk == f"FILE#score#{f.input_key}" and f.expires_at for f in files)

    # The same attempt planned again (a retried task) is fenced off before any FILE write ...
    with pytest.raises(StaleAttemptError):
        start_attempt(model, StepRef("p", "run-6", "score"), 2, keys)
    # ... and a re-plan of the attempt (its job never started) rewrites only what is still PENDING, to the same.
    worker = WorkerLedger(
        LedgerContext(
            table=ledger_table, pipeline="p", run_id="run-6", step="score", attempt=2, input_uri="s3://raw/in/"
        ),
        "algo-1",
    )
    worker.claim_file("dt=1/part-0000.parquet")
    worker.claim_file("dt=1/part-0001.parquet")
    worker.finish_file("dt=1/part-0001.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=1, rows_out=1))
    assert continue_attempt(model, StepRef("p", "run-6", "score"), 2, keys) == 258
    after = {f.sk: f for f in model.query("RUN#p#run-6", model.sk.startswith("FILE#score#"))}
    assert len(after) == 260  # no file twice
    assert after["FILE#score#s3://raw/in/dt=1/part-0000.parquet"].status == "RUNNING"  # the claim stands
    assert after["FILE#score#s3://raw/in/dt=1/part-0001.parquet"].status == "SUCCEEDED"  # and so does the finish
    assert sum(f.status == "PENDING" for f in after.values()) == 258


def test_a_finish_whose_claim_was_dropped_lands_but_a_zombie_s_is_refused_by_the_retry_s_fence(ledger_table):
    """A claim the pump dropped (the endpoint was down past its budget) leaves no item: the finish is still this
    attempt's. Once a retry planned the file, its PENDING item fences the older attempt's finish off."""
    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-0", "score"), 1)
    first = WorkerLedger(
        LedgerContext(
            table=ledger_table, pipeline="p", run_id="run-0", step="score", attempt=1, input_uri="s3://raw/in/"
        ),
        "algo-1",
    )
    first.finish_file("a.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=3, rows_out=3))
    [item] = read_step(model, StepRef("p", "run-0", "score")).files
    assert (item.input_key, item.status, int(item.attempt), int(item.rows_out)) == (
        "s3://raw/in/a.parquet",
        "SUCCEEDED",
        1,
        3,
    )
    start_attempt(model, StepRef("p", "run-0", "score"), 2, [("s3://raw/in/b.parquet", 1)])
    with pytest.raises(StaleAttemptError):
        first.finish_file("b.parquet", FinishedFile(FileStatus.SUCCEEDED))
    assert {
        f.input_key: (f.status, int(f.attempt)) for f in read_step(model, StepRef("p", "run-0", "score")).files
    } == {"s3://raw/in/a.parquet": ("SUCCEEDED", 1), "s3://raw/in/b.parquet": ("PENDING", 2)}


def test_each_attempt_s_plan_file_is_recorded_with_it_and_a_re_plan_replaces_only_its_own(ledger_table):
    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-7", "score"), 1, plan_file="s3://m/attempt-0001.aaa.files.json.gz")
    continue_attempt(model, StepRef("p", "run-7", "score"), 1, plan_file="s3://m/attempt-0001.bbb.files.json.gz")
    start_attempt(
        model, StepRef("p", "run-7", "score"), 2, [("s3://raw/a", 1)], plan_file="s3://m/attempt-0002.ccc.files.json.gz"
    )
    assert read_step(model, StepRef("p", "run-7", "score")).step.plan_files == {
        1: "s3://m/attempt-0001.bbb.files.json.gz",
        2: "s3://m/attempt-0002.ccc.files.json.gz",
    }
    with pytest.raises(StaleAttemptError):  # a late planner of attempt 1 records nothing
        continue_attempt(model, StepRef("p", "run-7", "score"), 1, plan_file="s3://m/attempt-0001.zzz.files.json.gz")
    assert read_step(model, StepRef("p", "run-7", "score")).step.plan_files[1].endswith(".bbb.files.json.gz")
    assert read_step(model, StepRef("p", "nope", "score")).step is None


def test_of_two_planners_that_read_the_same_record_only_one_records_its_plan_file(ledger_table):
    """The record is written in the fenced update, conditioned on what the planner read: a planner that read it
    before another one's update loses, even for the same attempt (two tries of one plan task)."""
    from shardline.ledger.keys import run_pk
    from shardline.ledger.step_writes import _plan_files_update

    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-8", "score"), 1, plan_file="s3://m/one")
    stale_action, stale_condition = _plan_files_update(model, run_pk("p", "run-8"), "score", 1, "s3://m/late")
    continue_attempt(model, StepRef("p", "run-8", "score"), 1, plan_file="s3://m/two")  # the other try, first
    from pynamodb.exceptions import UpdateError

    c = model.Control
    with pytest.raises(UpdateError):
        c(run_pk("p", "run-8"), "STEP#score#").update(actions=stale_action, condition=stale_condition)
    assert read_step(model, StepRef("p", "run-8", "score")).step.plan_files == {1: "s3://m/two"}


def test_attempts_only_move_forward(ledger_table):
    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-2", "score"), 1)
    start_attempt(model, StepRef("p", "run-2", "score"), 2)
    with pytest.raises(StaleAttemptError, match=r"no longer at attempt 0"):
        start_attempt(model, StepRef("p", "run-2", "score"), 1)
    # An on-call resubmission names the attempt it saw as the newest; if that moved, it loses.
    with pytest.raises(StaleAttemptError, match=r"no longer at attempt 1"):
        start_attempt(model, StepRef("p", "run-2", "score"), 3, follows=Succession(after=1))
    start_attempt(model, StepRef("p", "run-2", "score"), 3, follows=Succession(after=2))
    assert read_step(model, StepRef("p", "run-2", "score")).step.attempt == 3


def test_fencing_two_planners_of_one_attempt_only_one_wins(ledger_table):
    """The watch's resubmission and an on-call engineer's forced one both saw attempt 1: exactly one plans attempt 2."""
    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-3", "score"), 1)
    start_attempt(model, StepRef("p", "run-3", "score"), 2, follows=Succession(after=1))
    _finish(ledger_table, "run-3", "a", attempt=2)  # attempt 2's job finishes a file
    with pytest.raises(StaleAttemptError):  # the watch task, planning the attempt after the one it watched
        start_attempt(model, StepRef("p", "run-3", "score"), 2)
    statuses = {f.input_key: (f.status, int(f.attempt)) for f in read_step(model, StepRef("p", "run-3", "score")).files}
    assert statuses == {"s3://raw/a": ("SUCCEEDED", 2)}  # the loser reset nothing
    assert read_step(model, StepRef("p", "run-3", "score")).step.status == "PLANNED"


def test_fencing_planners_racing_at_once_over_http_exactly_one_wins_each_time(ledger_table):
    """The same race with the planners' requests in flight together, as DynamoDB serves them: of four
    planners that all saw attempt 1, exactly one plans attempt 2, every time. (moto checked a condition
    and applied the update unlocked, so two could win; the embedded endpoint serves one request at a time.)"""
    import threading

    model = bind_ledger(ledger_table)
    plan_file = "s3://b/_shardline/manifests/p/{run}/score/attempt-0002.{n}.files.json.gz"
    for round_no in range(25):
        run = f"race-{round_no}"
        start_attempt(model, StepRef("p", run, "score"), 1, plan_file=f"s3://b/{run}/attempt-0001.files.json.gz")
        start, wins = threading.Barrier(4), []

        def plan(n: int, run: str = run, start: threading.Barrier = start, wins: list = wins) -> None:
            start.wait()
            try:
                start_attempt(
                    model,
                    StepRef("p", run, "score"),
                    2,
                    [(f"s3://raw/{n}", 1)],
                    follows=Succession(after=1),
                    plan_file=plan_file.format(run=run, n=n),
                )
                wins.append(n)
            except StaleAttemptError:
                pass

        racers = [threading.Thread(target=plan, args=(n,)) for n in range(4)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        assert len(wins) == 1, f"round {round_no}: {len(wins)} planners won attempt 2"
        (winner,) = wins
        recorded = read_step(model, StepRef("p", run, "score")).step
        assert recorded.plan_files[2] == plan_file.format(run=run, n=winner)
        assert {f.input_key for f in read_step(model, StepRef("p", run, "score")).files} == {f"s3://raw/{winner}"}


def test_fencing_a_late_replan_never_resets_a_file_the_attempt_finished(ledger_table):
    """A planner retry that takes up its never-submitted attempt writes no FILE item, so it resets nothing."""
    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-4", "score"), 1)
    first = read_step(model, StepRef("p", "run-4", "score")).step.started_at
    _finish(ledger_table, "run-4", "a", attempt=1)
    continue_attempt(model, StepRef("p", "run-4", "score"), 1)
    records = read_step(model, StepRef("p", "run-4", "score"))
    assert {f.input_key: f.status for f in records.files} == {"s3://raw/a": "SUCCEEDED"}
    assert records.step.started_at > first  # what tells readers the attempt's plan file may have changed
    start_attempt(model, StepRef("p", "run-4", "score"), 2)
    with pytest.raises(StaleAttemptError, match="no longer a planned attempt 1"):
        continue_attempt(model, StepRef("p", "run-4", "score"), 1)


def test_fencing_cancel_is_conditional_on_the_attempt_seen(ledger_table):
    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-5", "score"), 1)
    start_attempt(model, StepRef("p", "run-5", "score"), 2)
    assert not cancel_step(model, StepRef("p", "run-5", "score"), 1, "stale view")  # someone resubmitted meanwhile
    assert cancel_step(model, StepRef("p", "run-5", "score"), 2, "wrong model")
    step = read_step(model, StepRef("p", "run-5", "score")).step
    assert (step.status, step.message) == ("CANCELLED", "wrong model")
    assert not cancel_step(model, StepRef("p", "run-5", "score"), 2, "again")  # already ended: left as it is
    with pytest.raises(StaleAttemptError):  # and the watch task cannot reopen it
        start_attempt(model, StepRef("p", "run-5", "score"), 3)
    start_attempt(model, StepRef("p", "run-5", "score"), 3, follows=Succession(reopen_cancelled=True))  # on-call may


def _finish(ledger_table: str, run_id: str, name: str, attempt: int) -> None:
    worker = WorkerLedger(
        LedgerContext(
            table=ledger_table, pipeline="p", run_id=run_id, step="score", attempt=attempt, input_uri="s3://raw/"
        ),
        f"algo-{attempt}",
    )
    worker.claim_file(name)
    worker.finish_file(name, FinishedFile(FileStatus.SUCCEEDED, rows_in=1, rows_out=1))


def test_put_items_is_idempotent_and_the_same_whatever_the_threads(ledger_table):
    from shardline.ledger.step_writes import put_items

    model = bind_ledger(ledger_table)
    items = [
        model(
            f"RUN#p#run-{threads}", f"FILE#score#k{i:03d}", status="PENDING", attempt=1, input_key=f"k{i:03d}"
        ).serialize()
        for threads in (1, 8)
        for i in range(60)
    ]
    put_items(model, items[:60], threads=1)
    put_items(model, items[60:], threads=8)
    put_items(model, items[60:], threads=8)  # sent again: the same items, not more of them

    def stored(run: str) -> list[dict]:
        return [{k: v for k, v in f.serialize().items() if k != "pk"} for f in model.query(run)]

    assert stored("RUN#p#run-1") == stored("RUN#p#run-8")
    assert len(stored("RUN#p#run-8")) == 60


class _Throttling:
    """BatchWriteItem as a throttled table answers: the last ``keep`` items of each call are left unprocessed,
    ``times`` times; records what each call processed."""

    def __init__(self, keep: int, times: int):
        self.keep, self.times, self.processed, self.calls = keep, times, [], 0

    def __call__(self, batch: list[dict]) -> list[dict]:
        self.calls += 1
        cut = len(batch) - self.keep if self.calls <= self.times else len(batch)
        self.processed.extend(batch[:cut])
        return batch[cut:]


def test_unprocessed_items_are_sent_again_after_a_growing_jittered_backoff():
    from shardline.ledger.step_writes import BACKOFF_SECONDS, write_batch

    send, slept = _Throttling(keep=3, times=2), []
    batch = [{"sk": {"S": f"k{i}"}} for i in range(25)]
    assert write_batch(send, batch, sleep=slept.append, jitter=lambda: 0.5) == 3
    assert send.processed == batch  # each item written once, none lost
    assert slept == [0.5 * BACKOFF_SECONDS * 2, 0.5 * BACKOFF_SECONDS * 4]


def test_a_table_that_keeps_throttling_fails_the_write_and_says_what_to_do():
    from shardline.ledger.step_writes import (
        BACKOFF_CAP_SECONDS,
        BATCH_TRIES,
        LedgerThrottledError,
        backoff_seconds,
        write_batch,
    )

    send, slept = _Throttling(keep=25, times=10**6), []
    with pytest.raises(LedgerThrottledError, match=r"25 ledger item\(s\) still unprocessed after 10 .*Retry the task"):
        write_batch(send, [{"sk": {"S": f"k{i}"}} for i in range(25)], sleep=slept.append, jitter=lambda: 1.0)
    assert send.calls == BATCH_TRIES and len(slept) == BATCH_TRIES - 1
    assert max(slept) == BACKOFF_CAP_SECONDS == backoff_seconds(30, 1.0)
    assert backoff_seconds(1, 0.0) == 0.0  # full jitter: anywhere from nothing to the cap


def test_a_late_failure_callback_ends_only_the_airflow_life_it_is_for(ledger_table):
    """Airflow runs a DAG's failure callback some time after the run failed. If on-call took the run up again in
    between (a resubmission, however close to the failure, or a rerun's plan in a later life), the callback ends
    nothing: neither FAILED over the reopened run nor its holds released. Lives (the DAG run's clear_number) decide,
    never clocks. A callback for a life nobody took up again marks the run failed, keeping a failed step's message."""
    from shardline.ledger.keys import RUN_SK, run_pk
    from shardline.ledger.states import StepStatus
    from shardline.ledger.step_writes import end_life, note_life, set_run_status

    model = bind_ledger(ledger_table)

    def run(run_id: str):
        return model.Control.get(run_pk("p", run_id), RUN_SK, consistent_read=True)

    # Failed in life 0; the page's Resubmit lands before the callback: the callback is late, whenever it runs.
    ensure_run(model, "p", "run-resubmitted")
    set_run_status(model, "p", "run-resubmitted", StepStatus.RUNNING, life=0)
    set_run_status(model, "p", "run-resubmitted", StepStatus.FAILED, "step score failed: 2 files")
    set_run_status(model, "p", "run-resubmitted", StepStatus.RUNNING, taken_up=True)  # on-call's resubmission
    assert not end_life(model, "p", "run-resubmitted", 0, "DAG run failed")
    assert run("run-resubmitted").status == "RUNNING"
    note_life(model, "p", "run-resubmitted", 1)  # the cleared watch task starts in life 1
    note_life(model, "p", "run-resubmitted", 0)  # never lowered
    assert not end_life(model, "p", "run-resubmitted", 0, "DAG run failed")
    # That life fails too: its own callback applies, once.
    assert end_life(model, "p", "run-resubmitted", 1, "DAG run failed")
    assert (run("run-resubmitted").status, run("run-resubmitted").ended_life) == ("FAILED", 1)
    assert not end_life(model, "p", "run-resubmitted", 1, "DAG run failed")

    # Nobody took it up again: the callback ends it, and a failed step's message stays what the run says.
    ensure_run(model, "p", "run-failed")
    set_run_status(model, "p", "run-failed", StepStatus.RUNNING, life=0)
    set_run_status(model, "p", "run-failed", StepStatus.FAILED, "step score failed: 2 files")
    assert end_life(model, "p", "run-failed", 0, "DAG run failed")
    assert (run("run-failed").status, run("run-failed").message) == ("FAILED", "step score failed: 2 files")
    ensure_run(model, "p", "run-waiting")
    set_run_status(model, "p", "run-waiting", StepStatus.RUNNING, life=0)
    assert end_life(model, "p", "run-waiting", 0, "DAG run failed: the plan task timed out")
    assert run("run-waiting").message == "DAG run failed: the plan task timed out"

    # A run that failed before it had a RUN item, rerun: the rerun's plan (life 1) creates it; the late callback
    # of life 0 leaves it alone. A cancelled or succeeded run is never ended by a callback.
    ensure_run(model, "p", "run-created-by-its-rerun")
    set_run_status(model, "p", "run-created-by-its-rerun", StepStatus.RUNNING, life=1)
    assert not end_life(model, "p", "run-created-by-its-rerun", 0, "DAG run failed")
    assert run("run-created-by-its-rerun").status == "RUNNING"
    for status in (StepStatus.CANCELLED, StepStatus.SUCCEEDED):
        ensure_run(model, "p", f"run-{status.value}")
        set_run_status(model, "p", f"run-{status.value}", status, "ended")
        assert not end_life(model, "p", f"run-{status.value}", 0, "DAG run failed")
        assert run(f"run-{status.value}").status == status.value


def test_a_wait_is_recorded_on_its_step_and_run_and_a_next_attempt_clears_both(ledger_table):
    """A waiting attempt's wait is on its STEP and RUN items; once the step moves on (an on-call resubmission
    plans the next attempt), neither says the old attempt's wait any more, and the old attempt may not write one."""
    from shardline.ledger.keys import RUN_SK, run_pk, step_sk
    from shardline.ledger.records import RunRecord, StepRecord
    from shardline.ledger.step_writes import note_step

    model = bind_ledger(ledger_table)
    ref = StepRef("p", "run-wait", "score")
    ensure_run(model, "p", "run-wait")
    start_attempt(model, ref, 1, [])
    assert note_step(model, ref, 1, '{"job_name": "j-1"}')

    def items():
        control = model.Control
        run = RunRecord.of(control.get(run_pk("p", "run-wait"), RUN_SK, consistent_read=True))
        step = StepRecord.of(control.get(run_pk("p", "run-wait"), step_sk("score"), consistent_read=True))
        return run, step

    run, step = items()
    assert (run.waiting, run.waiting_step, step.waiting) == ('{"job_name": "j-1"}', "score", '{"job_name": "j-1"}')
    start_attempt(model, ref, 2, [("k", 1)], follows=Succession(after=1))
    run, step = items()
    assert (run.waiting, run.waiting_step, step.waiting) == (None, None, None)
    assert not note_step(model, ref, 1, '{"job_name": "j-1"}')  # attempt 1 no longer owns the step
    assert items()[0].waiting is None


def test_a_fenced_write_refused_for_a_step_record_that_is_gone_says_so_and_is_never_read_as_a_newer_attempt(
    ledger_table,
):
    """finish_step's False means "a newer attempt or a cancel stands"; a missing STEP item (the endpoint's state lost)
    is an error that names it, as is a next attempt planned after one the ledger never heard of."""
    from shardline.errors import LedgerRecordMissing
    from shardline.ledger.states import StepStatus
    from shardline.ledger.step_writes import finish_step

    model = bind_ledger(ledger_table)
    gone = StepRef("p", "run-gone", "score")
    with pytest.raises(LedgerRecordMissing, match="the ledger has no record of step score of run run-gone"):
        finish_step(model, gone, 1, StepStatus.SUCCEEDED, "all 4 files succeeded")
    with pytest.raises(LedgerRecordMissing, match="shardline rerun p/run-gone"):
        start_attempt(model, gone, 2, follows=Succession(after=1))
    assert read_step(model, gone, files=False).step is None  # and nothing was made up in its place

    moved = StepRef("p", "run-moved", "score")
    start_attempt(model, moved, 1)
    start_attempt(model, moved, 2, [("s3://raw/in/a.parquet", 1)])
    assert finish_step(model, moved, 1, StepStatus.SUCCEEDED) is False  # a newer attempt stands
    with pytest.raises(StaleAttemptError):
        start_attempt(model, moved, 2, follows=Succession(after=1))


def test_a_step_outcome_is_fenced_on_its_attempt(ledger_table):
    model = bind_ledger(ledger_table)
    start_attempt(model, StepRef("p", "run-9", "score"), 1, [("s3://b/in/a", 1)])
    start_attempt(model, StepRef("p", "run-9", "score"), 2, [("s3://b/in/a", 1)])  # someone resubmitted
    assert not finish_step(model, StepRef("p", "run-9", "score"), 1, StepStatus.FAILED, "old news")
    assert read_step(model, StepRef("p", "run-9", "score")).step.status == StepStatus.PLANNED
    assert finish_step(model, StepRef("p", "run-9", "score"), 2, StepStatus.SUCCEEDED)
    assert read_step(model, StepRef("p", "run-9", "score")).step.status == StepStatus.SUCCEEDED
