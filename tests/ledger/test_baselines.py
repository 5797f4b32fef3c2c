"""A step's reference profile in the ledger (moto_server): written whole, replaced by the next, read back as written,
absent until made, and refused when it would not fit one item."""

from __future__ import annotations

import pytest

from shardline.errors import InvalidArgument
from shardline.ledger.baselines import MAX_BASELINE_BYTES, read_baseline, write_baseline
from shardline.ledger.table import bind_ledger


def test_a_baseline_is_absent_until_made_and_the_newest_one_stands(ledger_table):
    model = bind_ledger(ledger_table)
    assert read_baseline(model, "scoring", "score") is None
    write_baseline(model, "scoring", "score", {"profile": {"format": "x"}, "source": "s3://b/v1.parquet"})
    write_baseline(model, "scoring", "score", {"profile": {"format": "x"}, "source": "s3://b/v2.parquet"})
    assert read_baseline(model, "scoring", "score")["source"] == "s3://b/v2.parquet"
    assert read_baseline(model, "scoring", "calibrate") is None  # each step its own
    assert read_baseline(model, "other", "score") is None  # each pipeline its own


def test_a_baseline_too_big_for_one_item_is_refused_naming_what_to_do(ledger_table):
    model = bind_ledger(ledger_table)
    with pytest.raises(InvalidArgument, match="only the step's output columns"):
        write_baseline(model, "scoring", "score", {"profile": "x" * (MAX_BASELINE_BYTES + 1)})
    assert read_baseline(model, "scoring", "score") is None
