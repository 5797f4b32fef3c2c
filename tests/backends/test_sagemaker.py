"""SageMaker Processing through boto3 (``shardline.backends.sagemaker``), against moto_server's SageMaker API over
HTTP: what a describe reads from the job, and which of SageMaker's errors mean "no such job"."""

from __future__ import annotations

import uuid

import boto3
import botocore.exceptions
import pytest

from shardline.backends import JobStatus
from shardline.backends.sagemaker import SageMakerBackend, _is_not_found

ROLE = "arn:aws:iam::123456789012:role/shardline"


def _request(name: str) -> dict:
    return {
        "ProcessingJobName": name,
        "ProcessingResources": {
            "ClusterConfig": {"InstanceCount": 2, "InstanceType": "ml.c5.2xlarge", "VolumeSizeInGB": 30}
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "AppSpecification": {"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/shardline-worker:cpu"},
        "RoleArn": ROLE,
    }


def test_a_describe_reads_the_jobs_status_and_times_as_sagemaker_gives_them(aws_env):
    client = boto3.client("sagemaker")
    backend = SageMakerBackend(client)
    name = f"sl-describe-{uuid.uuid4().hex[:8]}"
    assert backend.submit(_request(name)) == name
    state = backend.describe(name)
    job = client.describe_processing_job(ProcessingJobName=name)
    assert state.name == name
    assert state.status is JobStatus.COMPLETED  # moto runs nothing: its jobs complete at once
    assert (state.created_at, state.ended_at) == (job["CreationTime"].timestamp(), job["ProcessingEndTime"].timestamp())
    assert state.failure_reason is None
    # moto's answer leaves ProcessingResources out: the instance type is then unknown, not an error.
    assert "ProcessingResources" not in job and state.instance_type is None


def _client_error(code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "m"}}, "DescribeProcessingJob")


@pytest.mark.parametrize(
    ("code", "not_found"),
    [
        ("ValidationException", True),  # AWS quirk: an unknown processing job is a ValidationException
        ("ResourceNotFound", True),
        ("ThrottlingException", False),
        ("AccessDeniedException", False),
        ("ResourceInUse", False),
    ],
)
def test_only_sagemakers_no_such_job_errors_mean_not_found(code, not_found):
    assert _is_not_found(_client_error(code)) is not_found
