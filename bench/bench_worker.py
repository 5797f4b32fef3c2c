"""Worker throughput benchmark (`make bench`).

Measures rows/s end to end (parquet in, parquet out with id + prediction), in one run,
interleaved round by round, for each model kind:

  (a) sequential   one process, model loaded once, pandas read/write, library default threads
  (b) naive        ProcessPoolExecutor, one task per file: load model per file, read the whole
                   file with pandas, predict, write parquet, no thread caps
  (c) shardline    `python -m shardline.worker`, timed from launch to exit (startup included)
  (d) compute      predict() alone on preloaded arrays, one process per core, one thread each;
                   the best of batch sizes 4k/16k/64k/whole and (scikit-learn) both memory layouts
  (e) io           read the features into arrays and write id + a constant prediction, no model,
                   one process per core

  (f) baseline     with --baseline REF: the shardline worker of another commit (a git worktree on
                   PYTHONPATH), run back to back with (c), each first in every other round; the
                   ratio is the median of the rounds' paired ratios, so a change's cost comes from one run

pipeline ceiling = 1 / (1/compute + 1/io): decode, predict and encode share the same cores,
so that is what a perfect worker could reach. Every run is a subprocess, and the peak RSS
of its whole process tree is sampled. A batch-size x workers sweep of the shardline worker
is saved as a PNG, and a single 5M-row file is run for peak memory.

    python bench/bench_worker.py --out bench-results [--quick] [--rounds 3] [--baseline REF]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for examples/

import psutil

FEATURES = [f"f{i}" for i in range(32)]
KINDS = ("sklearn", "xgboost", "torch")
MODEL_FILES = {"sklearn": "model.joblib", "xgboost": "model.json", "torch": "model.pt"}
VARIANTS = ("sequential", "naive", "shardline", "compute", "io")
COMPUTE_SAMPLE_ROWS = 400_000

# The synthetic models' features in training order (examples.synthetic.feature_names()): most record no names.
TRAINED = ",".join(f"f{i}" for i in range(32))


# -- the variants, each run in its own subprocess ----------------------------------------


def load_model(kind: str, path: str):
    if kind == "sklearn":
        import joblib

        return joblib.load(path)
    if kind == "xgboost":
        import xgboost

        return xgboost.Booster(model_file=path)
    import torch

    return torch.jit.load(path)


def predict(kind: str, model, x):
    if kind == "sklearn":
        return model.predict(x)
    if kind == "xgboost":
        return model.inplace_predict(x)
    import torch

    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy().ravel()


def pandas_file(kind: str, model, src: str, dst: str) -> int:
    """The common starting point: whole file through pandas, predict, to_parquet."""
    import pandas as pd

    df = pd.read_parquet(src)
    x = df[FEATURES].to_numpy(dtype="float32")
    df[["id"]].assign(prediction=predict(kind, model, x)).to_parquet(dst)
    return len(df)


def naive_task(kind: str, model_path: str, src: str, dst: str) -> int:
    return pandas_file(kind, load_model(kind, model_path), src, dst)


def variant_sequential(kind, model_path, files, out):
    model = load_model(kind, model_path)
    return sum(pandas_file(kind, model, f, str(Path(out) / Path(f).name)) for f in files)


def variant_naive(kind, model_path, files, out):
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        futures = [pool.submit(naive_task, kind, model_path, f, str(Path(out) / Path(f).name)) for f in files]
        return sum(f.result() for f in futures)


def _ceiling_worker(args):
    """One process per core: load untimed, wait at the barrier, then time only the work."""
    mode, kind, model_path, files, out, barrier = args
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"  # before any model library initialises its thread pool
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    pa.set_cpu_count(1)
    if mode == "compute":
        import torch

        torch.set_num_threads(1)
        model = load_model(kind, model_path)
        if kind == "xgboost":
            model.set_param({"nthread": 1})
        # A rate needs no more than a sample: each configuration predicts COMPUTE_SAMPLE_ROWS rows.
        arrays, loaded = [], 0
        for f in files:
            arrays.append(pq.read_table(f, columns=FEATURES).to_pandas().to_numpy(dtype="float32"))
            loaded += len(arrays[-1])
            if loaded >= COMPUTE_SAMPLE_ROWS:
                break
        arrays = [np.ascontiguousarray(np.concatenate(arrays)[:COMPUTE_SAMPLE_ROWS])]
        # The ceiling is the best this process can do: every layout and batch size is tried, and
        # the fastest counts. (Tree ensembles in scikit-learn prefer column-major float64.)
        layouts = {"C": arrays}
        if kind == "sklearn":
            layouts["F"] = [np.asfortranarray(x, dtype=np.float64) for x in arrays]
        timings = {}
        for layout, xs in layouts.items():
            for batch in (4096, 16384, 65536, None):
                barrier.wait()
                started = time.perf_counter()
                rows = 0
                for x in xs:
                    step = batch or len(x)
                    for i in range(0, len(x), step):
                        rows += len(predict(kind, model, x[i : i + step]))
                timings[f"{layout}/{batch or 'file'}"] = time.perf_counter() - started
        return rows, timings
    barrier.wait()
    started = time.perf_counter()
    rows = 0
    for f in files:
        pf = pq.ParquetFile(f)
        writer = None
        for batch in pf.iter_batches(batch_size=65536, columns=["id", *FEATURES], use_threads=False):
            x = np.empty((batch.num_rows, len(FEATURES)), dtype=np.float32)
            for j, name in enumerate(FEATURES):
                x[:, j] = batch.column(name).to_numpy()
            out_batch = pa.record_batch(
                [batch.column("id"), pa.array(np.full(batch.num_rows, 0.5))], names=["id", "prediction"]
            )
            if writer is None:
                writer = pq.ParquetWriter(str(Path(out) / Path(f).name), out_batch.schema, use_dictionary=False)
            writer.write_batch(out_batch)
            rows += batch.num_rows
        writer.close()
    return rows, time.perf_counter() - started


def variant_ceiling(mode, kind, model_path, files, out):
    import multiprocessing as mp

    workers = os.cpu_count()
    ctx = mp.get_context("spawn")
    barrier = ctx.Manager().Barrier(workers)
    shares = [files[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        results = list(pool.map(_ceiling_worker, [(mode, kind, model_path, s, out, barrier) for s in shares]))
    rows = sum(r for r, _ in results)
    if mode == "io":
        return rows, max(t for _, t in results)
    # Processes ran each configuration in lockstep (barrier); the best configuration counts.
    configs = results[0][1].keys()
    return rows, min(max(timings[c] for _, timings in results) for c in configs)


def run_variant_inline(argv):
    """Entry point of a variant subprocess: prints {"rows", "seconds"} as JSON."""
    variant, kind, model_path, data, out = argv
    files = sorted(str(p) for p in Path(data).glob("*.parquet"))
    started = time.perf_counter()
    if variant in ("compute", "io"):
        rows, seconds = variant_ceiling(variant, kind, model_path, files, out)
    else:
        rows = {"sequential": variant_sequential, "naive": variant_naive}[variant](kind, model_path, files, out)
        seconds = time.perf_counter() - started
    print(json.dumps({"rows": rows, "seconds": seconds}))


# -- the harness --------------------------------------------------------------------------


def run_measured(command: list[str], env: dict | None = None, memory: str | None = "rss") -> dict:
    """Run a command; wall time from launch to exit, and the peak memory of its whole process tree.

    ``memory``: "rss" sums RSS every 20 ms (pages shared by forked workers counted in each); "pss" sums PSS
    every 100 ms (each shared page split among its processes: what the tree really holds), and also keeps the
    largest single process's; None samples nothing. The sampler costs about 9% of a core at 20 ms, so a run
    set against ceilings that run unobserved is timed with None."""
    peak = largest = 0
    stop = threading.Event()
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )

    def size(process: psutil.Process) -> int:
        return process.memory_full_info().pss if memory == "pss" else process.memory_info().rss

    def sample():
        nonlocal peak, largest
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                sizes = [size(p) for p in [root, *root.children(recursive=True)] if p.is_running()]
                peak, largest = max(peak, sum(sizes)), max([largest, *sizes])
            except psutil.Error:
                pass
            stop.wait(0.1 if memory == "pss" else 0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    if memory:
        sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - started
    stop.set()
    if memory:
        sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{stderr[-3000:]}")
    return {"wall": wall, "peak_rss": peak, "peak_largest": largest, "stdout": stdout, "stderr": stderr}


def run_one(
    variant: str,
    kind: str,
    model_path: Path,
    data: Path,
    scratch: Path,
    extra: list[str] = (),
    baseline_src: Path | None = None,
    env: dict | None = None,
    memory: str | None = "rss",
) -> dict:
    out = Path(tempfile.mkdtemp(dir=scratch))
    if variant in ("shardline", "baseline"):
        module = "shardline.worker"
        if variant == "baseline":  # an older commit's worker: before the src/ layout it was `shardline_worker`
            old_layout = not (baseline_src / "src" / "shardline" / "worker").is_dir()
            env = {**(env or {}), "PYTHONPATH": str(baseline_src / ("inference_container" if old_layout else "src"))}
            module = "shardline_worker" if old_layout else module
        launched = time.time()
        command = [
            sys.executable,
            "-m",
            module,
            "--input-dir",
            str(data),
            "--output-dir",
            str(out),
            "--model-dir",
            str(model_path.parent),
            "--passthrough",
            "id",
            "--features",
            TRAINED,
            "--host",
            "bench",
            "--scratch-dir",
            str(scratch / "model"),
            "--summary-json",
            str(out / "summary.json"),
            "--progress-interval",
            "3600",
            *extra,
        ]
        measured = run_measured(command, env, memory)
        summary = json.loads((out / "summary.json").read_text())
        rows, work_seconds = summary["rows_out"], measured["wall"]
        result = {
            "rows": rows,
            "seconds": work_seconds,
            "startup": summary["startup_seconds"],
            "worker_seconds": summary["seconds"],
        }
        breakdown = summary.get("startup")  # absent from workers before the breakdown existed
        if isinstance(breakdown, dict) and breakdown.get("first_prediction_at"):
            result["breakdown"] = breakdown
            result["first_prediction_s"] = breakdown["first_prediction_at"] - launched
    else:
        measured = run_measured(
            [sys.executable, __file__, "_variant", variant, kind, str(model_path), str(data), str(out)]
        )
        result = json.loads(measured["stdout"].strip().splitlines()[-1])
    subprocess.run(["rm", "-rf", str(out)], check=True)
    result.update(
        rate=result["rows"] / result["seconds"],
        peak_rss=measured["peak_rss"],
        peak_largest=measured["peak_largest"],
        wall=measured["wall"],
    )
    return result


def prepare(out: Path, files: int, rows: int) -> tuple[Path, dict[str, Path]]:
    from examples import synthetic

    data = out / f"data-{files}x{rows}"
    marker = data / "_READY"
    if not marker.exists():
        print(f"generating {files} parquet files, {rows:,} rows ...", flush=True)
        synthetic.make_dataset(data, files=files, rows=rows)
        marker.write_text("ok")
    models = {}
    for kind in KINDS:
        path = out / "models" / kind / MODEL_FILES[kind]
        if not path.exists():
            print(f"training {kind} ...", flush=True)
            synthetic.TRAINERS[kind](path.parent)
        models[kind] = path
    return data, models


def round_order(variants: Sequence[str], round_no: int) -> list[str]:
    """The variants of one round. With a baseline, the two workers run back to back, each first in every other
    round: a worker run right after the naive pool (a gigabyte of processes just ended) ran up to a fifth slower
    here than one run after the light I/O ceiling, and that is the machine, not the worker."""
    order = [v for v in variants if v != "baseline"]
    if "baseline" in variants:
        at = order.index("shardline")
        order[at : at + 1] = ["shardline", "baseline"] if round_no % 2 else ["baseline", "shardline"]
    return order


def checkout(ref: str, scratch: Path) -> Path:
    """A detached worktree of ``ref``, for the baseline worker."""
    root = Path(__file__).resolve().parents[1]
    dest = scratch / f"baseline-{ref.replace('/', '_')}"
    subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "--detach", "--force", str(dest), ref],
        check=True,
        capture_output=True,
    )
    return dest


def fmt_rate(r: float) -> str:
    return f"{r / 1e6:.2f}M" if r >= 1e6 else f"{r / 1e3:.0f}k" if r >= 1e4 else f"{r:,.0f}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_variant":
        run_variant_inline(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--quick", action="store_true", help="fewer rows and one round (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument("--only-startup", action="store_true", help="just the start-up section")
    parser.add_argument(
        "--only-uploads",
        action="store_true",
        help="just per-file uploads to the embedded endpoint against local files only (both with the ledger)",
    )
    parser.add_argument("--baseline", metavar="REF", help="also time the worker of this git commit, interleaved")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="shardline-bench-"))
    files, rows = (16, 400_000) if args.quick else (16, 6_400_000)
    rounds = args.rounds or (1 if args.quick else 3)
    kinds = args.kinds.split(",")
    data, models = prepare(args.out, files, rows)
    variants = VARIANTS + (("baseline",) if args.baseline else ())
    baseline_src = checkout(args.baseline, scratch) if args.baseline else None
    print(
        f"machine: {os.cpu_count()} cores; data: {files} files, {rows:,} rows, 32 float32 features + id; "
        f"{rounds} round(s), interleaved",
        flush=True,
    )

    if args.only_uploads:
        report = uploads_section(models, kinds, data, scratch, rounds=rounds)
        (args.out / "bench_uploads.json").write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.out / 'bench_uploads.json'}")
        return 0
    if args.only_startup:
        report = startup_section(
            args.out, models, kinds, scratch, baseline_src, args.baseline, rounds=rounds, quick=args.quick
        )
        report["large_tarball"] = tarball_section(
            args.out, scratch, baseline_src, args.baseline, rounds=rounds, quick=args.quick
        )
        (args.out / "bench_startup.json").write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.out / 'bench_startup.json'}")
        if baseline_src is not None:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(baseline_src)], check=False, capture_output=True
            )
        return 0
    results: dict[str, dict[str, list[dict]]] = {k: {v: [] for v in variants} for k in kinds}
    for round_no in range(1, rounds + 1):
        for kind in kinds:
            for variant in round_order(variants, round_no):
                r = run_one(variant, kind, models[kind], data, scratch, baseline_src=baseline_src)
                results[kind][variant].append(r)
                print(
                    f"  round {round_no} {kind:8s} {variant:10s} {fmt_rate(r['rate']):>7s} rows/s "
                    f"peak RSS {r['peak_rss'] / 2**20:,.0f} MiB",
                    flush=True,
                )

    table = []
    for kind in kinds:
        med = {v: statistics.median(r["rate"] for r in results[kind][v]) for v in variants}
        rss = {v: max(r["peak_rss"] for r in results[kind][v]) for v in variants}
        startup = statistics.median(r["startup"] for r in results[kind]["shardline"])
        steady = statistics.median(r["rows"] / (r["seconds"] - r["startup"]) for r in results[kind]["shardline"])
        ceiling = 1 / (1 / med["compute"] + 1 / med["io"])
        table.append(
            {
                "model": kind,
                **{f"{v}_rows_per_s": round(med[v]) for v in variants},
                "pipeline_ceiling_rows_per_s": round(ceiling),
                "shardline_vs_ceiling": round(med["shardline"] / ceiling, 3),
                "shardline_steady_vs_ceiling": round(steady / ceiling, 3),
                "shardline_vs_naive": round(med["shardline"] / med["naive"], 3),
                "shardline_vs_sequential": round(med["shardline"] / med["sequential"], 3),
                "shardline_startup_s": round(startup, 3),
                **{f"{v}_peak_rss_mib": round(rss[v] / 2**20) for v in variants},
            }
        )
        if args.baseline:
            # Paired: each round's two workers ran back to back, so the machine's drift cancels within a pair.
            pairs = [
                a["rate"] / b["rate"]
                for a, b in zip(results[kind]["shardline"], results[kind]["baseline"], strict=True)
                if b["rate"]
            ]
            table[-1]["shardline_vs_baseline"] = round(statistics.median(pairs), 3)
            table[-1]["shardline_vs_baseline_rounds"] = [round(p, 3) for p in pairs]

    print("\nrows/s end to end (median of rounds); ratios from the same run")
    header = (
        f"{'model':8s} {'seq':>7s} {'naive':>7s} {'shardln':>7s} {'compute':>8s} {'io':>7s} {'ceiling':>8s}"
        f" {'vs ceil':>8s} {'steady':>7s} {'vs naive':>9s} {'startup':>8s} {'RSS MiB':>8s}"
    )
    print(header)
    for row in table:
        print(
            f"{row['model']:8s} {fmt_rate(row['sequential_rows_per_s']):>7s} {fmt_rate(row['naive_rows_per_s']):>7s}"
            f" {fmt_rate(row['shardline_rows_per_s']):>7s} {fmt_rate(row['compute_rows_per_s']):>8s}"
            f" {fmt_rate(row['io_rows_per_s']):>7s} {fmt_rate(row['pipeline_ceiling_rows_per_s']):>8s}"
            f" {row['shardline_vs_ceiling']:>7.2f}x {row['shardline_steady_vs_ceiling']:>6.2f}x"
            f" {row['shardline_vs_naive']:>8.2f}x {row['shardline_startup_s']:>7.2f}s"
            f" {row['shardline_peak_rss_mib']:>8d}"
        )
    print(
        "  vs ceil: shardline end to end (startup included) / pipeline ceiling; steady: the same with the "
        "worker's pool start + model load taken out"
    )
    for row in table if args.baseline else ():
        print(
            f"  {row['model']}: this worker {fmt_rate(row['shardline_rows_per_s'])} rows/s, the worker of "
            f"{args.baseline} {fmt_rate(row['baseline_rows_per_s'])}: {row['shardline_vs_baseline']:.2f}x (the median "
            f"of the rounds' paired ratios: {', '.join(f'{p:.2f}' for p in row['shardline_vs_baseline_rounds'])})"
        )

    startup_report = None
    if not args.skip_startup:
        startup_report = startup_section(
            args.out, models, kinds, scratch, baseline_src, args.baseline, rounds=rounds, quick=args.quick
        )
        startup_report["large_tarball"] = tarball_section(
            args.out, scratch, baseline_src, args.baseline, rounds=rounds, quick=args.quick
        )
    report = {
        "machine_cores": os.cpu_count(),
        "files": files,
        "rows": rows,
        "rounds": rounds,
        "table": table,
        "startup": startup_report,
        "raw": {
            k: {v: [{x: y for x, y in r.items()} for r in rs] for v, rs in vs.items()} for k, vs in results.items()
        },
    }
    if not args.skip_memory:
        report["memory"] = memory_run(args.out, models, kinds, scratch, 1_000_000 if args.quick else 5_000_000)
    if not args.skip_sweep:
        report["sweep"] = sweep(args.out, models, data, scratch, quick=args.quick)
    (args.out / "bench_worker.json").write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out / 'bench_worker.json'}")
    if baseline_src is not None:
        subprocess.run(["git", "worktree", "remove", "--force", str(baseline_src)], check=False, capture_output=True)
    subprocess.run(["rm", "-rf", str(scratch)], check=True)
    return 0


STARTUP_TARGETS = {"sklearn": 1.0, "xgboost": 0.5, "torch": 1.0}  # launch to first prediction, seconds
# When each start-up stage ended, in seconds from the worker's launch (its summary's "startup"): the stages
# overlap (the forkserver imports while the main process prepares), so each is a time, not a length.
STAGES = ("main_s", "loader_started_s", "library_imported_s", "model_loaded_s", "workers_ready_s")


# The floor of a cold start: a fresh interpreter that does only what a first prediction needs, each stage timed
# from the launch. "library" imports the model's library (as the worker does: XGBoost without scikit-learn) and
# loads the model; "serial" also imports pyarrow first and reads and predicts one first batch (65,536 rows), in
# the one process. Whatever the design, the process that predicts must at least import the library and load the
# model, so "library" bounds any cold worker's first prediction from below.
FLOOR_SCRIPT = """
import sys, time
kind, model_path, data_file, serial = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
if serial:
    import numpy as np
    import pyarrow.parquet as pq
    arrow_at = time.time()
if kind == "sklearn":
    import joblib, sklearn
    imported_at = time.time()
    model = joblib.load(model_path)
elif kind == "xgboost":
    sys.modules["sklearn"] = None  # as the worker imports it
    import xgboost
    del sys.modules["sklearn"]
    imported_at = time.time()
    model = xgboost.Booster(model_file=model_path)
    model.set_param({"nthread": 1})
else:
    import torch
    torch.set_num_threads(1)
    imported_at = time.time()
    model = torch.jit.load(model_path)
loaded_at = time.time()
first_at = None
if serial:
    batch = next(pq.ParquetFile(data_file).iter_batches(batch_size=65536, columns=[f"f{i}" for i in range(32)]))
    x = np.column_stack([c.to_numpy() for c in batch.columns]).astype("float32")
    if kind == "xgboost":
        model.inplace_predict(x)
    elif kind == "torch":
        with torch.inference_mode():
            model(torch.from_numpy(x))
    else:
        model.predict(x)
    first_at = time.time()
import json
print(json.dumps([imported_at, loaded_at, first_at]))
"""


def floor_run(kind: str, model_path: Path, data: Path, serial: bool) -> dict:
    """One cold process doing only what a first prediction needs (FLOOR_SCRIPT); seconds from its launch."""
    first_file = sorted(data.glob("*.parquet"))[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    launched = time.time()
    done = subprocess.run(
        [sys.executable, "-c", FLOOR_SCRIPT, kind, str(model_path), str(first_file), "1" if serial else "0"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    imported_at, loaded_at, first_at = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "imported_s": imported_at - launched,
        "loaded_s": loaded_at - launched,
        "first_prediction_s": first_at - launched if first_at else None,
    }


def print_stages(rows) -> None:
    """rows: (model, method, breakdown, first prediction from launch, target or None)."""
    print(
        "\nwhere the start-up goes: when each stage ended, median seconds from launch. main: the main process "
        "reached the pool; loader: our code began where the model loads (the forkserver, or each spawned "
        "worker); import: the model's library imported; load: the model loaded; ready: every worker ready"
    )
    print(
        f"{'model':16s} {'method':7s} {'main':>6s} {'loader':>7s} {'import':>7s} {'load':>6s} {'ready':>6s} "
        f"{'first pred':>11s} {'target':>7s}"
    )
    for model, method, b, first, target in rows:
        cells = " ".join(
            f"{b[stage]:{w}.2f}" if b.get(stage) is not None else f"{'-':>{w}s}"
            for stage, w in zip(STAGES, (6, 7, 7, 6, 6), strict=True)
        )
        print(f"{model:16s} {method:7s} {cells} {first:10.2f}s " + (f"{target:6.1f}s" if target else f"{'':>7s}"))


def large_tarball_model(out: Path) -> Path:
    """A large scikit-learn model (a random forest of ~150 MB) delivered as SageMaker delivers one: model.tar.gz.

    Start-up then holds real work for the main process (the tarball's sha256, its unpacking), which a
    forkserver started first thing overlaps with the library's import; the bench's small models hide that.
    """
    dest = out / "models" / "sklearn-large-tarball" / "model.tar.gz"
    if dest.exists():
        return dest
    import tarfile

    import joblib
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    print("training a large random forest and packing it as model.tar.gz ...", flush=True)
    rng = np.random.default_rng(0)
    x = rng.random((60_000, len(FEATURES)), dtype=np.float32)
    y = x[:, 0] * 3 + x[:, 1] * x[:, 2] + rng.random(60_000)
    model = RandomForestRegressor(n_estimators=30, n_jobs=os.cpu_count(), random_state=0).fit(x, y)
    loose = dest.parent / "loose"
    loose.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, loose / "model.joblib")
    with tarfile.open(dest.with_suffix(".partial"), "w:gz", compresslevel=1) as archive:
        archive.add(loose / "model.joblib", arcname="model.joblib")
    (loose / "model.joblib").unlink()
    loose.rmdir()
    dest.with_suffix(".partial").rename(dest)
    return dest


def tarball_section(
    out: Path, scratch: Path, baseline_src: Path | None, baseline_ref: str | None, *, rounds: int, quick: bool
) -> dict:
    """First prediction and wall time with a large model in a model.tar.gz: auto, spawn and the baseline."""
    tarball = large_tarball_model(out)
    files, rows = (8, 400_000) if quick else (8, 1_600_000)
    data, _ = prepare(out, files, rows)
    variants = ["spawn", "auto"] + (["baseline"] if baseline_src else [])
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    size = tarball.stat().st_size / 2**20
    print(
        f"\nstart-up with a large model: a {size:,.0f} MiB model.tar.gz (scikit-learn random forest), {files} files, "
        f"{rows:,} rows; {rounds} round(s), interleaved"
    )
    for round_no in range(1, rounds + 1):
        for variant in variants:
            extra = ["--start-method", variant] if variant != "baseline" else []
            r = run_one(
                "shardline" if variant != "baseline" else "baseline",
                "sklearn",
                tarball,
                data,
                scratch,
                extra,
                baseline_src=baseline_src,
            )
            runs[variant].append(r)
            print(
                f"  round {round_no} {variant:8s} wall {r['wall']:.2f}s, first prediction "
                f"{r.get('first_prediction_s', float('nan')):.2f}s",
                flush=True,
            )
    summary = {"tarball_mib": round(size, 1), "files": files, "rows": rows, "rounds": rounds}
    for variant in variants:
        summary[f"{variant}_wall_s"] = round(statistics.median(r["wall"] for r in runs[variant]), 3)
        firsts = [r["first_prediction_s"] for r in runs[variant] if "first_prediction_s" in r]
        summary[f"{variant}_first_prediction_s"] = round(statistics.median(firsts), 3) if firsts else None
        if variant != "baseline":
            summary[f"{variant}_breakdown"] = {
                stage: statistics.median(r["breakdown"][stage] for r in runs[variant]) for stage in STAGES
            }
    print_stages(
        [
            ("sklearn tarball", v, summary[f"{v}_breakdown"], summary[f"{v}_first_prediction_s"], None)
            for v in ("spawn", "auto")
        ]
    )
    print(
        f"{'':16s} "
        + "  ".join(
            f"{v}: wall {summary[f'{v}_wall_s']:.2f}s, first prediction {summary[f'{v}_first_prediction_s']:.2f}s"
            for v in variants
        )
    )
    if baseline_ref:
        print(f"  baseline: the worker of {baseline_ref}")
    return summary


def startup_section(
    out: Path,
    models,
    kinds,
    scratch: Path,
    baseline_src: Path | None,
    baseline_ref: str | None,
    *,
    rounds: int,
    quick: bool,
) -> dict:
    """Start-up, and what it costs end to end, on a set small enough for start-up to matter.

    One run, interleaved round by round, per model kind: the pipeline ceiling's two halves
    (compute, io), the worker with --start-method spawn (every worker imports and loads on its
    own: the design before the forkserver), the worker as it ships (auto), and with --baseline the
    worker of that commit. Printed: where the start-up went, launch to first prediction against
    its target, and each variant's end-to-end rate as a fraction of the pipeline ceiling.
    """
    files, rows = (8, 400_000) if quick else (8, 1_600_000)
    data, _ = prepare(out, files, rows)
    variants = ["compute", "io", "spawn", "auto"] + (["baseline"] if baseline_src else [])
    found: dict[str, dict[str, list[dict]]] = {k: {v: [] for v in variants} for k in kinds}
    floors: dict[str, dict[str, list[dict]]] = {k: {"library": [], "serial": []} for k in kinds}
    print(f"\nstart-up: {files} files, {rows:,} rows; {rounds} round(s), interleaved")
    for round_no in range(1, rounds + 1):
        for kind in kinds:
            for variant in variants:
                if variant in ("spawn", "auto"):
                    r = run_one("shardline", kind, models[kind], data, scratch, ["--start-method", variant])
                else:
                    r = run_one(variant, kind, models[kind], data, scratch, baseline_src=baseline_src)
                found[kind][variant].append(r)
                first = f", first prediction {r['first_prediction_s']:.2f}s" if "first_prediction_s" in r else ""
                print(f"  round {round_no} {kind:8s} {variant:8s} {fmt_rate(r['rate']):>7s} rows/s{first}", flush=True)
            for floor in ("library", "serial"):
                f = floor_run(kind, models[kind], data, serial=floor == "serial")
                floors[kind][floor].append(f)
                first = f", first prediction {f['first_prediction_s']:.2f}s" if f["first_prediction_s"] else ""
                print(
                    f"  round {round_no} {kind:8s} floor {floor}: library imported {f['imported_s']:.2f}s, model "
                    f"loaded {f['loaded_s']:.2f}s{first}",
                    flush=True,
                )

    def med(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    table = []
    for kind in kinds:
        runs = found[kind]
        ceiling = 1 / (
            1 / statistics.median(r["rate"] for r in runs["compute"])
            + 1 / statistics.median(r["rate"] for r in runs["io"])
        )
        row = {
            "model": kind,
            "pipeline_ceiling_rows_per_s": round(ceiling),
            "first_prediction_target_s": STARTUP_TARGETS[kind],
        }
        for variant in [v for v in variants if v not in ("compute", "io")]:
            rate = statistics.median(r["rate"] for r in runs[variant])
            row[f"{variant}_rows_per_s"] = round(rate)
            row[f"{variant}_vs_ceiling"] = round(rate / ceiling, 3)
            if variant in ("spawn", "auto"):
                row[f"{variant}_first_prediction_s"] = med(r.get("first_prediction_s") for r in runs[variant])
                row[f"{variant}_breakdown"] = {
                    stage: med(r["breakdown"].get(stage) for r in runs[variant]) for stage in STAGES
                }
        table.append(row)

    print_stages(
        [
            (
                row["model"],
                variant,
                row[f"{variant}_breakdown"],
                row[f"{variant}_first_prediction_s"],
                row["first_prediction_target_s"],
            )
            for row in table
            for variant in ("spawn", "auto")
        ]
    )
    floor_table = {
        kind: {floor: {stage: med(f[stage] for f in runs) for stage in runs[0]} for floor, runs in floors[kind].items()}
        for kind in kinds
    }
    print(
        "\nthe floor of a cold start: a fresh interpreter doing only what a first prediction needs, median "
        "seconds from launch. library: import the model's library, load the model (what the predicting process "
        "cannot skip, whatever the design); serial: import pyarrow too, then read and predict one 65,536-row batch"
    )
    print(f"{'model':8s} {'library: import':>16s} {'load':>6s} {'serial: first pred':>19s} {'target':>7s}")
    for kind in kinds:
        lib, ser = floor_table[kind]["library"], floor_table[kind]["serial"]
        print(
            f"{kind:8s} {lib['imported_s']:15.2f}s {lib['loaded_s']:5.2f}s {ser['first_prediction_s']:18.2f}s "
            f"{STARTUP_TARGETS[kind]:6.1f}s"
        )
    print(f"\nend to end on {files} files, {rows:,} rows, as a fraction of the pipeline ceiling (target >= 0.9x)")
    others = [v for v in variants if v not in ("compute", "io")]
    print(f"{'model':8s} {'ceiling':>8s} " + " ".join(f"{v:>14s}" for v in others))
    for row in table:
        print(
            f"{row['model']:8s} {fmt_rate(row['pipeline_ceiling_rows_per_s']):>8s} "
            + " ".join(f"{fmt_rate(row[f'{v}_rows_per_s']):>7s} {row[f'{v}_vs_ceiling']:5.2f}x" for v in others)
        )
    if baseline_ref:
        print(f"  baseline: the worker of {baseline_ref}")
    return {
        "files": files,
        "rows": rows,
        "rounds": rounds,
        "table": table,
        "floor": floor_table,
        "raw": {k: {v: [{x: y for x, y in r.items()} for r in rs] for v, rs in vs.items()} for k, vs in found.items()},
    }


def uploads_section(models, kinds, data: Path, scratch: Path, *, rounds: int) -> list[dict]:
    """The worker as a pipeline runs it (the ledger on the embedded moto_server), with each output uploaded to S3
    as its file finishes, against the same run keeping its outputs as local files; interleaved, in one run."""
    import uuid

    from shardline.ledger.table import create_ledger_table
    from shardline.local.embedded_aws import apply_env, embedded_aws

    print(
        "\nuploads: per-file uploads to the embedded endpoint vs local files only (both write the ledger), and "
        "uploads through the job's grant proxy, as a local job makes them"
    )
    rows = []
    with embedded_aws(scratch / "moto.log") as aws:
        import boto3

        apply_env(aws)  # this process's clients too (the ledger table)
        table, bucket = f"bench-{uuid.uuid4().hex[:8]}", f"bench-uploads-{uuid.uuid4().hex[:8]}"
        create_ledger_table(table, "us-east-1", aws["AWS_ENDPOINT_URL"])
        boto3.client("s3", endpoint_url=aws["AWS_ENDPOINT_URL"], region_name="us-east-1").create_bucket(Bucket=bucket)
        modes = ("local", "uploads", "grant")
        measured: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in kinds}
        for round_no in range(1, rounds + 1):
            for kind in kinds:
                # The order rotates every round, so a machine that speeds up or slows down over the run (a
                # neighbour's load, a cache warming) weighs on every mode alike.
                for mode in modes[round_no % 3 :] + modes[: round_no % 3]:
                    run_id = f"{kind}-{mode}-{round_no}"
                    proxy = _grant_proxy(aws, table, bucket, run_id) if mode == "grant" else None
                    endpoint = {"AWS_ENDPOINT_URL": proxy.url} if proxy else {}
                    env = {
                        **aws,
                        **endpoint,
                        "SHARDLINE_LEDGER_TABLE": table,
                        "SHARDLINE_PIPELINE": "bench",
                        "SHARDLINE_RUN_ID": run_id,
                        "SHARDLINE_STEP": "score",
                        "SHARDLINE_ATTEMPT": "1",
                        "SHARDLINE_INPUT_URI": f"s3://{bucket}/in",
                        # Without an s3:// output URI the worker keeps its outputs as local files.
                        "SHARDLINE_OUTPUT_URI": f"s3://{bucket}/out/{run_id}" if mode == "uploads" else "",
                    }
                    try:
                        r = run_one("shardline", kind, models[kind], data, scratch, env=env)
                    finally:
                        if proxy:
                            proxy.__exit__(None, None, None)
                    measured[kind][mode].append(r["rate"])
                    print(f"  round {round_no} {kind:8s} {mode:8s} {fmt_rate(r['rate']):>7s} rows/s", flush=True)
        for kind in kinds:
            local = statistics.median(measured[kind]["local"])
            uploads = statistics.median(measured[kind]["uploads"])
            granted = statistics.median(measured[kind]["grant"])
            through = sorted(g / u for g, u in zip(measured[kind]["grant"], measured[kind]["uploads"], strict=True))
            # Each round's two runs ran back to back: their ratio cancels what the machine did meanwhile.
            paired = sorted(u / lo for u, lo in zip(measured[kind]["uploads"], measured[kind]["local"], strict=True))
            rows.append(
                {
                    "model": kind,
                    "local_rows_per_s": round(local),
                    "uploads_rows_per_s": round(uploads),
                    "ratio": round(uploads / local, 3),
                    "paired_ratio_median": round(statistics.median(paired), 3),
                    "paired_ratios": [round(r, 3) for r in paired],
                    "grant_rows_per_s": round(granted),
                    "grant_vs_uploads_paired_median": round(statistics.median(through), 3),
                }
            )
            print(
                f"uploads: {kind} local files only {fmt_rate(local)} rows/s, per-file uploads "
                f"{fmt_rate(uploads)} rows/s: {uploads / local:.2f}x (median of {rounds}); round by round "
                f"{statistics.median(paired):.2f}x (median; {paired[0]:.2f}-{paired[-1]:.2f})"
            )
            print(
                f"uploads: {kind} through the job's grant proxy {fmt_rate(granted)} rows/s: round by round "
                f"{statistics.median(through):.2f}x the direct uploads (median; {through[0]:.2f}-{through[-1]:.2f})"
            )
    return rows


def _grant_proxy(aws: dict, table: str, bucket: str, run_id: str):
    """The grant proxy a local job's instances reach AWS through, for one bench run (started)."""
    from shardline.grant.job import JobGrant, JobScope
    from shardline.grant.proxy import GrantProxy

    scope = JobScope(
        "bench", table, "us-east-1", f"s3://{bucket}/in", f"s3://{bucket}/model/m.tar.gz", f"s3://{bucket}/out/{run_id}"
    )
    upstream = aws["AWS_ENDPOINT_URL"]
    return GrantProxy(JobGrant.of(scope), {"s3": upstream, "dynamodb": upstream}).__enter__()


def memory_run(out: Path, models, kinds, scratch: Path, rows: int) -> list[dict]:
    from examples import synthetic

    data = out / f"data-single-{rows}"
    if not (data / "_READY").exists():
        print(f"\ngenerating one parquet file of {rows:,} rows ...", flush=True)
        synthetic.make_dataset(data, files=1, rows=rows)
        (data / "_READY").write_text("ok")
    print(f"\npeak RSS of the whole process tree, one {rows:,}-row parquet file (limit 1.5 GiB):")
    found = []
    for kind in kinds:
        r = run_one("shardline", kind, models[kind], data, scratch)
        found.append(
            {
                "model": kind,
                "rows": r["rows"],
                "peak_rss_mib": round(r["peak_rss"] / 2**20),
                "rows_per_s": round(r["rate"]),
            }
        )
        print(f"  {kind:8s} {r['peak_rss'] / 2**30:.2f} GiB  {fmt_rate(r['rate'])} rows/s", flush=True)
    return found


def sweep(out: Path, models, data: Path, scratch: Path, quick: bool) -> list[dict]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = [4096, 16384, 65536, 262144] if not quick else [16384, 65536]
    workers = [1, 2]
    points = []
    print("\nsweep: shardline worker, xgboost, batch rows x workers")
    for w in workers:
        for b in batches:
            r = run_one(
                "shardline", "xgboost", models["xgboost"], data, scratch, ["--batch-rows", str(b), "--workers", str(w)]
            )
            points.append(
                {
                    "workers": w,
                    "batch_rows": b,
                    "rows_per_s": round(r["rate"]),
                    "peak_rss_mib": round(r["peak_rss"] / 2**20),
                }
            )
            print(
                f"  workers {w} batch {b:>7d}: {fmt_rate(r['rate'])} rows/s, peak RSS {r['peak_rss'] / 2**20:,.0f} MiB",
                flush=True,
            )
    fig, ax = plt.subplots(figsize=(6, 4))
    for w in workers:
        xs = [p["batch_rows"] for p in points if p["workers"] == w]
        ys = [p["rows_per_s"] / 1e6 for p in points if p["workers"] == w]
        ax.plot(xs, ys, marker="o", label=f"{w} worker(s)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows per record batch")
    ax.set_ylabel("M rows/s, end to end")
    ax.set_title("shardline worker, XGBoost: batch size x workers")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "sweep_batch_workers.png", dpi=110)
    print(f"  plot: {out / 'sweep_batch_workers.png'}")
    return points


if __name__ == "__main__":
    raise SystemExit(main())
