"""A quote's figures, by hand: the fit of earlier runs, the range, the rows guessed from bytes, and the sums."""

from __future__ import annotations

import pytest

from shardline.report.quote import (
    FEW_RUNS_MARGIN,
    MANY_RUNS_MARGIN,
    ONE_RUN_MARGIN,
    SAMPLE_MARGIN,
    PastRun,
    Span,
    Work,
    margin_for,
    quote_step,
    rates_from,
    total_of,
)


def run(run_id: str, instances: int, rows: int, per_instance: float, per_row: float, *, busy_share: float = 0.9):
    seconds = per_instance * instances + per_row * rows
    return PastRun(
        run_id, instances, rows, seconds, seconds * busy_share, bytes_in=rows * 100, rows_in=rows, startup_seconds=30
    )


def test_runs_of_different_sizes_give_back_the_time_per_instance_and_per_row_they_were_made_with():
    # 4 s an instance and 2 us a prediction: 1 x 1M rows = 6 s, 2 x 5M = 18 s, 1 x 200k = 4.4 s
    runs = [run("a", 1, 1_000_000, 4.0, 2e-6), run("b", 2, 5_000_000, 4.0, 2e-6), run("c", 1, 200_000, 4.0, 2e-6)]
    rates = rates_from(runs, "history")
    assert rates.per_instance == pytest.approx(4.0)
    assert rates.per_row == pytest.approx(2e-6)
    assert rates.rows_per_second == pytest.approx(500_000)
    # the runs lie on the fit, so the range is the margin alone (three runs)
    assert rates.below == pytest.approx(MANY_RUNS_MARGIN) and rates.above == pytest.approx(MANY_RUNS_MARGIN)
    assert rates.runs == ("a", "b", "c") and rates.startup_seconds == 30
    assert rates.rows_per_byte == pytest.approx(0.01)


def test_a_quote_by_hand_in_seconds_dollars_and_per_million():
    rates = rates_from([run("a", 1, 1_000_000, 4.0, 2e-6), run("b", 2, 5_000_000, 4.0, 2e-6)], "history")
    # 3 instances, 9M rows (footers): 3 x 4 + 9e6 x 2e-6 = 30 instance-seconds, at $0.23/h
    q = quote_step(
        "score", Work(files=90, bytes=10**9, instances=3, instance_type="ml.m5.xlarge", rows=9_000_000), rates, 0.23
    )
    assert q.rows_known and q.rows == Span(9e6, 9e6, 9e6)
    assert q.instance_seconds.expected == pytest.approx(30.0)
    assert q.usd.expected == pytest.approx(30 * 0.23 / 3600)
    assert q.per_million.expected == pytest.approx(30 * 0.23 / 3600 / 9)
    # two runs: FEW_RUNS_MARGIN each side
    assert q.instance_seconds.low == pytest.approx(30 * (1 - FEW_RUNS_MARGIN))
    assert q.instance_seconds.high == pytest.approx(30 * (1 + FEW_RUNS_MARGIN))
    # wall: 30 s start-up + 4 s + 3M rows an instance x 2 us
    assert q.wall_seconds == pytest.approx(30 + 4 + 6)


def test_runs_that_stray_from_the_fit_widen_the_range_by_as_much_as_they_stray():
    # three runs on one line, and a fourth 30% slower than the line says
    runs = [run("a", 1, 1_000_000, 4.0, 2e-6), run("b", 1, 3_000_000, 4.0, 2e-6), run("c", 1, 2_000_000, 4.0, 2e-6)]
    slow = run("d", 1, 4_000_000, 4.0 * 1.3, 2e-6 * 1.3)
    rates = rates_from([*runs, slow], "history")
    fitted = [
        r.instance_seconds / (rates.per_instance * r.instances + rates.per_row * r.rows) - 1 for r in [*runs, slow]
    ]
    assert rates.above == pytest.approx(MANY_RUNS_MARGIN + max(fitted))
    assert rates.below == pytest.approx(MANY_RUNS_MARGIN - min(fitted))
    assert max(fitted) > 0.05 and min(fitted) < 0  # it strays both ways from a fit of all four


def test_one_run_splits_its_time_outside_files_per_instance_and_the_rest_per_row():
    one = PastRun("only", 2, 1_000_000, instance_seconds=20.0, busy_seconds=16.0)
    rates = rates_from([one], "history")
    assert rates.per_instance == pytest.approx(2.0)  # (20 - 16) / 2 instances
    assert rates.per_row == pytest.approx(16.0 / 1_000_000)
    assert rates.below == rates.above == pytest.approx(ONE_RUN_MARGIN)


def test_text_inputs_rows_are_guessed_from_bytes_and_the_range_widens_for_the_guess():
    runs = [
        PastRun("a", 1, 1_000_000, 10.0, 9.0, bytes_in=100_000_000, rows_in=1_000_000),
        PastRun("b", 1, 2_000_000, 18.0, 17.0, bytes_in=220_000_000, rows_in=2_000_000),
    ]
    rates = rates_from(runs, "history")
    assert rates.rows_per_byte == pytest.approx((0.01 + 1 / 110) / 2)
    q = quote_step("score", Work(files=10, bytes=50_000_000, instances=1, instance_type="ml.m5.xlarge"), rates, 1.0)
    assert not q.rows_known
    assert q.rows.expected == pytest.approx(50_000_000 * rates.rows_per_byte)
    assert q.rows.low < q.rows.expected < q.rows.high
    spread = rates.rows_per_byte_spread + 0.05
    assert q.rows.high == pytest.approx(q.rows.expected * (1 + spread))


def test_a_sample_or_another_version_quotes_with_a_wider_range():
    assert margin_for("sample", 1) == SAMPLE_MARGIN > margin_for("other-version", 5) > margin_for("history", 1)
    assert margin_for("history", 2) > margin_for("history", 3) == margin_for("history", 10) == MANY_RUNS_MARGIN


def test_no_usable_run_is_an_error_not_a_free_quote():
    with pytest.raises(ValueError, match="at least one earlier run"):
        rates_from([PastRun("empty", 1, 0, 0.0, 0.0)], "history")
    rates = rates_from([PastRun("a", 1, 100, 1.0, 1.0)], "history")  # no bytes recorded
    with pytest.raises(ValueError, match="rows per byte"):
        quote_step("s", Work(files=1, bytes=10, instances=1, instance_type="t"), rates, 1.0)


def test_totals_add_each_end_of_the_ranges():
    rates = rates_from([run("a", 1, 1_000_000, 4.0, 2e-6)], "history")
    work = Work(files=1, bytes=1, instances=1, instance_type="t", rows=1_000_000)
    one = quote_step("s", work, rates, 3.6)
    total = total_of([one, one, one])
    assert total.usd.low == pytest.approx(3 * one.usd.low) and total.usd.high == pytest.approx(3 * one.usd.high)
    assert total.rows.expected == 3_000_000
    assert total.per_million.expected == pytest.approx(one.per_million.expected)
    with pytest.raises(ValueError):
        Span(2.0, 1.0, 3.0)
