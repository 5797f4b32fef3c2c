"""The compiled-trees row of `make bench`: do compiled tree libraries beat the libraries' own predict?

For the bench's XGBoost booster and scikit-learn HistGradientBoosting model, on 200,000 of the bench's rows:

  equal      the candidate's probabilities against the library's own, all rows and again with NaN in some
             features (the worker passes a missing value as NaN): max |diff|, target <= 1e-6
  predict    one thread, batches of 65,536 rows (the worker's), the library's own and the candidate alternated
             in one process, median of 5 repeats; the ratio is the figure (absolute rates are noisy)
  import     the candidate's import and conversion (the worker would pay them once per job, at start-up)
  end to end what the worker would gain on parquet input, from the share predict has of a file's time (timed
             here through the worker's own read and conversion) and its start-up (timed by running it), at 1.6M
             and 6.4M rows on this machine's cores

Candidates: oneDAL (daal4py, from scikit-learn-intelex) and treelite + tl2cgen (compiled with gcc). Their
packages are not the project's dependencies: `make bench` installs them into build/bench-compiled-libs
(bench/requirements-compiled.txt) and runs this with that folder on PYTHONPATH.

    python bench/bench_compiled.py --out bench-results
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_worker import FEATURES, MODEL_FILES, fmt_rate

ROWS, BATCH, REPEATS = 200_000, 65_536, 5
ROOT = Path(__file__).resolve().parents[1]


def prepare(out: Path) -> tuple[Path, dict[str, Path]]:
    """The bench's data and its XGBoost and scikit-learn models, made as bench_worker.py makes them (its own
    `prepare` trains a torch model too, and this venv has no torch)."""
    from examples import synthetic

    data = out / "data-8x1600000"
    if not (data / "_READY").exists():
        synthetic.make_dataset(data, files=8, rows=1_600_000)
        (data / "_READY").write_text("ok")
    models = {}
    for kind in ("xgboost", "sklearn"):
        models[kind] = out / "models" / kind / MODEL_FILES[kind]
        if not models[kind].exists():
            synthetic.TRAINERS[kind](models[kind].parent)
    return data, models


def load_rows(data: Path) -> tuple:
    """The first file's first 200k rows as the worker reads them (and how long reading and converting took)."""
    import numpy as np
    import pyarrow.parquet as pq

    from shardline.worker.io.formats import to_matrix

    source = pq.ParquetFile(sorted(data.glob("*.parquet"))[0])
    started = time.perf_counter()
    batches = list(source.iter_batches(batch_size=BATCH, columns=FEATURES, use_threads=False))
    x = np.concatenate([to_matrix(b, FEATURES, np.dtype(np.float32), "C") for b in batches])[:ROWS]
    read_s = time.perf_counter() - started
    rng = np.random.default_rng(0)
    with_nan = x.copy()
    for column in (0, 5, 11, 20, 31):
        with_nan[rng.random(len(x)) < 0.1, column] = np.nan
    with_nan[:100] = np.nan
    return x, with_nan, read_s


def import_seconds(module: str) -> float:
    """How long a fresh interpreter that has numpy takes to import ``module``."""
    code = f"import time, numpy; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def in_batches(predict, x):
    import numpy as np

    return np.concatenate(
        [np.asarray(predict(x[i : i + BATCH]), dtype=np.float64).ravel() for i in range(0, len(x), BATCH)]
    )


def timed(own, candidate, x) -> tuple[float, float]:
    """rows/s of each, alternated within every repeat (order flipped each time), medians."""
    batches = [x[i : i + BATCH] for i in range(0, len(x), BATCH)]
    seconds: dict[str, list[float]] = {"own": [], "candidate": []}
    for repeat in range(REPEATS):
        pair = [("own", own), ("candidate", candidate)]
        for name, predict in pair if repeat % 2 == 0 else pair[::-1]:
            started = time.perf_counter()
            for batch in batches:
                predict(batch)
            seconds[name].append(time.perf_counter() - started)
    return len(x) / statistics.median(seconds["own"]), len(x) / statistics.median(seconds["candidate"])


def own_models(models: dict) -> dict:
    import joblib
    from threadpoolctl import threadpool_limits

    from shardline.worker.model.loading import import_xgboost_without_sklearn

    threadpool_limits(1)
    booster = import_xgboost_without_sklearn().Booster(model_file=str(models["xgboost"]))
    booster.set_param({"nthread": 1})
    forest = joblib.load(models["sklearn"])
    return {"xgboost": (booster, booster.inplace_predict), "sklearn": (forest, lambda b: forest.predict_proba(b)[:, 1])}


def onedal(kind: str, model):
    import daal4py

    started = time.perf_counter()
    daal4py.daalinit(1)  # its thread pool (TBB) follows neither OMP_NUM_THREADS nor threadpoolctl
    if kind == "sklearn":  # oneDAL has no converter of its own for HistGradientBoosting: through treelite's
        import treelite

        model = treelite.sklearn.import_model(model)
    converted = daal4py.mb.convert_model(model)
    return (lambda b: converted.predict_proba(b)[:, 1]), time.perf_counter() - started


def tl2cgen_compiled(kind: str, model, scratch: Path):
    import tl2cgen
    import treelite

    started = time.perf_counter()
    tree_model = treelite.frontend.from_xgboost(model) if kind == "xgboost" else treelite.sklearn.import_model(model)
    library = scratch / f"{kind}.so"
    tl2cgen.export_lib(tree_model, toolchain="gcc", libpath=str(library), params={"parallel_comp": 2})
    predictor = tl2cgen.Predictor(str(library), nthread=1)
    dtype = "float32" if kind == "xgboost" else "float64"

    def predict(b):
        return predictor.predict(tl2cgen.DMatrix(b.astype(dtype, copy=False))).reshape(len(b), -1)[:, -1]

    return predict, time.perf_counter() - started


def worker_startup(python: str, data: Path, model: Path, scratch: Path) -> float:
    """Seconds from the worker's launch to its workers being ready (its start-up summary), median of 3 runs of
    one small file, by ``python``: the project's own venv, which has what the worker needs."""
    import pyarrow.parquet as pq

    small = scratch / "startup-in"
    small.mkdir()
    pq.write_table(pq.read_table(sorted(data.glob("*.parquet"))[0]).slice(0, 1000), small / "part.parquet")
    seconds = []
    for run in range(3):
        out = scratch / f"startup-out-{run}"
        command = [python, "-m", "shardline.worker", "--input-dir", str(small), "--output-dir", str(out)]
        command += ["--model-dir", str(model.parent), "--passthrough", "id", "--features", ",".join(FEATURES)]
        command += ["--scratch-dir", str(scratch / "model"), "--summary-json", str(out / "summary.json")]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        subprocess.run(command, check=True, capture_output=True, env=env)
        seconds.append(json.loads((out / "summary.json").read_text())["startup"]["workers_ready_s"])
    return statistics.median(seconds)


def end_to_end(share: float, speedup: float, own_rate: float, fixed_s: float, rows: int, startup: float) -> float:
    """The worker's projected gain on ``rows`` rows: its time per row is ``share`` predict, on every core, plus
    its ``startup``; the candidate cuts predict by ``speedup`` and adds its import and conversion (``fixed_s``)."""
    cores = os.cpu_count() or 1
    per_row = 1 / own_rate / share  # seconds of a file's time per row, one core
    own = startup + rows * per_row / cores
    candidate = startup + fixed_s + rows * per_row * (1 - share + share / speedup) / cores
    return own / candidate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument(
        "--worker-python", default=str(ROOT / ".venv" / "bin" / "python"), help="runs the worker to time its start-up"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data, models = prepare(args.out)
    import numpy as np

    x, with_nan, read_s = load_rows(data)
    scratch = Path(tempfile.mkdtemp(prefix="shardline-bench-compiled-"))
    own = own_models(models)
    startup = worker_startup(args.worker_python, data, models["xgboost"], scratch)
    imports = {"oneDAL": import_seconds("daal4py"), "tl2cgen": import_seconds("tl2cgen, treelite")}
    candidates = {"oneDAL": onedal, "tl2cgen": lambda k, m: tl2cgen_compiled(k, m, scratch)}
    rows = []
    for kind, (model, own_predict) in own.items():
        if kind == "sklearn":  # the worker's layout for scikit-learn: float64, column-major (each gets the same)
            x, with_nan = (np.asarray(m, dtype=np.float64, order="F") for m in (x, with_nan))
        started = time.perf_counter()
        in_batches(own_predict, x)
        predict_s = time.perf_counter() - started
        share = predict_s / (predict_s + read_s)  # of reading, converting and predicting a parquet file
        for name, build in candidates.items():
            try:
                predict, converted = build(kind, model)
            except Exception as err:  # noqa: BLE001 - a candidate that cannot take this model is a row that says so
                rows.append({"model": kind, "candidate": name, "error": f"{type(err).__name__}: {err}"[:200]})
                continue
            diff = float(abs(in_batches(predict, x) - in_batches(own_predict, x)).max())
            diff_nan = float(abs(in_batches(predict, with_nan) - in_batches(own_predict, with_nan)).max())
            own_rate, rate = timed(own_predict, predict, x)
            imported = imports[name]
            fixed = imported + converted
            rows.append(
                {
                    "model": kind,
                    "candidate": name,
                    "max_abs_diff": diff,
                    "max_abs_diff_nan_rows": diff_nan,
                    "equal": diff <= 1e-6 and diff_nan <= 1e-6,
                    "own_rows_per_s": round(own_rate),
                    "rows_per_s": round(rate),
                    "predict_ratio": round(rate / own_rate, 2),
                    "import_s": round(imported, 2),
                    "convert_s": round(converted, 2),
                    "predict_share_parquet": round(share, 2),
                    "end_to_end_1_6m": round(
                        end_to_end(share, rate / own_rate, own_rate, fixed, 1_600_000, startup), 2
                    ),
                    "end_to_end_6_4m": round(
                        end_to_end(share, rate / own_rate, own_rate, fixed, 6_400_000, startup), 2
                    ),
                }
            )
    print(f"\ncompiled trees, one thread, {ROWS:,} rows, batches of {BATCH:,}, medians of {REPEATS} (target: >= 1.3x")
    print(f"end to end with predictions equal within 1e-6; projected with the worker's start-up, {startup:.2f}s here)")
    print(
        f"{'model':8s} {'candidate':9s} {'max|diff|':>10s} {'NaN rows':>9s} {'own':>7s} {'compiled':>8s}"
        f" {'predict':>8s} {'import+conv':>11s} {'e2e 1.6M':>9s} {'e2e 6.4M':>9s}"
    )
    for row in rows:
        if "error" in row:
            print(f"{row['model']:8s} {row['candidate']:9s} cannot: {row['error']}")
            continue
        print(
            f"{row['model']:8s} {row['candidate']:9s} {row['max_abs_diff']:>10.1e}"
            f" {row['max_abs_diff_nan_rows']:>9.1e} {fmt_rate(row['own_rows_per_s']):>7s}"
            f" {fmt_rate(row['rows_per_s']):>8s} {row['predict_ratio']:>7.2f}x"
            f" {row['import_s'] + row['convert_s']:>10.2f}s {row['end_to_end_1_6m']:>8.2f}x"
            f" {row['end_to_end_6_4m']:>8.2f}x"
        )
    (args.out / "bench_compiled.json").write_text(json.dumps({"worker_startup_s": startup, "rows": rows}, indent=2))
    print(f"\nwrote {args.out / 'bench_compiled.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
