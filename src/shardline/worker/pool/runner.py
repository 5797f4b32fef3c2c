"""The pool: feeds work units to worker processes and survives their crashes.

Which task runs next, and what a crash means (suspects retried alone, poison), is decided by the
pure :class:`~shardline.worker.pool.scheduler.Scheduler`; the :class:`Runner` does what it says with a
process pool, and keeps each file's result:

- At most ``workers x inflight_per_worker`` units are in flight; more are submitted as
  each completes (pull-based backpressure).
- When a worker dies (SIGKILL, OOM), the pool is rebuilt and every unit that was in
  flight becomes a suspect. Suspects are retried one at a time, so the next crash is
  attributable; a unit that kills its worker ``max_crashes`` times is FAILED as poison
  and the other files go on.
- Split files are merged by a pool task once all their parts succeed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing as mp
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from shardline import contract
from shardline.contract import rows_allowed
from shardline.errors import HostSetupError, PoisonFileError, RowCountMismatch, SetupError, TooManyRejectsError
from shardline.ledger.states import FileStatus, ShardStatus
from shardline.report.profile import Profile
from shardline.worker.io.rejects import Reject, RejectLog
from shardline.worker.io.work_units import WorkUnit
from shardline.worker.model.features import FROM_FILE_ORDER
from shardline.worker.pool import forkserver, process
from shardline.worker.pool.devices import WorkerSlot
from shardline.worker.pool.process import JobSettings, UnitResult
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
    Task,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class FileResult:
    """What became of one input file, as the manifest and the ledger record it."""

    input: str
    status: FileStatus = FileStatus.PENDING
    output: str | None = None  # relative to the output dir
    rows_in: int = 0
    rows_out: int = 0
    rows_rejected: int = 0  # rows in = rows out + rows rejected (tolerance.rows)
    rejects_file: str | None = None  # where its rejects are listed, relative to the output dir
    model_warnings: int = 0  # lines the model code said that may signal a problem
    bytes_in: int = 0
    bytes_out: int = 0
    sha256: str | None = None
    seconds: float = 0.0
    tries: int = 0
    crashes: int = 0
    error_class: str | None = None
    error_message: str | None = None
    workers: list[str] = dataclasses.field(default_factory=list)
    # Its columns' profile (report/profile.py's dict): the step's checks and the run report read it from the
    # manifest, without reading the outputs or inputs again.
    profile: dict | None = None
    rejects: list[Reject] = dataclasses.field(default_factory=list, repr=False)

    def add_profile(self, part: dict | None) -> None:
        """Merge one unit's profile into the file's (a split file has one per part)."""
        if part is None:
            return
        if self.profile is None:
            self.profile = part
            return
        merged = Profile.from_dict(self.profile).merge(Profile.from_dict(part))
        merged.files = 1  # the parts of one file
        self.profile = merged.to_dict()

    def finished_file(self, output_key: str | None, rejects_key: str | None = None):
        """What the ledger records of this file: every figure both records share, by name, where its output
        went (``output_key``, the S3 key the instance's output dir maps to) and its rejects list."""
        from shardline.ledger.job_writes import FinishedFile  # pynamodb loads only when a ledger is configured

        shared = {f.name for f in dataclasses.fields(FinishedFile)} & {f.name for f in dataclasses.fields(self)}
        return FinishedFile(
            **{name: getattr(self, name) for name in shared}, output_key=output_key, rejects_key=rejects_key
        )


def rejects_path(input_relative: str) -> str:
    """Where a file's rejects are listed, relative to the output dir (and, uploaded, to its instance's manifest
    folder): one JSON object per rejected row."""
    return f"{contract.METADATA_FOLDER}/rejects/{input_relative}.jsonl"


def write_rejects(output_dir: Path, input_relative: str, rejects: list[Reject]) -> str:
    relative = rejects_path(input_relative)
    path = output_dir / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(r.to_json() + "\n" for r in rejects).encode())
    return relative


class Stopped(Exception):
    """The job was told to stop, for example because a newer attempt fenced it out."""


class Terminated(Exception):
    """SIGTERM arrived (SageMaker's StopProcessingJob, or the local backend's stop): the job's command line turns the
    signal into this, so the pool is stopped and temp files are swept."""


class Hooks:
    """Callbacks the scheduler fires on state changes (the ledger listens here).

    The job holds its hooks as a context manager around the run: these do nothing, and
    ``LedgerHooks`` flushes its writes on the way out and withdraws what the ledger refused.
    """

    fenced = False  # a newer attempt owns the step (only a ledger can say so)

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *_exc) -> None:
        return None

    def file_started(self, file_result: FileResult) -> None: ...

    def file_finished(self, file_result: FileResult) -> None: ...

    def drain(self) -> None:
        """Wait until every finished file's end is settled (a ledger's hooks: its output uploaded, or failed)."""

    def beat(self, status: ShardStatus) -> None:
        """The instance's own status (running, or how it ended)."""

    def poll(self) -> str | None:
        """Called about twice a second; return a reason to stop the job, or None."""
        return None

    def withdrawn_outputs(self) -> list[str] | None:
        """Outputs deleted because the ledger never accepted their success (None: no ledger)."""
        return None


@dataclasses.dataclass(frozen=True)
class PoolOptions:
    """How the pool runs, as the worker's command line sets it: tasks in flight per worker, the crashes a unit
    may cause before it is poison, how often progress is logged, and how workers start."""

    inflight_per_worker: int = 2
    max_crashes: int = 2
    progress_interval: float = 5.0
    start_method: str = "auto"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PoolOptions:
        return cls(args.inflight_per_worker, args.max_worker_crashes, args.progress_interval, args.start_method)


class Runner:
    def __init__(
        self,
        settings: JobSettings,
        slots: list[WorkerSlot],
        options: PoolOptions = PoolOptions(),
        *,
        hooks: Hooks | None = None,
        log_prefix: str = "",
    ):
        self.settings = settings
        self.slots = slots
        self.max_inflight = max(1, len(slots) * options.inflight_per_worker)
        self.max_crashes = options.max_crashes
        self.progress_interval = options.progress_interval
        start_method = options.start_method
        self.hooks = hooks or Hooks()
        self.prefix = log_prefix
        # Never a plain fork of this process: its threads (the ledger pump, the pool's own) and any
        # CUDA state must not leak into a worker. GPU workers spawn a clean interpreter each (CUDA
        # must start after CUDA_VISIBLE_DEVICES is set). CPU workers fork from a forkserver, a clean
        # single-threaded process that imports the model's library and loads the model once, before
        # the first fork (worker/pool/preload.py): a pool, and each rebuild of it, starts in milliseconds
        # instead of a second per worker. The command line starts that forkserver first thing
        # (worker/pool/forkserver.py); here it is handed the verified model, or started with the pool.
        uses_gpu = any(slot.gpu is not None for slot in slots)
        if start_method == "auto":
            start_method = "spawn" if uses_gpu or "forkserver" not in mp.get_all_start_methods() else "forkserver"
        elif start_method == "forkserver" and uses_gpu:
            raise SetupError(
                "--start-method forkserver is for CPU workers: GPU workers spawn, so that CUDA starts "
                "after CUDA_VISIBLE_DEVICES is set; use --start-method auto"
            )
        self._ctx = mp.get_context(start_method)
        if self._ctx.get_start_method() == "forkserver":
            forkserver.hand_over(settings.artifact, settings.probabilities)
        self._pool: ProcessPoolExecutor | None = None
        self._warm_ups: list[Future] = []
        self._starter: threading.Thread | None = None
        self._start_error: Exception | None = None
        self.rows_done = self._ctx.Value("q", 0)
        self.pool_starts = 0
        self._first_pool_created = 0.0
        self._first_pool_ready: dict[str, float] = {}
        self._first_pool_timing: dict[str, process.WorkerTiming] = {}  # the latest report of each worker
        self.feature_choices: dict = {}  # FeatureChoice -> files that used it; each new one is logged once
        self._scheduler = Scheduler(self.max_inflight, self.max_crashes)  # run() sets up each run's own

    # -- public -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the pool's workers now, so they load the model while the caller still prepares the files.

        With a forkserver, starting a worker waits until the forkserver has imported the library and
        loaded the model, so the workers are started from a thread and this returns at once.
        """
        if self._pool is not None:
            return
        self._pool = self._new_pool()
        if self._ctx.get_start_method() == "forkserver":
            self._starter = threading.Thread(target=self._submit_warm_ups, name="pool-start", daemon=True)
            self._starter.start()
        else:
            self._submit_warm_ups()

    def _submit_warm_ups(self) -> None:
        try:
            self._warm_ups = [self._pool.submit(process.warm_up) for _ in self.slots]
        except Exception as err:  # noqa: BLE001 - a pool that cannot start: run() finds out and says so
            self._start_error = err

    def _await_start(self) -> None:
        """Wait for :meth:`start`'s thread; a pool that could not start its workers fails here."""
        if self._starter is not None:
            self._starter.join()
            self._starter = None
        if self._start_error is not None:
            raise HostSetupError(
                f"the worker pool could not start: {type(self._start_error).__name__}: {self._start_error}"
            )

    def close(self) -> None:
        """Stop a pool that :meth:`start` started and :meth:`run` never used (nothing to do after all)."""
        if self._pool is not None:
            if self._starter is not None:
                self._starter.join()
                self._starter = None
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(self, units: list[WorkUnit], total_rows: int | None = None) -> list[FileResult]:
        files = {u.file.relative_path: u.file for u in units}
        file_results = {rel: FileResult(rel, bytes_in=f.size) for rel, f in files.items()}
        scheduler = Scheduler.for_units(units, max_inflight=self.max_inflight, max_crashes=self.max_crashes)
        self._scheduler = scheduler
        in_flight: dict[Future, Task] = {}
        self._started = time.monotonic()
        self._last_progress = self._started
        self._total_bytes = sum(f.size for f in files.values())
        self._total_rows = total_rows
        self.start()
        self._await_start()
        pool, self._pool = self._pool, None
        try:
            while scheduler.busy:
                self._check_warm_ups()
                stop_reason = self.hooks.poll()
                if stop_reason:
                    raise Stopped(stop_reason)
                for action in scheduler.handle(RoomToStart()):
                    in_flight[self._submit(pool, action.task, file_results)] = action.task
                done, _ = wait(list(in_flight), timeout=0.5, return_when=FIRST_COMPLETED)
                broken: list[Task] = []
                for future in done:
                    task = in_flight.pop(future)
                    if not self._collect(future, task, file_results):
                        broken.append(task)
                if broken:
                    pool.shutdown(wait=True, cancel_futures=True)
                    # Units still in flight died with the pool, unless their result made it out first.
                    broken += [
                        task for future, task in in_flight.items() if not self._collect(future, task, file_results)
                    ]
                    in_flight.clear()
                    for action in scheduler.handle(Crashed(tuple(broken))):
                        self._on_crash(action, file_results)
                    pool = self._new_pool()
                self._maybe_log_progress(file_results)
        except BaseException:
            self._kill(pool)
            raise
        finally:
            self._warm_ups.clear()
            pool.shutdown(wait=True, cancel_futures=True)
        return [file_results[rel] for rel in sorted(file_results)]

    def _submit(self, pool: ProcessPoolExecutor, task: Task, file_results: dict[str, FileResult]) -> Future:
        """Hand a task the scheduler started to the pool; a unit's file is RUNNING from its first try."""
        if isinstance(task, Merge):
            return pool.submit(
                process.merge_file,
                task.file,
                list(task.parts),
                self.settings.output_format,
                self.settings.output_dir,
                self.settings.output_tag,
            )
        file_result = file_results[task.file.relative_path]
        if file_result.status is FileStatus.PENDING:
            file_result.status = FileStatus.RUNNING
            self.hooks.file_started(file_result)
        file_result.tries += 1
        return pool.submit(process.run_unit, task)

    # -- internals --------------------------------------------------------------------

    @property
    def startup_seconds(self) -> float | None:
        """Pool start plus model load: until every worker of the first pool that reported was ready."""
        if not self._first_pool_ready:
            return None
        return max(self._first_pool_ready.values()) - self._first_pool_created

    def _check_warm_ups(self) -> None:
        """Record the workers that came up; a worker that could not load the model stops the job now."""
        for future in [f for f in self._warm_ups if f.done()]:
            self._warm_ups.remove(future)
            if future.cancelled() or future.exception() is not None:
                continue  # its worker died: the pool's next task finds out, and the crash logic takes over
            result = future.result()
            self._first_pool_ready.setdefault(result.worker, result.ready_at)
            self._first_pool_timing.setdefault(result.worker, result.timing)
            if result.fatal:
                raise SetupError(f"a worker could not load the model: {result.error_message}")

    def startup_breakdown(self, launched_at: float) -> dict | None:
        """Where the first pool's start-up went; None when no worker reported.

        Each ``*_s`` stage is when it ended, in seconds from the process's launch (the slowest worker
        for each), because the stages overlap: a forkserver started early imports while the main
        process still prepares. ``library_import_s`` and ``model_load_s`` are how long those took.
        """
        timings = list(self._first_pool_timing.values())
        if not timings:
            return None
        first = [t.first_prediction_at for t in timings if t.first_prediction_at]
        ready_at = max(t.ready_at for t in timings)
        return {
            "start_method": self._ctx.get_start_method(),
            "model_preloaded": all(t.preloaded for t in timings),
            "forkserver_started_early": self._ctx.get_start_method() == "forkserver" and forkserver.started_early(),
            "pool_created_at": round(self._first_pool_created, 3),
            "workers_ready_at": round(ready_at, 3),
            "first_prediction_at": round(min(first), 3) if first else None,
            "main_s": round(self._first_pool_created - launched_at, 3),  # the main process reached the pool
            # our code began where the model loads: the forkserver, or each spawned worker's interpreter
            "loader_started_s": round(max(t.started_at for t in timings) - launched_at, 3),
            "library_imported_s": round(max(t.imported_at for t in timings) - launched_at, 3),
            "model_loaded_s": round(max(t.loaded_at for t in timings) - launched_at, 3),
            "workers_ready_s": round(ready_at - launched_at, 3),
            "first_prediction_s": round(min(first) - launched_at, 3) if first else None,
            "library_import_s": round(max(t.imported_at - t.started_at for t in timings), 3),
            "model_load_s": round(max(t.loaded_at - max(t.imported_at, t.handed_over_at) for t in timings), 3),
            "threads_in_use": max(t.threads_in_use for t in timings),
            "forkserver_threads_started": max(t.forkserver_threads_started for t in timings),
            "forkserver_threads": max((t.forkserver_threads for t in timings if t.preloaded), default=None),
        }

    def _new_pool(self) -> ProcessPoolExecutor:
        slot_queue = self._ctx.Queue()
        for slot in self.slots:
            slot_queue.put(slot)
        self.pool_starts += 1
        if self.pool_starts == 1:
            self._first_pool_created = time.time()
        return ProcessPoolExecutor(
            max_workers=len(self.slots),
            mp_context=self._ctx,
            initializer=process.init_worker,
            initargs=(self.settings, slot_queue, self.rows_done),
        )

    @staticmethod
    def _kill(pool: ProcessPoolExecutor) -> None:
        for child in mp.active_children():
            child.terminate()
        pool.shutdown(wait=False, cancel_futures=True)

    def _collect(self, future: Future, task: Task, file_results: dict[str, FileResult]) -> bool:
        """Handle a finished future; True if it produced a result, False if its worker died."""
        error = future.exception() if future.done() else BrokenProcessPool("worker died")
        if isinstance(error, (BrokenProcessPool, CancelledError)):
            return False
        if error is not None:  # a bug in our own code, not a file's fault
            raise error
        self._on_result(future.result(), task, file_results)
        self._scheduler.handle(Finished(task))
        return True

    def _on_result(self, result: UnitResult, task: Task, file_results: dict[str, FileResult]) -> None:
        if self.pool_starts == 1 and result.ready_at:
            self._first_pool_ready.setdefault(result.worker, result.ready_at)
            if result.timing is not None:
                self._first_pool_timing[result.worker] = result.timing
        if result.fatal:
            raise SetupError(f"a worker could not load the model: {result.error_message}")
        rel = task.file.relative_path
        file_result = file_results[rel]
        file_result.seconds += result.seconds
        if result.features is not None:
            if result.features not in self.feature_choices:
                # The file's own column order decided: said as a warning, as nothing vouches for it.
                level = logging.WARNING if result.features.source == FROM_FILE_ORDER else logging.INFO
                log.log(level, "%s%s: the model gets %s", self.prefix, rel, result.features.describe())
                self.feature_choices[result.features] = 0
            self.feature_choices[result.features] += 1
        if result.worker and result.worker not in file_result.workers:
            file_result.workers.append(result.worker)
        if isinstance(task, Merge):
            if result.ok:
                self._finish(file_result, output=result.output, sha256=result.sha256, bytes_out=result.bytes_out)
            else:
                self._fail(file_result, result.error_class, result.error_message)
            return
        if file_result.status is FileStatus.FAILED:
            if result.output:  # a sibling part failed first; drop this part's temp file
                Path(result.output).unlink(missing_ok=True)
            return
        if not result.ok:
            self._fail(file_result, result.error_class, result.error_message)
            return
        file_result.rows_in += result.rows_in
        file_result.rows_out += result.rows_out
        file_result.rows_rejected += len(result.rejects)
        file_result.rejects.extend(result.rejects)
        file_result.model_warnings += result.model_warnings
        file_result.add_profile(result.profile)
        if not task.is_split:
            self._finish(file_result, output=result.output, sha256=result.sha256, bytes_out=result.bytes_out)
            return
        self._scheduler.handle(PartWritten(task, result.output))

    def _on_crash(self, action: RetryOneByOne | RetryAlone | FailAsPoison, file_results: dict[str, FileResult]) -> None:
        """Count the crash against the files that were in flight, and say what happens to them."""
        if isinstance(action, RetryOneByOne):
            log.warning(
                "%sa worker process died with %d unit(s) in flight (%s); rebuilding the pool and "
                "retrying them one at a time",
                self.prefix,
                len(action.tasks),
                ", ".join(t.label for t in action.tasks),
            )
            for task in action.tasks:
                file_results[task.file.relative_path].crashes += 1
            return
        task = action.task
        file_result = file_results[task.file.relative_path]
        file_result.crashes += 1
        if isinstance(action, RetryAlone):
            log.warning(
                "%sworker died on %s (crash %d of %d allowed); retrying it alone",
                self.prefix,
                task.label,
                action.crash,
                action.allowed,
            )
            return
        log.error("%s%s killed its worker %d times: failing it as poison", self.prefix, task.label, action.crashes)
        self._fail(
            file_result,
            PoisonFileError.__name__,
            f"the worker process died {action.crashes} times while processing {task.label} alone "
            "(killed by a signal, or out of memory); the file is skipped as poison",
        )

    def _finish(self, file_result: FileResult, *, output, sha256, bytes_out) -> None:
        file_result.status = FileStatus.SUCCEEDED
        file_result.output = Path(output).relative_to(self.settings.output_dir).as_posix()
        file_result.sha256 = sha256
        file_result.bytes_out = bytes_out
        if file_result.rows_in != file_result.rows_out + file_result.rows_rejected:
            # Never leave an output that disagrees with its input under a final name.
            (Path(self.settings.output_dir) / file_result.output).unlink(missing_ok=True)
            file_result.output = None
            rejected = f" and rejected {file_result.rows_rejected}" if file_result.rows_rejected else ""
            self._fail(
                file_result,
                RowCountMismatch.__name__,
                f"read {file_result.rows_in} rows but wrote {file_result.rows_out}{rejected}",
            )
            return
        if file_result.rejects:
            file_result.rejects.sort(key=Reject.sort_key)
            over = RejectLog(self.settings.tolerate_rows)
            over.rejects = file_result.rejects
            if over.count > rows_allowed(over.limit, file_result.rows_in):  # a split file's parts, together
                (Path(self.settings.output_dir) / file_result.output).unlink(missing_ok=True)
                file_result.output = None
                self._fail(file_result, TooManyRejectsError.__name__, over.over_limit_message())
                return
            file_result.rejects_file = write_rejects(
                Path(self.settings.output_dir), file_result.input, file_result.rejects
            )
            log.warning(
                "%s%s: %d row(s) rejected (tolerance.rows), first %s: %s; all listed in %s",
                self.prefix,
                file_result.input,
                file_result.rows_rejected,
                file_result.rejects[0].where(),
                file_result.rejects[0].reason,
                file_result.rejects_file,
            )
        self.hooks.file_finished(file_result)

    def _fail(self, file_result: FileResult, error_class: str | None, message: str | None) -> None:
        if file_result.status is FileStatus.FAILED:
            return
        file_result.status = FileStatus.FAILED
        self._scheduler.handle(FileFailed(file_result.input))
        file_result.error_class = error_class or "Error"
        file_result.error_message = message or ""
        log.error(
            "%sFAILED %s: %s: %s", self.prefix, file_result.input, file_result.error_class, file_result.error_message
        )
        self.hooks.file_finished(file_result)

    def _maybe_log_progress(self, file_results) -> None:
        now = time.monotonic()
        if now - self._last_progress < self.progress_interval:
            return
        self._last_progress = now
        log.info("%sprogress: %s", self.prefix, self.progress_line(file_results, now))

    def progress_line(self, file_results, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        done = [r for r in file_results.values() if r.status.is_terminal]
        failed = sum(1 for r in done if r.status is FileStatus.FAILED)
        rows = self.rows_done.value
        rate = rows / elapsed
        if self._total_rows:
            fraction = min(1.0, rows / self._total_rows)
        else:
            fraction = sum(r.bytes_in for r in done) / self._total_bytes if self._total_bytes else 1.0
        eta = f"{elapsed * (1 - fraction) / fraction:.0f}s" if fraction > 0 else "unknown"
        return (
            f"files {len(done)}/{len(file_results)} ({failed} failed), rows {rows:,}, "
            f"{rate:,.0f} rows/s, {fraction:.0%} done, ETA {eta}"
        )
