"""The control plane's cost against moto_server and the local backend: the requests a job's instances count and
record with their heartbeats are the requests its grant proxy let through to the endpoint, kind by kind, and the run
report prices them apart from the instances."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardline.decision.policy import Action
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.report.cost import REQUEST_PRICES, requests_cost
from shardline.spec import RequestKind
from tests.orchestration.test_quote import report_of
from tests.support.pipelines import plan_request, wait_for_job


def test_the_requests_the_instances_count_are_those_the_endpoint_was_sent_and_the_report_prices_them(pipeline):
    spec, bucket = pipeline
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-cp", bucket))).attempt
    wait_for_job(spec, attempt)
    assert step_end.finish(spec, attempt, Action.ADVANCE, "all 4 files succeeded").value == "SUCCEEDED"
    report = report_of(spec, "run-cp")
    # What the job's grant proxy let through to the endpoint, counted from the wire, written when the job ended
    seen = json.loads(
        (Path(os.environ["SHARDLINE_LOCAL_ROOT"]) / "jobs" / attempt.job_name / "grant-requests.json").read_text()
    )
    assert report.cost.requests == seen, (report.cost.requests, seen)
    # 4 files: a claim and a finish each (writes), the heartbeats (transactions), each output and its profile (PUTs)
    assert seen["dynamodb.write"] >= 8 and seen["dynamodb.transact"] >= 2 and seen["s3.put"] >= 8 + 1  # + manifest
    # Priced apart from the instances: theirs, and one GET a file and one for the model
    assert report.cost.downloads == 4 + 1
    priced = {**seen, "s3.get": seen.get("s3.get", 0) + 5}
    assert report.cost.control_plane == pytest.approx(requests_cost(priced))
    assert report.cost.control_plane_per_million == pytest.approx(report.cost.control_plane / 1200 * 1e6)
    assert report.cost.total is not None and report.cost.control_plane > 0


def test_the_spec_prices_the_same_kinds_the_shipped_table_does():
    from typing import get_args

    assert set(get_args(RequestKind)) == set(REQUEST_PRICES)
