"""Where one core's time goes for a gzipped CSV in and out: decompress, parse, to float32, predict, write.

Each stage alone on one 200,000-row file (32 float32 features and an id), one thread, best of 3, as CPU seconds
(docs/benchmarks.md, "Text inputs"). It makes its own file and XGBoost model under --work unless they are there.

    python bench/text_stages.py [--work bench-results/text-stages]
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for examples/

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

FEATURES = [f"f{i}" for i in range(32)]
ROWS = 200_000


def timed(label: str, fn, rows: int = ROWS):
    best = None
    for _ in range(3):
        cpu = time.process_time()
        result = fn()
        spent = time.process_time() - cpu
        best = spent if best is None else min(best, spent)
    print(f"{label:58s} {best:6.3f} CPU s  {rows / best / 1e3:7.0f}k rows per CPU-s", flush=True)
    return result


def prepare(work: Path) -> tuple[Path, Path]:
    from examples import synthetic

    data, model = work / "data", work / "model" / "model.json"
    source = data / "part-00000.csv.gz"
    if not source.exists():
        synthetic.make_dataset(data / "parquet", files=1, rows=ROWS)
        table = pq.read_table(next((data / "parquet").glob("*.parquet")))
        with pa.CompressedOutputStream(str(source), "gzip") as out:
            pacsv.write_csv(table, out)
    if not model.exists():
        synthetic.TRAINERS["xgboost"](model.parent)
    return source, model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("bench-results/text-stages"))
    args = parser.parse_args()
    source, model_path = prepare(args.work)
    pa.set_cpu_count(1)
    import xgboost as xgb

    from shardline.worker.io.json_lines import batch_lines

    raw = source.read_bytes()
    text = timed("gzip decompress (zlib)", lambda: zlib.decompress(raw, 31))
    read = pacsv.ReadOptions(use_threads=False, block_size=1 << 20)
    typed = pacsv.ConvertOptions(column_types={name: pa.float32() for name in FEATURES})
    table = timed(
        "CSV parse to float32 (Arrow, 1 MiB blocks)",
        lambda: pacsv.read_csv(io.BytesIO(text), read, convert_options=typed),
    )
    timed("CSV parse, inferred types", lambda: pacsv.read_csv(io.BytesIO(text), read))

    def matrix():
        x = np.empty((table.num_rows, len(FEATURES)), dtype=np.float32)
        for j, name in enumerate(FEATURES):
            x[:, j] = table.column(name).to_numpy()
        return x

    x = timed("to a float32 matrix", matrix)
    booster = xgb.Booster()
    booster.load_model(str(model_path))
    booster.set_param({"nthread": 1})
    predictions = timed("XGBoost inplace_predict, 1 thread", lambda: booster.inplace_predict(x))
    out = pa.table({"id": table.column("id"), "prediction": pa.array(predictions)})

    def arrow_gzip():
        with pa.CompressedOutputStream(pa.BufferOutputStream(), "gzip") as stream:
            pacsv.write_csv(out, stream)

    def level_one():
        with gzip.GzipFile(fileobj=io.BytesIO(), mode="wb", compresslevel=1, mtime=0) as packed:
            pacsv.write_csv(out, pa.PythonFile(packed, mode="w"))

    timed("write id + prediction as csv.gz, Arrow's gzip (level 9)", arrow_gzip)
    timed("write id + prediction as csv.gz, zlib level 1 (the worker)", level_one)
    timed(
        "JSON lines through pandas to_json (15 digits)",
        lambda: out.to_pandas().to_json(orient="records", lines=True, double_precision=15),
    )
    batch = out.combine_chunks().to_batches()[0]
    timed("JSON lines through Arrow's kernels (the worker)", lambda: batch_lines(batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
