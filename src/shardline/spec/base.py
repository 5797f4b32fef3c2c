"""What every part of a pipeline spec shares: the error, the strict base model, and the name patterns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from shardline.errors import PermanentError

NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,39}$"  # short: names go into SageMaker job names (63 chars)
SHA256_PATTERN = r"^[0-9a-f]{64}$"
# A model version becomes one segment of an S3 key: no "/", no "." or ".." segment, no spaces.
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# The keys a trigger conf may carry: each pipeline DAG's Params (see dag_factory.params_for).
TRIGGER_PARAMS = ("input_prefix", "model_version", "instance_count", "dry_run")
VERSION_TEMPLATE = "params.model_version"
# A SageMaker instance type: ml.FAMILY.SIZE (decision.fleet.vcpus reads its vCPUs from the size).
INSTANCE_TYPE_PATTERN = r"^ml\.[a-z0-9-]+\.(\d*xlarge|medium|large)$"


class SpecError(PermanentError, ValueError):
    """A pipeline spec is invalid. The message names the file and each bad field."""


class _Strict(BaseModel):
    # A field's docstring is its description: the spec reference (docs/spec-reference.md) is generated from them.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
