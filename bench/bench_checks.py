"""What a step's output checks cost at its end: 1,000 files' profiles read from their manifests' JSON, merged, and
every kind of check evaluated against 7 earlier partitions. docs/checks.md quotes the figure.

    .venv/bin/python bench/bench_checks.py [--files 1000] [--rows 50000] [--rounds 5]

Each file's profile is made the way the worker makes it (report/profile.py, from the predictions and one input
feature), then stored as the manifest stores it (JSON); the timed part is what the step's end does with them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from shardline.report.checks import Partition, evaluate
from shardline.report.profile import Profile
from shardline.spec.checks import ChecksSpec

CHECKS = ChecksSpec(
    rows_out={"at_least": 1, "within": 0.5},
    columns={
        "prediction": {"min": 0, "max": 1, "max_nan_share": 0, "min_distinct": 2, "mean_within": 0.2},
        "label": {"class_share_within": 0.1, "max_null_share": 0},
    },
    features={"f0": {"max_null_share": 0.01, "max_psi": 0.2}},
)


def file_profile(rng: np.random.Generator, rows: int) -> dict:
    """One file's profile as its manifest stores it: a probability, a 0/1 label and a float feature."""
    profile = Profile()
    profile.files = 1
    probability = rng.beta(2.0, 5.0, rows).astype(np.float32)
    profile.column("outputs", "prediction", "numbers").add_numbers(probability, 0)
    profile.column("outputs", "label", "numbers").add_numbers((probability > 0.5).astype(np.int64), 0)
    profile.column("inputs", "f0", "numbers").add_numbers(rng.standard_normal(rows).astype(np.float32), 0)
    return json.loads(json.dumps(profile.to_dict()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=50_000, help="rows per file")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    stored = [file_profile(rng, args.rows) for _ in range(args.files)]
    history = [
        Partition(f"run-{i}", args.files * args.rows, Profile.merged(Profile.from_dict(p) for p in stored[:50]))
        for i in range(7)
    ]
    size = sum(len(json.dumps(p)) for p in stored) / len(stored)
    timings = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        files = {f"part-{i:05d}.parquet": Profile.from_dict(p) for i, p in enumerate(stored)}
        merged = Profile.merged(files.values())
        results = evaluate(CHECKS, Partition("now", args.files * args.rows, merged), history, files)
        timings.append(time.perf_counter() - started)
    assert merged.files == args.files and len(results) >= 10
    print(
        f"checks: {args.files:,} files' profiles ({size / 1024:.1f} KiB of JSON each, {args.rows:,} rows each) read, "
        f"merged and {len(results)} checks evaluated in {statistics.median(timings):.2f}s "
        f"(median of {args.rounds}; min {min(timings):.2f}s, max {max(timings):.2f}s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
