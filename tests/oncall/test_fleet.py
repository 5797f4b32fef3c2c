"""`shardline fleet`'s counts and lines (``shardline.oncall.fleet``), from records and views. Pure; the pools
themselves are read from a real Airflow in tests/scenarios/test_admission.py."""

from __future__ import annotations

import datetime as dt

from shardline.ledger.records import StepRecord
from shardline.oncall.fleet import JobsToday, StepInPool, TypeView, fleet_lines, fleet_view, jobs_by_type

C5, C5_4X = "ml.c5.2xlarge", "ml.c5.4xlarge"


def test_todays_jobs_are_counted_on_the_type_each_step_last_ran_on():
    steps = [
        StepRecord("SUCCEEDED", 1, instance_type=C5),
        StepRecord("PARTIAL", 2, instance_type=C5),  # ended within its tolerance: it succeeded
        StepRecord("FAILED", 3, instance_type=C5),
        StepRecord("CANCELLED", 1, instance_type=C5),
        StepRecord("PLANNED", 1, instance_type=C5),  # running: its STEP item says PLANNED until it ends
        # Two jobs SageMaker could not provision on the first type; the third ran on the fallback and succeeded.
        StepRecord("SUCCEEDED", 3, instance_type=C5_4X, capacity_failures={C5: 2}),
        StepRecord("PLANNED", 2, instance_type=C5_4X, capacity_failures={C5: 1}),  # running on the fallback
        StepRecord("SKIPPED", 1, instance_type=C5),  # an empty input: no job
        StepRecord("SUCCEEDED", 1),  # a plan without the type: not counted anywhere
    ]
    assert jobs_by_type(steps) == {
        C5: JobsToday(succeeded=2, resubmitted_for_capacity=3, failed=2),
        C5_4X: JobsToday(succeeded=1),
    }
    assert jobs_by_type([]) == {}


def test_the_lines_say_the_quota_who_holds_it_who_waits_and_todays_jobs():
    view = TypeView(
        C5,
        "sagemaker-ml.c5.2xlarge",
        4,
        3,
        [StepInPool("hourly/run-1 watch_score", 3, 120.0)],
        [StepInPool("backfill/run-9 watch_score", 2, 41.0), StepInPool("hourly/run-2 watch_score", 2, 5.0)],
        JobsToday(succeeded=12, resubmitted_for_capacity=1, failed=0),
    )
    assert fleet_lines([view]) == [
        "ml.c5.2xlarge: 3 of 4 in use (pool sagemaker-ml.c5.2xlarge); 1 step task(s) running, 2 waiting, the oldest "
        "for 41s",
        "  today    12 succeeded, 1 resubmitted for capacity, 0 failed",
        "  running  hourly/run-1 watch_score (3 instance(s))",
        "  waiting  backfill/run-9 watch_score (2 instance(s)) for 41s",
        "  waiting  hourly/run-2 watch_score (2 instance(s)) for 5s",
    ]


def test_when_the_ledger_cannot_be_read_the_lines_say_so_and_still_show_the_pool():
    view = TypeView(C5, "sagemaker-ml.c5.2xlarge", 4, 0, [], [], None, "the ledger could not be read (ClientError)")
    assert fleet_lines([view])[1] == "  today    unknown: the ledger could not be read (ClientError)"


class _Pools:
    """Airflow's pools as its REST API answers for them: ``pools`` by name."""

    def __init__(self, pools: dict[str, dict]):
        self.pools = pools

    def pool(self, name: str):
        return self.pools.get(name)

    def pool_task_instances(self, name: str, states):
        return []


def test_a_pool_fleet_yaml_names_that_airflow_lacks_or_holds_otherwise_is_named_with_the_fix(tmp_path):
    (tmp_path / "fleet.yaml").write_text("quotas:\n  ml.c5.2xlarge: 4\n  ml.m5.large: 2\n  ml.m5.xlarge: 1\n")
    pools = _Pools(
        {
            "sagemaker-ml.m5.large": {"slots": 2, "include_deferred": False},
            "sagemaker-ml.m5.xlarge": {"slots": 1, "include_deferred": True},
        }
    )
    views = {v.instance_type: v for v in fleet_view(tmp_path, pools, dt.datetime(2026, 11, 29, tzinfo=dt.UTC))}
    assert views[C5].out_of_step == "it does not exist in Airflow, so a step on this type waits for it forever"
    assert views["ml.m5.large"].out_of_step.startswith("it does not count deferred tasks")
    assert views["ml.m5.xlarge"].out_of_step is None
    lines = fleet_lines([views[C5]])
    assert lines[1] == (
        "  ! pool sagemaker-ml.c5.2xlarge: it does not exist in Airflow, so a step on this type waits for it "
        "forever; `shardline fleet sync` mends it"
    )
