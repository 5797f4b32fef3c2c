"""Pipeline specs validate on load, and a bad one names the file and the field."""

from __future__ import annotations

import pytest
import yaml

from shardline.spec import SpecError, load_spec, parse_spec
from tests.support.specs import SHA, minimal, with_model


def test_a_minimal_spec_gets_the_documented_defaults():
    spec = parse_spec(minimal(), "p.yaml")
    step = spec.steps[0]
    assert spec.backend == "local"
    assert step.resources.instance_count == 1
    assert step.retry.max_attempts == 3
    assert step.sharding == "by_size"
    assert step.input.passthrough == ("id",)


def test_spec_file_round_trip(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(minimal()))
    assert load_spec(path).pipeline == "tabular_scoring"


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (
            lambda s: (
                s["steps"][0]["resources"].__setitem__("instance_count", 0)
                if "resources" in s["steps"][0]
                else s["steps"][0].__setitem__("resources", {"instance_count": 0})
            ),
            "steps[0].resources.instance_count",
            "greater than or equal to 1",
        ),
        (lambda s: s["steps"][0]["model"].__setitem__("sha256", "abc"), "steps[0].model.sha256", "pattern"),
        (lambda s: s["steps"][0].__setitem__("retyr", {}), "steps[0].retyr", "Extra inputs"),
        (lambda s: s.__setitem__("schedule", "@sometimes"), "schedule", "unknown preset"),
        (lambda s: s["steps"][0]["input"].__setitem__("prefix", "/local/path"), "steps[0].input", "s3:// URI"),
        (lambda s: s.__setitem__("pipeline", "Bad Name!"), "pipeline", "pattern"),
        (
            lambda s: s["steps"][0]["model"].__setitem__("batch_strategy", "SingleRecord"),
            "steps[0].model.batch_strategy",
            "'multi_record' or 'single_record'",
        ),
        (
            lambda s: s["steps"][0]["model"].__setitem__("content_type", "text/plain"),
            "steps[0].model.content_type",
            "text/csv",
        ),
        (
            lambda s: s["steps"][0]["model"].__setitem__("json_layout", "split"),
            "steps[0].model.json_layout",
            "'records', 'instances', 'inputs', 'array' or 'lines'",
        ),
        (
            lambda s: s["steps"][0]["model"].__setitem__("max_payload_mb", 0),
            "steps[0].model.max_payload_mb",
            "greater than 0",
        ),
        (
            lambda s: s["steps"][0].__setitem__("resources", {"instance_count": 3, "max_concurrent_instances": 2}),
            "steps[0].resources",
            "max_concurrent_instances (2) is below instance_count (3): no job of this step could ever start",
        ),
    ],
)
def test_a_bad_field_is_named_with_the_file(mutate, field, words):
    data = minimal()
    mutate(data)
    with pytest.raises(SpecError) as err:
        parse_spec(data, "dags/pipelines/bad.yaml")
    message = str(err.value)
    assert message.startswith("dags/pipelines/bad.yaml: invalid pipeline spec")
    assert f"  {field}: " in message
    assert words in message


def test_from_step_must_name_an_earlier_step():
    data = minimal()
    data["steps"].append(
        {
            "name": "post",
            "model": {"uri": "s3://m/x.tar.gz", "sha256": SHA},
            "input": {"from_step": "nope"},
            "output": {"prefix": "s3://data/post/"},
        }
    )
    with pytest.raises(SpecError, match="reads from_step 'nope', which is not an earlier step"):
        parse_spec(data, "p.yaml")


def test_sagemaker_backend_requires_role_and_image():
    with pytest.raises(SpecError, match=r"needs sagemaker\.role_arn and sagemaker\.image_uri"):
        parse_spec(minimal(backend="sagemaker"), "p.yaml")


def test_sagemaker_backend_requires_the_kms_key_that_encrypts_job_volumes_and_outputs():
    data = minimal(
        backend="sagemaker",
        sagemaker={
            "role_arn": "arn:aws:iam::123456789012:role/r",
            "image_uri": "1.dkr.ecr.us-east-1.amazonaws.com/w:1",
        },
    )
    with pytest.raises(SpecError, match=r"(?s)p\.yaml.*sagemaker\.kms_key_id: the ARN of the KMS key"):
        parse_spec(data, "p.yaml")
    data["sagemaker"]["kms_key_id"] = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    assert parse_spec(data, "p.yaml").sagemaker.kms_key_id.endswith("1234567890ab")


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("pipeline: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken\.yaml: not valid YAML"):
        load_spec(path)


# -- Trust boundary: an unpinned model runs on the local backend only ------------------------------------------


def test_allow_unpinned_is_accepted_on_the_local_backend_only():
    data = with_model(uri="s3://models/xgb/model.tar.gz", allow_unpinned=True)
    assert parse_spec(data, "p.yaml").steps[0].model.pin_for(None) is None
    data.update(
        backend="sagemaker",
        sagemaker={
            "role_arn": "arn:aws:iam::123456789012:role/r",
            "image_uri": "1.dkr.ecr.us-east-1.amazonaws.com/w:1",
            "kms_key_id": "arn:aws:kms:us-east-1:123456789012:key/k",
        },
    )
    with pytest.raises(
        SpecError,
        match=r"steps\[0\]\.model\.allow_unpinned: an unpinned model is accepted on "
        r"the local backend only",
    ):
        parse_spec(data, "p.yaml")


@pytest.mark.parametrize("field", ["prefix", "metadata_prefix"])
def test_two_steps_may_not_share_an_output_folder(field):
    first = {**minimal()["steps"][0]}
    value = "s3://data/meta/dt={{ ds }}/_shardline/" if field == "metadata_prefix" else "s3://data/scores/"
    first["output"] = {"prefix": "s3://data/a/", field: value} if field == "metadata_prefix" else {"prefix": value}
    second = {
        **first,
        "name": "again",
        "output": {**first["output"], "prefix": "s3://data/b/"}
        if field == "metadata_prefix"
        else {"prefix": value.rstrip("/")},
    }
    with pytest.raises(SpecError, match=f"steps 'score' and 'again' have the same output.{field}"):
        parse_spec(minimal(steps=[first, second]), "p.yaml")


def test_a_headerless_csv_and_a_deriving_script_reach_the_worker_as_flags():
    from shardline.planning.request import worker_arguments

    data = minimal()
    data["steps"][0]["input"].update({"csv_header": False, "features": ["id", "a", "b"]})
    data["steps"][0]["model"]["derives_features"] = True
    args = worker_arguments(parse_spec(data, "p.yaml").steps[0])
    assert args[args.index("--input-csv-header") + 1] == "false"
    assert args[args.index("--features") + 1] == "id,a,b"
    assert "--derives-features" in args
    assert "--input-csv-header" not in worker_arguments(parse_spec(minimal(), "p.yaml").steps[0])
