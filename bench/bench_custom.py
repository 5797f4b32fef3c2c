"""Custom ``inference.py`` throughput (`make bench`): what SageMaker-style code costs next to the built-in path.

One model (the benchmark's scikit-learn HistGradientBoosting), one data set (1M rows over 8
parquet files, 32 float32 features + id), every variant a whole `python -m shardline.worker`
run timed from launch to exit, interleaved round by round:

  builtin        the model file itself (no script): the reference
  csv-multi      text/csv numpy script (np.loadtxt, predict_proba, one line per prediction), multi-record
  csv-single     the same script, one record per call (Batch Transform's SingleRecord), on the first
                 --single-rows rows of the set (default 100k: at ~1k rows/s on 2 cores the whole
                 million takes a quarter of an hour; pass --single-rows 1000000 for all of it)
  json-multi     application/json pandas script (records keyed by name -> DataFrame), {"predictions": [...]}
  predict-only   a script with model_fn and predict_fn only: no body is serialised at all

Each custom variant's predictions are compared with the built-in path's on one file (they must be equal).

    python bench/bench_custom.py --out bench-results [--quick] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for examples/

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_worker import TRAINED, fmt_rate, run_measured

CSV_SCRIPT = """
    import io
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, content_type):
        return np.loadtxt(io.StringIO(request_body), delimiter=",", ndmin=2)


    def predict_fn(data, model):
        return model.predict_proba(data)[:, 1]


    def output_fn(prediction, accept):
        return "\\n".join(repr(v) for v in prediction.tolist()) + "\\n"
"""

JSON_SCRIPT = """
    import json
    import os

    import joblib
    import pandas as pd

    FEATURES = [f"f{i}" for i in range(32)]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, content_type):
        return pd.DataFrame(json.loads(request_body))[FEATURES]


    def predict_fn(frame, model):
        return model.predict_proba(frame.to_numpy())[:, 1]


    def output_fn(prediction, accept):
        return json.dumps({"predictions": prediction.tolist()}), "application/json"
"""

PREDICT_ONLY_SCRIPT = """
    import os

    import joblib


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def predict_fn(data, model):
        return model.predict_proba(data)[:, 1]
"""

VARIANTS = {
    "builtin": (None, ["--probabilities"]),
    "csv-multi": (CSV_SCRIPT, []),
    "csv-single": (CSV_SCRIPT, ["--batch-strategy", "single-record"]),
    "json-multi": (JSON_SCRIPT, ["--content-type", "application/json"]),
    "predict-only": (PREDICT_ONLY_SCRIPT, []),
}


def model_dirs(root: Path, model_file: Path) -> dict[str, Path]:
    dirs = {}
    for name, (script, _) in VARIANTS.items():
        d = root / f"model-{name}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(model_file, d / "model.joblib")
        if script:
            (d / "code").mkdir(exist_ok=True)
            (d / "code" / "inference.py").write_text(textwrap.dedent(script))
        dirs[name] = d
    return dirs


def subset(data: Path, rows: int) -> Path:
    """The first ``rows`` rows of the set, as files of the same names (for the slow single-record run)."""
    dest = data.parent / f"{data.name}-first-{rows}"
    if (dest / "_READY").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    left = rows
    for path in sorted(data.glob("*.parquet")):
        if left <= 0:
            break
        table = pq.read_table(path)
        pq.write_table(table.slice(0, left), dest / path.name)
        left -= min(left, table.num_rows)
    (dest / "_READY").write_text("ok")
    return dest


def run(name: str, model_dir: Path, data: Path, scratch: Path) -> dict:
    out = Path(tempfile.mkdtemp(dir=scratch))
    command = [
        sys.executable,
        "-m",
        "shardline.worker",
        "--input-dir",
        str(data),
        "--output-dir",
        str(out),
        "--model-dir",
        str(model_dir),
        "--passthrough",
        "id",
        "--host",
        "bench",
        "--features",
        TRAINED,
        "--scratch-dir",
        str(scratch / "model"),
        "--summary-json",
        str(out / "summary.json"),
        "--progress-interval",
        "3600",
        *VARIANTS[name][1],
    ]
    measured = run_measured(command)
    summary = json.loads((out / "summary.json").read_text())
    first = sorted(data.glob("*.parquet"))[0].name
    table = pq.read_table(out / first)
    column = "proba_1" if name == "builtin" else "prediction"
    predictions = table.column(column).to_numpy()
    shutil.rmtree(out)
    return {
        "rows": summary["rows_out"],
        "failed": summary["failed"],
        "seconds": measured["wall"],
        "startup": summary["startup_seconds"],
        "rate": summary["rows_out"] / measured["wall"],
        "peak_rss": measured["peak_rss"],
        "first_file": predictions,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--quick", action="store_true", help="100k rows, one round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--single-rows", type=int, default=100_000, help="rows of the single-record run")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated subset to run (builtin always runs: it is the reference)",
    )
    args = parser.parse_args()
    from examples import synthetic

    args.out.mkdir(parents=True, exist_ok=True)
    rows = 100_000 if args.quick else 1_000_000
    rounds = args.rounds or (1 if args.quick else 2)
    data = args.out / f"custom-data-{rows}"
    if not (data / "_READY").exists():
        synthetic.make_dataset(data, files=8, rows=rows)
        (data / "_READY").write_text("ok")
    model_file = args.out / "models" / "sklearn" / "model.joblib"
    if not model_file.exists():
        synthetic.train_sklearn(model_file.parent)
    scratch = Path(tempfile.mkdtemp(prefix="shardline-bench-custom-"))
    dirs = model_dirs(scratch, model_file)
    single_rows = min(rows, args.single_rows)
    inputs = {name: data for name in VARIANTS}
    inputs["csv-single"] = data if single_rows == rows else subset(data, single_rows)
    print(
        f"machine: {os.cpu_count()} cores; {rows:,} rows in 8 parquet files; scikit-learn HistGradientBoosting; "
        f"{rounds} round(s), interleaved",
        flush=True,
    )
    chosen = ["builtin", *(v for v in args.variants.split(",") if v in VARIANTS and v != "builtin")]
    results: dict[str, list[dict]] = {name: [] for name in chosen}
    for round_no in range(1, rounds + 1):
        for name in chosen:
            r = run(name, dirs[name], inputs[name], scratch)
            results[name].append(r)
            print(
                f"  round {round_no} {name:12s} {fmt_rate(r['rate']):>7s} rows/s  {r['seconds']:6.1f}s  "
                f"startup {r['startup']:.2f}s",
                flush=True,
            )
    reference = results["builtin"][0]["first_file"]
    table = []
    builtin_rate = statistics.median(r["rate"] for r in results["builtin"])
    for name, runs in results.items():
        rate = statistics.median(r["rate"] for r in runs)
        # The single-record run reads the first rows of the same files: compare those rows.
        worst = max(float(np.max(np.abs(r["first_file"] - reference[: len(r["first_file"])]))) for r in runs)
        expected = single_rows if name == "csv-single" else rows
        assert all(r["rows"] == expected and r["failed"] == 0 for r in runs), f"{name}: not every row was written"
        assert worst <= 1e-12, f"{name}: predictions differ from the built-in path by {worst}"
        table.append(
            {
                "variant": name,
                "rows": expected,
                "rows_per_s": round(rate),
                "vs_builtin": round(rate / builtin_rate, 3),
                "startup_s": round(statistics.median(r["startup"] for r in runs), 2),
                "max_abs_diff_vs_builtin": worst,
                "peak_rss_mib": round(max(r["peak_rss"] for r in runs) / 2**20),
            }
        )
    print(
        f"\n{'variant':12s} {'rows':>9s} {'rows/s':>8s} {'vs builtin':>10s} {'startup':>8s} {'RSS MiB':>8s}"
        "  same predictions"
    )
    for row in table:
        print(
            f"{row['variant']:12s} {row['rows']:>9,d} {fmt_rate(row['rows_per_s']):>8s} {row['vs_builtin']:>9.2f}x "
            f"{row['startup_s']:>7.2f}s {row['peak_rss_mib']:>8d}  max |diff| {row['max_abs_diff_vs_builtin']:.1e}"
        )
    by_name = {r["variant"]: r for r in table}
    if "csv-single" in by_name and "csv-multi" in by_name:
        ratio = by_name["csv-multi"]["rows_per_s"] / by_name["csv-single"]["rows_per_s"]
        print(f"  text/csv script: multi-record {ratio:.1f}x single-record")
    suffix = "" if len(chosen) == len(VARIANTS) else "-" + "-".join(chosen)
    report = {"rows": rows, "single_rows": single_rows, "rounds": rounds, "table": table}
    (args.out / f"bench_custom{suffix}.json").write_text(json.dumps(report, indent=2))
    print(f"wrote the table to {args.out}")
    shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
