"""The typed attempt: what is derived from it, and how it travels (XCom, a trigger's kwargs, the ledger)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from shardline.planning import naming
from shardline.planning.attempt import Attempt, PlannedFile
from shardline.planning.inputs import S3Object


def _attempt(**overrides) -> Attempt:
    fields = dict(
        pipeline="tabular_scoring_hourly",
        run_id="manual__2026-11-22T10:00:00+00:00",
        step="score",
        number=2,
        input_prefix="s3://b/events/hour=10/",
        output_prefix="s3://b/scores/hour=10/",
        model_uri="s3://b/models/v1/model.tar.gz",
        model_version="v1",
        requested_instances=4,
        file_count=3,
    )
    return Attempt(**{**fields, **overrides})


def test_the_job_name_manifest_and_instance_count_are_derived_in_one_place():
    attempt = _attempt()
    assert attempt.job_name == naming.job_name(attempt.pipeline, attempt.run_id, "score", 2)
    assert attempt.manifest_uri == naming.manifest_key(attempt.output_prefix, attempt.run_id, "score", 2)
    assert attempt.instance_count == 3  # never more instances than files
    assert _attempt(file_count=40).instance_count == 4
    meta = _attempt(metadata_prefix="s3://b/meta/_shardline/")
    assert meta.manifest_uri.startswith("s3://b/meta/_shardline/manifests/")


def test_it_round_trips_through_xcom_as_the_json_the_tasks_have_always_passed():
    attempt = _attempt(files=(PlannedFile(key="events/hour=10/a.parquet", size=10),), submitted_at=1.5)
    data = attempt.to_xcom()
    assert json.loads(json.dumps(data)) == data
    # The shape earlier releases wrote, derived fields included, so runs in flight across an upgrade go on.
    assert (data["attempt"], data["files"], data["job_name"], data["instance_count"], data["manifest_uri"]) == (
        2,
        3,
        attempt.job_name,
        3,
        attempt.manifest_uri,
    )
    back = Attempt.from_xcom(data)
    assert back == attempt.model_copy(update={"files": ()})  # the list stays in the manifest and the ledger


def test_an_attempt_from_an_earlier_releases_xcom_is_read():
    old = {
        "pipeline": "p",
        "run_id": "r",
        "step": "score",
        "attempt": 1,
        "job_name": naming.job_name("p", "r", "score", 1),
        "manifest_uri": naming.manifest_key("s3://b/out/", "r", "score", 1),
        "input_prefix": "s3://b/in/",
        "output_prefix": "s3://b/out/",
        "metadata_prefix": None,
        "model_uri": "s3://b/m.tar.gz",
        "model_version": None,
        "requested_instances": 2,
        "instance_count": 2,
        "files": 5,
        "submitted_at": 12.0,
        "planning": {"list_seconds": 0.1},
    }
    attempt = Attempt.from_xcom(old)
    assert (attempt.number, attempt.file_count, attempt.instance_count, attempt.submitted_at) == (1, 5, 2, 12.0)


def test_an_xcom_whose_job_name_no_longer_derives_the_same_is_refused():
    """Following a job by another name than the attempt derives would watch (or start) the wrong job."""
    data = _attempt().to_xcom()
    with pytest.raises(ValueError, match="job_name 'sl-other-a2' is not the"):
        Attempt.from_xcom({**data, "job_name": "sl-other-a2"})


def test_it_is_rebuilt_from_the_ledgers_plan_alone():
    attempt = _attempt()
    again = Attempt.from_plan(attempt.plan_json(), 2, 3, pipeline=attempt.pipeline, run_id=attempt.run_id, step="score")
    assert again == attempt
    with pytest.raises(ValueError, match="lacks input_prefix, model_uri"):
        Attempt.from_plan(json.dumps({"output_prefix": "s3://b/out/"}), 1, 1, pipeline="p", run_id="r", step="s")
    assert set(json.loads(attempt.plan_json())) == {
        "pipeline",
        "run_id",
        "step",
        "input_prefix",
        "parts_prefix",
        "output_prefix",
        "metadata_prefix",
        "model_uri",
        "model_version",
        "requested_instances",
        "instance_type",
        "capacity_failures",
        "planned_instances",
        "table_partition",  # a table step's partition, as rendered: its next attempts and its end commit it
    }


def test_the_next_attempt_keeps_the_plan_and_takes_its_files_with_their_sizes():
    files = [PlannedFile.of(S3Object("events/hour=10/b.parquet", 700)), PlannedFile(key="events/hour=10/c", size=5)]
    nxt = _attempt(submitted_at=9.0, planning={"list_seconds": 1}).next(3, files)
    assert (nxt.number, nxt.file_count, sum(f.size for f in nxt.files), nxt.submitted_at, nxt.planning) == (
        3,
        2,
        705,
        None,
        None,
    )
    assert nxt.job_name.endswith("-a3") and nxt.requested_instances == 4


def test_it_is_frozen_and_refuses_what_it_does_not_know():
    attempt = _attempt()
    with pytest.raises(ValidationError):
        attempt.number = 3
    with pytest.raises(ValidationError):
        Attempt(**{**attempt.model_dump(), "instances": 2})
    with pytest.raises(ValidationError):
        _attempt(number=0)


def test_an_attempt_after_capacity_failures_keeps_its_instance_type_and_is_counted_without_them():
    """The STEP item's plan carries the fallback type and the capacity failures: a resumed watch counts the same."""
    moved = _attempt().model_copy(
        update={"number": 4, "instance_type": "ml.m5.2xlarge", "capacity_failures": {"ml.c5.2xlarge": 2}}
    )
    assert moved.counted_number == 2 and _attempt().counted_number == _attempt().number
    again = Attempt.from_plan(moved.plan_json(), 4, 3, pipeline=moved.pipeline, run_id=moved.run_id, step="score")
    assert (again.instance_type, again.capacity_failures, again.counted_number) == (
        "ml.m5.2xlarge",
        {"ml.c5.2xlarge": 2},
        2,
    )
    assert Attempt.from_xcom(moved.to_xcom()) == moved
