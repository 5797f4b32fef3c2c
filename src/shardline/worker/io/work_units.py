"""Which files to process and how to cut them into work units. Pure apart from listing.

A work unit is a whole file, or a contiguous range of a parquet file's row groups when
one file is much larger than the rest: otherwise that file would keep one core busy
long after the others have gone idle.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from shardline import contract

FORMATS = contract.INPUT_FORMATS
# Below this size a file is never split: the merge would cost more than it saves.
MIN_SPLIT_BYTES = 16 * 1024 * 1024
# Aim for about this many units per worker when sizing split parts.
UNITS_PER_WORKER = 2


@dataclasses.dataclass(frozen=True)
class InputFile:
    relative_path: str  # POSIX path under the input dir; also the output's relative path
    path: str
    fmt: str  # parquet | csv | jsonl
    gzipped: bool
    size: int
    # Why this file is not read (a name that says another format than the step's input.format, or
    # none the worker knows): it fails alone with this reason, naming the setting to change.
    refusal: str | None = None
    # A CSV without a header line (input.csv_header: false): its columns' names, by position (input.features).
    csv_names: tuple[str, ...] | None = None
    trust_header: bool = False  # input.csv_header: true: a header line of numbers is names all the same


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    file: InputFile
    part: int = 0
    parts: int = 1
    row_groups: tuple[int, ...] | None = None  # None = the whole file
    est_bytes: int = 0

    @property
    def is_split(self) -> bool:
        return self.parts > 1

    @property
    def label(self) -> str:
        name = self.file.relative_path
        return f"{name} [part {self.part + 1}/{self.parts}]" if self.is_split else name


def classify(name: str) -> tuple[str, bool] | None:
    """(format, gzipped) for a file name, or None when it is not an input we read."""
    lower = name.lower()
    gzipped = lower.endswith(".gz")
    if gzipped:
        lower = lower[:-3]
    fmt = FORMATS.get(os.path.splitext(lower)[1])
    return (fmt, gzipped) if fmt else None


def discover_inputs(
    input_dir: Path,
    input_format: str | None = None,
    *,
    refuse_unknown: bool = False,
    csv_names: tuple[str, ...] | None = None,
    trust_header: bool = False,
) -> tuple[list[InputFile], list[str]]:
    """Every input under ``input_dir``, sorted, plus the names that were ignored.

    Hidden files and names starting with ``_`` (``_SUCCESS``, our own manifests) are skipped
    silently. Each file's format comes from its name (``.parquet``, ``.csv``, ``.jsonl``, each
    optionally ``.gz``). With ``input_format`` (the spec's ``input.format``) a file whose name
    says no format (Spark's ``part-00000``, ``.txt``, ``.json``) is read in that format, and one
    whose name says another format is refused: reading it either way could be silently wrong.
    A name that says no format, without ``input_format``, is ignored (returned, so the caller
    can warn), or refused with ``refuse_unknown`` (in a pipeline, where every file was planned).
    ``csv_names`` names the columns of CSV files that have no header line, by position.
    """
    found: list[InputFile] = []
    ignored: list[str] = []
    for root, dirs, files in os.walk(input_dir):
        dirs[:] = sorted(d for d in dirs if not contract.is_reserved(d))
        for name in sorted(files):
            if contract.is_reserved(name):
                continue
            path = Path(root) / name
            relative = path.relative_to(input_dir).as_posix()
            kind, refusal = _format_of(name, input_format)
            if kind is None and not refuse_unknown:
                ignored.append(relative)
                continue
            fmt, gzipped = kind or ("parquet", name.lower().endswith(".gz"))
            names = csv_names if fmt == "csv" else None
            found.append(
                InputFile(relative, str(path), fmt, gzipped, path.stat().st_size, refusal, names, trust_header)
            )
    found.sort(key=lambda f: f.relative_path)
    return found, ignored


def _format_of(name: str, input_format: str | None) -> tuple[tuple[str, bool] | None, str | None]:
    """((format, gzipped) or None, the reason to refuse the file or None)."""
    by_name = classify(name)
    if input_format is None:
        if by_name is None:
            return None, (
                f"{name} has no extension the worker reads by name (.parquet, .csv, .jsonl, each "
                "optionally .gz): set input.format (--input-format) to read it as parquet, csv or "
                "jsonl, or leave it out with input.exclude"
            )
        return by_name, None
    if by_name is None:
        return (input_format, name.lower().endswith(".gz")), None
    if by_name[0] != input_format:
        return by_name, (
            f"{name} is {by_name[0]} by its name, but the step reads {input_format} (input.format, "
            f"--input-format): set input.format: {by_name[0]} if the step's files are {by_name[0]}, "
            "or leave this file out with input.exclude"
        )
    return by_name, None


def plan_units(
    files: Iterable[InputFile],
    workers: int,
    row_group_sizes: Callable[[InputFile], list[int]],
    *,
    min_split_bytes: int = MIN_SPLIT_BYTES,
) -> list[WorkUnit]:
    """Cut files into work units, largest first.

    ``row_group_sizes(file)`` returns the compressed byte size of each row group; it is
    called only for plain parquet files big enough to be worth splitting.
    """
    files = list(files)
    total = sum(f.size for f in files)
    target = max(min_split_bytes, math.ceil(total / max(1, workers * UNITS_PER_WORKER)))
    units: list[WorkUnit] = []
    for f in files:
        splittable = workers > 1 and f.fmt == "parquet" and not f.gzipped and f.size > 1.5 * target
        groups = row_group_sizes(f) if splittable else []
        if len(groups) < 2:
            units.append(WorkUnit(f, est_bytes=f.size))
            continue
        ranges = split_row_groups(groups, min(len(groups), math.ceil(f.size / target)))
        for i, rg in enumerate(ranges):
            units.append(WorkUnit(f, part=i, parts=len(ranges), row_groups=rg, est_bytes=sum(groups[g] for g in rg)))
    # Longest-processing-time first: big units start early, small ones fill the gaps.
    units.sort(key=lambda u: (-u.est_bytes, u.file.relative_path, u.part))
    return units


def split_row_groups(sizes: list[int], parts: int) -> list[tuple[int, ...]]:
    """Split row groups into at most ``parts`` contiguous ranges of similar total size."""
    parts = max(1, min(parts, len(sizes)))
    goal = sum(sizes) / parts
    ranges: list[tuple[int, ...]] = []
    current: list[int] = []
    acc = 0.0
    for index, size in enumerate(sizes):
        current.append(index)
        acc += size
        remaining_groups = len(sizes) - index - 1
        remaining_parts = parts - len(ranges) - 1
        if remaining_parts and acc >= goal * (len(ranges) + 1) - size / 2 and remaining_groups >= remaining_parts:
            ranges.append(tuple(current))
            current = []
        elif remaining_parts and remaining_groups == remaining_parts:
            # Just enough groups left for one per remaining part.
            ranges.append(tuple(current))
            current = []
    if current:
        ranges.append(tuple(current))
    return ranges
