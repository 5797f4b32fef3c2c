"""Auto-tune (``python -m shardline.worker --tune``): this machine's rows/s for each setting, on a sample.

The worker runs its own job repeatedly -- the real :class:`~shardline.worker.pool.runner.Runner` over the
real :class:`~shardline.worker.pool.process.JobSettings` (``worker/job/run.py``'s own :func:`job_settings`),
the real model, files and outputs -- on a fixed sample of the instance's inputs (the first files, up
to ``--tune-rows`` rows, copied once so that every run reads the same bytes), writing to a temporary
folder deleted after each run. It sweeps:

1. the split of the cores into workers x threads (every divisor split: 16 cores -> 16x1, 8x2, 4x4,
   2x8, 1x16), at the step's rows per batch;
2. for the best split, the rows per batch, doubling from 4,096 until throughput falls by more
   than the noise threshold (the rule of dynamic batching: "increase the batch size until
   throughput decreases"), or the cap;
3. on GPU workers instead, the GPU batch rows the same way (one worker per GPU, as the job runs).

A run's rate is its rows over the time from the moment every worker of the pool was ready (start-up
excluded: the Runner's start-up breakdown says when) to the moment the last output was in place.
Each setting runs ``--tune-repeat`` times; the table shows the median and the spread.

Everything that decides (the splits, the ladder, the stopping rule, the choice, the snippet) is a
pure function of ``worker/tools/tune_decisions.py``, tested without a process; the sample is
``worker/tools/tune_sample.py``, the table, text and plot ``worker/tools/tune_report.py``; :func:`run_tune` here is
the IO around them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardline.contract import EXIT_OK
from shardline.errors import SetupError
from shardline.ledger.states import FileStatus
from shardline.worker.io import formats
from shardline.worker.io.work_units import UNITS_PER_WORKER, InputFile, discover_inputs, plan_units
from shardline.worker.model.loading import ModelArtifact
from shardline.worker.pool import devices
from shardline.worker.pool.process import JobSettings
from shardline.worker.pool.runner import FileResult, Hooks, PoolOptions, Runner
from shardline.worker.tools.tune_decisions import (
    FIRST_BATCH_ROWS,
    TOLERANCE,
    Point,
    Setting,
    best_point,
    core_splits,
    doubling_sweep,
    snippet_notes,
    spec_snippet,
)
from shardline.worker.tools.tune_report import JSON_NAME, PLOT_NAME, draw_plot, machine_line, render
from shardline.worker.tools.tune_sample import Sample, take_sample

log = logging.getLogger("shardline.worker")


# --- one run --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    rows: int
    seconds: float  # from every worker ready to the last output in place (the pool's shutdown left out)
    startup_s: float  # from the run's start to every worker ready (excluded from the rate)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


class _Clock(Hooks):
    """When the last file of a run was finished (its output renamed into place), before the pool shuts down."""

    finished_at = 0.0

    def file_finished(self, report: FileResult) -> None:
        self.finished_at = time.time()


def run_once(
    args: argparse.Namespace,
    base: JobSettings,
    sample: Sample,
    setting: Setting,
    gpus: list[str],
    input_format: str | None,
) -> Run:
    """One job over the sample with ``setting``, as run_job runs it, into a temporary output folder."""
    slots = devices.plan_slots(
        cpu_count=devices.cpu_count(),
        gpus=gpus,
        model_kind=base.artifact.kind,
        workers=setting.workers,
        threads_per_worker=setting.threads,
        use_gpu=not args.no_gpu,
    )
    files, _ = discover_inputs(
        sample.folder, input_format, csv_names=args.csv_names, trust_header=args.input_csv_header == "true"
    )
    units = plan_units(
        files,
        len(slots),
        lambda f: (formats.parquet_meta(f) or (0, []))[1] if f.fmt == "parquet" and not f.gzipped else [],
    )
    with tempfile.TemporaryDirectory(prefix="shardline-tune-out-") as out:
        settings = dataclasses.replace(
            base, output_dir=out, batch_rows=setting.batch_rows, gpu_batch_rows=setting.gpu_batch_rows
        )
        clock = _Clock()
        runner = Runner(settings, slots, PoolOptions.from_args(args), hooks=clock, log_prefix="tune: ")
        started = time.time()
        reports = runner.run(units)
        ended = clock.finished_at or time.time()
    failed = [r for r in reports if r.status is not FileStatus.SUCCEEDED]
    if failed:
        raise SetupError(
            f"--tune: the sample's file {failed[0].input} failed ({failed[0].error_class}: "
            f"{failed[0].error_message}); the tune needs a sample that runs clean: run --preview "
            "to see why"
        )
    breakdown = runner.startup_breakdown(started) or {}
    ready = started
    if breakdown.get("workers_ready_at") is not None:
        ready = max(started, breakdown["workers_ready_at"])
    return Run(rows=sum(r.rows_in for r in reports), seconds=ended - ready, startup_s=ready - started)


# --- the machine ----------------------------------------------------------------------------------------


def describe_machine(gpus: list[str]) -> dict:
    """What the figures were measured on: they hold for this machine only."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass  # not Linux: platform's name stays
    memory = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    return {
        "cores": devices.cpu_count(),
        "cpu": model,
        "memory_gib": memory,
        "load_average_1m": load,
        "gpus": _gpu_names(gpus),
        "simulated_gpus": bool(os.environ.get(devices.ENV_SIMULATED_GPUS)),
        "python": platform.python_version(),
    }


def _gpu_names(gpus: list[str]) -> list[str]:
    if not gpus or os.environ.get(devices.ENV_SIMULATED_GPUS) or shutil.which("nvidia-smi") is None:
        return [f"GPU {g}" for g in gpus]
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [f"GPU {g}" for g in gpus]
    return [line.strip() for line in listing.splitlines() if line.split(",", 1)[0].strip() in gpus]


# --- the sweep ------------------------------------------------------------------------------------------


def run_tune(args: argparse.Namespace, files: list[InputFile], artifact: ModelArtifact, base: JobSettings) -> int:
    """Sample, sweep, print the table and the snippet, write the plot and the JSON; exit 0."""
    cores = devices.cpu_count()
    gpus = [] if args.no_gpu else devices.visible_gpus(os.environ, devices.detect_gpu_count())
    default_slots = devices.plan_slots(
        cpu_count=cores,
        gpus=gpus,
        model_kind=artifact.kind,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        use_gpu=not args.no_gpu,
    )
    on_gpu = any(slot.gpu is not None for slot in default_slots)
    machine = describe_machine(gpus if on_gpu else [])
    with tempfile.TemporaryDirectory(prefix="shardline-tune-sample-") as folder:
        widest = len(default_slots) if on_gpu else cores
        sample = take_sample(files, args.tune_rows, Path(folder), min_files=UNITS_PER_WORKER * widest)
        largest = max(rows for _, rows in sample.source_files)
        log.info(
            "tune: sample of %d file(s), %d rows (x%d a run), on %s",
            len(sample.source_files),
            sample.rows,
            sample.copies,
            machine_line(machine),
        )
        sweep = _Sweep(args, base, sample, gpus)
        cap = min(args.tune_max_batch_rows, largest)
        if on_gpu:
            split_points, (workers, threads) = [], (len(default_slots), default_slots[0].threads)
        else:
            split_points = sweep.splits(cores)
            top = best_point(split_points).setting
            workers, threads = top.workers, top.threads
        stopped = sweep.batch_sizes(workers, threads, cap, on_gpu=on_gpu)
    # The split sweep's point of this split (at the step's batch rows) competes too.
    candidates = [p for p in sweep.points.values() if (p.setting.workers, p.setting.threads) == (workers, threads)]
    chosen = best_point(candidates)
    candidates.sort(key=lambda p: p.setting.gpu_batch_rows if on_gpu else p.setting.batch_rows)
    result = _result(
        args, artifact, machine, sample, sweep, chosen, stopped, cores=cores, largest=largest, on_gpu=on_gpu
    )
    args.tune_out.mkdir(parents=True, exist_ok=True)
    (args.tune_out / JSON_NAME).write_text(json.dumps(result, indent=2))
    plot = draw_plot(split_points, candidates, chosen, args.tune_out / PLOT_NAME, machine, on_gpu=on_gpu)
    text = render(result, list(sweep.points.values()), chosen, on_gpu=on_gpu, plot=plot, out=args.tune_out)
    sys.stdout.write(text)
    sys.stdout.flush()
    return EXIT_OK


class _Sweep:
    """The settings measured so far: each is run ``--tune-repeat`` times, once, whichever phase asks first."""

    def __init__(self, args: argparse.Namespace, base: JobSettings, sample: Sample, gpus: list[str]):
        self.args, self.base, self.sample, self.gpus = args, base, sample, gpus
        self.repeat, self.tolerance = args.tune_repeat, TOLERANCE
        self.points: dict[Setting, Point] = {}

    def measure(self, phase: str, setting: Setting) -> Point:
        point = self.points.get(setting)
        if point is None:
            point = self.points[setting] = Point(phase, setting)
            for i in range(self.repeat):
                run = run_once(self.args, self.base, self.sample, setting, self.gpus, self.args.input_format)
                point.rates.append(run.rate)
                point.startup_s.append(run.startup_s)
                point.rows = run.rows
                log.info(
                    "tune: %s, batch %d, gpu batch %d: %.0f rows/s (run %d of %d; start-up %.2fs excluded)",
                    setting.split,
                    setting.batch_rows,
                    setting.gpu_batch_rows,
                    run.rate,
                    i + 1,
                    self.repeat,
                    run.startup_s,
                )
        return point

    def splits(self, cores: int) -> list[Point]:
        """Every split of the cores into workers x threads, at the step's batch rows."""
        args = self.args
        return [
            self.measure("split", Setting(w, t, args.batch_rows, args.gpu_batch_rows)) for w, t in core_splits(cores)
        ]

    def batch_sizes(self, workers: int, threads: int, cap: int, *, on_gpu: bool) -> str:
        """Rows per batch (GPU batch rows on GPU workers), doubling; why the doubling stopped."""
        args = self.args
        if on_gpu:
            _, stopped = doubling_sweep(
                lambda rows: self.measure("gpu batch", Setting(workers, threads, args.batch_rows, rows)).rates,
                FIRST_BATCH_ROWS,
                cap,
                self.tolerance,
            )
        else:
            _, stopped = doubling_sweep(
                lambda rows: self.measure("batch", Setting(workers, threads, rows, args.gpu_batch_rows)).rates,
                FIRST_BATCH_ROWS,
                cap,
                self.tolerance,
            )
        return stopped


def _result(
    args: argparse.Namespace,
    artifact: ModelArtifact,
    machine: dict,
    sample: Sample,
    sweep: _Sweep,
    chosen: Point,
    stopped: str,
    *,
    cores: int,
    largest: int,
    on_gpu: bool,
) -> dict:
    """The figures (``tune.json``), the snippet and its notes: what the text and the plot show."""
    step = args.tune_step or "STEP"
    snippet = spec_snippet(step, workers=chosen.setting.workers, batch_rows=chosen.setting.batch_rows, cores=cores)
    notes = snippet_notes(
        workers=chosen.setting.workers,
        threads=chosen.setting.threads,
        cores=cores,
        gpu_batch_rows=chosen.setting.gpu_batch_rows if on_gpu else None,
    )
    if on_gpu:
        notes.append(f"on GPU workers the CPU batch_rows ({args.batch_rows:,}) is not used; the snippet keeps it")
    if largest < args.tune_max_batch_rows and not stopped.startswith("stopped"):
        notes.append(
            f"the largest sample file has {largest:,} rows and a batch never spans files, so no larger "
            "batch was tried: on files of this size a larger batch_rows changes nothing"
        )
    return {
        "machine": machine,
        "model": {"kind": artifact.kind, "sha256": artifact.sha256},
        "sample": {
            "files": [{"input": name, "rows": rows} for name, rows in sample.source_files],
            "rows": sample.rows,
            "copies": sample.copies,
            "rows_per_run": sample.rows_per_run,
        },
        "repeat": sweep.repeat,
        "tolerance": sweep.tolerance,
        "on_gpu": on_gpu,
        "points": [p.to_dict() for p in sweep.points.values()],
        "best": chosen.to_dict(),
        "batch_sweep": stopped,
        "snippet": snippet,
        "notes": notes,
    }
