"""What an instance says when its job ends: the summary, its manifest on disk, its log lines.

The manifest (``_shardline/attempt-NNNN/manifest-HOST.json`` under the output) is the
instance's own record of every file: rows, checksums, failures with their reasons.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import time
from pathlib import Path

from shardline.ledger.states import FileStatus
from shardline.report.profile import Profile
from shardline.worker.io import formats
from shardline.worker.model.loading import ModelArtifact
from shardline.worker.pool import devices
from shardline.worker.pool.runner import FileResult, Runner

log = logging.getLogger("shardline.worker")


def process_started_at() -> float:
    """Wall-clock time this process was launched (Linux: from /proc, to 10 ms), or now elsewhere.

    Start-up is timed from the launch, not from when Python reached our code: the interpreter and
    the imports before ``main`` are part of what an instance pays before its first prediction.
    """
    try:
        since_boot = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - (uptime - since_boot)


def describe_slots(slots: list[devices.WorkerSlot]) -> str:
    gpus = [s for s in slots if s.gpu is not None]
    kind = f"{len(gpus)} GPU worker(s)" if gpus else f"{len(slots)} CPU worker(s)"
    return f"{kind} x {slots[0].threads} thread(s)"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def build_summary(
    results: list[FileResult],
    *,
    seconds: float,
    slots: list[devices.WorkerSlot],
    artifact: ModelArtifact,
    host: str,
    hosts: list[str],
    runner: Runner,
    started_wall: dt.datetime,
    launched_at: float,
) -> dict:
    """The job's summary: what the manifest holds and ``--summary-json`` writes."""
    rows_in = sum(r.rows_in for r in results)
    rows_out = sum(r.rows_out for r in results if r.status is FileStatus.SUCCEEDED)
    return {
        "host": host,
        "hosts": hosts,
        "started_at": started_wall.isoformat(),
        "seconds": round(seconds, 3),
        "model": {"kind": artifact.kind, "sha256": artifact.sha256},
        "features": [
            {"source": c.source, "columns": list(c.columns), "unused": list(c.unused), "units": units}
            for c, units in runner.feature_choices.items()
        ],
        "workers": [dataclasses.asdict(s) for s in slots],
        "pool_starts": runner.pool_starts,
        "startup_seconds": None if runner.startup_seconds is None else round(runner.startup_seconds, 3),
        "startup": {
            "launched_at": round(launched_at, 3),
            "job_started_at": round(started_wall.timestamp(), 3),
            **(runner.startup_breakdown(launched_at) or {}),
        },
        "files": len(results),
        "succeeded": sum(r.status is FileStatus.SUCCEEDED for r in results),
        "failed": sum(r.status is FileStatus.FAILED for r in results),
        "rows_in": rows_in,
        "rows_out": rows_out,
        "rows_rejected": sum(r.rows_rejected for r in results if r.status is FileStatus.SUCCEEDED),
        "rows_per_second": round(rows_in / seconds, 1) if seconds > 0 else 0.0,
        "prediction_histogram": _merged_histogram(r.profile for r in results if r.status is FileStatus.SUCCEEDED),
        # Each file's rejects are listed in its rejects file, not here: a manifest stays small.
        "file_reports": [{**dataclasses.asdict(r), "status": r.status.value, "rejects": None} for r in results],
    }


def _merged_histogram(profiles) -> dict | None:
    """This instance's predictions over every file it wrote: the first prediction column's histogram (the column
    the first file's profile names first), with its name."""
    merged = Profile.merged(Profile.from_dict(p) for p in profiles if p is not None)
    for column, found in merged.outputs.items():
        if found.histogram is None:
            return None  # labels: no histogram
        return {"column": column, **found.histogram.to_dict()}
    return None


def manifest_path(folder: Path, host: str, attempt: int | None) -> Path:
    """Each attempt's instances write their own manifests under ``folder`` (``<output>/_shardline``, or
    ``--manifest-dir``), so a resubmission never overwrites the record of the files an earlier attempt
    wrote (a worker run outside a pipeline has no attempt)."""
    return (folder / f"attempt-{attempt:04d}" if attempt is not None else folder) / f"manifest-{host}.json"


def write_manifest(folder: Path, host: str, summary: dict, attempt: int | None) -> Path:
    """Write this instance's manifest atomically: a reader sees the old one or the new one."""
    path = manifest_path(folder, host, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + formats.TEMP_MARKER)
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, path)
    return path


def log_summary(summary: dict, failed: list[FileResult], manifest: Path | str) -> None:
    log.info(
        "summary: %d file(s): %d succeeded, %d failed | rows in %s, rows out %s%s | %.1fs, %s rows/s | "
        "startup %s | pool started %d time(s) | manifest %s",
        summary["files"],
        summary["succeeded"],
        summary["failed"],
        f"{summary['rows_in']:,}",
        f"{summary['rows_out']:,}",
        f", rows rejected {summary['rows_rejected']:,}" if summary.get("rows_rejected") else "",
        summary["seconds"],
        f"{summary['rows_per_second']:,.0f}",
        "n/a" if summary["startup_seconds"] is None else f"{summary['startup_seconds']:.2f}s",
        summary["pool_starts"],
        manifest,
    )
    for result in failed:
        log.error("failed: %s: %s: %s", result.input, result.error_class, result.error_message)
