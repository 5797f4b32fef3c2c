"""A step's reference profile, made once from a baseline file (``shardline checks baseline``): the predictions of a
validation set, say, that later partitions' PSI checks compare with (``checks.reference: baseline``).

The file is read batch by batch and profiled as the worker profiles a step's outputs (report/profile.py): every
column, so one file serves ``checks.columns.C.max_psi`` and ``checks.features.F.max_psi`` alike.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path

from shardline.errors import InvalidArgument
from shardline.ledger.baselines import read_baseline, write_baseline
from shardline.orchestration import services
from shardline.report.profile import Profile
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec

FORMATS = (".parquet", ".csv", ".jsonl", ".json")
BATCH_ROWS = 65_536


def make_baseline(spec: PipelineSpec, step: str, source: str, by: str) -> dict:
    """Profile ``source`` (an s3:// URI or a local path of a parquet, CSV or JSON lines file) and record it as
    ``step``'s reference. Returns what was recorded: ``profile``, ``source``, ``made_at``, ``made_by``, ``rows``."""
    spec.step(step)  # an unknown step is refused before anything is read
    name = source.rsplit("/", 1)[-1].lower()
    if not name.endswith(FORMATS):
        raise InvalidArgument(f"{source}: a baseline file is parquet, CSV or JSON lines ({', '.join(FORMATS)})")
    with tempfile.TemporaryDirectory(prefix="shardline-baseline-") as folder:
        path = Path(source)
        if source.startswith("s3://"):
            bucket, key = parse_s3_uri(source)
            path = Path(folder) / name
            services.s3_client(spec).download_file(bucket, key, str(path))
        elif not path.is_file():
            raise InvalidArgument(f"{source}: no such file (give an s3:// URI or a local path)")
        profile = profile_file(path)
    if not profile.outputs:
        raise InvalidArgument(f"{source} has no rows to make a baseline of")
    rows = next(iter(profile.outputs.values())).rows
    baseline = {
        "profile": profile.to_dict(),
        "source": source,
        "made_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "made_by": by,
        "rows": rows,
    }
    write_baseline(services.ledger_model(spec), spec.pipeline, step, baseline)
    return baseline


def profile_file(path: Path) -> Profile:
    """Every column of the file, counted batch by batch (as output columns: a feature's PSI looks there too)."""
    profile = Profile()
    profile.files = 1
    for batch in _batches(path):
        for column_name, column in zip(batch.schema.names, batch.columns, strict=True):
            profile.add_column("outputs", column_name, column)
    return profile


def _batches(path: Path):
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        yield from pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS)
    elif name.endswith(".csv"):
        import pyarrow.csv as pacsv

        yield from pacsv.open_csv(path)
    else:
        import pyarrow.json as pajson

        yield from pajson.read_json(path).to_batches(max_chunksize=BATCH_ROWS)


def baseline_of(spec: PipelineSpec, step: str) -> tuple[Profile | None, str | None]:
    """The step's reference profile and where it came from, or (None, why there is none)."""
    found = read_baseline(services.ledger_model(spec), spec.pipeline, step)
    if found is None:
        return None, (
            f"no baseline was made for step {step}: make one with "
            f"`shardline checks baseline {spec.pipeline} --step {step} --from s3://.../predictions.parquet`"
        )
    return Profile.from_dict(found["profile"]), f"the baseline made from {found['source']} at {found['made_at']}"
