"""Wiring: which backend, S3 client and ledger table a pipeline uses. The only place that knows.

For ``backend: local`` everything goes through boto3's default chain, which honours
``AWS_ENDPOINT_URL`` (the embedded moto_server). For ``backend: sagemaker`` the clients
come from the Airflow AWS connection named in the spec.
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3

from shardline.backends import Backend
from shardline.spec import PipelineSpec

ENV_LOCAL_ROOT = "SHARDLINE_LOCAL_ROOT"
LOCAL_IMAGE = "shardline-worker:local"
LOCAL_ROLE = "arn:aws:iam::000000000000:role/shardline-local"


def local_root() -> Path:
    """Where the local backend keeps its jobs (state, staged inputs, logs)."""
    if os.environ.get(ENV_LOCAL_ROOT):
        return Path(os.environ[ENV_LOCAL_ROOT])
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "shardline-local"


def client_config():
    """Every AWS call gives up in bounded time (as the ledger's do): a frozen endpoint never hangs a task."""
    from botocore.config import Config

    return Config(connect_timeout=5, read_timeout=30, retries={"mode": "standard", "max_attempts": 5})


def _aws_client(spec: PipelineSpec, service: str):
    if spec.backend == "local":
        return boto3.client(service, config=client_config())
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    return AwsBaseHook(aws_conn_id=spec.sagemaker.aws_conn_id, client_type=service,
                       config=client_config()).get_conn()


def s3_client(spec: PipelineSpec):
    return _aws_client(spec, "s3")


def backend_for(spec: PipelineSpec) -> Backend:
    if spec.backend == "local":
        from shardline.backends.local import LocalBackend

        return LocalBackend(local_root())
    from shardline.backends.sagemaker import SageMakerBackend

    return SageMakerBackend(_aws_client(spec, "sagemaker"))


def region(spec: PipelineSpec) -> str:
    """The ledger table's region: where the worker must write, whatever its container assumes."""
    return ledger_model(spec).Meta.region


def image_and_role(spec: PipelineSpec) -> tuple[str, str]:
    if spec.backend == "local":
        return spec.sagemaker.image_uri or LOCAL_IMAGE, spec.sagemaker.role_arn or LOCAL_ROLE
    return spec.sagemaker.image_uri, spec.sagemaker.role_arn


def ledger_model(spec: PipelineSpec):
    from shardline.ledger.table import bind_ledger

    return bind_ledger(spec.ledger_table, retention_days=spec.ledger_retention_days)
