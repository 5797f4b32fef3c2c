"""Wiring: which backend, S3 client and ledger table a pipeline uses. The only place that knows.

For ``backend: local`` everything goes through boto3's default chain, which honours
``AWS_ENDPOINT_URL`` (the embedded moto_server). For ``backend: sagemaker`` the clients
come from the Airflow AWS connection named in the spec.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import boto3

from shardline.backends import Backend
from shardline.backends.local import LocalBackend
from shardline.backends.sagemaker import SageMakerBackend
from shardline.ledger.table import bind_ledger
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
    """Every AWS call gives up in bounded time (as the ledger's do): a frozen endpoint never hangs a task. The pool
    holds a connection for each thread a step's end runs at once (its checks' and its report's): with urllib3's
    default of 10, each check past the tenth opened a connection and threw it away."""
    from botocore.config import Config

    return Config(
        connect_timeout=5, read_timeout=30, retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=32
    )


@dataclasses.dataclass(frozen=True)
class AwsSettings:
    """Which clients a pipeline's calls use, as JSON values: what a trigger carries instead of a spec path.

    No credentials and no local path: those come from the environment of the process that builds the clients
    (boto3's default chain or the Airflow connection named here; the local backend's root, :func:`local_root`)."""

    backend: str
    aws_conn_id: str
    ledger_table: str
    retention_days: int

    @classmethod
    def of(cls, spec: PipelineSpec) -> AwsSettings:
        return cls(spec.backend, spec.sagemaker.aws_conn_id, spec.ledger_table, spec.ledger_retention_days)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AwsSettings:
        return cls(
            str(data["backend"]), str(data["aws_conn_id"]), str(data["ledger_table"]), int(data["retention_days"])
        )


# What a call names its pipeline by: its spec, or the settings taken from one (a trigger has no spec).
Source = PipelineSpec | AwsSettings


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a pipeline's clients depend on: its AWS settings and this process's environment (boto3 reads the
    endpoint, region and credentials when a client is built; the local backend's jobs live under its root)."""

    aws: AwsSettings
    aws_environment: tuple[tuple[str, str], ...]
    local_root: str

    @classmethod
    def of(cls, source: Source) -> Settings:
        aws = source if isinstance(source, AwsSettings) else AwsSettings.of(source)
        environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
        return cls(aws, environment, str(local_root()))


class PipelineServices:
    """The clients a pipeline uses, each built on first use and then kept, as a Hook keeps its connection:
    a task, a trigger's polls and the CLI's calls share them instead of building a client (and, on
    SageMaker, looking up the Airflow connection) per call. boto3 clients are thread-safe."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _aws_client(self, service: str):
        if self.settings.aws.backend == "local":
            return boto3.client(service, config=client_config())
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        return AwsBaseHook(
            aws_conn_id=self.settings.aws.aws_conn_id, client_type=service, config=client_config()
        ).get_conn()

    @functools.cached_property
    def s3(self):
        return self._aws_client("s3")

    @functools.cached_property
    def sqs(self):
        """The queue a pipeline's ready markers' S3 events arrive on (``trigger.queue``)."""
        return self._aws_client("sqs")

    @functools.cached_property
    def s3_listing(self):
        """An S3 client for listing a step's inputs: it leaves each object's ``LastModified`` as text.

        The planner reads only keys and sizes, and botocore spends most of a 1,000-key page's parsing
        (about 43 of 71 ms) turning timestamps into datetimes: at 1M keys, 43 s of the planner's one core.
        botocore offers the setting per session (``set_parser_defaults``); the client's own endpoint takes it
        here, so that the same client factory serves both backends (Airflow's hook builds the session).
        """
        from botocore.parsers import ResponseParserFactory

        client = self._aws_client("s3")
        factory = ResponseParserFactory()
        factory.set_parser_defaults(timestamp_parser=str)
        client._endpoint._response_parser_factory = factory  # private, but botocore is pinned and a test guards it
        return client

    @functools.cached_property
    def backend(self) -> Backend:
        if self.settings.aws.backend == "local":
            return LocalBackend(Path(self.settings.local_root))

        return SageMakerBackend(self._aws_client("sagemaker"))

    @functools.cached_property
    def ledger(self):

        return bind_ledger(self.settings.aws.ledger_table, retention_days=self.settings.aws.retention_days)


@functools.lru_cache(maxsize=32)
def _built(settings: Settings) -> PipelineServices:
    return PipelineServices(settings)


def of(source: Source) -> PipelineServices:
    """The services for this spec (or its settings) in this process's AWS environment, built once and shared
    by every call with the same settings (a changed endpoint or credentials gets new ones)."""
    return _built(Settings.of(source))


def s3_client(spec: Source):
    return of(spec).s3


def s3_listing_client(spec: Source):
    return of(spec).s3_listing


def backend_for(spec: Source) -> Backend:
    return of(spec).backend


def region(spec: PipelineSpec) -> str:
    """The ledger table's region: where the worker must write, whatever its container assumes."""
    return ledger_model(spec).Meta.region


def image_and_role(spec: PipelineSpec) -> tuple[str, str]:
    if spec.backend == "local":
        return spec.sagemaker.image_uri or LOCAL_IMAGE, spec.sagemaker.role_arn or LOCAL_ROLE
    return spec.sagemaker.image_uri, spec.sagemaker.role_arn


def ledger_model(spec: Source):
    return of(spec).ledger
