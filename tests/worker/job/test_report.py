"""A file's report and what the ledger records of it agree by name, so a figure added to both travels."""

from __future__ import annotations

import dataclasses

from shardline.ledger.job_writes import FileOutcome
from shardline.ledger.states import FileStatus
from shardline.worker.pool.runner import FileReport


def test_every_figure_the_ledger_records_comes_from_the_report():
    # Where the output and the rejects list went is known once they are uploaded, not from the report.
    recorded = {f.name for f in dataclasses.fields(FileOutcome)} - {"output_key", "rejects_key"}
    assert recorded <= {f.name for f in dataclasses.fields(FileReport)}, recorded


def test_a_report_becomes_its_ledger_outcome():
    report = FileReport(
        "dt=1/a.parquet",
        FileStatus.FAILED,
        None,
        rows_in=7,
        rows_out=0,
        bytes_in=900,
        seconds=0.25,
        tries=2,
        error_class="CorruptInputError",
        error_message="bad footer",
    )
    assert report.ledger_outcome(None) == FileOutcome(
        FileStatus.FAILED,
        rows_in=7,
        bytes_in=900,
        seconds=0.25,
        error_class="CorruptInputError",
        error_message="bad footer",
    )
    done = dataclasses.replace(
        report,
        status=FileStatus.SUCCEEDED,
        output="dt=1/a.parquet",
        rows_out=7,
        bytes_out=300,
        error_class=None,
        error_message=None,
    )
    assert done.ledger_outcome("s3://b/out/dt=1/a.parquet") == FileOutcome(
        FileStatus.SUCCEEDED,
        rows_in=7,
        rows_out=7,
        bytes_in=900,
        bytes_out=300,
        seconds=0.25,
        output_key="s3://b/out/dt=1/a.parquet",
    )
    rejected = dataclasses.replace(done, rows_out=5, rows_rejected=2, model_warnings=1)
    assert rejected.ledger_outcome("s3://b/out/dt=1/a.parquet", "s3://b/r.jsonl") == FileOutcome(
        FileStatus.SUCCEEDED,
        rows_in=7,
        rows_out=5,
        rows_rejected=2,
        model_warnings=1,
        bytes_in=900,
        bytes_out=300,
        seconds=0.25,
        output_key="s3://b/out/dt=1/a.parquet",
        rejects_key="s3://b/r.jsonl",
    )
