"""A step's summary as one typed value: to and from XCom, and the one mapping from outcome to status (pure)."""

from __future__ import annotations

import json

import pytest

from shardline.decision.policy import Action
from shardline.decision.summary import FailedFile, StepSummary, status_of
from shardline.ledger.states import StepStatus

SUMMARY = StepSummary(
    step="score",
    files=3,
    succeeded=2,
    failed=1,
    rows_in=300,
    rows_out=290,
    rows_rejected=10,
    attempts=2,
    rows_mismatched_files=(),
    failed_files=(FailedFile("s3://b/in/c.parquet", "PredictionError: no column x"),),
    report="s3://b/out/_shardline/reports/run/score/report.html",
    reported_at="2026-12-07T03:00:00+00:00",
)


def test_a_summary_goes_to_xcom_as_plain_json_and_comes_back_equal():
    ended = SUMMARY.ended(Action.PARTIAL)
    carried = json.loads(json.dumps(ended.to_xcom()))  # what XCom stores
    assert carried["outcome"] == "PARTIAL" and carried["failed_files"][0]["input"] == "s3://b/in/c.parquet"
    assert StepSummary.from_xcom(carried) == ended
    assert ended.status is StepStatus.PARTIAL and SUMMARY.status is StepStatus.SUCCEEDED


def test_an_earlier_releases_summary_reads_with_no_rows_rejected_but_a_missing_count_is_an_error():
    carried = SUMMARY.to_xcom()
    del carried["rows_rejected"], carried["outcome"]
    assert StepSummary.from_xcom(carried).rows_rejected == 0
    for needed in ("rows_out", "attempts", "rows_mismatched_files"):
        broken = {k: v for k, v in SUMMARY.to_xcom().items() if k != needed}
        with pytest.raises(KeyError, match=needed):  # never read as zero rows written
            StepSummary.from_xcom(broken)


def test_each_outcome_a_step_ends_with_records_one_status():
    assert [status_of(a) for a in (Action.ADVANCE, Action.PARTIAL, Action.FAIL, Action.TIMEOUT)] == [
        StepStatus.SUCCEEDED,
        StepStatus.PARTIAL,
        StepStatus.FAILED,
        StepStatus.FAILED,
    ]
    with pytest.raises(KeyError):  # a step never records RESUBMIT or WAIT as its end
        status_of(Action.RESUBMIT)
