"""The CreateProcessingJob request passes botocore's own validation against the service model."""

from __future__ import annotations

import botocore.session
import pytest
from botocore.validate import ParamValidator

from shardline.planning.attempt import Attempt
from shardline.planning.request import build_processing_request
from shardline.spec import parse_spec
from tests.test_spec import minimal

ROLE = "arn:aws:iam::123456789012:role/shardline-sagemaker"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/shardline-worker:cpu"


@pytest.fixture(scope="module")
def input_shape():
    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model("CreateProcessingJob").input_shape


def attempt(**overrides) -> Attempt:
    fields = dict(
        pipeline="tabular_scoring",
        run_id="scheduled__2026-11-22T10:00:00+00:00",
        step="score",
        number=2,
        input_prefix="s3://data/raw/dt=2026-11-22/",
        output_prefix="s3://data/scores/dt=2026-11-22/",
        model_uri="s3://models/xgb/model.tar.gz",
        requested_instances=4,
        file_count=12,
    )
    fields.update(overrides)
    return Attempt(**fields)


def full_spec():
    data = minimal()
    data["steps"][0].update(
        resources={"instance_count": 4, "instance_type": "ml.c5.2xlarge", "workers_per_instance": 8},
        max_runtime_seconds=7200,
    )
    data["sagemaker"] = {
        "role_arn": ROLE,
        "image_uri": IMAGE,
        "tags": {"team": "ml"},
        "kms_key_id": "alias/shardline",
        "vpc": {"subnets": ["subnet-0abc"], "security_group_ids": ["sg-0abc"]},
    }
    return parse_spec(data, "p.yaml")


def test_request_is_valid_for_the_real_service_model(input_shape):
    request = build_processing_request(full_spec(), attempt(), image_uri=IMAGE, role_arn=ROLE)
    report = ParamValidator().validate(request, input_shape)
    assert not report.has_errors(), report.generate_report()


def test_request_shards_the_manifest_by_key_and_replicates_the_model():
    request = build_processing_request(full_spec(), attempt(), image_uri=IMAGE, role_arn=ROLE)
    data, model = (i["S3Input"] for i in request["ProcessingInputs"])
    assert data["S3DataType"] == "ManifestFile" and data["S3DataDistributionType"] == "ShardedByS3Key"
    assert model["S3DataDistributionType"] == "FullyReplicated"
    assert request["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 4
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200}
    assert request["NetworkConfig"]["VpcConfig"]["Subnets"] == ["subnet-0abc"]
    # No EndOfJob upload: each instance uploads each output as its file finishes, with the spec's KMS key.
    assert "ProcessingOutputConfig" not in request
    env = request["Environment"]
    assert env["SHARDLINE_OUTPUT_URI"] == attempt().output_prefix
    assert env["SHARDLINE_OUTPUT_KMS_KEY_ID"] == "alias/shardline"
    assert env["SHARDLINE_ATTEMPT"] == "2" and "SHARDLINE_MODEL_SHA256" not in env  # the pin is an argument
    assert env["SHARDLINE_INPUT_URI"] == "s3://data/raw/dt=2026-11-22/"
    assert request["AppSpecification"]["ContainerArguments"] == [
        "--exit-zero-on-file-failures",
        "--heartbeat-interval",
        "30",
        "--ledger-retry-seconds",
        "600",
        "--passthrough",
        "id",
        "--workers",
        "8",
        "--model-sha256",
        "0" * 64,
    ]
    assert {"Key": "team", "Value": "ml"} in request["Tags"]


def test_same_attempt_gives_the_same_request():
    spec = full_spec()
    assert build_processing_request(spec, attempt(), image_uri=IMAGE, role_arn=ROLE) == build_processing_request(
        spec, attempt(), image_uri=IMAGE, role_arn=ROLE
    )


def test_network_isolation_is_refused_with_the_reason():
    data = minimal()
    data["sagemaker"] = {"network_isolation": True}
    with pytest.raises(ValueError, match="DynamoDB gateway endpoint"):
        parse_spec(data, "p.yaml")


def test_the_worker_writes_to_the_ledger_in_the_orchestrators_region():
    env = build_processing_request(full_spec(), attempt(), image_uri=IMAGE, role_arn=ROLE, region="eu-west-1")[
        "Environment"
    ]
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert (
        "AWS_REGION"
        not in build_processing_request(full_spec(), attempt(), image_uri=IMAGE, role_arn=ROLE)["Environment"]
    )


def test_custom_code_settings_reach_the_worker_as_flags_it_accepts():
    from shardline.planning.request import worker_arguments
    from shardline.worker.job.cli import build_parser

    data = minimal()
    data["steps"][0]["model"].update(
        content_type="application/json",
        accept="text/csv",
        batch_strategy="single_record",
        json_layout="instances",
        max_payload_mb=2,
        csv_header=True,
        allow_nan_predictions=True,
    )
    args = worker_arguments(parse_spec(data, "p.yaml").steps[0])
    parsed = build_parser().parse_args(args)  # the worker's own parser takes them as they are
    assert (parsed.content_type, parsed.accept, parsed.batch_strategy, parsed.json_layout) == (
        "application/json",
        "text/csv",
        "single-record",
        "instances",
    )
    assert (parsed.max_payload_mb, parsed.csv_header, parsed.allow_nan_predictions) == (2.0, True, True)


def test_input_format_reaches_the_worker_as_a_flag_it_accepts():
    from shardline.planning.request import worker_arguments
    from shardline.worker.job.cli import build_parser

    data = minimal()
    assert "--input-format" not in worker_arguments(parse_spec(data, "p.yaml").steps[0])  # unset: by each name
    data["steps"][0]["input"]["format"] = "csv"
    parsed = build_parser().parse_args(worker_arguments(parse_spec(data, "p.yaml").steps[0]))
    assert parsed.input_format == "csv"


def test_default_model_settings_add_no_flags():
    from shardline.planning.request import model_arguments

    assert model_arguments(parse_spec(minimal(), "p.yaml").steps[0]) == []


def test_the_job_carries_the_digest_pinned_for_the_runs_model_version():
    data = minimal()
    data["steps"][0]["model"] = {
        "uri": "s3://models/xgb/{{ params.model_version }}/model.tar.gz",
        "version": "v1",
        "versions": {"v1": "1" * 64, "v2": "2" * 64},
    }
    spec = parse_spec(data, "p.yaml")

    def pinned(version):
        arguments = build_processing_request(spec, attempt(model_version=version), image_uri=IMAGE, role_arn=ROLE)[
            "AppSpecification"
        ]["ContainerArguments"]
        return arguments[arguments.index("--model-sha256") + 1]

    assert (pinned("v2"), pinned("v1"), pinned(None)) == ("2" * 64, "1" * 64, "1" * 64)
    with pytest.raises(ValueError, match="model_version 'v3' is not pinned"):
        pinned("v3")


def test_an_unpinned_local_model_sends_no_digest():
    data = minimal()
    data["steps"][0]["model"] = {"uri": "s3://models/xgb/model.tar.gz", "allow_unpinned": True}
    request = build_processing_request(parse_spec(data, "p.yaml"), attempt(), image_uri=IMAGE, role_arn=ROLE)
    assert "SHARDLINE_MODEL_SHA256" not in request["Environment"]
    assert "--model-sha256" not in request["AppSpecification"]["ContainerArguments"]


def test_the_worker_beats_four_times_within_the_steps_heartbeat_timeout():
    data = minimal()
    data["steps"][0]["heartbeat_timeout_seconds"] = 30
    args = build_processing_request(parse_spec(data, "p.yaml"), attempt(), image_uri=IMAGE, role_arn=ROLE)[
        "AppSpecification"
    ]["ContainerArguments"]
    assert args[args.index("--heartbeat-interval") + 1] == "7.5"


def test_the_worker_holds_ledger_writes_through_an_outage_until_the_watch_task_would_give_up_on_it():
    data = minimal()
    data["steps"][0]["heartbeat_timeout_seconds"] = 45
    args = build_processing_request(parse_spec(data, "p.yaml"), attempt(), image_uri=IMAGE, role_arn=ROLE)[
        "AppSpecification"
    ]["ContainerArguments"]
    assert args[args.index("--ledger-retry-seconds") + 1] == "45"


def test_the_instances_manifests_go_to_a_folder_of_their_run_step_and_attempt(input_shape):
    """Two runs of one partition write one output prefix: their instances' manifests never share a key."""
    spec = full_spec()
    meta = "s3://data/meta/scores/dt=2026-11-22/_shardline/"
    request = build_processing_request(spec, attempt(metadata_prefix=meta), image_uri=IMAGE, role_arn=ROLE)
    report = ParamValidator().validate(request, input_shape)
    assert not report.has_errors(), report.generate_report()
    folder = request["Environment"]["SHARDLINE_MANIFEST_URI"]
    assert folder.startswith(meta.rstrip("/") + "/instances/") and folder.endswith("/score/attempt-0002")
    assert "--manifest-dir" not in request["AppSpecification"]["ContainerArguments"]
    plain = build_processing_request(spec, attempt(), image_uri=IMAGE, role_arn=ROLE)["Environment"]
    other_run = build_processing_request(spec, attempt(run_id="manual__other"), image_uri=IMAGE, role_arn=ROLE)
    assert plain["SHARDLINE_MANIFEST_URI"].startswith(attempt().output_prefix.rstrip("/") + "/_shardline/instances/")
    assert plain["SHARDLINE_MANIFEST_URI"] != other_run["Environment"]["SHARDLINE_MANIFEST_URI"]
