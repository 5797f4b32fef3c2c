"""The instance's side of the ledger during a job: file claims and ends, heartbeats, fencing, and each
output's upload before its file is recorded SUCCEEDED.

Every write goes through the background :class:`LedgerPump`, so the scheduler never waits on
DynamoDB. In a pipeline each finished output first goes to S3 (``worker/job/uploads.py``) and only then is
its FILE item marked SUCCEEDED with the output's sha256: a SUCCEEDED file is durable, whatever becomes of the
instance afterwards. ``with LedgerHooks(...) as hooks:`` around the run guarantees the end of it on every
path (success, a failed setup, fencing, SIGTERM): the uploads in flight end, queued writes are flushed, then
the local outputs whose success the ledger never accepted are deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from pathlib import Path

from shardline.contract import PROFILES_FOLDER
from shardline.errors import OutputUploadError
from shardline.ledger.context import StaleAttemptError
from shardline.ledger.states import FileStatus, ShardStatus
from shardline.worker.job.ledger_pump import LedgerPump
from shardline.worker.job.uploads import OutputUploader, Uploaded
from shardline.worker.pool.runner import FileResult, Hooks, Runner

log = logging.getLogger("shardline.worker")


class LedgerHooks(Hooks):
    """Mirrors file status and heartbeats into the ledger (``ledger`` is a ``WorkerLedger``)."""

    def __init__(
        self,
        ledger,
        *,
        files_assigned: int,
        heartbeat_interval: float,
        retry_budget_seconds: float,
        output_dir: Path,
        uploader: OutputUploader | None = None,
    ):
        self.ledger = ledger
        self.uploader = uploader  # None: outputs stay in output_dir (a worker run outside SageMaker's layout)
        self._count_lock = threading.Lock()  # upload threads count failures too
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
        # A file's claim (queued on the pump) and its uploaded output's record (written on the upload thread, see
        # _record_now) take the file's own lock, so a claim that lands late never moves a recorded file back to
        # RUNNING. Per file: the upload threads record at once, side by side, and never wait on another file's call.
        self._file_locks: dict[str, threading.Lock] = {}
        self._file_locks_guard = threading.Lock()

    def __enter__(self) -> LedgerHooks:
        self.pump = LedgerPump(retry_budget_seconds=self.retry_budget_seconds).__enter__()
        if self.uploader:
            self.uploader.stopped = self.pump.fenced  # once fenced, nothing more goes up
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.drain()  # every upload in flight ends and queues its file's record
        finally:
            self.pump.__exit__(*exc)  # flush what finished, on every way out (an error, SIGTERM, fencing)
            self.withdraw_uncommitted()

    @property
    def fenced(self) -> bool:
        return self.pump is not None and self.pump.fenced.is_set()

    def file_started(self, result: FileResult) -> None:
        def claim() -> None:
            with self._file_lock(result.input):
                if result.input not in self.committed:  # recorded already: its end says more than a claim would
                    self.ledger.claim_file(result.input)

        self.pump.put(claim, f"claim {result.input}")

    def file_finished(self, result: FileResult) -> None:
        with self._count_lock:
            self.done += 1
            self.failed += result.status is FileStatus.FAILED
        if result.output:
            self.outputs[result.input] = result.output
        if self.uploader and result.status is FileStatus.SUCCEEDED and result.output:
            # Recorded SUCCEEDED only once S3 has the output and its rejects list (or FAILED when either could not
            # go up): a rejected row is accounted for only where the on-call engineer can read it.
            rejects: list[str] = []

            def first() -> None:
                self._still_owned(result.input)
                if result.rejects_file:
                    rejects.append(self._put_rejects(result))
                if result.profile is not None and self.ledger.context.manifest_uri:
                    self._put_profile(result)  # a job that names no manifest folder has no step's end to read it

            self.uploader.submit(
                result.output,
                result.sha256 or "",
                lambda up, err: self._uploaded(result, up, err, rejects[0] if rejects else None),
                first=first,
            )
            return
        output_key = self.ledger.context.output_key(result.output) if result.output else None
        self._record(result, result.finished_file(output_key))

    def drain(self) -> None:
        if self.uploader:
            self.uploader.close()

    def _still_owned(self, relative_path: str) -> None:
        """Before an output goes up: a zombie (its attempt superseded) must not put it where the newer attempt's
        goes. Only a refusal stops the upload; an endpoint that does not answer does not (the file's record
        waits in the pump, and the step's end compares every object with the ledger's sha256 anyway)."""
        try:
            self.ledger.confirm_claim(relative_path)
        except StaleAttemptError as err:
            self.pump.fence(str(err))
            raise
        except Exception as err:  # noqa: BLE001 - see the docstring
            log.warning("could not confirm %s is still this attempt's before its upload: %s", relative_path, err)

    def _put_rejects(self, result: FileResult) -> str:
        """Upload a file's rejects list beside its instance's manifest; its URI. Raises when it cannot go up."""
        folder = self.ledger.context.manifest_uri
        local = self.output_dir / result.rejects_file
        if not folder:
            raise OutputUploadError(f"{result.input}: the job names no manifest folder to put its rejects list in")
        uri = f"{folder.rstrip('/')}/rejects/{result.input}.jsonl"
        try:
            self.uploader.put_bytes(uri, local.read_bytes(), content_type="application/x-ndjson")
        except Exception as err:
            raise OutputUploadError(
                f"the rejects list of {result.input} could not be uploaded to {uri}: {type(err).__name__}: {err}"
            ) from err
        with contextlib.suppress(OSError):
            local.unlink()
        return uri

    def _put_profile(self, result: FileResult) -> None:
        """Upload a file's profile beside its instance's manifest (``profiles/<input>.json``), so the step's checks
        read it even when the instance is lost before its manifest goes up. Raises when it cannot go up: a file is
        recorded SUCCEEDED only with everything its step's end reads of it."""
        uri = f"{self.ledger.context.manifest_uri.rstrip('/')}/{PROFILES_FOLDER}/{result.input}.json"
        try:
            self.uploader.put_bytes(uri, json.dumps(result.profile).encode(), content_type="application/json")
        except Exception as err:
            raise OutputUploadError(
                f"the profile of {result.input} could not be uploaded to {uri}: {type(err).__name__}: {err}"
            ) from err

    def _uploaded(
        self, result: FileResult, uploaded: Uploaded | None, error: Exception | None, rejects_key: str | None = None
    ) -> None:
        """On an upload thread: record the file's end now that its output is in S3, or that it is not."""
        if uploaded is not None:
            self._record_now(result, result.finished_file(uploaded.key, rejects_key))
            return
        if isinstance(error, StaleAttemptError) or self.fenced:
            return  # a newer attempt owns it: nothing is recorded, and its local copy is withdrawn on the way out
        with contextlib.suppress(OSError):
            (self.output_dir / result.output).unlink()  # never recorded: nothing of it stays
        self.outputs.pop(result.input, None)
        result.status, result.output = FileStatus.FAILED, None
        result.error_class, result.error_message = type(error).__name__, str(error)
        with self._count_lock:
            self.failed += 1
        log.error("FAILED %s: %s: %s", result.input, result.error_class, result.error_message)
        self._record(result, result.finished_file(None))

    def _record(self, result: FileResult, finished) -> None:
        def finish() -> None:
            self.ledger.finish_file(result.input, finished)
            self.committed.add(result.input)

        self.pump.put(finish, f"finish {result.input}")

    def _record_now(self, result: FileResult, finished) -> None:
        """Record an uploaded output's file on this (upload) thread, at once; through the pump when the ledger
        does not answer. Behind the pump's queue of claims and heartbeats its record would land seconds after the
        upload, and an instance lost in between costs every output stored but not yet recorded: each is scored
        again by the next attempt (the recovery benchmark counted 20 of 45 so)."""
        if self.fenced:
            return
        if self.pump.failing:  # an outage: each write would spend the client's retries here, one file after another
            self._record(result, finished)
            return
        try:
            with self._file_lock(result.input):
                self.ledger.finish_file(result.input, finished)
                self.committed.add(result.input)
            with self._file_locks_guard:  # a claim from now on finds it committed: no lock a file need be kept
                self._file_locks.pop(result.input, None)
        except StaleAttemptError as err:
            self.pump.fence(str(err))
        except Exception as err:  # noqa: BLE001 - an outage: the pump tries again within its budget
            log.warning(
                "recording %s failed (%s: %s); the ledger writes queue will try again",
                result.input,
                type(err).__name__,
                err,
            )
            self._record(result, finished)

    def _file_lock(self, relative_path: str) -> threading.Lock:
        with self._file_locks_guard:
            return self._file_locks.setdefault(relative_path, threading.Lock())

    def put_manifest(self, path: Path) -> str | None:
        """Upload this instance's manifest to the folder the step's plan gave it (run, step and attempt in its
        key); returns its URI, or None when there is nowhere to put it or it could not go up (it is the run
        report's source of the predictions' distribution, never what makes a file count as written)."""
        folder = self.ledger.context.manifest_uri
        if not (self.uploader and folder) or self.fenced:
            return None
        uri = f"{folder.rstrip('/')}/{path.name}"
        try:
            self.uploader.put_bytes(uri, path.read_bytes())
        except Exception as err:  # noqa: BLE001 - the files are recorded already; the report notes a missing manifest
            log.warning("the instance's manifest could not be uploaded to %s: %s: %s", uri, type(err).__name__, err)
            return None
        return uri

    def withdrawn_outputs(self) -> list[str]:
        return sorted(output for source, output in self.outputs.items() if source not in self.committed)

    def withdraw_uncommitted(self) -> int:
        """Delete the local outputs whose success the ledger never accepted.

        Their files are either owned by a newer attempt (this instance was fenced: a zombie's
        output must not replace the newer attempt's) or still unfinished in the ledger (the
        endpoint was unreachable), and the watch task retries them. One that went up already stays in S3 (its key may
        be a newer attempt's output by now); the check before ``_SUCCESS`` compares the object with the ledger's
        sha256, so it never passes for another attempt's. Returns how many local copies were withdrawn.
        """
        withdrawn = 0
        for output in self.withdrawn_outputs():
            with contextlib.suppress(OSError):  # gone already (uploaded), or not a file the worker wrote
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
        # The last heartbeat of an instance that finished goes before its manifest's upload: that PUT is counted in it.
        finished = status in (ShardStatus.SUCCEEDED, ShardStatus.PARTIAL)
        ahead = int(finished and bool(self.uploader and self.ledger.context.manifest_uri) and not self.fenced)
        self.pump.put(lambda: self.ledger.heartbeat(status, **counts, requests_ahead=ahead), "heartbeat")

    def poll(self) -> str | None:
        now = time.monotonic()
        if now >= self.next_beat:
            self.next_beat = now + self.interval
            self.beat(ShardStatus.RUNNING)
        return self.pump.fenced_reason if self.fenced else None
