"""The demo's own arithmetic (the demo itself runs end to end in tests/scenarios/test_pipeline_e2e.py)."""

from __future__ import annotations

import pytest

from examples.airflow_demo import _covered_seconds


@pytest.mark.parametrize(
    ("spans", "covered"),
    [
        ([], 0.0),
        ([(0.0, 10.0)], 10.0),
        ([(0.0, 10.0), (5.0, 12.0)], 12.0),  # a second job beside the first: its overlap counts once
        ([(0.0, 10.0), (1.0, 2.0)], 10.0),  # inside the first
        ([(2.0, 3.0), (0.0, 1.0)], 2.0),  # apart, in any order
    ],
)
def test_job_time_is_the_time_at_least_one_job_ran(spans, covered):
    assert _covered_seconds(spans) == covered
