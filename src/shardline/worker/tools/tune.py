"""Auto-tune (``python -m shardline.worker --tune``): this machine's rows/s for each setting, on a sample.

The worker runs its own job repeatedly -- the real :class:`~shardline.worker.runner.Runner` over the
real :class:`~shardline.worker.process.JobSettings` (``worker/job.py``'s own :func:`job_settings`),
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
pure function here, tested without a process; :func:`run_tune` is the IO around them.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from shardline.errors import SetupError
from shardline.ledger.states import FileStatus
from shardline.worker import devices
from shardline.worker.errors import EXIT_OK
from shardline.worker.job import parquet_meta
from shardline.worker.models import ModelArtifact
from shardline.worker.process import JobSettings
from shardline.worker.runner import FileReport, Hooks, Runner
from shardline.worker.work_units import UNITS_PER_WORKER, InputFile, discover_inputs, plan_units

log = logging.getLogger("shardline.worker")

FIRST_BATCH_ROWS = 4096
TOLERANCE = 0.03  # a fall smaller than this is noise: the doubling goes on
PLOT_NAME, JSON_NAME = "tune.png", "tune.json"


# --- pure: what to try, when to stop, what to recommend -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    workers: int
    threads: int
    batch_rows: int
    gpu_batch_rows: int

    @property
    def split(self) -> str:
        return f"{self.workers}x{self.threads}"


@dataclasses.dataclass
class Point:
    """One setting and the rows/s of each of its runs."""

    phase: str  # split | batch | gpu batch
    setting: Setting
    rates: list[float] = dataclasses.field(default_factory=list)
    rows: int = 0  # rows of one run
    startup_s: list[float] = dataclasses.field(default_factory=list)  # pool start-up of each run (excluded)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """(max - min) / median of the runs: 0 with one run."""
        return spread(self.rates)

    def to_dict(self) -> dict:
        return {
            "phase": self.phase,
            **dataclasses.asdict(self.setting),
            "rows_per_run": self.rows,
            "rows_per_s": [round(r, 1) for r in self.rates],
            "median_rows_per_s": round(self.median, 1),
            "spread": round(self.spread, 4),
            "startup_s": [round(s, 3) for s in self.startup_s],
        }


def spread(rates: list[float]) -> float:
    middle = statistics.median(rates)
    return (max(rates) - min(rates)) / middle if middle > 0 else 0.0


def core_splits(cores: int) -> list[tuple[int, int]]:
    """Every (workers, threads) with workers x threads == cores, most workers first."""
    return [(w, cores // w) for w in range(cores, 0, -1) if cores % w == 0]


def batch_ladder(first: int, cap: int) -> list[int]:
    """Rows per batch to try: ``first`` doubled while it stays within ``cap``, then ``cap`` itself (the largest
    file's rows, when that is the cap: a batch of a whole file)."""
    if cap < first:
        return [cap]
    ladder = [first]
    while ladder[-1] * 2 <= cap:
        ladder.append(ladder[-1] * 2)
    return ladder if ladder[-1] == cap else [*ladder, cap]


def fell(previous: list[float], current: list[float], tolerance: float = TOLERANCE) -> bool:
    """Throughput decreased beyond the noise: the median fell by more than ``tolerance`` and the runs' ranges do
    not overlap (every run of ``current`` is slower than every run of ``previous``)."""
    return statistics.median(current) < statistics.median(previous) * (1 - tolerance) and max(current) < min(previous)


def doubling_sweep(
    measure: Callable[[int], list[float]], first: int, cap: int, tolerance: float = TOLERANCE
) -> tuple[list[tuple[int, list[float]]], str]:
    """Measure rows per batch from ``first``, doubling, until throughput falls beyond the noise against the
    previous size (that point is measured, and kept) or the cap is reached. ``measure`` returns the rows/s
    of each run of one size.

    Returns the (batch rows, rows/s of each run) measured, and why the sweep stopped.
    """
    points: list[tuple[int, list[float]]] = []
    for rows in batch_ladder(first, cap):
        points.append((rows, measure(rows)))
        if len(points) >= 2 and fell(points[-2][1], points[-1][1], tolerance):
            (before, was), (_, now) = points[-2], points[-1]
            change = statistics.median(now) / statistics.median(was) - 1
            return points, (
                f"stopped at {rows:,}: {change:+.1%} against {before:,}, a fall beyond the noise "
                f"(more than {tolerance:.0%}, and every run slower)"
            )
    return points, f"reached the cap of {cap:,} rows without a fall beyond the noise"


def best_point(points: list[Point]) -> Point:
    """The highest median rows/s (the first of equals)."""
    return max(points, key=lambda p: p.median)


def within_noise(points: list[Point], best: Point, tolerance: float = TOLERANCE) -> list[Point]:
    """The other points as good as the best, as far as the runs can tell: within ``tolerance`` of its median, or
    with a run as fast as its slowest."""
    return [
        p
        for p in points
        if p is not best and (p.median >= best.median * (1 - tolerance) or max(p.rates) >= min(best.rates))
    ]


def spec_snippet(step: str, *, workers: int, batch_rows: int, cores: int) -> str:
    """The spec lines to paste (YAML: ``steps[].batch_rows`` and ``steps[].resources.workers_per_instance``)."""
    threads = max(1, cores // workers)
    return (
        f"steps:\n"
        f"  - name: {step}\n"
        f"    batch_rows: {batch_rows}\n"
        f"    resources:\n"
        f"      workers_per_instance: {workers}  # threads per worker = cores // workers = {cores} // {workers} "
        f"= {threads} here\n"
    )


def snippet_notes(*, workers: int, threads: int, cores: int, gpu_batch_rows: int | None) -> list[str]:
    """What the snippet cannot say, and what does not transfer."""
    notes = [
        f"the spec has no threads field: each worker gets cores // workers_per_instance threads ({cores} // "
        f"{workers} = {threads} on this machine); the worker's --threads-per-worker flag would set it apart",
        "workers_per_instance is a count, not a share of the cores: on an instance type with other cores the "
        "split changes (2 workers on 8 vCPUs get 4 threads each). Tune on the instance type the step runs on: "
        "figures from a laptop do not transfer to an ml.* instance",
    ]
    if gpu_batch_rows is not None:
        notes.insert(
            0,
            f"GPU batch rows {gpu_batch_rows:,}: the spec has no field for it; the pipeline's worker "
            "runs with its default --gpu-batch-rows (262,144), and --gpu-batch-rows is the flag that "
            "sets it",
        )
    return notes


def render_table(points: list[Point], chosen: Point, *, gpu: bool) -> list[str]:
    head = f"{'phase':<10} {'workers x threads':>17} {'batch_rows':>12} "
    head += f"{'gpu_batch_rows':>14} " if gpu else ""
    head += f"{'rows/s (median)':>16} {'spread':>7} {'runs':>5}"
    lines = [head]
    for p in points:
        line = f"{p.phase:<10} {p.setting.split:>17} {p.setting.batch_rows:>12,} "
        line += f"{p.setting.gpu_batch_rows:>14,} " if gpu else ""
        line += f"{p.median:>16,.0f} {p.spread:>7.1%} {len(p.rates):>5}"
        lines.append(line + ("  <- best" if p is chosen else ""))
    return lines


# --- the sample -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    folder: Path
    source_files: list[tuple[str, int]]  # (relative path, rows taken) of the first inputs
    rows: int  # rows of the source files taken
    copies: int  # times the sample is laid out, so that every worker of the widest split has files

    @property
    def rows_per_run(self) -> int:
        return self.rows * self.copies


def count_rows(file: InputFile) -> int:
    if file.fmt == "parquet" and not file.gzipped:
        meta = parquet_meta(file)
        if meta is None:
            raise SetupError(
                f"--tune: cannot read the parquet footer of {file.relative_path}; run --preview to see why"
            )
        return meta[0]
    if file.fmt == "parquet":
        return _read_gzipped_parquet(file).num_rows
    with _open_text(file.path, file.gzipped, "rb") as stream:
        lines = sum(1 for line in stream if line.strip())
    return max(0, lines - (1 if file.fmt == "csv" else 0))


def _open_text(path: str | Path, gzipped: bool, mode: str):
    return gzip.open(path, mode) if gzipped else open(path, mode)


def _read_gzipped_parquet(file: InputFile):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pa.input_stream(file.path, compression="gzip") as stream:
        return pq.read_table(stream)


def copy_head(file: InputFile, rows: int, dest: Path) -> None:
    """The first ``rows`` rows of ``file`` at ``dest``, in its own format and compression (parquet keeps its row
    group size)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dest.parent.mkdir(parents=True, exist_ok=True)
    if file.fmt == "parquet":
        if file.gzipped:
            table = _read_gzipped_parquet(file).slice(0, rows)
            with pa.output_stream(str(dest), compression="gzip") as out:
                pq.write_table(table, out)
            return
        parquet = pq.ParquetFile(file.path)
        group_rows = parquet.metadata.row_group(0).num_rows if parquet.metadata.num_row_groups else rows
        batch = next(parquet.iter_batches(batch_size=rows), None)
        table = pa.Table.from_batches([batch]) if batch is not None else parquet.schema_arrow.empty_table()
        pq.write_table(table, dest, row_group_size=max(1, group_rows))
        return
    header = 1 if file.fmt == "csv" else 0
    with _open_text(file.path, file.gzipped, "rb") as source, _open_text(dest, file.gzipped, "wb") as out:
        taken = 0
        for line in source:
            out.write(line)
            if line.strip():
                taken += 1
            if taken >= rows + header:
                break


def take_sample(files: list[InputFile], rows: int, folder: Path, *, min_files: int) -> Sample:
    """Copy the first files (the last one cut) up to ``rows`` rows into ``folder``; lay them out ``copies`` times
    (under ``copy-K/``) when fewer than ``min_files``, so that the widest split has work for every worker."""
    readable = [f for f in files if not f.refusal]
    if not readable:
        reason = f": {files[0].refusal}" if files else ""
        raise SetupError(f"--tune: no input file to sample can be read{reason}")
    taken: list[tuple[InputFile, int, bool]] = []  # (file, rows taken, whole)
    total = 0
    for file in readable:
        if total >= rows:
            break
        count = count_rows(file)
        if count == 0:
            continue
        take = min(count, rows - total)
        taken.append((file, take, take == count))
        total += take
    if not taken:
        raise SetupError("--tune: the input files hold no rows to sample")
    copies = max(1, -(-min_files // len(taken)))
    for k in range(copies):
        base = folder / f"copy-{k}" if copies > 1 else folder
        for file, take, whole in taken:
            dest = base / file.relative_path
            dest.parent.mkdir(parents=True, exist_ok=True)
            if k > 0:
                shutil.copyfile(folder / "copy-0" / file.relative_path, dest)
            elif whole:
                shutil.copyfile(file.path, dest)
            else:
                copy_head(file, take, dest)
    return Sample(folder, [(f.relative_path, n) for f, n, _ in taken], total, copies)


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

    def file_finished(self, report: FileReport) -> None:
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
    files, _ = discover_inputs(sample.folder, input_format)
    units = plan_units(
        files, len(slots), lambda f: (parquet_meta(f) or (0, []))[1] if f.fmt == "parquet" and not f.gzipped else []
    )
    with tempfile.TemporaryDirectory(prefix="shardline-tune-out-") as out:
        settings = dataclasses.replace(
            base, output_dir=out, batch_rows=setting.batch_rows, gpu_batch_rows=setting.gpu_batch_rows
        )
        clock = _Clock()
        runner = Runner(
            settings,
            slots,
            inflight_per_worker=args.inflight_per_worker,
            max_crashes=args.max_worker_crashes,
            progress_interval=args.progress_interval,
            hooks=clock,
            log_prefix="tune: ",
            start_method=args.start_method,
        )
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


def machine_line(machine: dict) -> str:
    gpus = ", ".join(machine["gpus"]) or "no GPU"
    if machine["simulated_gpus"]:
        gpus += " (simulated: computing on the CPU)"
    memory = f", {machine['memory_gib']} GiB" if machine["memory_gib"] else ""
    load = (
        f", load average {machine['load_average_1m']} as it started (other work skews the figures)"
        if machine.get("load_average_1m") is not None
        else ""
    )
    return f"{machine['cores']} cores ({machine['cpu']}){memory}, {gpus}{load}"


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
    repeat, tolerance = args.tune_repeat, TOLERANCE
    points: dict[Setting, Point] = {}
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

        def measure(phase: str, setting: Setting) -> Point:
            point = points.get(setting)
            if point is None:
                point = points[setting] = Point(phase, setting)
                for i in range(repeat):
                    run = run_once(args, base, sample, setting, gpus, args.input_format)
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
                        repeat,
                        run.startup_s,
                    )
            return point

        cap = min(args.tune_max_batch_rows, largest)
        if on_gpu:
            workers, threads = len(default_slots), default_slots[0].threads
            split_points: list[Point] = []
            _, stopped = doubling_sweep(
                lambda rows: measure("gpu batch", Setting(workers, threads, args.batch_rows, rows)).rates,
                FIRST_BATCH_ROWS,
                cap,
                tolerance,
            )
        else:
            split_points = [
                measure("split", Setting(w, t, args.batch_rows, args.gpu_batch_rows)) for w, t in core_splits(cores)
            ]
            top = best_point(split_points).setting
            workers, threads = top.workers, top.threads
            _, stopped = doubling_sweep(
                lambda rows: measure("batch", Setting(workers, threads, rows, args.gpu_batch_rows)).rates,
                FIRST_BATCH_ROWS,
                cap,
                tolerance,
            )
    # The split sweep's point of this split (at the step's batch rows) competes too.
    candidates = [p for p in points.values() if (p.setting.workers, p.setting.threads) == (workers, threads)]
    chosen = best_point(candidates)
    candidates.sort(key=lambda p: p.setting.gpu_batch_rows if on_gpu else p.setting.batch_rows)
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
    result = {
        "machine": machine,
        "model": {"kind": artifact.kind, "sha256": artifact.sha256},
        "sample": {
            "files": [{"input": name, "rows": rows} for name, rows in sample.source_files],
            "rows": sample.rows,
            "copies": sample.copies,
            "rows_per_run": sample.rows_per_run,
        },
        "repeat": repeat,
        "tolerance": tolerance,
        "on_gpu": on_gpu,
        "points": [p.to_dict() for p in points.values()],
        "best": chosen.to_dict(),
        "batch_sweep": stopped,
        "snippet": snippet,
        "notes": notes,
    }
    args.tune_out.mkdir(parents=True, exist_ok=True)
    (args.tune_out / JSON_NAME).write_text(json.dumps(result, indent=2))
    plot = draw_plot(split_points, candidates, chosen, args.tune_out / PLOT_NAME, machine, on_gpu=on_gpu)
    text = render(result, list(points.values()), chosen, on_gpu=on_gpu, plot=plot, out=args.tune_out)
    sys.stdout.write(text)
    sys.stdout.flush()
    return EXIT_OK


def render(result: dict, points: list[Point], chosen: Point, *, on_gpu: bool, plot: Path | None, out: Path) -> str:
    sample, machine = result["sample"], result["machine"]
    laid = (
        f", laid out {sample['copies']} times ({sample['rows_per_run']:,} rows a run) so every worker has files"
        if sample["copies"] > 1
        else ""
    )
    lines = [
        f"auto-tune on {machine_line(machine)}",
        f"model {result['model']['kind']} (sha256 {result['model']['sha256'][:12]}...); sample: the first "
        f"{len(sample['files'])} input file(s), {sample['rows']:,} rows{laid}",
        f"each setting run {result['repeat']} time(s); rows/s from every worker ready to the last output (pool "
        "start-up excluded); spread = (max - min) / median",
        "",
        *render_table(points, chosen, gpu=on_gpu),
        "",
        f"best: {chosen.setting.split} (workers x threads), "
        + (
            f"gpu batch rows {chosen.setting.gpu_batch_rows:,}"
            if on_gpu
            else f"batch_rows {chosen.setting.batch_rows:,}"
        )
        + f": {chosen.median:,.0f} rows/s",
        f"{'gpu ' if on_gpu else ''}batch sweep: {result['batch_sweep']}",
    ]
    close = within_noise(points, chosen, result["tolerance"])
    if close:
        lines.append(
            f"as good as the best, as far as the runs tell (within {result['tolerance']:.0%}, or a run as "
            "fast as its slowest): "
            + ", ".join(
                f"{p.setting.split} batch {p.setting.batch_rows:,}"
                + (f" gpu {p.setting.gpu_batch_rows:,}" if on_gpu else "")
                for p in close
            )
        )
    lines += [
        "",
        "paste into the step's entry in the pipeline spec:",
        "",
        *(f"  {line}" for line in result["snippet"].splitlines()),
        "",
    ]
    lines += [f"- {note}" for note in result["notes"]]
    lines += [
        "",
        f"figures: {out / JSON_NAME}",
        f"plot: {plot}" if plot else "plot: none (matplotlib is not installed here: pip install matplotlib)",
    ]
    return "\n".join(lines) + "\n"


def draw_plot(
    split_points: list[Point], batch_points: list[Point], chosen: Point, path: Path, machine: dict, *, on_gpu: bool
) -> Path | None:
    """rows/s per split and per batch size (each run a dot, the median a line); None without matplotlib."""
    try:
        from matplotlib.figure import Figure  # Agg through Figure.savefig: no pyplot, no display
    except ImportError:
        log.warning("tune: matplotlib is not installed, so no plot is drawn (the table and %s are written)", JSON_NAME)
        return None
    panels = [p for p in (split_points, batch_points) if p]
    figure = Figure(figsize=(5.5 * len(panels), 4), dpi=100, layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    index = 0
    if split_points:
        ax = axes[index]
        index += 1
        labels = [p.setting.split for p in split_points]
        ax.bar(range(len(labels)), [p.median for p in split_points], color="#9ecae1")
        for i, p in enumerate(split_points):
            ax.plot([i] * len(p.rates), p.rates, "o", color="#08519c", markersize=4)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel(f"workers x threads (batch rows {split_points[0].setting.batch_rows:,})")
        ax.set_ylabel("rows/s")
        ax.set_title("split of the cores")
    ax = axes[index]
    sizes = [p.setting.gpu_batch_rows if on_gpu else p.setting.batch_rows for p in batch_points]
    ax.plot(sizes, [p.median for p in batch_points], "-", color="#9ecae1")
    for size, p in zip(sizes, batch_points, strict=True):
        ax.plot([size] * len(p.rates), p.rates, "o", color="#08519c", markersize=4)
    best = chosen.setting.gpu_batch_rows if on_gpu else chosen.setting.batch_rows
    ax.axvline(best, color="#e6550d", linestyle="--", label=f"best {best:,}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{size // 1024}k" if size >= 1024 else str(size) for size in sizes])
    ax.minorticks_off()
    ax.set_xlabel(("GPU batch rows" if on_gpu else "batch rows") + f" ({chosen.setting.split})")
    ax.set_ylabel("rows/s")
    ax.set_title("rows per batch")
    ax.legend()
    for axis in axes:
        axis.set_ylim(bottom=0)
        axis.yaxis.set_major_formatter(lambda value, _pos: f"{value / 1e3:,.0f}k")
        axis.grid(alpha=0.3)
    figure.suptitle(
        f"shardline --tune on {machine['cores']} cores"
        + (f", {', '.join(machine['gpus'])}" if machine["gpus"] else ", no GPU"),
        fontsize=10,
    )
    figure.savefig(path, format="png")
    return path
