"""The worker's ledger pump rides out a failing endpoint within a budget, and never retries a fenced write."""

from __future__ import annotations

from shardline_ledger.context import StaleAttemptError
from shardline_worker.ledger_pump import LedgerPump


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
