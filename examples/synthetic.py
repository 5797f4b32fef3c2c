"""Synthetic data and models for the demo, the tests and the benchmark.

    python -m examples.synthetic data   --out DIR [--files 16 --rows 3000000 --format parquet]
    python -m examples.synthetic models --out DIR [--kinds sklearn,xgboost,torch --tarball]

Rows hold an ``id`` (int64) and ``f0..f{n-1}`` float32 features. The label the models
learn is a fixed nonlinear function of the features, so predictions are meaningful.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

N_FEATURES = 32


def feature_names(n: int = N_FEATURES) -> list[str]:
    return [f"f{i}" for i in range(n)]


def _features(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    return rng.standard_normal((rows, n), dtype=np.float32)


def _label(x: np.ndarray) -> np.ndarray:
    score = x[:, 0] * 1.5 - x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + np.sin(x[:, 4])
    return (score > 0).astype(np.int64)


def make_table(rows: int, *, first_id: int = 0, n_features: int = N_FEATURES, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = _features(rng, rows, n_features)
    columns = {"id": pa.array(np.arange(first_id, first_id + rows, dtype=np.int64))}
    for j, name in enumerate(feature_names(n_features)):
        columns[name] = pa.array(x[:, j])
    return pa.table(columns)


def write_table(table: pa.Table, path: Path, fmt: str, *, row_group_rows: int = 65536) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    gz = path.name.endswith(".gz")
    if fmt == "parquet":
        with pa.output_stream(str(path), compression="gzip" if gz else None) as out:
            pq.write_table(table, out, row_group_size=row_group_rows, use_dictionary=["id"], compression="snappy")
    elif fmt == "csv":
        with pa.output_stream(str(path), compression="gzip" if gz else None) as out:
            pacsv.write_csv(table, out)
    elif fmt == "jsonl":
        with pa.output_stream(str(path), compression="gzip" if gz else None) as out:
            out.write(table.to_pandas().to_json(orient="records", lines=True).encode())
    else:
        raise ValueError(f"unknown format {fmt!r}")


def make_dataset(
    out: Path,
    *,
    files: int,
    rows: int,
    fmt: str = "parquet",
    gzip: bool = False,
    seed: int = 0,
    row_group_rows: int = 65536,
    sizes: list[int] | None = None,
) -> list[Path]:
    """Write ``rows`` rows over ``files`` files (or explicit per-file ``sizes``); ids are unique."""
    counts = sizes or [rows // files + (1 if i < rows % files else 0) for i in range(files)]
    suffix = {"parquet": ".parquet", "csv": ".csv", "jsonl": ".jsonl"}[fmt] + (".gz" if gzip else "")
    paths, first = [], 0
    for i, count in enumerate(counts):
        path = out / f"part-{i:05d}{suffix}"
        write_table(make_table(count, first_id=first, seed=seed + i), path, fmt, row_group_rows=row_group_rows)
        paths.append(path)
        first += count
    return paths


def training_data(rows: int = 20000, seed: int = 12345) -> tuple[np.ndarray, np.ndarray]:
    x = _features(np.random.default_rng(seed), rows, N_FEATURES)
    return x, _label(x)


def train_sklearn(dest: Path) -> Path:
    import joblib
    from sklearn.ensemble import HistGradientBoostingClassifier

    x, y = training_data()
    model = HistGradientBoostingClassifier(max_iter=100, random_state=0).fit(x, y)
    dest.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, dest / "model.joblib")
    return dest / "model.joblib"


def train_xgboost(dest: Path, *, broken: bool = False) -> Path:
    """The demo's XGBoost classifier; ``broken``: one trained on labels that are all 0 (a training job whose label
    column came through empty), which scores every row the same: what an output check must stop."""
    import xgboost

    x, y = training_data()
    if broken:
        y = np.zeros_like(y)
    booster = xgboost.train(
        {"objective": "binary:logistic", "max_depth": 6, "eta": 0.3, "nthread": 2},
        # Named, as a model trained on a DataFrame is: the worker then picks its columns by name.
        xgboost.DMatrix(x, label=y, feature_names=feature_names(x.shape[1])),
        num_boost_round=100,
    )
    dest.mkdir(parents=True, exist_ok=True)
    booster.save_model(dest / "model.json")
    return dest / "model.json"


def train_torch(dest: Path, epochs: int = 30) -> Path:
    import torch

    torch.manual_seed(0)
    x, y = training_data()
    model = torch.nn.Sequential(
        torch.nn.Linear(N_FEATURES, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
        torch.nn.Sigmoid(),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.float32)).unsqueeze(1)
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
    model.eval()
    dest.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(model), str(dest / "model.pt"))
    return dest / "model.pt"


TRAINERS = {"sklearn": train_sklearn, "xgboost": train_xgboost, "torch": train_torch}

# Platt scaling of a score's log-odds: calibrated = sigmoid(A * logit(p) + B). daily_churn's second step.
CALIBRATION = {"a": 0.8, "b": -0.1}
CALIBRATION_SCRIPT = """\
# Calibrates a churn probability (the score step's proba_1) by Platt scaling: sigmoid(a * logit(p) + b).
import io
import json
import os

import numpy as np


def model_fn(model_dir):
    with open(os.path.join(model_dir, "calibration.json")) as params:
        return json.load(params)


def input_fn(body, content_type):
    return np.loadtxt(io.StringIO(body), delimiter=",", ndmin=2)


def predict_fn(data, params):
    p = np.clip(data[:, 0], 1e-6, 1 - 1e-6)
    return 1.0 / (1.0 + np.exp(-(params["a"] * np.log(p / (1 - p)) + params["b"])))
"""


def calibrate(p: np.ndarray, params: dict = CALIBRATION) -> np.ndarray:
    """What the calibration model computes, for checking its outputs."""
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return 1.0 / (1.0 + np.exp(-(params["a"] * np.log(p / (1 - p)) + params["b"])))


def calibration_model(dest: Path, *, script: str = CALIBRATION_SCRIPT) -> Path:
    """daily_churn's calibration step: a SageMaker-style code/inference.py and its parameters (the folder)."""
    (dest / "code").mkdir(parents=True, exist_ok=True)
    (dest / "code" / "inference.py").write_text(script)
    (dest / "calibration.json").write_text(json.dumps(CALIBRATION))
    return dest


def pack(model_dir: Path, tarball: Path) -> str:
    """Pack a model directory as model.tar.gz (SageMaker's layout); return its sha256.

    Reproducible: the same files give the same bytes (no times, owners or modes from this machine), so a
    digest pinned in a spec names the content, whoever packed it and when.
    """
    import gzip

    from shardline.worker.model.loading import sha256_of

    tarball.parent.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(model_dir.rglob("*")):
            if path.is_file():
                info = tarfile.TarInfo(path.relative_to(model_dir).as_posix())
                info.size, info.mode, info.mtime = path.stat().st_size, 0o644, 0
                with path.open("rb") as body:
                    archive.addfile(info, body)
    tarball.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return sha256_of(tarball)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.synthetic", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="write a synthetic dataset")
    data.add_argument("--out", type=Path, required=True)
    data.add_argument("--files", type=int, default=16)
    data.add_argument("--rows", type=int, default=3_000_000)
    data.add_argument("--format", choices=["parquet", "csv", "jsonl"], default="parquet")
    data.add_argument("--gzip", action="store_true")
    data.add_argument("--row-group-rows", type=int, default=65536)
    models = sub.add_parser("models", help="train the reference models")
    models.add_argument("--out", type=Path, required=True)
    models.add_argument("--kinds", default="sklearn,xgboost,torch")
    models.add_argument("--tarball", action="store_true", help="also write <kind>/model.tar.gz + sha256")
    args = parser.parse_args(argv)
    if args.command == "data":
        paths = make_dataset(
            args.out,
            files=args.files,
            rows=args.rows,
            fmt=args.format,
            gzip=args.gzip,
            row_group_rows=args.row_group_rows,
        )
        print(f"wrote {args.rows:,} rows in {len(paths)} {args.format} file(s) under {args.out}")
        return 0
    shas = {}
    for kind in args.kinds.split(","):
        path = TRAINERS[kind](args.out / kind)
        if args.tarball:
            shas[kind] = pack(path.parent, args.out / f"{kind}-packed" / "model.tar.gz")
        print(f"trained {kind}: {path}", file=sys.stderr)
    if shas:
        print(json.dumps(shas, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
