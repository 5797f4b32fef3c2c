"""The ledger's items mapped to the report's records, and a report from them."""

from __future__ import annotations

import datetime as dt

import pytest

from shardline.ledger.keys import file_sk, run_pk, shard_sk, step_sk
from shardline.ledger.table import ControlItem, LedgerItem
from shardline.report.build import build_report
from shardline.report.inputs import StepIdentity, records_from_ledger

T = dt.datetime(2026, 11, 20, 10, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T + dt.timedelta(seconds=seconds)


def ledger_items():
    """The items as the ledger holds them: the real pynamodb classes, with the attributes its writers set."""
    pk = run_pk("scores", "r7")
    step = ControlItem(
        pk,
        step_sk("score"),
        pipeline="scores",
        run_id="r7",
        step="score",
        attempt=2,
        status="RUNNING",
        started_at=at(-30),
    )
    files = [
        LedgerItem(
            pk,
            file_sk("score", "in/a"),
            status="SUCCEEDED",
            attempt=1,
            input_key="in/a",
            host="algo-1",
            rows_in=100,
            rows_out=100,
            bytes_in=1000,
            bytes_out=500,
            seconds=9.5,
            started_at=at(2),
            finished_at=at(12),
        ),
        LedgerItem(
            pk,
            file_sk("score", "in/b"),
            status="FAILED",
            attempt=2,
            input_key="in/b",
            host="algo-2",
            rows_in=0,
            rows_out=0,
            bytes_in=2000,
            seconds=0.2,
            started_at=at(60),
            finished_at=at(61),
            error_class="SchemaError",
            error_message="column f07 is missing",
        ),
        LedgerItem(pk, file_sk("score", "in/c"), status="PENDING", attempt=2, input_key="in/c", bytes_in=300),
    ]
    shards = [
        LedgerItem(
            pk,
            shard_sk("score", 1, "algo-1"),
            status="SUCCEEDED",
            attempt=1,
            host="algo-1",
            pipeline="scores",
            run_id="r7",
            step="score",
            heartbeat_at=at(15),
            files_assigned=1,
            files_done=1,
            files_failed=0,
            rows_done=100,
        ),
        LedgerItem(
            pk,
            shard_sk("score", 2, "algo-2"),
            status="PARTIAL",
            attempt=2,
            host="algo-2",
            pipeline="scores",
            run_id="r7",
            step="score",
            heartbeat_at=at(64),
            files_assigned=1,
            files_done=0,
            files_failed=1,
            rows_done=0,
        ),
    ]
    return step, files, shards


def test_records_from_ledger_items():
    step, files, shards = ledger_items()
    records = records_from_ledger(step, files, shards, instance_type="ml.c5.xlarge")
    assert records.identity == StepIdentity(pipeline="scores", run_id="r7", step="score", attempt=2)
    a, b, c = records.files
    assert (a.input_key, a.status, a.host, a.attempt, a.rows_in, a.rows_out, a.bytes_in, a.bytes_out, a.seconds) == (
        "in/a",
        "SUCCEEDED",
        "algo-1",
        1,
        100,
        100,
        1000,
        500,
        9.5,
    )
    assert (a.started_at, a.finished_at, a.error_line()) == (at(2), at(12), "")
    assert (b.status, b.attempt, b.error_line()) == ("FAILED", 2, "SchemaError: column f07 is missing")
    assert (c.status, c.host, c.started_at, c.bytes_in) == ("PENDING", None, None, 300)
    one, two = records.instances
    # the ledger has no instance start: its first file's claim stands in; its last heartbeat is its end
    assert (one.host, one.attempt, one.instance_type, one.started_at, one.ended_at, one.status) == (
        "algo-1",
        1,
        "ml.c5.xlarge",
        at(2),
        at(15),
        "SUCCEEDED",
    )
    assert (two.host, two.attempt, two.started_at, two.ended_at) == ("algo-2", 2, at(60), at(64))


def test_each_attempts_instances_are_priced_at_the_type_its_job_ran_on():
    """After a capacity move attempt 2 ran on a fallback type: its instance-seconds cost that type's price."""
    from shardline.report.cost import Prices

    step, files, shards = ledger_items()
    spec_type = records_from_ledger(step, files, shards, instance_type="ml.c5.xlarge")
    moved = records_from_ledger(step, files, shards, instance_type="ml.c5.xlarge", instance_types={2: "ml.m5.4xlarge"})
    assert [i.instance_type for i in moved.instances] == ["ml.c5.xlarge", "ml.m5.4xlarge"]
    prices = Prices.default({"ml.c5.xlarge": 1.0, "ml.m5.4xlarge": 10.0})
    cost = {
        name: build_report(r.identity, r.files, r.instances, prices=prices).cost.total
        for name, r in (("spec", spec_type), ("moved", moved))
    }
    assert cost["moved"] > cost["spec"]


def test_a_file_claimed_but_never_finished_takes_its_bytes_from_the_plan():
    """A claim writes no size (the plan file has it): the report still counts the file's bytes on its shard."""
    step, files, shards = ledger_items()
    running = LedgerItem(
        run_pk("scores", "r7"),
        file_sk("score", "in/d"),
        status="RUNNING",
        attempt=2,
        input_key="in/d",
        host="algo-2",
        started_at=at(62),
    )
    records = records_from_ledger(
        step, [*files, running], shards, instance_type="ml.c5.xlarge", planned_sizes={"in/d": 4096, "in/a": 1}
    )
    by_key = {f.input_key: f.bytes_in for f in records.files}
    assert by_key["in/d"] == 4096 and by_key["in/a"] == 1000  # what an instance read comes first


def test_records_from_attribute_dicts_and_iso_strings_match():
    step, files, shards = ledger_items()
    from_items = records_from_ledger(step, files, shards, instance_type="ml.c5.xlarge")

    def plain(item):
        return {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in item.attribute_values.items()}

    from_dicts = records_from_ledger(
        plain(step), [plain(f) for f in files], [plain(s) for s in shards], instance_type="ml.c5.xlarge"
    )
    assert from_dicts == from_items


def test_a_report_from_ledger_items_agrees_with_them():
    step, files, shards = ledger_items()
    records = records_from_ledger(step, files, shards, instance_type="ml.c5.xlarge")
    report = build_report(records.identity, records.files, records.instances)
    assert report.attempt == 2 and [s.instance for s in report.instances] == [
        "algo-1 (attempt 1)",
        "algo-2 (attempt 2)",
    ]
    assert report.reconciliation.rows_out == 100 and report.reconciliation.failed == 1
    assert report.reconciliation.unfinished == 1
    # 13 s (2 -> 15) + 4 s (60 -> 64) of ml.c5.xlarge at $0.204/h
    assert report.cost.instance_seconds == 17 and report.cost.total == pytest.approx(17 * 0.204 / 3600)
    assert report.cost.cost_per_million == pytest.approx(17 * 0.204 / 3600 / 100 * 1e6)


def test_a_shard_without_files_starts_when_the_step_was_planned():
    step, _, shards = ledger_items()
    records = records_from_ledger(step, [], shards[:1], instance_type="ml.m5.xlarge")
    assert records.instances[0].started_at == at(-30)
    bare = records_from_ledger(None, [], [], instance_type="ml.m5.xlarge", pipeline="p", run_id="r", step="s")
    assert bare.identity == StepIdentity(pipeline="p", run_id="r", step="s", attempt=1)
