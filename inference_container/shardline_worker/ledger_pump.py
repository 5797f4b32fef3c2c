"""Ledger writes off the hot path: one background thread, in order, fenced.

The scheduler must never wait on DynamoDB, so it queues writes here. If a write is
rejected because a newer attempt owns the step, :attr:`fenced` is set and the
scheduler stops the job.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from shardline_ledger.context import StaleAttemptError

log = logging.getLogger(__name__)

_STOP = object()


class LedgerPump:
    def __init__(self, name: str = "ledger"):
        self._queue: queue.Queue = queue.Queue()
        self.fenced = threading.Event()
        self.fenced_reason: str | None = None
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, write: Callable[[], None], what: str) -> None:
        if not self.fenced.is_set():
            self._queue.put((write, what))

    def close(self, timeout: float = 60.0) -> None:
        """Flush every queued write, then stop the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("ledger writes still pending after %.0fs; the sensor will see stale records", timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            write, what = item
            if self.fenced.is_set():
                continue
            try:
                write()
            except StaleAttemptError as err:
                self.fenced_reason = str(err)
                self.fenced.set()
                log.error("fenced: %s", err)
            except Exception as err:  # noqa: BLE001 - a lost status write is retried by the sensor, not fatal here
                self.errors += 1
                log.error("ledger write failed (%s): %s: %s", what, type(err).__name__, err)
