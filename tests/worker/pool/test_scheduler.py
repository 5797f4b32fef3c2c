"""scheduler.py: the pool's queue, suspects and poison as a table of (state, event) -> actions, no process.

Each row gives the scheduler's state, one event, the actions it must answer, and the state it must be in
after. test_runner.py runs the same rules with real processes and real crashes.
"""

from __future__ import annotations

from collections import deque

import pytest

from shardline.worker.io.work_units import InputFile, WorkUnit
from shardline.worker.pool.scheduler import (
    Crashed,
    FailAsPoison,
    FileFailed,
    Finished,
    Merge,
    PartWritten,
    RetryAlone,
    RetryOneByOne,
    RoomToStart,
    Scheduler,
    Start,
)


def _file(name: str) -> InputFile:
    return InputFile(name, f"/in/{name}", "parquet", False, 1 << 20)


A, B, C, D = (WorkUnit(_file(f"{name}.parquet")) for name in "abcd")
BIG = _file("big.parquet")
PART_0 = WorkUnit(BIG, part=0, parts=2, row_groups=(0,))
PART_1 = WorkUnit(BIG, part=1, parts=2, row_groups=(1,))
MERGE = Merge(BIG, ("/out/big.part-0", "/out/big.part-1"))

SEQUENCES = ("queue", "suspects")  # deques; the rest are sets and dicts as given


def _state(max_inflight: int = 2, max_crashes: int = 2, **fields) -> Scheduler:
    return Scheduler(
        max_inflight=max_inflight,
        max_crashes=max_crashes,
        **{name: deque(value) if name in SEQUENCES else value for name, value in fields.items()},
    )


ROWS = [
    # (what the row shows, state, event, actions, state after: the fields named)
    (
        "starts queued tasks up to max_inflight",
        _state(queue=[A, B, C]),
        RoomToStart(),
        [Start(A), Start(B)],
        {"queue": [C], "in_flight": {A, B}},
    ),
    (
        "starts nothing while max_inflight tasks are in flight",
        _state(queue=[C], in_flight={A, B}),
        RoomToStart(),
        [],
        {"queue": [C], "in_flight": {A, B}},
    ),
    (
        "a finished task frees its slot",
        _state(queue=[C], in_flight={A, B}),
        Finished(A),
        [],
        {"queue": [C], "in_flight": {B}},
    ),
    (
        "a free slot takes the next queued task",
        _state(queue=[C, D], in_flight={B}),
        RoomToStart(),
        [Start(C)],
        {"queue": [D], "in_flight": {B, C}},
    ),
    (
        "a part of a failed file is dropped, not started",
        _state(queue=[PART_1, C], failed_files={"big.parquet"}),
        RoomToStart(),
        [Start(C)],
        {"queue": [], "in_flight": {C}},
    ),
    (
        "a failed file's parts still queued are not started",
        _state(queue=[PART_1], in_flight={PART_0}),
        FileFailed("big.parquet"),
        [],
        {"failed_files": {"big.parquet"}, "queue": [PART_1]},
    ),
    (
        "a part written before the last: no merge yet",
        _state(queue=[C], parts_left={"big.parquet": 2}, part_outputs={"big.parquet": {}}),
        PartWritten(PART_1, "/out/big.part-1"),
        [],
        {"queue": [C], "parts_left": {"big.parquet": 1}, "part_outputs": {"big.parquet": {1: "/out/big.part-1"}}},
    ),
    (
        "the last part written queues the merge first",
        _state(queue=[C], parts_left={"big.parquet": 1}, part_outputs={"big.parquet": {1: "/out/big.part-1"}}),
        PartWritten(PART_0, "/out/big.part-0"),
        [],
        {"queue": [MERGE, C], "parts_left": {"big.parquet": 0}},
    ),
    (
        "a merge starts like any task",
        _state(queue=[MERGE, C], max_inflight=1),
        RoomToStart(),
        [Start(MERGE)],
        {"queue": [C], "in_flight": {MERGE}},
    ),
    (
        "a crash with several tasks in flight makes each a suspect, no crash counted against one",
        _state(queue=[C], in_flight={A, B}),
        Crashed((A, B)),
        [RetryOneByOne((A, B))],
        {"queue": [C], "suspects": [A, B], "suspected": {A, B}, "in_flight": set(), "crashes": {}},
    ),
    (
        "a crash of one task running among others (none suspected) is not isolated either",
        _state(queue=[C], in_flight={A}),
        Crashed((A,)),
        [RetryOneByOne((A,))],
        {"suspects": [A], "suspected": {A}, "crashes": {}},
    ),
    (
        "suspects start one at a time, before the queue",
        _state(queue=[C], suspects=[A, B], suspected={A, B}),
        RoomToStart(),
        [Start(A)],
        {"queue": [C], "suspects": [B], "in_flight": {A}},
    ),
    (
        "nothing starts beside a suspect in flight",
        _state(queue=[C], suspects=[B], suspected={A, B}, in_flight={A}),
        RoomToStart(),
        [],
        {"queue": [C], "suspects": [B], "in_flight": {A}},
    ),
    (
        "nothing starts beside the last suspect either",
        _state(queue=[C, D], suspected={B}, in_flight={B}),
        RoomToStart(),
        [],
        {"queue": [C, D], "in_flight": {B}},
    ),
    (
        "a suspect that finished is cleared",
        _state(queue=[C, D], suspected={B}, in_flight={B}),
        Finished(B),
        [],
        {"suspected": set(), "in_flight": set()},
    ),
    (
        "with no suspect left the queue runs at full width again",
        _state(queue=[C, D]),
        RoomToStart(),
        [Start(C), Start(D)],
        {"queue": [], "in_flight": {C, D}},
    ),
    (
        "a suspect dropped for its failed file does not take the slot",
        _state(queue=[C], suspects=[PART_1, B], suspected={PART_1, B}, failed_files={"big.parquet"}),
        RoomToStart(),
        [Start(B)],
        {"suspects": [], "in_flight": {B}},
    ),
    (
        "a suspect that kills its worker alone is retried alone, first",
        _state(queue=[C], suspects=[B], suspected={A, B}, in_flight={A}),
        Crashed((A,)),
        [RetryAlone(A, 1, 2)],
        {"suspects": [A, B], "suspected": {A, B}, "in_flight": set(), "crashes": {A: 1}},
    ),
    (
        "the last suspect killing its worker alone is retried alone too",
        _state(queue=[C], suspected={A}, in_flight={A}),
        Crashed((A,)),
        [RetryAlone(A, 1, 2)],
        {"suspects": [A], "crashes": {A: 1}},
    ),
    (
        "a suspect that kills its worker alone max_crashes times fails its file as poison",
        _state(queue=[C], suspects=[B], suspected={A, B}, in_flight={A}, crashes={A: 1}),
        Crashed((A,)),
        [FailAsPoison(A, 2)],
        {"suspects": [B], "crashes": {A: 2}, "failed_files": {"a.parquet"}, "in_flight": set(), "queue": [C]},
    ),
    (
        "with max_crashes 1 the first crash alone is poison",
        _state(max_crashes=1, suspected={A}, in_flight={A}),
        Crashed((A,)),
        [FailAsPoison(A, 1)],
        {"suspects": [], "failed_files": {"a.parquet"}},
    ),
    (
        "a merge that kills its worker alone is poison like a unit",
        _state(max_crashes=1, suspected={MERGE}, in_flight={MERGE}),
        Crashed((MERGE,)),
        [FailAsPoison(MERGE, 1)],
        {"failed_files": {"big.parquet"}},
    ),
]


@pytest.mark.parametrize(("state", "event", "actions", "after"), [row[1:] for row in ROWS], ids=[r[0] for r in ROWS])
def test_the_scheduler_answers_each_event_as_the_table_says(state, event, actions, after):
    assert state.handle(event) == actions
    got = {name: list(getattr(state, name)) if name in SEQUENCES else getattr(state, name) for name in after}
    assert got == after


def test_for_units_queues_every_unit_and_counts_each_files_parts():
    scheduler = Scheduler.for_units([A, PART_0, PART_1], max_inflight=4, max_crashes=2)
    assert list(scheduler.queue) == [A, PART_0, PART_1]
    assert scheduler.parts_left == {"a.parquet": 1, "big.parquet": 2}
    assert scheduler.part_outputs == {"a.parquet": {}, "big.parquet": {}}
    assert scheduler.busy


def test_a_split_file_runs_its_parts_then_its_merge_then_the_scheduler_is_idle():
    scheduler = Scheduler.for_units([PART_0, PART_1], max_inflight=4, max_crashes=2)
    assert scheduler.handle(RoomToStart()) == [Start(PART_0), Start(PART_1)]
    for part, output in ((PART_1, "/out/big.part-1"), (PART_0, "/out/big.part-0")):
        assert scheduler.handle(PartWritten(part, output)) == []
        assert scheduler.handle(Finished(part)) == []
    assert scheduler.handle(RoomToStart()) == [Start(MERGE)]
    assert scheduler.busy
    scheduler.handle(Finished(MERGE))
    assert not scheduler.busy
    assert scheduler.handle(RoomToStart()) == []


def test_a_poison_unit_among_others_is_isolated_retried_and_failed_while_the_rest_finish():
    """The runner's loop, played by hand: A kills every worker it runs in; B and C are fine."""
    scheduler = Scheduler.for_units([A, B, C], max_inflight=3, max_crashes=2)
    assert scheduler.handle(RoomToStart()) == [Start(A), Start(B), Start(C)]
    scheduler.handle(Finished(C))
    assert scheduler.handle(Crashed((A, B))) == [RetryOneByOne((A, B))]
    assert scheduler.handle(RoomToStart()) == [Start(A)]
    assert scheduler.handle(Crashed((A,))) == [RetryAlone(A, 1, 2)]
    assert scheduler.handle(RoomToStart()) == [Start(A)]
    assert scheduler.handle(Crashed((A,))) == [FailAsPoison(A, 2)]
    assert scheduler.handle(RoomToStart()) == [Start(B)]
    assert scheduler.handle(RoomToStart()) == []
    scheduler.handle(Finished(B))
    assert not scheduler.busy
