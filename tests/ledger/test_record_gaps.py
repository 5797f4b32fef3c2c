"""When the ledger cannot vouch for a step (``shardline.ledger.record_gaps``): its STEP item gone or older than the
attempt planned, or the table itself gone. Absence is never success, and never a newer attempt that moved on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pynamodb.exceptions import GetError

from shardline.errors import LedgerRecordMissing
from shardline.ledger.keys import StepRef, run_pk, step_sk
from shardline.ledger.record_gaps import check_refusal, record_gap, table_gone, table_gone_text
from shardline.ledger.step_writes import start_attempt
from shardline.ledger.table import bind_ledger

REF = StepRef("nightly", "run-1", "score")


@pytest.mark.parametrize(
    ("step_item", "attempt", "found"),
    [
        (None, 1, "the ledger has no record of step score of run run-1, which planned attempt 1"),
        (SimpleNamespace(attempt=1), 2, "the ledger records only attempt 1 of step score of run run-1"),
        (SimpleNamespace(attempt=None), 1, "the ledger records only attempt 0 of step score"),
        (SimpleNamespace(attempt=2), 2, None),  # the attempt planned
        (SimpleNamespace(attempt=3), 2, None),  # a newer attempt moved on: not a gap
    ],
)
def test_a_step_item_gone_or_older_than_the_attempt_planned_is_a_gap(step_item, attempt, found):
    gap = record_gap(step_item, REF, attempt)
    if found is None:
        assert gap is None
    else:
        assert gap.startswith(found), gap
        assert gap.endswith("Plan the run again: shardline rerun nightly/run-1")


def test_a_rerun_command_is_quoted_for_the_shell():
    gap = record_gap(None, StepRef("nightly", "manual__2026-11-22T10:00:00+00:00 x", "score"), 1)
    assert gap.endswith("shardline rerun 'nightly/manual__2026-11-22T10:00:00+00:00 x'")


def test_a_missing_table_is_told_from_other_errors_and_named(aws_env):
    model = bind_ledger("shardline-test-no-such-table")
    with pytest.raises(GetError) as err:
        model.Control.get(run_pk(*REF[:2]), step_sk(REF.step))
    assert table_gone(err.value)
    assert not table_gone(GetError("throttled"))
    assert not table_gone(ValueError("no"))
    said = table_gone_text(model, REF)
    assert said.startswith("the ledger table shardline-test-no-such-table does not exist, so step score of run run-1")
    assert "`shardline local up`" in said and said.endswith("shardline rerun nightly/run-1")


def test_a_refused_write_is_explained_by_the_step_item_as_it_is_now(ledger_table):
    model = bind_ledger(ledger_table)
    with pytest.raises(LedgerRecordMissing, match="has no record of step score of run run-1"):
        check_refusal(model, REF, 1)
    start_attempt(model, REF, 1)
    start_attempt(model, REF, 2, [("s3://raw/in/a.parquet", 1)])
    assert check_refusal(model, REF, 1) is None  # a newer attempt stands: the refusal was the fence's
    assert check_refusal(model, REF, 2) is None
    with pytest.raises(LedgerRecordMissing, match="records only attempt 2 of step score"):
        check_refusal(model, REF, 3)
