"""AWS's ordinary refusals as pure decisions (``shardline.decision.fleet``): waits at submit, capacity fallbacks,
pools and priorities. Tables, no AWS."""

from __future__ import annotations

import json

import pytest

from shardline.decision.fleet import (
    PRIORITY_WEIGHTS,
    Admission,
    SubmitRefusal,
    Waiting,
    admission_text,
    capacity_choice,
    is_capacity_failure,
    pool_name,
    refusal_of,
    submit_wait,
    submit_wait_text,
    vcpus,
)
from shardline.errors import InvalidArgument

QUOTA_MESSAGE = (
    "The account-level service limit 'ml.c5.2xlarge for processing job usage' is 20 Instances, with current "
    "utilization of 18 Instances and a request delta of 4 Instances."
)


@pytest.mark.parametrize(
    ("code", "refusal"),
    [
        ("ResourceLimitExceeded", SubmitRefusal.QUOTA),
        ("ThrottlingException", SubmitRefusal.THROTTLED),
        ("ServiceUnavailable", SubmitRefusal.UNAVAILABLE),
        ("InternalFailure", SubmitRefusal.INTERNAL),
        ("ValidationException", None),  # a bad request: waiting mends nothing
        ("ResourceInUse", None),  # the job exists: the backend adopts it
        ("AccessDeniedException", None),
        ("", None),
        (None, None),
    ],
)
def test_which_answers_are_waits(code, refusal):
    assert refusal_of(code) is refusal
    wait = submit_wait(code, "x", 1, 0.0)
    assert (wait.refusal if wait else None) is refusal


# refusals in a row, jitter -> the wait (first 30 s, doubling, at most 900 s; jitter spans the upper half)
@pytest.mark.parametrize(
    ("refusals", "jitter", "seconds"),
    [
        (1, 0.0, 15.0),
        (1, 0.5, 22.5),
        (1, 0.999, 29.985),
        (2, 0.0, 30.0),
        (3, 0.0, 60.0),
        (5, 0.0, 240.0),
        (6, 0.0, 450.0),  # 30 * 2**5 = 960: capped at 900
        (6, 0.999, 899.55),
        (40, 0.5, 675.0),  # still capped: no overflow after many refusals
    ],
)
def test_the_wait_doubles_with_jitter_in_its_upper_half_up_to_a_cap(refusals, jitter, seconds):
    wait = submit_wait("ThrottlingException", "Rate exceeded", refusals, jitter)
    assert wait.delay_seconds == pytest.approx(seconds)
    assert wait.refusals == refusals


def test_a_quota_refusal_says_why_and_that_it_is_no_attempt():
    wait = submit_wait("ResourceLimitExceeded", QUOTA_MESSAGE, 2, 0.25)
    assert wait.reason.startswith("the account's quota of this instance type is in use (ResourceLimitExceeded: ")
    assert "18 Instances" in wait.reason
    text = submit_wait_text("p-r-score-1", wait)
    assert "p-r-score-1" in text and "in 38s" in text and "not an attempt" in text


def test_a_submit_gives_up_waiting_after_a_day_and_refuses_nonsense():
    assert submit_wait("ResourceLimitExceeded", "x", 100, 0.1, waited_seconds=24 * 3600) is None
    assert submit_wait("ResourceLimitExceeded", "x", 100, 0.1, waited_seconds=24 * 3600 - 1) is not None
    for refusals, jitter in ((0, 0.5), (1, 1.0), (1, -0.1)):
        with pytest.raises(InvalidArgument):
            submit_wait("ThrottlingException", "x", refusals, jitter)


@pytest.mark.parametrize(
    ("reason", "capacity"),
    [
        (
            "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML "
            "instance type.",
            True,
        ),
        ("  CapacityError: Unable to provision", True),
        ("AlgorithmError: exit code 1", False),
        ("ClientError: Failed to download data. CapacityError mentioned later", False),
        ("InternalServerError: We encountered an internal error.", False),
        ("", False),
        (None, False),
    ],
)
def test_a_capacity_failure_is_told_by_its_reason(reason, capacity):
    assert is_capacity_failure(reason) is capacity


@pytest.mark.parametrize(
    ("instance_type", "cpus"),
    [
        ("ml.t3.medium", 2),
        ("ml.m5.large", 2),
        ("ml.m5.xlarge", 4),
        ("ml.c5.2xlarge", 8),
        ("ml.c5.9xlarge", 36),
        ("ml.p4d.24xlarge", 96),
        ("ml.g4dn.xlarge", 4),
        ("ml.inf1.6xlarge", 24),
    ],
)
def test_vcpus_from_the_size(instance_type, cpus):
    assert vcpus(instance_type) == cpus


@pytest.mark.parametrize("bad", ["c5.2xlarge", "ml.c5", "ml.c5.huge", "ml.c5.2xlarge ", ""])
def test_an_unknown_instance_type_names_the_settings(bad):
    with pytest.raises(InvalidArgument, match=r"resources\.instance_type"):
        vcpus(bad)


TYPES = ("ml.c5.2xlarge", "ml.m5.2xlarge", "ml.c5.xlarge")


# failures so far -> (type, count) of the next job, for 4 instances planned on ml.c5.2xlarge (32 vCPUs)
@pytest.mark.parametrize(
    ("failures", "chosen"),
    [
        ({}, ("ml.c5.2xlarge", 4)),  # a first capacity failure of nothing: the same type again
        ({"ml.c5.2xlarge": 1}, ("ml.c5.2xlarge", 4)),  # one failure: the same type once more
        ({"ml.c5.2xlarge": 2}, ("ml.m5.2xlarge", 4)),  # its tries spent: the first fallback, same vCPUs
        ({"ml.c5.2xlarge": 2, "ml.m5.2xlarge": 2}, ("ml.c5.xlarge", 8)),  # half the vCPUs each: twice as many
        ({"ml.c5.2xlarge": 2, "ml.m5.2xlarge": 2, "ml.c5.xlarge": 2}, ("ml.c5.2xlarge", 4)),  # round again
        ({"ml.c5.2xlarge": 3, "ml.m5.2xlarge": 2, "ml.c5.xlarge": 2}, ("ml.m5.2xlarge", 4)),  # the least failed
    ],
)
def test_a_capacity_failure_moves_down_the_fallbacks_keeping_the_vcpus(failures, chosen):
    choice = capacity_choice(TYPES, 4, failures)
    assert (choice.instance_type, choice.instance_count) == chosen
    assert "not counted against retry.max_attempts" in choice.reason


def test_without_fallbacks_the_same_type_is_tried_again_and_counts_round_up():
    assert capacity_choice(("ml.m5.xlarge",), 3, {"ml.m5.xlarge": 9}).instance_type == "ml.m5.xlarge"
    # 3 x ml.c5.xlarge (12 vCPUs) on ml.c5.9xlarge (36): 1 instance
    assert capacity_choice(("ml.c5.xlarge", "ml.c5.9xlarge"), 3, {"ml.c5.xlarge": 2}).instance_count == 1
    moved = capacity_choice(("ml.c5.xlarge", "ml.c5.9xlarge"), 3, {"ml.c5.xlarge": 2})
    assert "resources.fallback_instance_types" in moved.reason and "ml.c5.xlarge 2x" in moved.reason
    with pytest.raises(InvalidArgument):
        capacity_choice((), 1, {})


def test_a_pool_per_instance_type_and_priorities_in_order():
    assert pool_name("ml.c5.2xlarge") == "sagemaker-ml.c5.2xlarge"
    assert PRIORITY_WEIGHTS["high"] > PRIORITY_WEIGHTS["normal"] > PRIORITY_WEIGHTS["low"] >= 1
    text = admission_text("ml.c5.2xlarge", 4, 20)
    assert text.startswith("waiting for 4 ml.c5.2xlarge instance(s) within the account's quota of 20 (pool ")
    assert "sagemaker-ml.c5.2xlarge" in text and "`shardline fleet`" in text
    both = admission_text("ml.c5.2xlarge", 4, 20, cap=8)
    assert "quota of 20 (pool" in both and "and the step's resources.max_concurrent_instances of 8;" in both
    capped = admission_text("ml.c5.2xlarge", 4, None, cap=8)
    assert capped == "waiting for 4 ml.c5.2xlarge instance(s) within the step's resources.max_concurrent_instances of 8"


@pytest.mark.parametrize(
    ("quota", "cap", "arguments", "max_instances", "says"),
    [
        (None, None, {}, None, ""),
        (
            20,
            None,
            {"pool": "sagemaker-ml.c5.2xlarge", "pool_slots": 4},
            4,
            "quota of 20 (pool sagemaker-ml.c5.2xlarge",
        ),
        (None, 8, {"max_active_tis_per_dag": 2}, 4, "resources.max_concurrent_instances of 8"),
        (20, 8, {"max_active_tis_per_dag": 2, "pool": "sagemaker-ml.c5.2xlarge", "pool_slots": 4}, 4, "and the step's"),
    ],
)
def test_a_steps_admission_is_its_pool_and_its_cap_and_bounds_what_a_run_may_ask_for(
    quota, cap, arguments, max_instances, says
):
    admission = Admission("ml.c5.2xlarge", 4, quota, cap)
    assert admission.task_arguments() == arguments
    assert admission.max_instances == max_instances  # a run may ask for fewer instances than it is admitted by
    text = admission.waiting_text()
    assert (says in text and text.startswith("waiting for 4 ml.c5.2xlarge")) if says else text == ""


def test_an_admission_travels_as_json_and_comes_back_the_same():
    admission = Admission("ml.c5.2xlarge", 4, 20, 8)
    assert Admission.from_json(json.loads(json.dumps(admission.to_json()))) == admission
    assert Admission.from_json(Admission("ml.m5.large", 1).to_json()) == Admission("ml.m5.large", 1, None, None)


def test_a_wait_is_recorded_as_data_and_rendered_where_it_is_shown():
    """A planned step's wait goes on its STEP item as JSON and comes back equal; the words are made from it by the
    views, so the waiting text is never stored."""
    admitted = Waiting(admission=Admission("ml.c5.2xlarge", 4, 20))
    assert Waiting.from_json(admitted.to_json()) == admitted
    assert admitted.text() == Admission("ml.c5.2xlarge", 4, 20).waiting_text()
    wait = submit_wait("ResourceLimitExceeded", "quota", refusals=2, jitter=0.0, first_seconds=30.0)
    refused = Waiting(submit=wait, job_name="sl-p-run-score-a1", retry_at=1_800_000_030.0)
    assert Waiting.from_json(refused.to_json()) == refused
    assert refused.text() == submit_wait_text("sl-p-run-score-a1", wait)
    assert "not submitted yet: the account's quota of this instance type is in use" in refused.text()
    # Nothing counts the step's instances: nothing to wait for, and nothing to say.
    assert Waiting(admission=Admission("ml.m5.large", 1)).text() == ""
    # A view never fails on what it reads: no wait, or not one.
    for recorded in (None, "", "not json", "[1]", '{"submit": {"refusal": "Nope"}}'):
        assert Waiting.from_json(recorded) is None or Waiting.from_json(recorded).text() == "", recorded
