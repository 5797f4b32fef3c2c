"""The instance's side of the ledger during a job: file claims and outcomes, heartbeats, fencing.

Every write goes through the background :class:`LedgerPump`, so the scheduler never waits on
DynamoDB. ``with LedgerHooks(...) as hooks:`` around the run guarantees the end of it on every
path (success, a failed setup, fencing, SIGTERM): queued writes are flushed, then the outputs
whose success the ledger never accepted are deleted, so they are never uploaded.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from shardline.ledger.states import FileStatus, ShardStatus
from shardline.worker.job.ledger_pump import LedgerPump
from shardline.worker.pool.runner import FileReport, Hooks, Runner

log = logging.getLogger("shardline.worker")


class LedgerHooks(Hooks):
    """Mirrors file status and heartbeats into the ledger (``ledger`` is a ``WorkerLedger``)."""

    def __init__(
        self, ledger, *, files_assigned: int, heartbeat_interval: float, retry_budget_seconds: float, output_dir: Path
    ):
        self.ledger = ledger
        self.files_assigned = files_assigned
        self.interval = heartbeat_interval
        self.retry_budget_seconds = retry_budget_seconds
        self.output_dir = output_dir
        self.pump: LedgerPump | None = None
        self.runner: Runner | None = None  # set once the runner exists; its counter feeds the heartbeat
        self.done = self.failed = 0
        self.next_beat = 0.0
        # The ledger is the commit point of an output: written here, kept only once its SUCCEEDED
        # record has landed (set from the pump's thread; a set add is atomic under the GIL).
        self.outputs: dict[str, str] = {}
        self.committed: set[str] = set()

    def __enter__(self) -> LedgerHooks:
        self.pump = LedgerPump(retry_budget_seconds=self.retry_budget_seconds).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.pump.__exit__(*exc)  # flush what finished, on every way out (an error, SIGTERM, fencing)
        self.withdraw_uncommitted()

    @property
    def fenced(self) -> bool:
        return self.pump is not None and self.pump.fenced.is_set()

    def file_started(self, report: FileReport) -> None:
        self.pump.put(lambda: self.ledger.claim_file(report.input), f"claim {report.input}")

    def file_finished(self, report: FileReport) -> None:
        self.done += 1
        self.failed += report.status is FileStatus.FAILED
        outcome = report.ledger_outcome(self.ledger.context.output_key(report.output) if report.output else None)
        if report.output:
            self.outputs[report.input] = report.output

        def finish() -> None:
            self.ledger.finish_file(report.input, outcome)
            self.committed.add(report.input)

        self.pump.put(finish, f"finish {report.input}")

    def withdrawn_outputs(self) -> list[str]:
        return sorted(output for source, output in self.outputs.items() if source not in self.committed)

    def withdraw_uncommitted(self) -> int:
        """Delete the outputs whose success the ledger never accepted, so they are never uploaded.

        Their files are either owned by a newer attempt (this instance was fenced: a zombie's
        output must not replace the newer attempt's) or still unfinished in the ledger (the
        endpoint was unreachable), and the sensor retries them. Returns how many were withdrawn.
        """
        withdrawn = 0
        for output in self.withdrawn_outputs():
            with contextlib.suppress(FileNotFoundError):
                (self.output_dir / output).unlink()
                withdrawn += 1
        if withdrawn:
            log.warning(
                "withdrew %d output(s) whose success the ledger did not accept (%s); the files stay "
                "unfinished or belong to a newer attempt, which writes them",
                withdrawn,
                self.pump.fenced_reason or f"{self.pump.errors} ledger write(s) failed",
            )
        return withdrawn

    def beat(self, status: ShardStatus) -> None:
        rows = self.runner.rows_done.value if self.runner else 0
        counts = dict(
            files_assigned=self.files_assigned, files_done=self.done, files_failed=self.failed, rows_done=rows
        )
        self.pump.put(lambda: self.ledger.heartbeat(status, **counts), "heartbeat")

    def poll(self) -> str | None:
        now = time.monotonic()
        if now >= self.next_beat:
            self.next_beat = now + self.interval
            self.beat(ShardStatus.RUNNING)
        return self.pump.fenced_reason if self.fenced else None
