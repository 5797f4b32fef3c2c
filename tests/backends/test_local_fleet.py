"""The local emulator's account (``shardline.backends.local_fleet``): the quota it enforces, the refusals it
injects, and its own record of the instances in use, which never passes the quota, even when submits race."""

from __future__ import annotations

import json
import multiprocessing as mp

import botocore.exceptions
import pytest

from shardline.backends import local_fleet
from shardline.backends.local_fleet import EmulatedFleet, FleetConfigError, in_use, peak_in_use, read_record

TYPE = "ml.c5.2xlarge"


def never_ended(job: str) -> bool:
    return False


def test_the_quota_admits_up_to_its_instances_and_refuses_as_sagemaker_does(tmp_path):
    fleet = EmulatedFleet(quotas={TYPE: 5})
    local_fleet.take(tmp_path, fleet, "job-a", TYPE, 3, never_ended)
    local_fleet.take(tmp_path, fleet, "job-a", TYPE, 3, never_ended)  # a retried submit takes nothing twice
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        local_fleet.take(tmp_path, fleet, "job-b", TYPE, 3, never_ended)
    error = refused.value.response["Error"]
    assert error["Code"] == "ResourceLimitExceeded"
    assert f"'{TYPE} for processing job usage' is 5 Instances, with current utilization of 3" in error["Message"]
    local_fleet.take(tmp_path, fleet, "job-c", TYPE, 2, never_ended)  # 3 + 2 = 5: within
    local_fleet.take(tmp_path, fleet, "job-d", "ml.m5.xlarge", 50, never_ended)  # no quota for this type
    assert in_use(read_record(tmp_path))[TYPE] == {"job-a": 3, "job-c": 2}
    local_fleet.give_back(tmp_path, "job-a")
    local_fleet.give_back(tmp_path, "job-a")  # once
    local_fleet.take(tmp_path, fleet, "job-b", TYPE, 3, never_ended)
    assert peak_in_use(read_record(tmp_path)) == {TYPE: 5, "ml.m5.xlarge": 50}


def test_a_job_that_ended_without_giving_back_its_instances_frees_them_at_the_next_submit(tmp_path):
    """Its supervisor was killed with -9: no -n line. The next admission asks whether it ended."""
    fleet = EmulatedFleet(quotas={TYPE: 4})
    local_fleet.take(tmp_path, fleet, "dead", TYPE, 4, never_ended)
    with pytest.raises(botocore.exceptions.ClientError):
        local_fleet.take(tmp_path, fleet, "next", TYPE, 4, never_ended)
    local_fleet.take(tmp_path, fleet, "next", TYPE, 4, lambda job: job == "dead")
    assert in_use(read_record(tmp_path))[TYPE] == {"next": 4}
    assert peak_in_use(read_record(tmp_path))[TYPE] == 4


def _submit_many(args) -> int:
    root, worker = args
    fleet = EmulatedFleet(quotas={TYPE: 4})
    admitted = 0
    for i in range(30):
        job = f"w{worker}-{i}"
        try:
            local_fleet.take(root, fleet, job, TYPE, 1 + i % 3, never_ended)
        except botocore.exceptions.ClientError:
            continue
        admitted += 1
        local_fleet.give_back(root, job)
    return admitted


def test_racing_submits_never_take_the_account_past_its_quota(tmp_path):
    with mp.get_context("spawn").Pool(4) as pool:
        admitted = pool.map(_submit_many, [(tmp_path, w) for w in range(4)])
    record = read_record(tmp_path)
    assert sum(admitted) == sum(1 for e in record if e["delta"] > 0) > 0
    assert peak_in_use(record)[TYPE] <= 4
    assert in_use(record)[TYPE] == {}


def test_refusals_by_schedule_and_by_share_are_repeatable():
    scheduled = EmulatedFleet(refuse_first={"ThrottlingException": 1, "ResourceLimitExceeded": 2})
    assert [scheduled.refusal("j", call) for call in (1, 2, 3, 4)] == [
        "ResourceLimitExceeded",  # the codes in name order
        "ResourceLimitExceeded",
        "ThrottlingException",
        None,
    ]
    shared = EmulatedFleet(refuse={"ThrottlingException": 0.3}, seed="s")
    picked = [shared.refusal(f"job-{i}", 1) for i in range(2000)]
    assert picked == [shared.refusal(f"job-{i}", 1) for i in range(2000)]  # the same calls every time
    assert 0.25 < picked.count("ThrottlingException") / 2000 < 0.35
    other = EmulatedFleet(refuse={"ThrottlingException": 0.3}, seed="other")
    assert [other.refusal(f"job-{i}", 1) for i in range(2000)] != picked  # the seed picks which calls
    always = EmulatedFleet(capacity_errors={TYPE: 1.0})
    assert always.capacity_error("j", TYPE) and not always.capacity_error("j", "ml.m5.xlarge")


def test_the_settings_come_from_the_environment_or_the_local_root(tmp_path):
    assert EmulatedFleet.load(tmp_path, {}) == EmulatedFleet()
    (tmp_path / local_fleet.FLEET_FILE).write_text(json.dumps({"quotas": {TYPE: 4}}))
    assert EmulatedFleet.load(tmp_path, {}).quotas == {TYPE: 4}
    env = {local_fleet.FLEET_ENV: json.dumps({"quotas": {TYPE: 2}, "refuse": {"ThrottlingException": 0.5}})}
    assert EmulatedFleet.load(tmp_path, env).quotas == {TYPE: 2}  # the environment wins
    for bad in ("not json", json.dumps({"quota": {TYPE: 4}}), json.dumps({"quotas": {TYPE: "many"}})):
        with pytest.raises(FleetConfigError, match=local_fleet.FLEET_ENV):
            EmulatedFleet.load(tmp_path, {local_fleet.FLEET_ENV: bad})


def test_a_job_whose_submit_died_while_creating_it_holds_no_instances_past_the_staging_age(tmp_path):
    """A submit killed between taking its instances and renaming its staging folder into place: the folder
    stays. While it is young the job is being created; once it is older than any submit takes, it has ended."""
    import os
    import time

    from shardline.backends.local import STAGING_MAX_AGE_SECONDS, LocalBackend

    backend = LocalBackend(tmp_path)
    staging = tmp_path / "jobs" / ".job-a.x1y2"
    staging.mkdir(parents=True)
    assert not backend._ended("job-a")  # being created
    old = time.time() - STAGING_MAX_AGE_SECONDS - 60
    os.utime(staging, (old, old))
    assert backend._ended("job-a")  # its submit died
    assert backend._ended("job-b")  # never created at all
