"""One local job's grant, from the template's job-role statements: what a job (its worker, or its model's code)
may do to S3 and the ledger, request by request, as IAM decides it on AWS."""

from __future__ import annotations

import pytest

from shardline.grant.job import JobGrant, JobScope
from shardline.grant.policy import IamRequest
from shardline.grant.requests import dynamodb_requests, table_arn

SCOPE = JobScope(
    pipeline="daily_churn",
    table="shardline-jobs",
    region="us-east-1",
    input_uri="s3://data/events/dt=2026-11-22/",
    model_uri="s3://models/churn/v3/model.tar.gz",
    output_uri="s3://data/scores/daily_churn/dt=2026-11-22/",
)
OUT = "arn:aws:s3:::data/scores/daily_churn/dt=2026-11-22"
TABLE = table_arn("us-east-1", "shardline-jobs")
WORKER_ATTRIBUTES = [
    "at",
    "bout",
    "ho",
    "ik",
    "mw",
    "ok",
    "osha",
    "pk",
    "rin",
    "rjk",
    "rout",
    "rrej",
    "sk",
    "st",
    "ttl",
]


@pytest.fixture(scope="module")
def grant() -> JobGrant:
    return JobGrant.of(SCOPE)


def s3(action: str, resource: str, **context) -> IamRequest:
    return IamRequest(action, resource, context)


def get(pk: str, attributes: list[str], select: str = "SPECIFIC_ATTRIBUTES") -> IamRequest:
    """A GetItem as the grant engine reads it (``dynamodb:Select``: SPECIFIC_ATTRIBUTES with a projection)."""
    context = {"dynamodb:LeadingKeys": [pk], "dynamodb:Attributes": attributes, "dynamodb:Select": select}
    return IamRequest("dynamodb:GetItem", TABLE, context)


LOCK = "PARTITION#s3://data/scores/daily_churn/dt=2026-11-22/"


def update(pk: str, attributes: list[str], **context) -> IamRequest:
    return IamRequest(
        "dynamodb:UpdateItem", TABLE, {"dynamodb:LeadingKeys": [pk], "dynamodb:Attributes": attributes, **context}
    )


ALLOWED = {
    "its output": s3("s3:PutObject", f"{OUT}/part-00.parquet"),
    "its output, a multipart part": s3("s3:AbortMultipartUpload", f"{OUT}/part-00.parquet"),
    "its instance manifest": s3(
        "s3:PutObject", f"{OUT}/_shardline/instances/run-1/score/attempt-0001/manifest-algo-1.json"
    ),
    "a file's rejects list, tagged as Shardline's own": s3(
        "s3:PutObjectTagging", f"{OUT}/_shardline/instances/run-1/score/attempt-0001/rejects/part-00.csv.jsonl"
    ),
    "its input": s3("s3:GetObject", "arn:aws:s3:::data/events/dt=2026-11-22/part-00.parquet"),
    "its model": s3("s3:GetObject", "arn:aws:s3:::models/churn/v3/model.tar.gz"),
    "a listing of its input": s3("s3:ListBucket", "arn:aws:s3:::data", **{"s3:prefix": "events/dt=2026-11-22/"}),
    "its FILE item": update("RUN#daily_churn#run-1", WORKER_ATTRIBUTES, **{"dynamodb:ReturnValues": "ALL_NEW"}),
    "the STEP item's attempt, checked": IamRequest(
        "dynamodb:ConditionCheckItem",
        TABLE,
        {"dynamodb:LeadingKeys": ["RUN#daily_churn#run-1"], "dynamodb:Attributes": ["oat", "olv", "pk", "sk"]},
    ),
    "its run's status, before an upload": get("RUN#daily_churn#run-1", ["ost", "pk", "sk"]),
    "who holds its output prefix, before an upload": get(LOCK, ["opl", "ori", "osp", "ost", "pk", "sk"]),
}
REFUSED = {
    "another pipeline's outputs, read": s3(
        "s3:GetObject", "arn:aws:s3:::data/scores/weekly_ltv/dt=2026-11-22/part-00.parquet"
    ),
    "another pipeline's outputs, written": s3(
        "s3:PutObject", "arn:aws:s3:::data/scores/weekly_ltv/dt=2026-11-22/part-00.parquet"
    ),
    "another partition of its own pipeline": s3(
        "s3:PutObject", "arn:aws:s3:::data/scores/daily_churn/dt=2026-11-21/part-00.parquet"
    ),
    "its own _SUCCESS": s3("s3:PutObject", f"{OUT}/_SUCCESS"),
    "its own _SUCCESS, deleted": s3("s3:DeleteObject", f"{OUT}/_SUCCESS"),
    "its run report": s3("s3:PutObject", f"{OUT}/_shardline/reports/run-1/score/report.json"),
    "its input manifest": s3("s3:PutObject", f"{OUT}/_shardline/manifests/run-1/score/attempt-0001.json"),
    "an output deleted": s3("s3:DeleteObject", f"{OUT}/part-00.parquet"),
    "its input, written": s3("s3:PutObject", "arn:aws:s3:::data/events/dt=2026-11-22/part-00.parquet"),
    "its model, replaced": s3("s3:PutObject", "arn:aws:s3:::models/churn/v3/model.tar.gz"),
    "another model": s3("s3:GetObject", "arn:aws:s3:::models/ltv/v1/model.tar.gz"),
    "a listing of the whole bucket": s3("s3:ListBucket", "arn:aws:s3:::data"),
    "a listing of another pipeline": s3("s3:ListBucket", "arn:aws:s3:::data", **{"s3:prefix": "scores/weekly_ltv/"}),
    "a bucket that is not its own": s3("s3:GetBucketLocation", "arn:aws:s3:::secrets"),
    "every bucket": s3("s3:ListAllMyBuckets", "*"),
    "a bucket policy": s3("s3:PutBucketPolicy", "arn:aws:s3:::data"),
    "another pipeline's FILE item": update("RUN#weekly_ltv#run-1", WORKER_ATTRIBUTES),
    "a step's plan": update("RUN#daily_churn#run-1", ["pk", "sk", "pj"]),
    "a run's message": update("RUN#daily_churn#run-1", ["pk", "sk", "msg"]),
    "a whole item back": update("RUN#daily_churn#run-1", ["pk", "sk", "st"], **{"dynamodb:ReturnValues": "ALL_OLD"}),
    "a whole item written": IamRequest(
        "dynamodb:PutItem",
        TABLE,
        {"dynamodb:LeadingKeys": ["RUN#daily_churn#run-1"], "dynamodb:Attributes": ["pk", "sk"]},
    ),
    "an item deleted": IamRequest("dynamodb:DeleteItem", TABLE, {"dynamodb:LeadingKeys": ["RUN#daily_churn#run-1"]}),
    "the table read": IamRequest("dynamodb:Scan", TABLE),
    "another table": IamRequest(
        "dynamodb:UpdateItem",
        table_arn("us-east-1", "other"),
        {"dynamodb:LeadingKeys": ["RUN#daily_churn#r"], "dynamodb:Attributes": ["pk", "sk"]},
    ),
    "a whole RUN item": get("RUN#daily_churn#run-1", ["pk", "sk"], select="ALL_ATTRIBUTES"),
    "a step's plan, read": get("RUN#daily_churn#run-1", ["pj", "pk", "sk"]),
    "another pipeline's run": get("RUN#weekly_ltv#run-1", ["ost", "pk", "sk"]),
    "a whole partition lock": get(LOCK, ["pk", "sk"], select="ALL_ATTRIBUTES"),
    "who holds another prefix": get("PARTITION#s3://data/scores/weekly_ltv/dt=2026-11-22/", ["ost", "pk", "sk"]),
    "who holds another partition": get("PARTITION#s3://data/scores/daily_churn/dt=2026-11-21/", ["ost", "pk", "sk"]),
    "a partition lock": update("PARTITION#s3://data/scores/daily_churn/dt=2026-11-22/", ["pk", "sk", "st"]),
    "another service": IamRequest("sts:AssumeRole", "arn:aws:iam::123456789012:role/airflow"),
}


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_a_job_may_do_what_its_work_needs(grant, case):
    assert grant.allows(ALLOWED[case])


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_job_may_do_nothing_else(grant, case):
    assert not grant.allows(REFUSED[case])


def test_an_output_prefix_at_a_buckets_top_level_is_still_only_its_own():
    grant = JobGrant.of(JobScope("p", "t", "us-east-1", "s3://in/", "s3://m/model.tar.gz", "s3://out/"))
    assert grant.allows(s3("s3:PutObject", "arn:aws:s3:::out/part-0.parquet"))
    assert not grant.allows(s3("s3:PutObject", "arn:aws:s3:::out/_SUCCESS"))
    assert not grant.allows(s3("s3:PutObject", "arn:aws:s3:::other/part-0.parquet"))


def test_the_scope_comes_from_the_request_shardline_builds():
    request = {
        "ProcessingJobName": "sl-p-score-abc-a1",
        "Environment": {
            "SHARDLINE_PIPELINE": "p",
            "SHARDLINE_LEDGER_TABLE": "t",
            "SHARDLINE_INPUT_URI": "s3://in/x/",
            "SHARDLINE_OUTPUT_URI": "s3://out/y/",
            "AWS_REGION": "eu-west-1",
        },
        "ProcessingInputs": [
            {"InputName": "data", "S3Input": {"S3Uri": "s3://out/y/_shardline/manifests/a.json"}},
            {"InputName": "model", "S3Input": {"S3Uri": "s3://m/model.tar.gz"}},
        ],
    }
    assert JobScope.of_request(request, {}) == JobScope(
        "p", "t", "eu-west-1", "s3://in/x/", "s3://m/model.tar.gz", "s3://out/y/", ""
    )
    del request["Environment"]["SHARDLINE_OUTPUT_URI"]
    with pytest.raises(ValueError, match="SHARDLINE_OUTPUT_URI"):
        JobScope.of_request(request, {})


def test_with_a_metadata_prefix_its_instances_manifests_go_there_and_nothing_else_does():
    scope = JobScope(
        "p",
        "t",
        "us-east-1",
        "s3://data/in/",
        "s3://m/model.tar.gz",
        "s3://data/out/",
        "s3://data/meta/_shardline/instances/run-1/score/attempt-0001/",
    )
    grant = JobGrant.of(scope)
    folder = "arn:aws:s3:::data/meta/_shardline/instances/run-1/score/attempt-0001"
    assert grant.allows(s3("s3:PutObject", f"{folder}/manifest-algo-1.json"))
    assert grant.allows(s3("s3:PutObject", "arn:aws:s3:::data/out/part-0.parquet"))
    assert not grant.allows(s3("s3:PutObject", f"{folder}/_SUCCESS"))
    assert not grant.allows(s3("s3:PutObject", "arn:aws:s3:::data/meta/_shardline/reports/run-1/report.json"))
    assert not grant.allows(s3("s3:PutObject", "arn:aws:s3:::data/meta/_shardline/manifests/run-1/score/a.manifest"))
    assert not grant.allows(s3("s3:PutObject", "arn:aws:s3:::data/meta/_shardline/instances/run-2/x.json"))


@pytest.mark.parametrize(
    ("body", "allowed"),
    [
        ({"ProjectionExpression": "#a", "ExpressionAttributeNames": {"#a": "ost"}}, True),
        ({}, False),  # no projection: GetItem returns the whole item, plan and messages included
    ],
    ids=["projected", "whole item"],
)
def test_a_read_of_its_runs_status_needs_a_projection(grant, body, allowed):
    request_body = {"TableName": "shardline-jobs", "Key": {"pk": {"S": "RUN#daily_churn#run-1"}, "sk": {"S": "RUN"}}}
    (request,) = dynamodb_requests("GetItem", {**request_body, **body}, "us-east-1")
    assert grant.allows(request) is allowed
