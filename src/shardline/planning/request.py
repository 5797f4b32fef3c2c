"""Pure builders for the CreateProcessingJob request. Spec in, dict out; no AWS.

The SageMaker backend sends this dict as is, and the local backend emulates a
processing job from the very same dict, so both run what was planned.
"""

from __future__ import annotations

import json

from shardline import contract
from shardline.ledger.context import LedgerContext
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec, StepSpec


def worker_arguments(step: StepSpec, *, rejects_part: bool = False) -> list[str]:
    # File failures are the ledger's business (each output is uploaded as its file finishes): an exit code
    # other than 0 is kept for what fails the instance itself.
    args = ["--exit-zero-on-file-failures"]
    # Four beats fit in the step's heartbeat timeout, so one late write never makes a healthy instance look lost.
    args += ["--heartbeat-interval", f"{min(30.0, step.heartbeat_timeout_seconds / 4):g}"]
    # Past the heartbeat timeout the watch task has given up on the instance, so holding its ledger
    # writes through an outage any longer gains nothing; until then it loses nothing.
    args += ["--ledger-retry-seconds", f"{step.heartbeat_timeout_seconds:g}"]
    if step.input.format:
        args += ["--input-format", step.input.format]
    if step.input.csv_header is not None:
        args += ["--input-csv-header", "true" if step.input.csv_header else "false"]
    if step.input.passthrough:
        args += ["--passthrough", ",".join(step.input.passthrough)]
    if step.input.features == contract.FEATURES_FILE_ORDER:
        args += ["--features", contract.FEATURES_FILE_ORDER]
    elif step.input.features:
        args += ["--features", ",".join(step.input.features)]
    if step.checks.features:
        args += ["--profile-inputs", ",".join(step.checks.features)]
    if step.resources.workers_per_instance:
        args += ["--workers", str(step.resources.workers_per_instance)]
    if rejects_part:
        args += ["--tolerate-rows", str(contract.EVERY_ROW)]
    elif step.tolerance.rows:
        rows = step.tolerance.rows
        args += ["--tolerate-rows", str(int(rows)) if rows >= 1 else repr(float(rows))]
    if step.batch_rows:
        args += ["--batch-rows", str(step.batch_rows)]
    if step.probabilities:
        args.append("--probabilities")
    return args + model_arguments(step)


def model_arguments(step: StepSpec) -> list[str]:
    """The custom-code request settings, only where they differ from the worker's defaults."""
    model, defaults = step.model, type(step.model).model_fields
    args: list[str] = []
    for field, flag in (
        ("content_type", "--content-type"),
        ("accept", "--accept"),
        ("batch_strategy", "--batch-strategy"),
        ("json_layout", "--json-layout"),
        ("max_payload_mb", "--max-payload-mb"),
    ):
        value = getattr(model, field)
        if value != defaults[field].default:
            args += [flag, str(value).replace("_", "-") if field == "batch_strategy" else str(value)]
    if model.csv_header:
        args.append("--csv-header")
    if model.derives_features:
        args.append("--derives-features")
    if model.allow_nan_predictions:
        args.append("--allow-nan-predictions")
    return args


def pin_arguments(step: StepSpec, model_version: str | None) -> list[str]:
    """The worker's ``--model-sha256`` for the digest pinned for this run's model_version (none when unpinned)."""
    pin = step.model.pin_for(model_version)
    return ["--model-sha256", pin] if pin else []


def job_arguments(step: StepSpec, attempt: Attempt) -> list[str]:
    """Everything the worker is told for one attempt travels as an argument: the step's settings and the
    pinned digest. Where its outputs and manifests go is the job's environment (:func:`worker_environment`)."""
    args = worker_arguments(step, rejects_part=attempt.parts_prefix is not None)
    return args + pin_arguments(step, attempt.model_version) + table_arguments(attempt)


def table_arguments(attempt: Attempt) -> list[str]:
    """A table step's worker writes parquet with the run's partition columns, each output named by the run and the
    attempt (``naming.output_tag``): the files the step's end commits, none of them a file a snapshot references."""
    if attempt.table_partition is None:
        return []
    partition = json.dumps(attempt.table_partition, sort_keys=True)
    return ["--output-format", "parquet", "--table-columns", partition, "--output-tag", attempt.output_tag]


def worker_environment(
    spec: PipelineSpec, step: StepSpec, attempt: Attempt, region: str | None = None
) -> dict[str, str]:
    """The instances' environment: which ledger, run, step and attempt they write as (the ledger's own
    agreement, written by :class:`LedgerContext`), where each output and the instances' manifests go (the
    instances upload them as their files finish), and the ledger's region."""
    env = LedgerContext(
        table=spec.ledger_table,
        pipeline=attempt.pipeline,
        run_id=attempt.run_id,
        step=attempt.step,
        attempt=attempt.number,
        input_uri=attempt.data_prefix,
        output_uri=attempt.output_prefix,
        retention_days=spec.ledger_retention_days,
        manifest_uri=naming.worker_manifest_folder(
            attempt.output_prefix, attempt.run_id, attempt.step, attempt.number, attempt.metadata_prefix
        ),
        output_kms_key_id=spec.sagemaker.kms_key_id or "",
    ).to_env()
    if region:  # the worker writes to the ledger in the orchestrator's region, whatever the container assumes
        env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = region
    return env


def build_processing_request(
    spec: PipelineSpec, attempt: Attempt, *, image_uri: str, role_arn: str, region: str | None = None
) -> dict:
    """The CreateProcessingJob parameters for one attempt."""
    step = spec.step(attempt.step)
    sm = spec.sagemaker
    cluster = {
        "InstanceCount": attempt.instance_count,
        "InstanceType": attempt.runs_on(step.resources.instance_type),
        "VolumeSizeInGB": step.resources.volume_size_gb,
    }
    if sm.kms_key_id:
        cluster["VolumeKmsKeyId"] = sm.kms_key_id
    request = {
        "ProcessingJobName": attempt.job_name,
        "RoleArn": role_arn,
        "AppSpecification": {"ImageUri": image_uri, "ContainerArguments": job_arguments(step, attempt)},
        "Environment": worker_environment(spec, step, attempt, region),
        "ProcessingInputs": _processing_inputs(attempt),
        # No ProcessingOutputConfig: SageMaker's EndOfJob upload would make the whole job the unit of durability.
        # Each instance uploads each output itself as its file finishes (worker/job/uploads.py), before the
        # ledger records the file SUCCEEDED, so a lost instance costs only its own unfinished files.
        "ProcessingResources": {"ClusterConfig": cluster},
        "StoppingCondition": {"MaxRuntimeInSeconds": step.max_runtime_seconds},
        "Tags": [
            {"Key": key, "Value": value}
            for key, value in {
                **sm.tags,
                "shardline:pipeline": attempt.pipeline,
                "shardline:run-id": attempt.run_id[:256],
                "shardline:step": attempt.step,
                "shardline:attempt": str(attempt.number),
            }.items()
        ],
    }
    network: dict = {}
    if sm.vpc:
        network["VpcConfig"] = {"SecurityGroupIds": list(sm.vpc.security_group_ids), "Subnets": list(sm.vpc.subnets)}
        network["EnableInterContainerTrafficEncryption"] = True
    if network:
        request["NetworkConfig"] = network
    return request


def _processing_inputs(attempt: Attempt) -> list[dict]:
    """The attempt's files, dealt out by key across its instances (the manifest lists exactly them, and SageMaker
    keeps their paths relative to its prefix), and the model, copied to every instance."""
    return [
        {
            "InputName": "data",
            "S3Input": {
                "S3Uri": attempt.manifest_uri,
                "LocalPath": contract.DATA_DIR,
                "S3DataType": "ManifestFile",
                "S3InputMode": "File",
                "S3DataDistributionType": "ShardedByS3Key",
            },
        },
        {
            "InputName": "model",
            "S3Input": {
                "S3Uri": attempt.model_uri,
                "LocalPath": contract.MODEL_DIR,
                "S3DataType": "S3Prefix",
                "S3InputMode": "File",
                "S3DataDistributionType": "FullyReplicated",
            },
        },
    ]
