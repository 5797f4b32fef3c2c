"""Pure builders for the CreateProcessingJob request. Spec in, dict out; no AWS.

The SageMaker backend sends this dict as is, and the local backend emulates a
processing job from the very same dict, so both run what was planned.
"""

from __future__ import annotations

from shardline import contract
from shardline.ledger.context import LedgerContext
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec, StepSpec


def worker_arguments(step: StepSpec) -> list[str]:
    # File failures are the ledger's business; the job itself must complete so SageMaker
    # uploads every output that did succeed.
    args = ["--exit-zero-on-file-failures"]
    # Four beats fit in the step's heartbeat timeout, so one late write never makes a healthy instance look lost.
    args += ["--heartbeat-interval", f"{min(30.0, step.heartbeat_timeout_seconds / 4):g}"]
    # Past the heartbeat timeout the sensor has given up on the instance, so holding its ledger
    # writes through an outage any longer gains nothing; until then it loses nothing.
    args += ["--ledger-retry-seconds", f"{step.heartbeat_timeout_seconds:g}"]
    if step.input.format:
        args += ["--input-format", step.input.format]
    if step.input.passthrough:
        args += ["--passthrough", ",".join(step.input.passthrough)]
    if step.input.features == contract.FEATURES_FILE_ORDER:
        args += ["--features", contract.FEATURES_FILE_ORDER]
    elif step.input.features:
        args += ["--features", ",".join(step.input.features)]
    if step.resources.workers_per_instance:
        args += ["--workers", str(step.resources.workers_per_instance)]
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
    if model.allow_nan_predictions:
        args.append("--allow-nan-predictions")
    return args


def pin_arguments(step: StepSpec, model_version: str | None) -> list[str]:
    """The worker's ``--model-sha256`` for the digest pinned for this run's model_version (none when unpinned)."""
    pin = step.model.pin_for(model_version)
    return ["--model-sha256", pin] if pin else []


def job_arguments(step: StepSpec, attempt: Attempt) -> list[str]:
    """Everything the worker is told for one attempt travels as an argument: the step's settings, the
    pinned digest and, with ``output.metadata_prefix``, where the instances' manifests go."""
    return (
        worker_arguments(step)
        + pin_arguments(step, attempt.model_version)
        + (["--manifest-dir", contract.METADATA_DIR] if attempt.metadata_prefix else [])
    )


def worker_environment(
    spec: PipelineSpec, step: StepSpec, attempt: Attempt, region: str | None = None
) -> dict[str, str]:
    """The instances' environment: which ledger, run, step and attempt they write as (the ledger's own
    agreement, written by :class:`LedgerContext`), and the ledger's region."""
    env = LedgerContext(
        table=spec.ledger_table,
        pipeline=attempt.pipeline,
        run_id=attempt.run_id,
        step=attempt.step,
        attempt=attempt.number,
        input_uri=attempt.input_prefix,
        output_uri=attempt.output_prefix,
        retention_days=spec.ledger_retention_days,
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
        "InstanceType": attempt.instance_type or step.resources.instance_type,
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
        "ProcessingOutputConfig": {"Outputs": _processing_outputs(attempt)},
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
    if sm.kms_key_id:
        request["ProcessingOutputConfig"]["KmsKeyId"] = sm.kms_key_id
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


def _processing_outputs(attempt: Attempt) -> list[dict]:
    """The predictions, and Shardline's own files, kept outside the data prefix when the spec asks."""
    outputs = [
        {
            "OutputName": "predictions",
            "S3Output": {"S3Uri": attempt.output_prefix, "LocalPath": contract.OUTPUT_DIR, "S3UploadMode": "EndOfJob"},
        }
    ]
    if attempt.metadata_prefix:
        outputs.append(
            {
                "OutputName": "metadata",
                "S3Output": {
                    "S3Uri": attempt.metadata_prefix,
                    "LocalPath": contract.METADATA_DIR,
                    "S3UploadMode": "EndOfJob",
                },
            }
        )
    return outputs
