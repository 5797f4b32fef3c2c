"""A realistic report built from synthetic records: 4 instances x 25 files, one straggler, drifted predictions.

    .venv/bin/python -m tests.report.example [/tmp/report-example.html]

writes the page, its JSON beside it and each chart as a PNG (``<page>-<chart>.png``) to look at.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path

import numpy as np

from shardline.ledger.records import FileRecord
from shardline.ledger.states import FileStatus, ShardStatus
from shardline.report.build import build_report
from shardline.report.cost import Prices
from shardline.report.histogram import Histogram
from shardline.report.inputs import InstanceRecord, PreviousRun, StepIdentity
from shardline.report.model import RunReport

START = dt.datetime(2026, 11, 20, 10, 0, 0, tzinfo=dt.UTC)
INSTANCE_TYPE = "ml.m5.xlarge"


def example_records(
    instances: int = 4, files_per_instance: int = 25, *, straggler: str = "algo-3", seed: int = 3
) -> tuple[StepIdentity, list[FileRecord], list[InstanceRecord]]:
    """Each instance runs 2 files at a time, ~40k rows in ~10 s each; the straggler's take ~2.5x as long.

    One file fails (a schema error), one was retried and succeeded on attempt 2, and one wrote fewer
    rows than it read; one key carries HTML, as anyone's S3 key may.
    """
    rng = np.random.default_rng(seed)
    identity = StepIdentity(
        pipeline="scores", run_id="scheduled__2026-11-20T10:00:00+00:00", step="score", attempt=2, backend="sagemaker"
    )
    files: list[FileRecord] = []
    records: list[InstanceRecord] = []
    for i in range(instances):
        host = f"algo-{i + 1}"
        began = START + dt.timedelta(seconds=float(rng.uniform(2, 6)))
        slots = [0.0, 0.3]  # two pool workers, each a clock in seconds after `began`
        for j in range(files_per_instance):
            number = i + instances * j  # the round-robin deal
            slot = int(np.argmin(slots))
            seconds = float(rng.uniform(8, 12)) * (2.5 if host == straggler else 1.0)
            rows = int(rng.integers(36_000, 44_000))
            claimed = began + dt.timedelta(seconds=slots[slot])
            finished = claimed + dt.timedelta(seconds=seconds)
            slots[slot] += seconds + 0.05
            key = f"features/dt=2026-11-20/part-{number:05d}.parquet"
            status, rows_out, error, attempt = FileStatus.SUCCEEDED.value, rows, None, 1
            if number == 17:
                status, rows_out = FileStatus.FAILED.value, 0
                error = ("SchemaError", "column 'f07' is missing <script>alert(1)</script>")
            if number == 42:
                attempt = 2
            if number == 63:
                rows_out = rows - 12
            if number == 88:
                key = "features/dt=2026-11-20/<b>odd & name</b>.parquet"
            files.append(
                FileRecord(
                    input_key=key,
                    status=status,
                    host=host,
                    attempt=attempt,
                    rows_in=rows,
                    rows_out=rows_out,
                    bytes_in=rows * 32 * 4 + 4_096,
                    bytes_out=rows_out * 16,
                    started_at=claimed,
                    finished_at=finished,
                    seconds=seconds,
                    error_class=error[0] if error else None,
                    error_message=error[1] if error else None,
                )
            )
        ended = began + dt.timedelta(seconds=max(slots) + 1.5)
        records.append(
            InstanceRecord(
                host=host,
                instance_type=INSTANCE_TYPE,
                attempt=1,
                started_at=began,
                ended_at=ended,
                status=ShardStatus.PARTIAL.value if host == "algo-2" else ShardStatus.SUCCEEDED.value,
            )
        )
    # the retried file's attempt 2 ran on a fresh instance of its own
    retried = next(f for f in files if f.attempt == 2)
    files.remove(retried)
    again = START + dt.timedelta(seconds=400)
    files.append(
        FileRecord(
            input_key=retried.input_key,
            status=retried.status,
            host="algo-1",
            attempt=2,
            rows_in=retried.rows_in,
            rows_out=retried.rows_out,
            bytes_in=retried.bytes_in,
            bytes_out=retried.bytes_out,
            started_at=again + dt.timedelta(seconds=3),
            finished_at=again + dt.timedelta(seconds=13),
            seconds=10.0,
        )
    )
    records.append(
        InstanceRecord(
            host="algo-1",
            instance_type=INSTANCE_TYPE,
            attempt=2,
            started_at=again,
            ended_at=again + dt.timedelta(seconds=15),
            status=ShardStatus.SUCCEEDED.value,
        )
    )
    return identity, files, records


def example_histograms(rows: int, seed: int = 5) -> tuple[Histogram, Histogram]:
    """(current, reference): scores from a beta distribution that moved right since the reference run."""
    rng = np.random.default_rng(seed)
    reference = Histogram.merged(Histogram().add(rng.beta(2, 5, size=rows // 4).astype(np.float32)) for _ in range(4))
    current = Histogram.merged(Histogram().add(rng.beta(2.6, 4, size=rows // 4).astype(np.float32)) for _ in range(4))
    return current, reference


def example_report() -> RunReport:
    identity, files, instances = example_records()
    rows = sum(f.rows_out for f in files if f.status == FileStatus.SUCCEEDED.value)
    current, reference = example_histograms(rows)
    previous = [
        PreviousRun(run_id=f"scheduled__2026-11-{day}T10:00:00+00:00", cost_per_million=value)
        for day, value in zip(range(14, 20), (0.0108, 0.0104, 0.0112, 0.0101, None, 0.0106), strict=True)
    ]
    return build_report(
        identity,
        files,
        instances,
        current,
        reference=reference,
        reference_run_id="scheduled__2026-11-19T10:00:00+00:00",
        previous_runs=previous,
        prices=Prices.default(),
        generated_at=START + dt.timedelta(minutes=9),
    )


def main(argv: list[str]) -> None:
    from shardline.report.charts import render_charts
    from shardline.report.render import render_html

    out = Path(argv[0] if argv else "/tmp/report-example.html")
    started = time.perf_counter()
    report = example_report()
    built = time.perf_counter()
    page = render_html(report)
    rendered = time.perf_counter()
    out.write_text(page, encoding="utf-8")
    out.with_suffix(".json").write_text(report.to_json(indent=2), encoding="utf-8")
    for name, svg in render_charts(report).items():
        out.with_name(f"{out.stem}-{name}.svg").write_bytes(svg)
    sys.stdout.write(
        f"{out} ({len(page) / 1e3:.0f} kB): built in {built - started:.2f} s, rendered in "
        f"{rendered - built:.2f} s; PSI {report.drift.psi:.3f} ({report.drift.verdict}), "
        f"stragglers {report.stragglers}, idle {report.idle}\n"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
