"""Ledger writes off the hot path: one background thread, in order, fenced.

The scheduler must never wait on DynamoDB, so it queues writes here. If a write is
rejected because a newer attempt owns the step, :attr:`fenced` is set and the
scheduler stops the job.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from shardline.ledger.context import StaleAttemptError

log = logging.getLogger(__name__)

_STOP = object()
# While the endpoint fails (paused, throttled, unreachable), writes are tried again for this
# long, on top of the client's own retries: every write is idempotent. The budget is for the
# outage, not for each write: once the endpoint has failed for this long, each queued write is
# tried once and dropped, so a long outage ends the job in one budget, not one per queued write.
# A dropped write leaves its file unfinished in the ledger, so the watch task retries it; nothing
# is marked wrongly. Pipelines set it to the step's heartbeat timeout: past that the watch task
# has given up on this instance anyway.
RETRY_BUDGET_SECONDS = 120.0


class LedgerPump:
    def __init__(
        self,
        name: str = "ledger",
        retry_budget_seconds: float = RETRY_BUDGET_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.retry_budget_seconds = retry_budget_seconds
        self._clock, self._sleep = clock, sleep
        self._failing_since: float | None = None  # when the current outage began; None while writes land
        self._queue: queue.Queue = queue.Queue()
        self.fenced = threading.Event()
        self.fenced_reason: str | None = None
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __enter__(self) -> LedgerPump:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()  # on every way out: what was queued is flushed, within its retry budget

    @property
    def failing(self) -> bool:
        """Whether the ledger is in an outage: a write failed and none has landed since."""
        return self._failing_since is not None

    def fence(self, reason: str) -> None:
        """A newer attempt owns the step: drop every write from now on, and say why."""
        if not self.fenced.is_set():
            self.fenced_reason = reason
            self.fenced.set()
            log.error("fenced: %s", reason)

    def put(self, write: Callable[[], None], what: str) -> None:
        if not self.fenced.is_set():
            self._queue.put((write, what))

    def close(self, timeout: float | None = None) -> None:
        """Flush every queued write (each within its retry budget), then stop the thread."""
        self._queue.put(_STOP)
        timeout = self.retry_budget_seconds + 60 if timeout is None else timeout
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("ledger writes still pending after %.0fs; the watch task will see stale records", timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            write, what = item
            if not self.fenced.is_set():
                self._write(write, what)

    def _write(self, write: Callable[[], None], what: str) -> None:
        delay = 1.0
        while True:
            try:
                write()
                self._failing_since = None
                return
            except StaleAttemptError as err:
                self.fence(str(err))
                return
            except Exception as err:  # noqa: BLE001 - a lost status write is retried by the watch task, not fatal here
                now = self._clock()
                if self._failing_since is None:
                    self._failing_since = now
                if now + delay > self._failing_since + self.retry_budget_seconds:
                    self.errors += 1
                    log.error(
                        "ledger write dropped (%s): the ledger has failed for %.0fs (budget %.0fs): %s: %s; "
                        "the file stays unfinished in the ledger and the watch task retries it",
                        what,
                        now - self._failing_since,
                        self.retry_budget_seconds,
                        type(err).__name__,
                        err,
                    )
                    return
                log.warning(
                    "ledger write failed (%s): %s: %s; trying again in %.0fs", what, type(err).__name__, err, delay
                )
                self._sleep(delay)
                delay = min(delay * 2, 15.0)
