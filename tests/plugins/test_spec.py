"""Pipeline specs validate on load, and a bad one names the file and the field."""

from __future__ import annotations

import pytest
import yaml
from shardline.spec import SpecError, load_spec, parse_spec

SHA = "0" * 64


def minimal(**overrides) -> dict:
    spec = {
        "pipeline": "tabular_scoring",
        "schedule": "@hourly",
        "steps": [
            {
                "name": "score",
                "model": {"uri": "s3://models/xgb/model.tar.gz", "sha256": SHA},
                "input": {"prefix": "s3://data/raw/dt={{ ds }}/", "passthrough": ["id"]},
                "output": {"prefix": "s3://data/scores/dt={{ ds }}/"},
            }
        ],
    }
    spec.update(overrides)
    return spec


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
        (lambda s: s["steps"][0]["resources"].__setitem__("instance_count", 0)
         if "resources" in s["steps"][0] else s["steps"][0].__setitem__("resources", {"instance_count": 0}),
         "steps[0].resources.instance_count", "greater than or equal to 1"),
        (lambda s: s["steps"][0]["model"].__setitem__("sha256", "abc"), "steps[0].model.sha256", "pattern"),
        (lambda s: s["steps"][0].__setitem__("retyr", {}), "steps[0].retyr", "Extra inputs"),
        (lambda s: s.__setitem__("schedule", "@sometimes"), "schedule", "unknown preset"),
        (lambda s: s["steps"][0]["input"].__setitem__("prefix", "/local/path"), "steps[0].input",
         "s3:// URI"),
        (lambda s: s.__setitem__("pipeline", "Bad Name!"), "pipeline", "pattern"),
        (lambda s: s["steps"][0]["model"].__setitem__("batch_strategy", "SingleRecord"),
         "steps[0].model.batch_strategy", "'multi_record' or 'single_record'"),
        (lambda s: s["steps"][0]["model"].__setitem__("content_type", "text/plain"),
         "steps[0].model.content_type", "text/csv"),
        (lambda s: s["steps"][0]["model"].__setitem__("json_layout", "split"), "steps[0].model.json_layout",
         "'records', 'instances' or 'array'"),
        (lambda s: s["steps"][0]["model"].__setitem__("max_payload_mb", 0), "steps[0].model.max_payload_mb",
         "greater than 0"),
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
    data["steps"].append({
        "name": "post", "model": {"uri": "s3://m/x.tar.gz"}, "input": {"from_step": "nope"},
        "output": {"prefix": "s3://data/post/"},
    })
    with pytest.raises(SpecError, match="reads from_step 'nope', which is not an earlier step"):
        parse_spec(data, "p.yaml")


def test_sagemaker_backend_requires_role_and_image():
    with pytest.raises(SpecError, match=r"needs sagemaker\.role_arn and sagemaker\.image_uri"):
        parse_spec(minimal(backend="sagemaker"), "p.yaml")


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("pipeline: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken\.yaml: not valid YAML"):
        load_spec(path)
