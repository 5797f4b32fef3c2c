"""Deterministic names: the same (pipeline, run, step, attempt) always gives the same job.

A retried or cleared Airflow task therefore finds the job its earlier try started and
adopts it, instead of starting a twin.
"""

from __future__ import annotations

import hashlib
import re
import shlex

from shardline import contract

# SageMaker: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}
MAX_JOB_NAME = 63


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower()
    return slug[:limit].strip("-") or "x"


def run_folder(run_id: str) -> str:
    """The folder of one run's manifests and reports: its id made key-safe and readable, and a digest of the
    exact id, so two run ids never share a folder (``Run-1`` and ``run-1``, or ``a+b`` and ``a-b``, slug alike)."""
    return f"{_slug(run_id, 64)}-{hashlib.sha256(run_id.encode()).hexdigest()[:10]}"


def output_tag(run_id: str, attempt: int) -> str:
    """The tag a table step's data files carry in their names (``part-00000.<tag>.parquet``): the run's and the
    attempt's own, so that no run rewrites a file a table's snapshot already references (a reader of the old
    snapshot reads it whole until the new one commits). Deterministic: a retried job writes the same keys."""
    return f"r{hashlib.sha1(run_id.encode()).hexdigest()[:8]}a{attempt}"


def job_name(pipeline: str, run_id: str, step: str, attempt: int) -> str:
    """``sl-<pipeline>-<step>-<digest>-a<attempt>``, at most 63 characters.

    The digest covers the full (pipeline, run_id, step), so two runs never share a name
    even when their readable parts are truncated alike.
    """
    digest = hashlib.sha256(f"{pipeline}\x00{run_id}\x00{step}".encode()).hexdigest()[:10]
    suffix = f"-{digest}-a{attempt}"
    head = f"sl-{_slug(pipeline, 24)}-{_slug(step, 16)}"
    return (head[: MAX_JOB_NAME - len(suffix)].rstrip("-") + suffix)[:MAX_JOB_NAME]


def metadata_root(output_prefix: str, metadata_prefix: str | None = None) -> str:
    """Where Shardline's own files for an output prefix go: ``<output>/_shardline``, or the spec's
    ``output.metadata_prefix`` (rendered) for readers that take every object under the data prefix."""
    return metadata_prefix.rstrip("/") if metadata_prefix else f"{output_prefix.rstrip('/')}/{contract.METADATA_FOLDER}"


def manifest_key(output_prefix: str, run_id: str, step: str, attempt: int, metadata_prefix: str | None = None) -> str:
    """Where an attempt's input manifest lives: beside the outputs, never among them."""
    root = metadata_root(output_prefix, metadata_prefix)
    return f"{root}/manifests/{run_folder(run_id)}/{step}/attempt-{attempt:04d}.manifest"


def rejects_parts_prefix(
    output_prefix: str, run_id: str, step: str, attempt: int, metadata_prefix: str | None = None
) -> str:
    """Where the rejects parts an attempt scores (rows picked from their sources by ``resubmit --rejects``) lie:
    beside its manifest, which the orchestrator writes and its job may read but never write."""
    root = metadata_root(output_prefix, metadata_prefix)
    return f"{root}/manifests/{run_folder(run_id)}/{step}/attempt-{attempt:04d}.rejects/"


def rejects_parts_prefix_of(key: str) -> str | None:
    """The parts prefix a rejects part's key (s3:// URI) lies under; None for any other key."""
    found = re.match(r"^(.*/attempt-\d{4}\.rejects/)", key)
    return found[1] if found else None


def rejects_part_name(relative_path: str, attempt: int) -> str:
    """A rejects part's path relative to its attempt's parts prefix: its source's, marked with the attempt
    (``day/x.csv.gz`` -> ``day/x.rejects-a3.csv.gz``; a gzipped text part is gzipped as its source, a parquet part
    never is). Its output is named from it, so it lands beside its source's output as one more part of the file."""
    gz = relative_path.lower().endswith(".gz")
    base = relative_path[:-3] if gz else relative_path
    folder, _, name = base.rpartition("/")
    stem, dot, ext = name.rpartition(".")
    marked = f"{stem}.rejects-a{attempt}.{ext}" if dot and stem else f"{name}.rejects-a{attempt}"
    if gz and ext.lower() not in ("parquet", "pq"):
        marked += relative_path[-3:]
    return f"{folder}/{marked}" if folder else marked


def plan_file_key(
    output_prefix: str, run_id: str, step: str, attempt: int, stamp: str, metadata_prefix: str | None = None
) -> str:
    """Where one plan of an attempt keeps its inputs and their sizes (``planning.inputs.plan_file_body``).

    ``stamp`` is unique to each plan (a re-plan of the attempt writes a new file), so a planner
    that lost its race, or wakes late, never overwrites the file the STEP item names.
    """
    return (
        manifest_key(output_prefix, run_id, step, attempt, metadata_prefix).removesuffix(".manifest")
        + f".{stamp}.files.json.gz"
    )


def outputs_manifest_key(output_prefix: str, run_id: str, step: str, metadata_prefix: str | None = None) -> str:
    """Where the step-level manifest of every output goes when the step ends."""
    root = metadata_root(output_prefix, metadata_prefix)
    return f"{root}/manifests/{run_folder(run_id)}/{step}/outputs.json"


def worker_manifest_folder(
    output_prefix: str, run_id: str, step: str, attempt: int, metadata_prefix: str | None = None
) -> str:
    """Where one attempt's instances upload their own manifests (the job's environment tells them): keyed by run
    and step, so two runs of one partition never read each other's."""
    root = metadata_root(output_prefix, metadata_prefix)
    return f"{root}/instances/{run_folder(run_id)}/{step}/attempt-{attempt:04d}"


def worker_manifest_key(
    output_prefix: str, run_id: str, step: str, attempt: int, host: str, metadata_prefix: str | None = None
) -> str:
    """Where an instance's own manifest lands (``worker/job/summary.py`` writes it, the instance uploads it)."""
    return f"{worker_manifest_folder(output_prefix, run_id, step, attempt, metadata_prefix)}/manifest-{host}.json"


def report_key(
    output_prefix: str, run_id: str, step: str, metadata_prefix: str | None = None, suffix: str = "html"
) -> str:
    """Where a step's run report goes (``report.html``, and the same data as ``report.json``)."""
    root = metadata_root(output_prefix, metadata_prefix)
    return f"{root}/reports/{run_folder(run_id)}/{step}/report.{suffix}"


def success_marker_key(output_prefix: str) -> str:
    """The ``_SUCCESS`` marker of an output prefix: there when, and only when, the step ended SUCCEEDED."""
    return f"{output_prefix.rstrip('/')}/{contract.SUCCESS_MARKER}"


def run_ref(pipeline: str, run_id: str) -> str:
    """How the CLI names a run: ``pipeline/run_id``."""
    return f"{pipeline}/{run_id}"


def budget_resubmit_command(pipeline: str, run_id: str, step: str, budget_usd: float) -> str:
    """The command that raises a run's budget and resubmits its step's unfinished files (after a budget stop)."""
    return shlex.join(
        ["shardline", "resubmit", run_ref(pipeline, run_id), "--step", step, "--budget-usd", f"{budget_usd:.2f}"]
    )


def resubmit_command(pipeline: str, run_id: str, step: str) -> str:
    """The exact command an on-call engineer runs to resubmit a step's failed files."""
    return shlex.join(["shardline", "resubmit", run_ref(pipeline, run_id), "--step", step, "--all-failed"])


def rerun_command(pipeline: str, run_id: str) -> str:
    """The exact command that plans a run again from the start (its ledger records gone or past mending)."""
    return shlex.join(["shardline", "rerun", run_ref(pipeline, run_id)])


def checks_command(pipeline: str, run_id: str) -> str:
    """The command that prints every output check of a run with its value against the last partitions'."""
    return shlex.join(["shardline", "checks", run_ref(pipeline, run_id)])


def approve_command(pipeline: str, run_id: str, step: str) -> str:
    """The command that accepts a step's outputs its blocking checks held back (a reason is required)."""
    return shlex.join(["shardline", "approve", run_ref(pipeline, run_id), "--step", step, "--reason", "..."])


def checks_ways_forward(pipeline: str, run_id: str, step: str) -> str:
    """What an on-call engineer does with a step its blocking checks held back: look, accept, or score again."""
    rescore = shlex.join(["shardline", "rerun", run_ref(pipeline, run_id), "--conf", '{"model_version": "..."}'])
    return (
        f"See every check against the last partitions: {checks_command(pipeline, run_id)}; accept the outputs as "
        f"they are: {approve_command(pipeline, run_id, step)}; or score the partition again once the cause is fixed: "
        f"{rescore} (after a change to the checks alone, {rerun_command(pipeline, run_id)} checks the same outputs "
        "again)"
    )


def report_command(pipeline: str, run_id: str, step: str) -> str:
    """The command that fetches a step's run report and opens it."""
    return shlex.join(["shardline", "report", run_ref(pipeline, run_id), "--step", step, "--open"])
