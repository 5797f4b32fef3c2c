"""The typed report's JSON: the whole report, and read back."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np

from shardline.report.build import build_report
from shardline.report.histogram import Histogram
from shardline.report.model import RunReport
from tests.report.example import example_records

T = dt.datetime(2026, 11, 20, 10, 0, 0, tzinfo=dt.UTC)


def test_to_json_is_the_whole_report_and_reads_back():
    identity, files, instances = example_records()
    report = build_report(
        identity,
        files,
        instances,
        Histogram().add(np.random.default_rng(1).random(1000)),
        reference=Histogram().add(np.random.default_rng(2).random(1000)),
        generated_at=T,
    )
    data = json.loads(report.to_json())
    assert data["format"] == "shardline.report/1" and data["run_id"] == identity.run_id
    assert len(data["reconciliation"]["rows"]) == 100 and len(data["instances"]) == 5
    assert data["timeline"]["series"][0]["rows_per_second"][0] is not None
    assert RunReport.from_json(report.to_json()) == report
    # A report.json written before its instances were called so says "shards": the next run's trend still reads it.
    data["shards"] = data.pop("instances")
    assert RunReport.from_json(json.dumps(data)) == report
