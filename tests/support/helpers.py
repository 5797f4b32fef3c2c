"""Helpers shared by the test modules: run the real worker, read real outputs, check them.

Nothing here replaces a part of Shardline: the worker runs as a subprocess, exactly as
a processing job runs it, and outputs are read back with pyarrow from disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from examples import synthetic

HOST = "test-host"
FEATURES = synthetic.feature_names()
# The synthetic models' training order, as a user names it for a model that records no feature names.
FEATURES_ARG = ",".join(FEATURES)
# The worker options for the synthetic datasets: the id passed through, the features named in training order.
SYNTHETIC_COLUMNS = ("--passthrough", "id", "--features", FEATURES_ARG)
WORKER = [sys.executable, "-m", "shardline.worker"]
# Environment that would change what the worker does; stripped so the developer's shell cannot leak in.
_SCRUB_PREFIXES = ("SHARDLINE_", "AWS_", "CUDA_VISIBLE_DEVICES")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def worker_command(
    input_dir: Path,
    output_dir: Path,
    model_dir: Path,
    *args: str,
    scratch: Path | None = None,
    host: str = HOST,
    workers: int | None = 2,
) -> list[str]:
    """The worker's command line; ``workers=None`` leaves the worker count to the worker itself."""
    scratch = scratch or output_dir.parent / f"{output_dir.name}-scratch"
    # Later options win in argparse, so callers may override defaults in args.
    return [
        *WORKER,
        "--input-dir",
        str(input_dir),
        "--output-dir",
        str(output_dir),
        "--model-dir",
        str(model_dir),
        "--host",
        host,
        "--scratch-dir",
        str(scratch),
        "--progress-interval",
        "1",
        *(["--workers", str(workers)] if workers is not None else []),
        *args,
    ]


def run_worker(
    input_dir: Path,
    output_dir: Path,
    model_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    host: str = HOST,
    workers: int | None = 2,
) -> subprocess.CompletedProcess:
    """Run ``python -m shardline.worker`` to completion and return its result (stderr holds the log)."""
    return subprocess.run(
        worker_command(input_dir, output_dir, model_dir, *args, host=host, workers=workers),
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def describe(result: subprocess.CompletedProcess) -> str:
    """A failure message with the worker's log, so a red test says why."""
    return f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


def load_manifest(output_dir: Path, host: str = HOST, attempt: int | None = None) -> dict:
    """An instance's manifest: per attempt in a pipeline (with a ledger), else the standalone one."""
    from shardline.worker.job.summary import manifest_path

    return json.loads(manifest_path(output_dir / "_shardline", host, attempt).read_text())


def reports_by_input(manifest: dict) -> dict[str, dict]:
    return {r["input"]: r for r in manifest["file_reports"]}


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def fmt_of(path: Path) -> tuple[str, bool]:
    name = path.name.lower()
    gz = name.endswith(".gz")
    if gz:
        name = name[:-3]
    for suffix, fmt in ((".parquet", "parquet"), (".csv", "csv"), (".jsonl", "jsonl")):
        if name.endswith(suffix):
            return fmt, gz
    raise ValueError(f"not a data file: {path}")


def read_table(path: Path, float_columns: Sequence[str] = ()) -> pa.Table:
    """Read a parquet / CSV / JSON lines file (optionally gzipped) with pyarrow.

    ``float_columns`` are read as float64 from text formats, the way the worker reads features.
    """
    fmt, gz = fmt_of(path)
    if fmt == "parquet":
        if gz:
            with pa.input_stream(str(path), compression="gzip") as stream:
                return pq.read_table(pa.BufferReader(stream.read()))
        return pq.read_table(path)
    with pa.input_stream(str(path), compression="gzip" if gz else None) as stream:
        if fmt == "csv":
            return pacsv.read_csv(
                stream, convert_options=pacsv.ConvertOptions(column_types={c: pa.float64() for c in float_columns})
            )
        data = stream.read()
    if not data.strip():
        return pa.table({})
    schema = pajson.read_json(pa.BufferReader(data)).schema
    explicit = pa.schema([pa.field(f.name, pa.float64() if f.name in float_columns else f.type) for f in schema])
    return pajson.read_json(pa.BufferReader(data), parse_options=pajson.ParseOptions(explicit_schema=explicit))


def feature_matrix(table: pa.Table, features: Sequence[str] = FEATURES, dtype=np.float64) -> np.ndarray:
    return np.column_stack([table.column(name).to_numpy(zero_copy_only=False).astype(dtype) for name in features])


# -- the reference models' own predictions, computed in the test process -----------------------------------


def sklearn_predict(model_path: Path) -> Callable[[pa.Table], np.ndarray]:
    import joblib

    model = joblib.load(model_path)
    return lambda table: model.predict(feature_matrix(table, dtype=np.float64))


def xgboost_predict(model_path: Path) -> Callable[[pa.Table], np.ndarray]:
    import xgboost

    booster = xgboost.Booster(model_file=str(model_path))
    return lambda table: booster.inplace_predict(feature_matrix(table, dtype=np.float32))


def torch_predict(model_path: Path) -> Callable[[pa.Table], np.ndarray]:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated, still what Shardline loads
        model = torch.jit.load(str(model_path))
    model.eval()

    def predict(table: pa.Table) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(feature_matrix(table, dtype=np.float32))).numpy()[:, 0]

    return predict


# -- output checks -----------------------------------------------------------------------------------------


def check_outputs(
    input_dir: Path,
    output_dir: Path,
    manifest: dict,
    predict: Callable[[pa.Table], np.ndarray],
    *,
    passthrough: Sequence[str] = ("id",),
    expected_output: Callable[[str], str] = lambda rel: rel,
    rtol: float = 1e-6,
    atol: float = 0.0,
    exact: bool = False,
    only: Sequence[str] | None = None,
) -> None:
    """Every input under ``input_dir`` has one correct output, listed in the manifest with its checksum.

    Correct means: same relative path (or ``expected_output(rel)``), the passthrough columns equal to
    the input's, one prediction per row, each equal to ``predict`` on the same features.
    ``only`` restricts the check to some inputs (the others are expected to have failed).
    """
    reports = reports_by_input(manifest)
    inputs = sorted(p.relative_to(input_dir).as_posix() for p in input_dir.rglob("*") if p.is_file())
    assert inputs, f"no inputs under {input_dir}"
    assert sorted(reports) == inputs, "the manifest must list every input file exactly once"
    if only is not None:
        inputs = sorted(only)
    for rel in inputs:
        report = reports[rel]
        assert report["status"] == "SUCCEEDED", report
        assert report["output"] == expected_output(rel)
        out_path = output_dir / report["output"]
        assert out_path.is_file(), out_path
        assert report["sha256"] == sha256_file(out_path), f"manifest sha256 of {rel} does not match the file"
        assert report["bytes_out"] == out_path.stat().st_size
        source = read_table(input_dir / rel, float_columns=FEATURES)
        result = read_table(out_path)
        assert result.num_rows == source.num_rows == report["rows_in"] == report["rows_out"], rel
        assert result.column_names == [*passthrough, "prediction"], result.column_names
        for name in passthrough:
            assert result.column(name).to_pylist() == source.column(name).to_pylist(), f"{rel}: {name} changed"
        if source.num_rows == 0:
            continue  # nothing to predict (and scikit-learn refuses empty input)
        got = result.column("prediction").to_numpy(zero_copy_only=False)
        want = np.asarray(predict(source))
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=rel)
        else:
            np.testing.assert_allclose(
                got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, err_msg=rel
            )


def no_temp_files(output_dir: Path) -> list[Path]:
    return sorted(output_dir.rglob("*.shardline-tmp"))


def write_inference_script(model_dir: Path, source: str) -> Path:
    """Write a SageMaker-style ``code/inference.py`` into ``model_dir``."""
    path = model_dir / "code" / "inference.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def makespan(shards) -> int:
    """Bytes on the busiest instance of a deal (lists of S3Objects): what the step's wall time follows."""
    return max((sum(o.size for o in shard) for shard in shards), default=0)


def shard_sk_prefix(step: str) -> str:
    """The sort-key prefix of a step's SHARD items, for tests that read them straight from the table."""
    from shardline.ledger.keys import step_sk

    return f"{step_sk(step)}SHARD#"
