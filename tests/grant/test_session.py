"""Credentials for a local job whose endpoints are AWS's own: the request's role, assumed (STS on moto_server, over
HTTP) with a session policy that narrows S3 and DynamoDB to the job, never the submitter's own credentials."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config

from shardline.backends.local_credentials import assume_job_role
from shardline.grant.job import JobGrant, JobScope
from shardline.grant.policy import IamRequest, allowed
from shardline.grant.session import SESSION_POLICY_LIMIT, JobCredentialsError, session_policy
from tests.support.backend_jobs import job  # noqa: F401

DATA, MODELS = "data-bucket-123456789012", "models-123456789012"
SCOPE = JobScope(
    "daily_churn",
    "shardline-jobs",
    "us-east-1",
    f"s3://{DATA}/events/dt=2026-11-22/hour=10/",
    f"s3://{MODELS}/churn/v12/model.tar.gz",
    f"s3://{DATA}/scores/daily_churn/dt=2026-11-22/hour=10/",
    "s3://meta-123456789012/shardline/daily_churn/instances/",
)


def _narrowing(policy: str) -> list[dict]:
    """The statements that narrow S3 and DynamoDB (the evaluator reads Action statements; the one NotAction
    statement passes every other service through as the role allows)."""
    statements = json.loads(policy)["Statement"]
    assert statements[0] == {"Effect": "Allow", "NotAction": ["s3:*", "dynamodb:*"], "Resource": "*"}
    return statements[1:]


def test_the_session_policy_narrows_s3_and_the_ledger_to_the_job_within_stss_limit():
    policy = session_policy(JobGrant.of(SCOPE))
    assert len(policy) <= SESSION_POLICY_LIMIT
    statements = _narrowing(policy)
    out = f"arn:aws:s3:::{DATA}/scores/daily_churn/dt=2026-11-22/hour=10/"
    ledger = "arn:aws:dynamodb:us-east-1:210987654321:table/shardline-jobs"
    allowed_requests = [
        IamRequest("s3:PutObject", out + "part-0.parquet"),
        IamRequest("s3:PutObject", "arn:aws:s3:::meta-123456789012/shardline/daily_churn/instances/m.json"),
        IamRequest("s3:GetObject", f"arn:aws:s3:::{DATA}/events/dt=2026-11-22/hour=10/part-0.parquet"),
        IamRequest("s3:GetObject", f"arn:aws:s3:::{MODELS}/churn/v12/model.tar.gz"),
        IamRequest("s3:ListBucket", f"arn:aws:s3:::{DATA}", {"s3:prefix": "events/dt=2026-11-22/hour=10/"}),
        IamRequest("dynamodb:UpdateItem", ledger, {"dynamodb:LeadingKeys": ["RUN#daily_churn#run-1"]}),
        IamRequest("dynamodb:GetItem", ledger, {"dynamodb:LeadingKeys": ["RUN#daily_churn#run-1"]}),
        IamRequest(
            "dynamodb:GetItem",
            ledger,
            {"dynamodb:LeadingKeys": [f"PARTITION#s3://{DATA}/scores/daily_churn/dt=2026-11-22/hour=10/"]},
        ),
    ]
    refused_requests = [
        IamRequest("s3:PutObject", f"arn:aws:s3:::{DATA}/scores/daily_churn/dt=2026-11-21/hour=10/part-0.parquet"),
        IamRequest("s3:GetObject", f"arn:aws:s3:::{DATA}/scores/weekly_ltv/dt=2026-11-22/part-0.parquet"),
        IamRequest("s3:GetObject", f"arn:aws:s3:::{MODELS}/churn/v13/model.tar.gz"),
        IamRequest("s3:ListBucket", f"arn:aws:s3:::{DATA}", {"s3:prefix": "scores/"}),
        IamRequest("s3:DeleteObject", out + "part-0.parquet"),
        IamRequest("dynamodb:UpdateItem", ledger, {"dynamodb:LeadingKeys": ["RUN#weekly_ltv#run-1"]}),
        IamRequest("dynamodb:Scan", ledger),
        IamRequest(
            "dynamodb:GetItem",
            ledger,
            {"dynamodb:LeadingKeys": [f"PARTITION#s3://{DATA}/scores/daily_churn/dt=2026-11-21/hour=10/"]},
        ),
    ]
    assert [r for r in allowed_requests if not allowed(statements, r)] == []
    assert [r for r in refused_requests if allowed(statements, r)] == []


def test_prefixes_too_long_for_a_session_policy_are_refused_naming_the_settings():
    long = "x" * 600
    scope = JobScope("p", "t", "us-east-1", f"s3://b/{long}/in/", f"s3://b/{long}/model.tar.gz", f"s3://b/{long}/out/")
    with pytest.raises(JobCredentialsError, match=r"input\.prefix, output\.prefix or model\.uri"):
        session_policy(JobGrant.of(scope))


@pytest.mark.slow
def test_the_job_holds_its_roles_session_named_for_it_never_the_submitters(aws_env, job):  # noqa: F811
    request = job(run_id="run-a")
    sts = boto3.client("sts")
    credentials = assume_job_role(request, sts, aws_env)
    submitter = boto3.Session().get_credentials().get_frozen_credentials()
    assert credentials.access_key != submitter.access_key and credentials.token
    identity = boto3.client(
        "sts",
        aws_access_key_id=credentials.access_key,
        aws_secret_access_key=credentials.secret_key,
        aws_session_token=credentials.token,
    ).get_caller_identity()
    role_name = request["RoleArn"].rsplit("/", 1)[1]
    assert identity["Arn"].endswith(f":assumed-role/{role_name}/{request['ProcessingJobName']}"), identity
    assert set(credentials.environment()) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}


def test_a_role_that_cannot_be_assumed_names_the_stack_parameter(job):  # noqa: F811
    request = job(run_id="run-a")
    unreachable = boto3.client(
        "sts",
        endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, connect_timeout=2),
    )
    with pytest.raises(JobCredentialsError, match="LocalJobsPrincipalArn"):
        assume_job_role(request, unreachable, {})
