"""SageMaker Processing through boto3: the same request dict, sent as is."""

from __future__ import annotations

import botocore.exceptions

from shardline.backends import JobNotFound, JobState, JobStatus


def _is_not_found(err: botocore.exceptions.ClientError) -> bool:
    # AWS quirk: an unknown processing job is a ValidationException, not ResourceNotFound.
    code = err.response.get("Error", {}).get("Code")
    return code in {"ValidationException", "ResourceNotFound"}


class SageMakerBackend:
    """``client`` is a boto3 SageMaker client (on Airflow, from the AWS connection's hook)."""

    def __init__(self, client):
        self.client = client

    def submit(self, request: dict) -> str:
        name = request["ProcessingJobName"]
        try:
            self.describe(name)
            return name  # a retried task adopts the job its earlier try started
        except JobNotFound:
            pass
        try:
            self.client.create_processing_job(**request)
        except botocore.exceptions.ClientError as err:
            # Two tries raced past the describe: the loser adopts the winner's job.
            if err.response.get("Error", {}).get("Code") == "ResourceInUse":
                return name
            raise
        return name

    def describe(self, name: str) -> JobState:
        try:
            job = self.client.describe_processing_job(ProcessingJobName=name)
        except botocore.exceptions.ClientError as err:
            if _is_not_found(err):
                raise JobNotFound(name) from err
            raise
        created, ended = job.get("CreationTime"), job.get("ProcessingEndTime")
        return JobState(
            name=name,
            status=JobStatus(job["ProcessingJobStatus"]),
            failure_reason=job.get("FailureReason"),
            created_at=created.timestamp() if created else None,
            ended_at=ended.timestamp() if ended else None,
            instance_type=job.get("ProcessingResources", {}).get("ClusterConfig", {}).get("InstanceType"),
        )

    def stop(self, name: str) -> None:
        if self.describe(name).status.is_terminal:
            return
        try:
            self.client.stop_processing_job(ProcessingJobName=name)
        except botocore.exceptions.ClientError:
            # It may have ended between the describe and the stop (SageMaker then refuses the stop).
            if self.describe(name).status.is_terminal:
                return
            raise
