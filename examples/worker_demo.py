"""`make demo`: the worker end to end on generated data, on this machine.

Generates a dataset (24 parquet files, 1.2M rows), trains an XGBoost model, packs it as
model.tar.gz with its sha256 pinned, runs ``python -m shardline.worker`` on it with every
core, and prints a summary from the instance manifest. Everything lands under
``.shardline/demo`` (or ``--workdir``); a second run reuses the data and the model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from examples import private_folder, synthetic

FILES, ROWS = 24, 1_200_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.worker_demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, default=Path(".shardline/demo"))
    args = parser.parse_args(argv)
    work = private_folder(args.workdir.resolve())
    data, model_src, model_dir, out = work / "input", work / "model-src", work / "model", work / "output"

    step("1/4", f"dataset: {FILES} parquet files, {ROWS:,} rows, 32 float features + id")
    if len(list(data.glob("*.parquet"))) != FILES:
        synthetic.make_dataset(data, files=FILES, rows=ROWS)
    step("2/4", "model: XGBoost, 100 trees of depth 6, packed as model.tar.gz")
    synthetic.train_xgboost(model_src)
    sha = synthetic.pack(model_src, model_dir / "model.tar.gz")
    print(f"      sha256 {sha} (pinned with --model-sha256)")

    step("3/4", "running: python -m shardline.worker (progress and summary lines below)")
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
        "--model-sha256",
        sha,
        "--passthrough",
        "id",
        "--host",
        "algo-1",
        "--scratch-dir",
        str(work / "scratch"),
        "--progress-interval",
        "2",
    ]
    print("      " + " ".join(command[1:]))
    started = time.monotonic()
    code = subprocess.run(command, check=False).returncode
    wall = time.monotonic() - started

    step("4/4", "summary (from the instance manifest)")
    manifest = json.loads((out / "_shardline" / "manifest-algo-1.json").read_text())
    sample = pq.read_table(out / manifest["file_reports"][0]["output"]).slice(0, 3).to_pylist()
    rows = [
        ("files", f"{manifest['files']} ({manifest['succeeded']} succeeded, {manifest['failed']} failed)"),
        ("rows in / out", f"{manifest['rows_in']:,} / {manifest['rows_out']:,}"),
        (
            "throughput",
            f"{manifest['rows_per_second']:,.0f} rows/s over {manifest['seconds']:.1f}s (process wall {wall:.1f}s)",
        ),
        ("workers", f"{len(manifest['workers'])} x {manifest['workers'][0]['threads']} thread(s)"),
        ("model", f"{manifest['model']['kind']} sha256 {manifest['model']['sha256'][:16]}..."),
        ("output", str(out)),
        ("sample rows", json.dumps(sample)),
        ("exit code", str(code)),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    if code != 0:
        print("the worker did not succeed; read its log lines above", file=sys.stderr)
    return code


def step(n: str, text: str) -> None:
    print(f"[{n}] {text}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
