"""Auto-tune's sample: the first input files, up to ``--tune-rows`` rows, copied once so that every run reads
the same bytes (laid out several times when there are fewer files than the widest split has workers)."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
from pathlib import Path

from shardline.errors import SetupError
from shardline.worker.io import formats
from shardline.worker.io.work_units import InputFile


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
        meta = formats.parquet_meta(file)
        if meta is None:
            raise SetupError(
                f"--tune: cannot read the parquet footer of {file.relative_path}; run --preview to see why"
            )
        return meta[0]
    if file.fmt == "parquet":
        return _read_gzipped_parquet(file).num_rows
    with _open_text(file.path, file.gzipped, "rb") as stream:
        lines = sum(1 for line in stream if line.strip())
    return max(0, lines - _header_lines(file))


def _header_lines(file: InputFile) -> int:
    return 1 if file.fmt == "csv" and file.csv_names is None else 0


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
    header = _header_lines(file)
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
