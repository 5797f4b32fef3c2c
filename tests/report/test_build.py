"""The report's data from plain records, checked by hand."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from shardline.ledger.records import FileRecord
from shardline.report.build import build_report
from shardline.report.cost import Prices
from shardline.report.histogram import Histogram
from shardline.report.inputs import InstanceRecord, PreviousRun, StepIdentity

T = dt.datetime(2026, 11, 20, 10, 0, 0, tzinfo=dt.UTC)
IDENTITY = StepIdentity(pipeline="scores", run_id="r7", step="score", attempt=1)


def at(seconds: float) -> dt.datetime:
    return T + dt.timedelta(seconds=seconds)


def small_step() -> tuple[list[FileRecord], list[InstanceRecord]]:
    """4 instances of ml.m5.xlarge; algo-2 is slow, algo-3 has no files, file c loses 2 rows, file e fails."""

    def ok(key, host, rows_in, rows_out, start, end):
        return FileRecord(
            key,
            "SUCCEEDED",
            host=host,
            rows_in=rows_in,
            rows_out=rows_out,
            bytes_in=10 * rows_in,
            started_at=at(start),
            finished_at=at(end),
        )

    files = [
        ok("in/a", "algo-1", 100, 100, 0, 10),
        ok("in/b", "algo-1", 300, 300, 10, 20),
        ok("in/c", "algo-2", 400, 398, 0, 40),
        ok("in/d", "algo-4", 200, 200, 0, 20),
        FileRecord(
            "in/e",
            "FAILED",
            host="algo-4",
            bytes_in=500,
            started_at=at(0),
            finished_at=at(1),
            error_class="ValueError",
            error_message="bad row",
        ),
    ]
    instances = [
        InstanceRecord("algo-1", "ml.m5.xlarge", started_at=at(0), ended_at=at(20)),
        InstanceRecord("algo-2", "ml.m5.xlarge", started_at=at(0), ended_at=at(40)),
        InstanceRecord("algo-3", "ml.m5.xlarge", started_at=at(0), ended_at=at(20)),
        InstanceRecord("algo-4", "ml.m5.xlarge", started_at=at(0), ended_at=at(20)),
    ]
    return files, instances


def test_throughput_per_instance_over_time_by_hand():
    files, instances = small_step()
    report = build_report(IDENTITY, files, instances, timeline_buckets=4)
    timeline = report.timeline
    # 40 s in 4 buckets: 10 s each
    assert timeline.start == T and timeline.bucket_seconds == 10 and timeline.offsets == [0, 10, 20, 30]
    series = {s.instance: s.rows_per_second for s in timeline.series}
    # algo-1: 100 rows in 0-10 s, 300 rows in 10-20 s, then it had ended (no line, not zero)
    assert series["algo-1"][:2] == pytest.approx([10.0, 30.0]) and series["algo-1"][2:] == [None, None]
    # algo-2: 398 rows out spread over 40 s: 9.95 rows/s throughout
    assert series["algo-2"] == pytest.approx([9.95] * 4)
    assert series["algo-3"] == [0.0, 0.0, None, None]  # running, doing nothing
    assert series["algo-4"][:2] == pytest.approx([10.0, 10.0])  # 200 rows over 20 s; the failed file adds none


def test_a_file_across_buckets_is_spread_by_its_overlap():
    # one file of 90 rows from 5 s to 35 s: 3 rows/s; buckets of 10 s see 5, 10, 10 and 5 s of it
    files = [
        FileRecord("in/x", "SUCCEEDED", host="algo-1", rows_in=90, rows_out=90, started_at=at(5), finished_at=at(35))
    ]
    instances = [InstanceRecord("algo-1", "ml.m5.xlarge", started_at=at(0), ended_at=at(40))]
    rates = build_report(IDENTITY, files, instances, timeline_buckets=4).timeline.series[0].rows_per_second
    assert rates == pytest.approx([1.5, 3.0, 3.0, 1.5])
    assert sum(r * 10 for r in rates) == pytest.approx(90)  # every row is counted once


def test_shards_stragglers_and_idle_instances():
    files, instances = small_step()
    report = build_report(IDENTITY, files, instances)
    shards = {s.instance: s for s in report.instances}
    assert [s.instance for s in report.instances] == ["algo-1", "algo-2", "algo-3", "algo-4"]
    one = shards["algo-1"]
    assert (one.files, one.files_succeeded, one.files_failed, one.rows_out, one.bytes_in) == (2, 2, 0, 400, 4000)
    assert (one.seconds, one.busy_seconds, one.busy_fraction, one.rows_per_second) == (20, 20, 1.0, 20.0)
    assert (shards["algo-4"].files, shards["algo-4"].files_failed, shards["algo-4"].bytes_in) == (2, 1, 2500)
    # finishes of the instances with files: 20, 40, 20 s; median 20; algo-2 is past 1.5 x 20 = 30 s and 20 s late
    assert report.stragglers == ["algo-2"] and shards["algo-2"].straggler
    assert report.idle == ["algo-3"] and shards["algo-3"].files == 0
    assert report.seconds == 40 and report.started_at == T and report.ended_at == at(40)


def test_an_instances_counts_are_its_own_even_when_a_later_attempt_took_over_its_failed_file():
    """algo-4 of attempt 1 was given 2 files and failed one (its manifest says 2 and 1); attempt 2 then ran that
    file on algo-1, so its FILE item is attempt 2's now. The report still counts algo-4's 2 files, 1 failed."""
    files, instances = small_step()
    files = [
        f
        if f.input_key != "in/e"
        else FileRecord(
            "in/e",
            "SUCCEEDED",
            host="algo-1",
            attempt=2,
            rows_in=5,
            rows_out=5,
            started_at=at(300),
            finished_at=at(301),
        )
        for f in files
    ]
    instances[3] = InstanceRecord(
        "algo-4", "ml.m5.xlarge", started_at=at(0), ended_at=at(20), files_assigned=2, files_done=2, files_failed=1
    )
    shards = {s.instance: s for s in build_report(IDENTITY, files, instances).instances}
    four = shards["algo-4 (attempt 1)"]
    assert (four.files, four.files_succeeded, four.files_failed) == (2, 1, 1)


def test_a_resubmission_is_compared_with_its_own_attempt_and_a_missing_instance_is_derived_from_its_files():
    files, instances = small_step()
    files.append(
        FileRecord(
            "in/f",
            "SUCCEEDED",
            host="algo-1",
            attempt=2,
            rows_in=50,
            rows_out=50,
            started_at=at(300),
            finished_at=at(305),
        )
    )
    report = build_report(IDENTITY, files, instances)
    labels = [s.instance for s in report.instances]
    assert labels[-1] == "algo-1 (attempt 2)" and "algo-1 (attempt 1)" in labels
    assert report.stragglers == ["algo-2 (attempt 1)"]  # attempt 2's late start is no straggling
    assert any("no instance record for algo-1 (attempt 2)" in note for note in report.notes)
    assert report.instances[-1].seconds == 5 and report.instances[-1].instance_type == "ml.m5.xlarge"
    assert report.reconciliation.retried == 1 and report.reconciliation.max_attempt == 2


def test_cost_and_cost_per_million_by_hand():
    files, instances = small_step()
    previous = [PreviousRun("r5", 6.1), PreviousRun("r6", None)]
    cost = build_report(IDENTITY, files, instances, previous_runs=previous).cost
    # instance-seconds 20 + 40 + 20 + 20 = 100 at $0.23/h: 100 x 0.23 / 3600 = $0.0063889
    assert cost.instance_seconds == 100 and cost.total == pytest.approx(100 * 0.23 / 3600)
    assert cost.total == pytest.approx(0.0063889, abs=1e-7)
    # 998 predictions (rows out of the succeeded files): 0.0063889 / 998 x 1e6 = $6.4017 per 1M
    assert cost.predictions == 998 and cost.cost_per_million == pytest.approx(6.4017, abs=1e-4)
    assert [(line.instance_type, line.instances, line.seconds) for line in cost.by_type] == [("ml.m5.xlarge", 4, 100)]
    assert [(p.run_id, p.cost_per_million, p.current) for p in cost.trend] == [
        ("r5", 6.1, False),
        ("r6", None, False),
        ("r7", cost.cost_per_million, True),
    ]
    # the local backend at its own price: 100 s at $0.36/h = $0.01
    local = StepIdentity(pipeline="scores", run_id="r7", step="score", backend="local")
    assert build_report(
        local, files, instances, prices=Prices.default(local_per_hour=0.36)
    ).cost.total == pytest.approx(0.01)


def test_the_control_plane_is_priced_from_the_counts_and_never_from_downloads_alone():
    import dataclasses

    from shardline.report.cost import REQUEST_PRICES

    files, instances = small_step()
    # Instances that counted no requests (an older worker, a stack that may not record them): not priced, and said.
    report = build_report(IDENTITY, files, instances)
    assert report.cost.control_plane is None and report.cost.control_plane_per_million is None
    assert any("4 of 4 instance(s) recorded no AWS request counts" in n and "not priced" in n for n in report.notes)
    # One counted: its requests and every instance's downloads (one GET a file and one for the model), and said so.
    instances[0] = dataclasses.replace(instances[0], requests={"dynamodb.transact": 2}, files_assigned=3)
    report = build_report(IDENTITY, files, instances)
    assert report.cost.downloads == 3 + 4
    expected = 2 * REQUEST_PRICES["dynamodb.transact"] + 7 * REQUEST_PRICES["s3.get"]
    assert report.cost.control_plane == pytest.approx(expected)
    assert any("3 of 4 instance(s)" in n and "priced without theirs" in n for n in report.notes)


def test_an_instance_whose_last_heartbeat_never_landed_is_billed_at_least_to_its_last_file():
    files, instances = small_step()
    # algo-1's record ends at its first heartbeat (its last one lost in a stop), before the files it finished.
    instances[0] = InstanceRecord("algo-1", "ml.m5.xlarge", started_at=at(0), ended_at=at(1))
    last = max(f.finished_at for f in files if f.host == "algo-1")
    report = build_report(IDENTITY, files, instances)
    assert report.instances[0].seconds == (last - at(0)).total_seconds() > 1


def test_an_unknown_instance_type_leaves_the_cost_empty_and_says_where_to_price_it():
    files, instances = small_step()
    instances[0] = InstanceRecord("algo-1", "ml.q9.large", started_at=at(0), ended_at=at(20))
    report = build_report(IDENTITY, files, instances)
    assert report.cost.total is None and report.cost.cost_per_million is None
    assert "ml.q9.large" in report.cost.error and "cost.prices" in report.cost.error
    assert report.instances[0].cost is None and report.instances[1].cost == pytest.approx(40 * 0.23 / 3600)


def test_no_predictions_is_no_cost_per_million():
    files = [FileRecord("in/e", "FAILED", host="algo-1", started_at=at(0), finished_at=at(1), error_message="x")]
    instances = [InstanceRecord("algo-1", "ml.m5.xlarge", started_at=at(0), ended_at=at(36))]
    cost = build_report(IDENTITY, files, instances).cost
    assert cost.total == pytest.approx(36 * 0.23 / 3600) and cost.cost_per_million is None


def test_reconciliation():
    files, instances = small_step()
    r = build_report(IDENTITY, files, instances).reconciliation
    assert (r.files, r.succeeded, r.failed, r.unfinished) == (5, 4, 1, 0)
    assert (r.rows_in, r.rows_out, r.balanced, r.mismatched) == (1000, 998, False, ["in/c"])
    assert [(f.key, f.host, f.error) for f in r.failures] == [("in/e", "algo-4", "ValueError: bad row")]
    assert [row.key for row in r.rows] == ["in/a", "in/b", "in/c", "in/d", "in/e"]
    balanced = build_report(IDENTITY, [f for f in files if f.input_key != "in/c"], instances).reconciliation
    assert balanced.balanced and balanced.mismatched == []


def test_rejected_rows_balance_a_file_and_are_listed_and_warnings_are_counted():
    import dataclasses

    from shardline.report.model import RejectRow
    from shardline.report.render import render_html

    files, instances = small_step()
    files = [dataclasses.replace(f, rows_rejected=2, model_warnings=3) if f.input_key == "in/c" else f for f in files]
    listed = {"in/c": [RejectRow(key="in/c", where="line 12 (id=11)", reason="column 'x': 'n.a.' is not a number")]}
    report = build_report(IDENTITY, files, instances, rejects=listed)
    r = report.reconciliation
    assert (r.rows_in, r.rows_out, r.rows_rejected, r.balanced, r.mismatched) == (1000, 998, 2, True, [])
    assert [(x.key, x.where) for x in r.rejects] == [("in/c", "line 12 (id=11)")]
    assert r.model_warnings == 3
    html = render_html(report)
    assert "2 rows rejected" in html and "line 12 (id=11)" in html and "3 warning line(s)" in html


def test_drift_against_the_reference_with_both_histograms():
    files, instances = small_step()
    current = Histogram().add(np.array([0] * 2 + [1] * 4 + [2] * 4))
    reference = Histogram().add(np.array([0] * 4 + [1] * 4 + [2] * 2))
    drift = build_report(
        IDENTITY, files, instances, current, reference=reference, reference_run_id="r6", max_psi=0.2
    ).drift
    # (0.2-0.4) ln(0.2/0.4) + 0 + (0.4-0.2) ln(0.4/0.2) = 0.4 ln 2 = 0.2773 >= 0.2
    assert drift.psi == pytest.approx(0.4 * math.log(2)) and drift.verdict == "drift" and drift.reference_run_id == "r6"
    assert drift.bins.labels == ["= 0", "= 1", "= 2", "other"]
    assert drift.density.kind == "values" and drift.density.edges == [0, 1, 2]
    assert drift.density.reference == pytest.approx([0.4, 0.4, 0.2]) and drift.density.current == pytest.approx(
        [0.2, 0.4, 0.4]
    )
    assert Histogram.from_dict(drift.current_histogram) == current
    assert drift.current_quantiles["p50"] == 1.0 and drift.reference_quantiles["p50"] == 1.0
    continuous = build_report(
        IDENTITY,
        files,
        instances,
        Histogram().add(np.linspace(0, 1, 1000)),
        reference=Histogram().add(np.linspace(0, 1, 1000)),
    ).drift
    assert continuous.psi == 0.0 and continuous.verdict == "stable" and continuous.density.kind == "intervals"
    assert sum(continuous.density.current) == pytest.approx(1.0)


def test_without_a_reference_or_a_histogram_drift_is_na_with_a_reason():
    files, instances = small_step()
    alone = build_report(IDENTITY, files, instances, Histogram().add(np.array([0.1, 0.2]))).drift
    assert alone.psi is None and alone.verdict == "n/a" and "no previous successful run" in alone.note
    assert alone.density is not None and alone.reference_histogram is None  # this run's histogram is still shown
    nothing = build_report(IDENTITY, files, instances).drift
    assert nothing.verdict == "n/a" and "no prediction histogram" in nothing.note


def test_an_empty_step_still_reports():
    report = build_report(IDENTITY, [], [])
    assert report.instances == [] and report.timeline.series == [] and report.cost.total == 0
    assert report.reconciliation.files == 0 and report.reconciliation.balanced and report.seconds is None


def test_unfinished_files_and_files_without_times():
    files = [
        FileRecord("in/p", "PENDING"),
        FileRecord("in/r", "RUNNING", host="algo-1", started_at=at(0)),
        FileRecord("in/s", "SUCCEEDED", host="algo-1", rows_in=10, rows_out=10, finished_at=at(8), seconds=4.0),
        FileRecord("in/t", "SUCCEEDED", host="algo-1", rows_in=10, rows_out=10),
    ]
    instances = [InstanceRecord("algo-1", "ml.m5.xlarge", started_at=at(0), ended_at=at(10))]
    report = build_report(IDENTITY, files, instances, timeline_buckets=10)
    assert report.reconciliation.unfinished == 2
    assert report.timeline.files_without_times == 1 and any("no recorded times" in n for n in report.notes)
    # in/s: finished at 8 s after 4 s of work, so 4-8 s at 2.5 rows/s
    assert report.timeline.series[0].rows_per_second[:10] == pytest.approx([0, 0, 0, 0, 2.5, 2.5, 2.5, 2.5, 0, 0])
