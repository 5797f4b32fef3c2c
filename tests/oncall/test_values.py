"""The on-call values (``shardline.oncall.values``): a run's name. Pure: no table needed."""

from __future__ import annotations

import datetime as dt

import pytest

from shardline.oncall.errors import BadRequest, OnCallError
from shardline.oncall.values import RunRef

NOW = dt.datetime(2026, 11, 22, 10, 0, 0, tzinfo=dt.UTC)
STARTED = NOW - dt.timedelta(seconds=100)


def test_a_run_is_named_pipeline_slash_run_id():
    ref = RunRef.parse("p/scheduled__2026-11-22T10:00:00+00:00")
    assert (
        ref == RunRef("p", "scheduled__2026-11-22T10:00:00+00:00")
        and str(ref) == "p/scheduled__2026-11-22T10:00:00+00:00"
    )
    for text in ("no-slash", "/r", "p/"):
        with pytest.raises(BadRequest, match="PIPELINE/RUN_ID"):
            RunRef.parse(text)


def test_run_refs_are_pipeline_slash_run_id():
    assert RunRef.parse("p/scheduled__2026-11-22T10:00:00+00:00") == RunRef("p", "scheduled__2026-11-22T10:00:00+00:00")
    with pytest.raises(OnCallError, match="PIPELINE/RUN_ID"):
        RunRef.parse("just-a-run-id")
