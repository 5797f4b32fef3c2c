"""The worker's ledger pump rides out a failing endpoint within a budget, and never retries a fenced write."""

from __future__ import annotations

from shardline.ledger.context import StaleAttemptError
from shardline.worker.job.ledger_pump import LedgerPump


def test_a_write_that_fails_for_a_while_is_retried_until_it_lands():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("endpoint paused")

    pump = LedgerPump(retry_budget_seconds=60)
    pump.put(flaky, "finish a.parquet")
    pump.close()
    assert len(calls) == 3 and pump.errors == 0


def test_a_write_that_keeps_failing_is_dropped_after_the_budget_and_counted():
    def down():
        raise ConnectionError("connection refused")

    pump = LedgerPump(retry_budget_seconds=2)
    pump.put(down, "finish a.parquet")
    pump.close()
    assert pump.errors == 1 and not pump.fenced.is_set()


def test_a_fenced_write_is_not_retried_and_stops_later_writes():
    calls = []

    def fenced():
        calls.append("fenced")
        raise StaleAttemptError("step moved past attempt 1")

    pump = LedgerPump(retry_budget_seconds=60)
    pump.put(fenced, "claim a")
    pump.put(lambda: calls.append("later"), "claim b")
    pump.close()
    assert calls == ["fenced"] and pump.fenced.is_set() and "attempt 1" in pump.fenced_reason


class FakeClock:
    """Time that passes only when the pump sleeps, so the budget is tested without waiting for it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_long_outage_costs_one_budget_not_one_per_queued_write():
    clock = FakeClock()
    tries = []

    def down(name):
        def write():
            tries.append((name, clock.now))
            raise ConnectionError("connection refused")

        return write

    pump = LedgerPump(retry_budget_seconds=30, clock=clock, sleep=clock.sleep)
    for name in ("a", "b", "c", "heartbeat"):
        pump.put(down(name), name)
    pump.close()
    assert pump.errors == 4
    # The first write waits out the budget; the ones queued behind it are tried once each, not for 30 s more.
    assert clock.now <= 30
    assert [name for name, _ in tries if name != "a"] == ["b", "c", "heartbeat"]


def test_a_write_that_lands_ends_the_outage_so_the_next_one_gets_a_whole_budget_again():
    clock = FakeClock()
    failures = {"a": 3, "b": 100}
    tries = []

    def flaky(name):
        def write():
            tries.append(name)
            if failures[name] > 0:
                failures[name] -= 1
                raise ConnectionError("throttled")

        return write

    pump = LedgerPump(retry_budget_seconds=30, clock=clock, sleep=clock.sleep)
    pump.put(flaky("a"), "a")
    pump.put(flaky("b"), "b")
    pump.close()
    assert tries.count("a") == 4 and pump.errors == 1  # a landed on its 4th try; b was dropped
    assert tries.count("b") > 1  # b had its own budget, since a had landed


def test_an_outage_is_said_until_a_write_lands_again():
    """While the ledger fails, an upload thread sends its file's record through the pump (one retry budget for the
    outage) instead of spending the client's retries itself, file after file."""
    landed = []
    pump = LedgerPump(retry_budget_seconds=1)
    assert not pump.failing

    def down():
        raise ConnectionError("connection refused")

    pump.put(down, "finish a.parquet")
    pump.put(lambda: landed.append(pump.failing), "finish b.parquet")  # runs once a.parquet's write is dropped
    pump.close()
    assert landed == [True]  # still in the outage when the next write began
    assert not pump.failing  # that write landed: the outage is over
