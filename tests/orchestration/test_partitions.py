"""A step's hold on its output prefix through its life (orchestration/partitions.py), against moto_server: taken by a
plan, refused to a second run while held, renewed for every prefix the run holds, lost to a takeover, and released
when the run ends. The lock item's own rules (fences, races, leases) are tests/ledger/test_partitions.py's."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest

from shardline.errors import LedgerRecordMissing
from shardline.ledger.keys import RUN_SK, StepRef, run_pk, step_sk
from shardline.ledger.partitions import read_holder
from shardline.ledger.records import RunRecord
from shardline.ledger.states import RunStatus
from shardline.ledger.step_reads import read_step
from shardline.ledger.step_writes import end_life, ensure_run, set_run_status
from shardline.orchestration import partitions, services
from shardline.orchestration.step import plan as step_plan
from tests.support.pipelines import plan_request

FAR = 4_000_000_000.0  # an epoch second decades away: a lease that runs from it is exact, whatever the clock says


def plan(spec, bucket: str, run_id: str, step: str = "score", **more):
    output = "out" if step == "score" else "calibrated"
    return step_plan.plan(spec, step, plan_request(run_id, bucket, output, **more))


def holder_of(spec, bucket: str, folder: str = "out"):
    return read_holder(services.ledger_model(spec), f"s3://{bucket}/{folder}/")


def run_record(spec, run_id: str) -> RunRecord:
    control = services.ledger_model(spec).Control
    return RunRecord.of(control.get(run_pk(spec.pipeline, run_id), RUN_SK, consistent_read=True))


def step_fence(spec, run_id: str, step: str = "score") -> int | None:
    control = services.ledger_model(spec).Control
    item = control.get(run_pk(spec.pipeline, run_id), step_sk(step), consistent_read=True)
    return None if item.fence is None else int(item.fence)


def at(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.UTC)


# -- the lease ----------------------------------------------------------------------------------------------------


def test_a_lease_runs_its_length_past_the_holders_announced_wait(monkeypatch):
    monkeypatch.delenv(partitions.LEASE_ENV, raising=False)
    assert partitions.lease_until(FAR) == at(FAR + partitions.DEFAULT_LEASE_SECONDS)
    monkeypatch.setenv(partitions.LEASE_ENV, "120")
    assert partitions.lease_until(FAR) == at(FAR + 120)
    before = dt.datetime.now(dt.UTC)
    lease = partitions.lease_until(1.0)  # a wait already over: the lease runs from now
    after = dt.datetime.now(dt.UTC)
    assert before + dt.timedelta(seconds=120) <= lease <= after + dt.timedelta(seconds=120)


# -- taking and refusing ------------------------------------------------------------------------------------------


def test_a_plan_takes_its_prefix_and_a_second_run_is_refused_naming_the_holder(two_steps):
    spec, bucket = two_steps
    plan(spec, bucket, "run-1")
    held = holder_of(spec, bucket)
    assert held.holds(StepRef(spec.pipeline, "run-1", "score")) and held.fence == 1
    assert step_fence(spec, "run-1") == 1  # recorded on the STEP item: the step never takes the prefix again after

    with pytest.raises(partitions.PartitionHeld) as refused:
        plan(spec, bucket, "run-2")
    assert refused.value.holder.run_id == "run-1" and refused.value.output_prefix == f"s3://{bucket}/out/"
    # The second run wrote nothing: no STEP item, and the prefix is still the first run's.
    ref = StepRef(spec.pipeline, "run-2", "score")
    assert read_step(services.ledger_model(spec), ref, files=False).step is None
    assert holder_of(spec, bucket).holds(StepRef(spec.pipeline, "run-1", "score"))

    waiting = partitions.held_text(refused.value, ref)
    assert f"shardline status {spec.pipeline}/run-1" in waiting and f"shardline cancel {spec.pipeline}/run-1" in waiting
    refusal = partitions.refused_text(refused.value, ref)
    assert "not resubmitted" in refusal and f"shardline rerun {spec.pipeline}/run-1" in refusal


def test_once_the_holder_ended_and_released_the_next_run_takes_the_prefix_with_a_higher_fence(two_steps):
    spec, bucket = two_steps
    plan(spec, bucket, "run-1")
    set_run_status(services.ledger_model(spec), spec.pipeline, "run-1", RunStatus.SUCCEEDED)
    partitions.release_run(spec, spec.pipeline, "run-1")
    assert holder_of(spec, bucket).released
    plan(spec, bucket, "run-2")
    held = holder_of(spec, bucket)
    assert held.holds(StepRef(spec.pipeline, "run-2", "score")) and held.fence == 2
    # run-1 took it with fence 1, run-2 since: run-1 never takes it again (its outputs there may be run-2's now).
    with pytest.raises(partitions.PartitionMovedOn):
        partitions.hold(spec, StepRef(spec.pipeline, "run-1", "score"), f"s3://{bucket}/out/")


def test_a_renewal_only_hold_is_refused_to_a_step_that_does_not_hold_the_prefix(two_steps):
    spec, bucket = two_steps
    plan(spec, bucket, "run-1")
    mine, other = StepRef(spec.pipeline, "run-1", "score"), StepRef(spec.pipeline, "run-2", "score")
    assert partitions.hold(spec, mine, f"s3://{bucket}/out/", may_take=False) == 1
    with pytest.raises(partitions.PartitionLost, match=f"{spec.pipeline}/run-2 no longer holds the lock"):
        partitions.hold(spec, other, f"s3://{bucket}/out/", may_take=False)
    assert holder_of(spec, bucket).holds(mine)


def test_a_later_attempt_refused_its_prefix_puts_its_runs_status_back(two_steps):
    """A later attempt reopens its run (RUNNING) before it asks for the prefix; refused, the run is as it was."""
    spec, bucket = two_steps
    model = services.ledger_model(spec)
    plan(spec, bucket, "run-1")
    ensure_run(model, spec.pipeline, "run-2")
    set_run_status(model, spec.pipeline, "run-2", RunStatus.FAILED, "its step failed")
    ref = StepRef(spec.pipeline, "run-2", "score")
    with pytest.raises(partitions.PartitionHeld):
        partitions.hold_for_attempt(spec, ref, f"s3://{bucket}/out/", number=2, may_take=True)
    assert (run_record(spec, "run-2").status, run_record(spec, "run-2").message) == ("FAILED", "its step failed")

    set_run_status(model, spec.pipeline, "run-1", RunStatus.SUCCEEDED)  # run-1 ended (no job of it runs)
    assert partitions.hold_for_attempt(spec, ref, f"s3://{bucket}/out/", number=2, may_take=True) == 2
    assert run_record(spec, "run-2").status == "RUNNING"


def test_record_fence_never_makes_a_step_item_up(two_steps):
    spec, _bucket = two_steps
    with pytest.raises(LedgerRecordMissing):
        partitions.record_fence(spec, StepRef(spec.pipeline, "run-never", "score"), 1)
    assert (
        read_step(services.ledger_model(spec), StepRef(spec.pipeline, "run-never", "score"), files=False).step is None
    )


# -- renewing and losing ------------------------------------------------------------------------------------------


def test_keep_renews_every_prefix_the_run_holds_past_the_announced_wait(two_steps, monkeypatch):
    spec, bucket = two_steps
    monkeypatch.setenv(partitions.LEASE_ENV, "60")
    plan(spec, bucket, "run-1", "score")
    calibrate = plan(spec, bucket, "run-1", "calibrate")
    assert holder_of(spec, bucket, "out").lease_until < at(FAR)  # the control: a lease from the plan's now
    partitions.keep(spec, calibrate, FAR)
    assert holder_of(spec, bucket, "calibrated").lease_until == at(FAR + 60)
    assert holder_of(spec, bucket, "out").lease_until == at(FAR + 60)  # score's too: its outputs stay held


def test_a_step_whose_prefix_was_taken_over_has_lost_it_and_names_who_holds_it(two_steps, monkeypatch):
    spec, bucket = two_steps
    monkeypatch.setenv(partitions.LEASE_ENV, "-1")  # every lease run-1 takes or renews has run out already
    first = plan(spec, bucket, "run-1")
    assert partitions.lost(spec, first) is None  # nobody took it yet: its holder still holds it
    monkeypatch.delenv(partitions.LEASE_ENV)

    plan(spec, bucket, "run-2")  # takes it over
    assert holder_of(spec, bucket).fence == 2
    why = partitions.lost(spec, first)
    assert f"run {spec.pipeline}/run-2 (step score) holds it now" in why and "marks nothing complete" in why
    with pytest.raises(partitions.PartitionLost):
        partitions.keep(spec, first)
    assert holder_of(spec, bucket).holds(StepRef(spec.pipeline, "run-2", "score"))


def test_a_step_whose_run_released_its_prefix_has_lost_it(two_steps):
    spec, bucket = two_steps
    first = plan(spec, bucket, "run-1")
    partitions.release_run(spec, spec.pipeline, "run-1")
    assert "nobody holds it now" in partitions.lost(spec, first)


# -- releasing ----------------------------------------------------------------------------------------------------


def test_release_run_lets_go_of_every_prefix_of_the_run_and_leaves_another_runs_alone(two_steps, monkeypatch):
    spec, bucket = two_steps
    monkeypatch.setenv(partitions.LEASE_ENV, "-1")
    plan(spec, bucket, "run-1", "score")  # run out at once: run-2 takes it over below
    monkeypatch.delenv(partitions.LEASE_ENV)
    plan(spec, bucket, "run-1", "calibrate")
    plan(spec, bucket, "run-2", "score")

    partitions.release_run(spec, spec.pipeline, "run-1")
    calibrated = holder_of(spec, bucket, "calibrated")
    assert calibrated.released and calibrated.run_id == "run-1"  # who held it last is kept
    assert holder_of(spec, bucket, "out").holds(StepRef(spec.pipeline, "run-2", "score"))  # not run-1's to release

    partitions.release_run(spec, spec.pipeline, "run-2")
    assert holder_of(spec, bucket, "out").released


def test_a_failure_callbacks_release_needs_the_life_it_ended(two_steps):
    spec, bucket = two_steps
    model = services.ledger_model(spec)
    plan(spec, bucket, "run-1", life=0)
    partitions.release_ended_life(spec, spec.pipeline, "run-1", 0)
    assert not holder_of(spec, bucket).released  # the run still runs in that life: nothing released

    assert end_life(model, spec.pipeline, "run-1", 0, "DAG run failed")
    partitions.release_ended_life(spec, spec.pipeline, "run-1", 1)  # another life's callback: not this one
    assert not holder_of(spec, bucket).released
    partitions.release_ended_life(spec, spec.pipeline, "run-1", 0)
    assert holder_of(spec, bucket).released


def test_a_run_gone_from_airflow_is_ended_and_its_prefix_is_free_for_the_next_run(two_steps):
    spec, bucket = two_steps
    plan(spec, bucket, "run-1")
    with pytest.raises(partitions.PartitionHeld) as held:
        plan(spec, bucket, "run-2")
    said = partitions.end_run_gone_from_airflow(spec, held.value.holder)
    assert said == f"its DAG run no longer exists in Airflow (deleted): run {spec.pipeline}/run-1 (step score) is ended"
    assert (run_record(spec, "run-1").status, run_record(spec, "run-1").message) == ("FAILED", said)
    assert partitions.end_run_gone_from_airflow(spec, held.value.holder).endswith("had ended already")
    plan(spec, bucket, "run-2")  # no job of run-1 runs: the prefix is free
    assert holder_of(spec, bucket).holds(StepRef(spec.pipeline, "run-2", "score"))


def test_withdraw_success_marker_removes_the_prefixs_marker_and_asks_nothing_of_its_absence(two_steps):
    spec, bucket = two_steps
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="out/_SUCCESS", Body=b"{}")
    s3.put_object(Bucket=bucket, Key="calibrated/_SUCCESS", Body=b"{}")
    partitions.withdraw_success_marker(spec, f"s3://{bucket}/out/")
    partitions.withdraw_success_marker(spec, f"s3://{bucket}/out/")  # idempotent
    left = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []) if o["Key"].endswith("_SUCCESS")}
    assert left == {"calibrated/_SUCCESS"}
