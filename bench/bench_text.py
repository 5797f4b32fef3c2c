"""Text inputs in `make bench`: csv, csv.gz, jsonl and jsonl.gz of the same rows, each against its own ceiling.

For each format, interleaved round by round, with the XGBoost model:

  shardline  `python -m shardline.worker` over the files, timed from launch to exit (start-up included)
  io         one process per core reads its files whole to a float32 matrix with Arrow and writes id + a constant
             prediction in the same format, as the worker writes it (gzip at zlib level 1, JSON lines through
             Arrow's kernels): the fastest read and write this machine's libraries give
  compute    XGBoost's own predict on preloaded float32 rows, one process per core, one thread each

pipeline ceiling = 1 / (1/compute + 1/io); the worker's rate over it is the figure to watch (target >= 0.9x).
The worker is timed with no memory sampler beside it (the ceilings run unobserved too).

Then memory: one csv.gz file of 5,000,000 rows (1,000,000 with --quick), and the peak PSS of the worker's
process tree (each page shared by forked workers split among them) while it scores it (target <= 1.5 GiB).

    python bench/bench_text.py --out bench-results [--quick] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_worker import FEATURES, fmt_rate, prepare, run_one

FORMATS = ("csv", "csv.gz", "jsonl", "jsonl.gz")
COMPUTE_ROWS = 400_000
MEMORY_ROWS, MEMORY_ROWS_QUICK = 5_000_000, 1_000_000


def write_formats(data: Path) -> dict[str, Path]:
    """The bench's parquet rows written once in each text format (gzip at level 6, as gzip's own default)."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from shardline.worker.io.json_lines import batch_lines

    folders = {}
    for fmt in FORMATS:
        folder = data.parent / f"{data.name}-{fmt.replace('.', '-')}"
        folders[fmt] = folder
        if (folder / "_READY").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        print(f"writing the rows as {fmt} ...", flush=True)
        for source in sorted(data.glob("*.parquet")):
            target = folder / f"{source.stem}.{fmt}"
            opener = gzip.open(target, "wb", compresslevel=6) if fmt.endswith(".gz") else open(target, "wb")  # noqa: SIM115
            with opener as out:
                if fmt.startswith("csv"):
                    pacsv.write_csv(pq.read_table(source), out)
                else:
                    for batch in pq.ParquetFile(source).iter_batches(65536):
                        out.write(batch_lines(batch))
        (folder / "_READY").write_text("ok")
    return folders


def write_one_large_file(data: Path, rows: int) -> Path:
    """A folder with one csv.gz file of ``rows`` rows: the bench's rows again and again (gzip level 1: it is
    only read)."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    folder = data.parent / f"{data.name}-one-{rows}-csv-gz"
    if (folder / "_READY").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    print(f"writing one csv.gz file of {rows:,} rows ...", flush=True)
    written = 0
    with gzip.open(folder / "large.csv.gz", "wb", compresslevel=1) as out:
        while written < rows:
            for source in sorted(data.glob("*.parquet")):
                table = pq.read_table(source).slice(0, rows - written)
                pacsv.write_csv(table, out, write_options=pacsv.WriteOptions(include_header=written == 0))
                written += table.num_rows
                if written >= rows:
                    break
    (folder / "_READY").write_text("ok")
    return folder


def _io_worker(args) -> tuple[int, float]:
    """Read each file whole to float32 and write id + a constant prediction in its format; timed after a barrier."""
    files, out, barrier = args
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    from shardline.worker.io.formats import OutputWriter

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    barrier.wait()
    started, rows = time.perf_counter(), 0
    for name in files:
        path = Path(name)
        gzipped = path.suffix == ".gz"
        fmt = "csv" if ".csv" in path.name else "jsonl"
        source = pa.input_stream(str(path), compression="gzip" if gzipped else None)
        if fmt == "csv":
            types = {f: pa.float32() for f in FEATURES}
            table = pacsv.read_csv(
                source,
                read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 20),
                convert_options=pacsv.ConvertOptions(column_types=types),
            )
        else:
            table = pajson.read_json(source, read_options=pajson.ReadOptions(use_threads=False, block_size=1 << 20))
        x = np.empty((table.num_rows, len(FEATURES)), dtype=np.float32)
        for j, feature in enumerate(FEATURES):
            x[:, j] = table.column(feature).to_numpy()
        result = pa.record_batch(
            [table.column("id").combine_chunks(), pa.array(np.full(len(x), 0.5))], ["id", "prediction"]
        )
        writer = OutputWriter(Path(out) / path.name, fmt, gzipped, result.schema)
        writer.write(result)
        writer.close()
        rows += len(x)
    return rows, time.perf_counter() - started


def _compute_worker(args) -> tuple[int, float]:
    model_path, sample, barrier = args
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np
    import xgboost as xgb

    x = np.load(sample)
    booster = xgb.Booster()
    booster.load_model(model_path)
    booster.set_param({"nthread": 1})
    booster.inplace_predict(x[:1000])
    barrier.wait()
    started = time.perf_counter()
    for offset in range(0, len(x), 65536):
        booster.inplace_predict(x[offset : offset + 65536])
    return len(x), time.perf_counter() - started


def ceiling(mode: str, model_path: Path, folder: Path, scratch: Path) -> float:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    workers = os.cpu_count()
    ctx = mp.get_context("spawn")
    barrier = ctx.Manager().Barrier(workers)
    if mode == "io":
        files = sorted(str(p) for p in folder.iterdir() if p.name != "_READY")
        out = Path(tempfile.mkdtemp(dir=scratch))
        jobs = [(files[i::workers], str(out), barrier) for i in range(workers)]
        worker = _io_worker
    else:
        sample = scratch / "compute-sample.npy"
        jobs = [(str(model_path), str(sample), barrier)] * workers
        worker = _compute_worker
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        results = list(pool.map(worker, jobs))
    return sum(rows for rows, _ in results) / max(seconds for _, seconds in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--quick", action="store_true", help="fewer rows and one round")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    files, rows = (8, 400_000) if args.quick else (8, 1_600_000)
    rounds = args.rounds or (1 if args.quick else 3)
    data, models = prepare(args.out, files, rows)
    folders = write_formats(data)
    scratch = Path(tempfile.mkdtemp(prefix="shardline-bench-text-"))
    import numpy as np
    import pyarrow.parquet as pq

    first = pq.read_table(sorted(data.glob("*.parquet"))[0], columns=FEATURES).to_pandas().to_numpy("float32")
    np.save(scratch / "compute-sample.npy", np.resize(first, (COMPUTE_ROWS, len(FEATURES))))
    print(f"machine: {os.cpu_count()} cores; {files} files, {rows:,} rows, XGBoost; {rounds} round(s)", flush=True)
    measured: dict[str, dict[str, list[float]]] = {
        fmt: {"shardline": [], "steady": [], "io": [], "compute": []} for fmt in FORMATS
    }
    for round_no in range(1, rounds + 1):
        for fmt in FORMATS:
            shardline = run_one("shardline", "xgboost", models["xgboost"], folders[fmt], scratch, memory=None)
            measured[fmt]["shardline"].append(shardline["rate"])
            # as bench_worker.py's steady column: the pool start and model load taken out
            measured[fmt]["steady"].append(shardline["rows"] / (shardline["seconds"] - shardline["startup"]))
            measured[fmt]["io"].append(ceiling("io", models["xgboost"], folders[fmt], scratch))
            measured[fmt]["compute"].append(ceiling("compute", models["xgboost"], folders[fmt], scratch))
            print(f"  round {round_no} {fmt:9s} shardline {fmt_rate(shardline['rate'])} rows/s", flush=True)
    table = []
    for fmt in FORMATS:
        med = {name: statistics.median(values) for name, values in measured[fmt].items()}
        pipeline = 1 / (1 / med["compute"] + 1 / med["io"])
        table.append(
            {
                "format": fmt,
                "io_rows_per_s": round(med["io"]),
                "compute_rows_per_s": round(med["compute"]),
                "pipeline_ceiling_rows_per_s": round(pipeline),
                "shardline_rows_per_s": round(med["shardline"]),
                "shardline_vs_ceiling": round(med["shardline"] / pipeline, 3),
                "shardline_steady_vs_ceiling": round(med["steady"] / pipeline, 3),
            }
        )
    print(f"\ntext inputs, XGBoost, medians of {rounds} round(s) (rows/s; target >= 0.9x of the pipeline ceiling)")
    print(f"{'format':9s} {'io':>7s} {'compute':>8s} {'ceiling':>8s} {'shardln':>8s} {'vs ceil':>8s} {'steady':>7s}")
    for row in table:
        print(
            f"{row['format']:9s} {fmt_rate(row['io_rows_per_s']):>7s} {fmt_rate(row['compute_rows_per_s']):>8s}"
            f" {fmt_rate(row['pipeline_ceiling_rows_per_s']):>8s} {fmt_rate(row['shardline_rows_per_s']):>8s}"
            f" {row['shardline_vs_ceiling']:>7.2f}x {row['shardline_steady_vs_ceiling']:>6.2f}x"
        )
    print(
        "  vs ceil: the worker from launch to exit / pipeline ceiling; steady: the same with the worker's pool start"
        " and model load taken out"
    )
    memory_rows = MEMORY_ROWS_QUICK if args.quick else MEMORY_ROWS
    large = write_one_large_file(data, memory_rows)
    measured = run_one("shardline", "xgboost", models["xgboost"], large, scratch, memory="pss")
    memory = {
        "rows": memory_rows,
        "file_bytes": (large / "large.csv.gz").stat().st_size,
        "peak_pss_mib": round(measured["peak_rss"] / 2**20),
        "largest_process_pss_mib": round(measured["peak_largest"] / 2**20),
        "rows_per_s": round(measured["rate"]),
    }
    print(
        f"\none csv.gz file of {memory_rows:,} rows ({memory['file_bytes'] / 1e6:,.0f} MB): peak PSS of the worker's"
        f" processes {memory['peak_pss_mib']:,} MiB, the largest one {memory['largest_process_pss_mib']:,} MiB"
        f" (target <= 1,536 MiB); {fmt_rate(memory['rows_per_s'])} rows/s on one worker (one file is one unit)"
    )
    (args.out / "bench_text.json").write_text(
        json.dumps({"rows": rows, "rounds": rounds, "table": table, "memory": memory}, indent=2)
    )
    print(f"\nwrote {args.out / 'bench_text.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
