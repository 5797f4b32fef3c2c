"""Scoring a file's rejected rows again: ``shardline resubmit --rejects``.

A file scored under ``tolerance.rows`` may end SUCCEEDED with rows rejected, each listed with its row number in the
file's rejects list. Once their cause is fixed (the source's lines mended in place, or the script), the rows are
picked from the source as it is now, by number, into a file of their own: a *rejects part*, under the attempt's
parts prefix beside its manifest (the orchestrator writes there; a job may read it, never write it). The next
attempt scores the parts like any input; each part's output lands beside its source's (``x.rejects-a2.csv``), and
readers fold a part into its source (:func:`shardline.ledger.records.settle_parts`), so rows in = rows out + rows
rejected still holds for the source, with what the part rejected again as its rejects.

Rows are picked by number, so the source must hold them where it held them: a source with another number of data
rows than it was scored with is refused, naming it. The picking is pure (:func:`pick_lines`, :func:`pick_parquet`);
the rest reads and writes S3.

A job's role may write its pipeline's FILE items, so what a FILE item says is no proof of where to read: each source
must be an input the step's plan files name, under its input prefix, each part the part its attempt planned for that
source, and each rejects list where the instances of the item's attempt put theirs
(:func:`check_sources`). All of them are checked, and every part picked, before anything is written.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import re
import tempfile
from collections.abc import Iterable, Sequence

from shardline import contract
from shardline.errors import PermanentError
from shardline.ledger.records import FileRecord, current_parts, sources_with_rejects
from shardline.ledger.states import FileStatus
from shardline.ledger.step_reads import StepRecords
from shardline.orchestration import services
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step.files import planned_inputs, read_step_files
from shardline.orchestration.step.run_report import misplaced_rejects, read_rejects
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import S3Object, put_metadata
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec


class RejectsPartError(PermanentError):
    """A file's rejected rows cannot be picked again: its source moved them, or its rejects list does not number
    them."""


def pick_lines(lines: Iterable[bytes], rows: Sequence[int], *, header: bool, fmt: str = "csv") -> tuple[bytes, int]:
    """The header line (when the file has one) and the data rows numbered ``rows`` (from 1, blank lines not
    counted, as the worker numbers them: a CSV's empty lines, a JSON lines file's lines of white space) of a text
    file, in the file's order; and how many data rows it has."""
    wanted = set(rows)
    picked: list[bytes] = []
    seen = 0
    want_header = header
    for line in lines:
        if not (line.strip() if fmt == "jsonl" else line.rstrip(b"\r\n")):
            continue
        if want_header:
            want_header = False
            picked.append(line if line.endswith(b"\n") else line + b"\n")
            continue
        seen += 1
        if seen in wanted:
            picked.append(line if line.endswith(b"\n") else line + b"\n")
    return b"".join(picked), seen


def pick_parquet(path: str, rows: Sequence[int]) -> tuple[bytes, int]:
    """The rows numbered ``rows`` (from 1) of a parquet file, as a parquet file; and how many rows it has."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    wanted = sorted(set(rows))
    tables, start, i = [], 0, 0
    for group in range(source.num_row_groups):
        size = source.metadata.row_group(group).num_rows
        mine = []
        while i < len(wanted) and wanted[i] <= start + size:
            mine.append(wanted[i] - 1 - start)
            i += 1
        if mine:
            tables.append(source.read_row_group(group).take(pa.array(mine)))
        start += size
    out = io.BytesIO()
    table = pa.concat_tables(tables) if tables else source.schema_arrow.empty_table()
    pq.write_table(table, out)
    return out.getvalue(), source.metadata.num_rows


def rows_map_key(parts_prefix: str) -> str:
    """Where an attempt's parts record which source rows each holds, in order (a part's row n is its source's
    ``rows[n - 1]``): beside the parts."""
    return parts_prefix.rstrip("/") + ".json"


def _format_of(key: str, input_format: str | None) -> tuple[str, bool]:
    lower = key.lower()
    gzipped = lower.endswith(".gz")
    fmt = contract.INPUT_FORMATS.get(os.path.splitext(lower[:-3] if gzipped else lower)[1]) or input_format
    if fmt is None:
        raise RejectsPartError(f"{key}: its name says no format the worker reads, and input.format is not set")
    return fmt, gzipped


def rows_still_rejected(spec: PipelineSpec, source: FileRecord, parts: Sequence[FileRecord]) -> list[int]:
    """The source's row numbers still rejected: its newest succeeded part's rejects, through that part's rows
    map; with no such part, the source's own rejects list. ``parts``: the source's current parts in attempt order
    (:func:`~shardline.ledger.records.current_parts`; a stale part's rejects are not the source's)."""
    done = [p for p in parts if p.status == FileStatus.SUCCEEDED]
    if not done:
        return _numbered(source.input_key, read_rejects(spec, source.rejects_key, None) if source.rejects_key else [])
    newest = done[-1]
    rejected = _numbered(newest.input_key, read_rejects(spec, newest.rejects_key, None) if newest.rejects_key else [])
    folder = naming.rejects_parts_prefix_of(newest.input_key)
    if folder is None:
        raise RejectsPartError(f"{newest.input_key} is not where rejects parts are kept")
    bucket, key = parse_s3_uri(rows_map_key(folder))
    mapping = json.loads(services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"].read())
    rows = mapping.get(newest.input_key)
    if not isinstance(rows, list) or any(n > len(rows) for n in rejected):
        raise RejectsPartError(f"the rows map {rows_map_key(folder)} does not number {newest.input_key}")
    return [rows[n - 1] for n in rejected]


def _numbered(key: str, rejects: list[dict]) -> list[int]:
    rows = [r.get("row") for r in rejects]
    if any(not isinstance(n, int) or n < 1 for n in rows):
        raise RejectsPartError(f"{key}: its rejects list has rows without a row number, so they cannot be picked")
    return sorted(set(rows))


def chosen_sources(spec: PipelineSpec, latest: Attempt, records: StepRecords, keys: Sequence[str]) -> list[FileRecord]:
    """The files ``keys`` (input keys) that still have rows rejected, each checked (:func:`check_sources`)."""
    chosen = set(keys)
    sources = [f for f in sources_with_rejects(records.files) if f.input_key in chosen]
    check_sources(spec, latest, records, sources)
    return sources


def check_sources(spec: PipelineSpec, latest: Attempt, records: StepRecords, sources: Sequence[FileRecord]) -> None:
    """Raise :class:`RejectsPartError` naming every item that is not what the step itself recorded: a source the
    step's plan files do not name under its input prefix, a part that is not the part its attempt planned for its
    source, a rejects list outside the folder of its attempt's instances. Reads only the plan files (the
    orchestrator's, under ``manifests/``, which a job may read but never write)."""
    planned = planned_inputs(spec, records.step) if records.step is not None else {}
    every = {uri for inputs in planned.values() for uri, _size in inputs}
    input_prefix = latest.input_prefix.rstrip("/") + "/"
    own = {f.input_key: f for f in records.files if not f.part_of}  # each source's own item, its parts not folded in
    parts = current_parts(list(records.files))
    wrong: list[str] = []
    for settled in sources:
        source = own.get(settled.input_key, settled)
        if not source.input_key.startswith(input_prefix) or source.input_key not in every:
            wrong.append(f"{source.input_key} is not an input the step planned under {input_prefix}")
            continue
        wrong += misplaced_rejects(latest, source)
        relative = source.input_key.removeprefix(input_prefix)
        for part in parts.get(source.input_key, []):
            # A part keeps the key of the attempt that picked it when a later attempt retries it.
            picked_by = _picked_by(part.input_key) or part.attempt
            expected = _parts_prefix(latest, picked_by) + naming.rejects_part_name(relative, picked_by)
            if part.input_key != expected or expected not in every or picked_by > part.attempt:
                wrong.append(
                    f"{part.input_key}, named a rejects part of {source.input_key}, is not a part the step planned "
                    f"for it (attempt {picked_by}'s is {expected})"
                )
                continue
            wrong += misplaced_rejects(latest, part)
    if wrong:
        raise RejectsPartError(
            "FILE items in the ledger name what the step's plans never did, so no row was picked and nothing was "
            "written: "
            + "; ".join(wrong)
            + ". A job's own code can write its FILE items: find out what wrote these before trusting the run; "
            f"`shardline rerun {latest.pipeline}/{latest.run_id}` scores it afresh from its inputs"
        )


def _picked_by(key: str) -> int | None:
    """The attempt whose parts folder ``key`` lies in (``.../attempt-0003.rejects/...``: 3); None outside one."""
    folder = naming.rejects_parts_prefix_of(key)
    found = re.search(r"attempt-(\d{4})\.rejects/$", folder or "")
    return int(found[1]) if found else None


def _parts_prefix(latest: Attempt, number: int) -> str:
    return naming.rejects_parts_prefix(latest.output_prefix, latest.run_id, latest.step, number, latest.metadata_prefix)


@dataclasses.dataclass(frozen=True, slots=True)
class _Part:
    """One source's rejected rows, picked and not yet written."""

    key: str  # the part's key under the parts prefix's bucket
    body: bytes
    source: str
    source_etag: str
    rows: list[int]


def write_parts(spec: PipelineSpec, latest: Attempt, sources: Sequence[FileRecord], all_files: Sequence[FileRecord]):
    """Pick each source's rejected rows into a part for attempt ``latest.number + 1``; return its parts prefix,
    the parts (as the attempt's inputs) and each part's source and the source's ETag. Every part is picked before
    the first is written: a source refused halfway leaves nothing behind."""
    number = latest.number + 1
    prefix = _parts_prefix(latest, number)
    bucket, key_prefix = parse_s3_uri(prefix)
    step = spec.step(latest.step)
    s3 = services.s3_client(spec)
    current = current_parts(list(all_files))
    picked: dict[str, _Part] = {}
    for source in sources:
        rows = rows_still_rejected(spec, source, current.get(source.input_key, []))
        relative = source.input_key.removeprefix(latest.input_prefix.rstrip("/") + "/")
        body, etag = _picked(s3, source, rows, step.input.format, header=step.input.csv_header is not False)
        key = key_prefix + naming.rejects_part_name(relative, number)
        if f"s3://{bucket}/{key}" in picked:
            raise RejectsPartError(f"{source.input_key} and {picked[f's3://{bucket}/{key}'].source} would share a part")
        picked[f"s3://{bucket}/{key}"] = _Part(key, body, source.input_key, etag, rows)
    for uri, part in picked.items():
        put_metadata(s3, uri, part.body, "application/octet-stream")
    rows_map = {uri: part.rows for uri, part in picked.items()}
    put_metadata(s3, rows_map_key(prefix), json.dumps(rows_map).encode(), "application/json")
    objects = [S3Object(part.key, len(part.body), "") for part in picked.values()]
    return prefix, objects, {uri: (part.source, part.source_etag) for uri, part in picked.items()}


def _picked(s3, source: FileRecord, rows: list[int], input_format: str | None, *, header: bool) -> tuple[bytes, str]:
    """The part's bytes and the source's ETag, the source read once from S3 (through a temporary file: a source
    may be far larger than memory)."""
    fmt, gzipped = _format_of(source.input_key, input_format)
    bucket, key = parse_s3_uri(source.input_key)
    with tempfile.NamedTemporaryFile(prefix="shardline-rejects-") as local:
        found = s3.get_object(Bucket=bucket, Key=key)
        for chunk in found["Body"].iter_chunks(1 << 20):
            local.write(chunk)
        local.flush()
        etag = (found.get("ETag") or "").strip('"')
        local.seek(0)
        if fmt == "parquet":
            with tempfile.NamedTemporaryFile(prefix="shardline-rejects-", suffix=".parquet") as plain:
                if gzipped:  # a gzipped parquet file, as the worker reads one: unpacked first (parquet seeks)
                    with gzip.GzipFile(fileobj=local) as packed:
                        while chunk := packed.read(1 << 20):
                            plain.write(chunk)
                    plain.flush()
                body, seen = pick_parquet(plain.name if gzipped else local.name, rows)
        else:
            stream = gzip.GzipFile(fileobj=local) if gzipped else local
            body, seen = pick_lines(stream, rows, header=header and fmt == "csv", fmt=fmt)
            if gzipped:  # its output is gzipped as its source's is
                body = gzip.compress(body, mtime=0)
    if seen != source.rows_in:
        raise RejectsPartError(
            f"{source.input_key} now has {seen:,} data rows; it had {source.rows_in or 0:,} when it was scored. "
            "Its rejected rows are picked by number, so mend them in place (one line for one line) and run "
            "the same command again"
        )
    return body, etag


def resubmit_rejects(
    spec: PipelineSpec, latest: Attempt, keys: Sequence[str], *, taken_up: bool = False
) -> step_jobs.Submitted | step_jobs.MustWait:
    """Submit the attempt after ``latest`` over the rejected rows of the files ``keys`` (input keys), each picked
    from its source as it is now into a part. Fenced on ``latest`` as any on-call resubmission is."""
    # Checked before the job is stopped, and again on what is read once it has (an instance may write meanwhile).
    chosen_sources(spec, latest, read_step_files(spec, latest.ref), keys)
    step_jobs.stop_live_jobs(spec, latest)  # a part still running could succeed after its rows were picked again
    records = read_step_files(spec, latest.ref)
    sources = chosen_sources(spec, latest, records, keys)
    if not sources:
        raise RejectsPartError("none of the chosen files has rows rejected any more")
    prefix, objects, parts = write_parts(spec, latest, sources, records.files)
    return step_jobs.submit_parts(spec, latest, prefix, objects, parts, taken_up=taken_up)
