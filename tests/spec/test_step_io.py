"""A step's model, input and output (``shardline.spec.step_io``): pinned models, where inputs come from and what
happens when they are missing, and where outputs and Shardline's own files go."""

from __future__ import annotations

import pytest

from shardline.spec import SpecError, parse_spec
from tests.support.specs import OTHER, SHA, minimal, with_model


def test_an_unpinned_model_is_an_import_error_naming_the_field():
    with pytest.raises(SpecError) as err:
        parse_spec(with_model(uri="s3://models/xgb/model.tar.gz"), "p.yaml")
    assert "steps[0].model" in str(err.value) and "model.sha256" in str(err.value)
    assert "allow_unpinned" in str(err.value)
    with pytest.raises(SpecError, match=r"model\.versions"):  # a versioned URI is pinned per version
        parse_spec(with_model(uri="s3://models/xgb/{{ params.model_version }}/model.tar.gz", version="v1"), "p.yaml")


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ({"uri": "s3://m/{{ params.model_version }}/model.tar.gz", "sha256": SHA}, "cannot pin it"),
        ({"uri": "s3://m/model.tar.gz", "versions": {"v1": SHA}}, "needs a model.uri that uses"),
        (
            {"uri": "s3://m/{{ params.model_version }}/model.tar.gz", "version": "v3", "versions": {"v1": SHA}},
            "model.version 'v3' has no digest",
        ),
        (
            {
                "uri": "s3://m/{{ params.model_version }}/m.tar.gz",
                "version": "v1",
                "versions": {"v1": SHA, "../x": SHA},
            },
            "steps[0].model.versions",
        ),
        (
            {"uri": "s3://m/{{ params.model_version }}/m.tar.gz", "version": "..", "allow_unpinned": True},
            "steps[0].model.version",
        ),
    ],
)
def test_a_model_pin_that_cannot_hold_is_an_import_error(model, words):
    with pytest.raises(SpecError) as err:
        parse_spec(with_model(**model), "p.yaml")
    assert words in str(err.value), str(err.value)


def test_the_model_version_param_picks_its_pinned_digest():
    model = (
        parse_spec(
            with_model(
                uri="s3://m/{{ params.model_version }}/model.tar.gz", version="v1", versions={"v1": SHA, "v2": OTHER}
            ),
            "p.yaml",
        )
        .steps[0]
        .model
    )
    assert (model.pin_for(None), model.pin_for("v1"), model.pin_for("v2")) == (SHA, SHA, OTHER)
    with pytest.raises(ValueError, match=r"model_version 'v9' is not pinned in model.versions \(pinned: v1, v2\)"):
        model.pin_for("v9")


def test_a_missing_input_waits_for_scheduled_runs_and_fails_manual_ones_unless_the_spec_says():
    step = parse_spec(minimal(), "p.yaml").steps[0]
    assert (
        step.input.missing_input_action("scheduled"),
        step.input.missing_input_action("manual"),
        step.input.missing_input_action("backfill"),
    ) == ("wait", "fail", "fail")
    data = minimal()
    data["steps"][0]["input"].update(when_missing="skip", ready_marker="_SUCCESS", wait_timeout_seconds=600)
    step = parse_spec(data, "p.yaml").steps[0]
    assert step.input.missing_input_action("scheduled") == "skip" and step.input.ready_marker == "_SUCCESS"


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("when_missing", "later", "when_missing"),
        ("ready_marker", "../_SUCCESS", "an object name under the prefix"),
        ("wait_timeout_seconds", 5, "wait_timeout_seconds"),
    ],
)
def test_a_bad_missing_input_setting_is_an_import_error_naming_the_field(field, value, words):
    data = minimal()
    data["steps"][0]["input"][field] = value
    with pytest.raises(SpecError, match=words):
        parse_spec(data, "p.yaml")


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        ("/local/meta/_shardline/", "must be an s3:// URI"),
        ("s3://data/meta/scores/", "must end in a folder named _shardline"),
        ("s3://data/scores/dt={{ ds }}/meta/_shardline/", "is inside output.prefix"),
    ],
)
def test_a_metadata_prefix_must_be_outside_the_data_and_recognisably_shardlines(meta, words):
    data = minimal()
    data["steps"][0]["output"] = {"prefix": "s3://data/scores/dt={{ ds }}/", "metadata_prefix": meta}
    with pytest.raises(SpecError, match=words):
        parse_spec(data, "p.yaml")
    data["steps"][0]["output"]["metadata_prefix"] = "s3://data/meta/scores/dt={{ ds }}/_shardline/"
    assert parse_spec(data, "p.yaml").steps[0].output.metadata_prefix.endswith("/_shardline/")


def test_settle_seconds_is_for_a_prefix_input_only():
    from shardline.spec import InputSpec

    assert InputSpec(prefix="s3://b/in/").settle_seconds == 300
    with pytest.raises(ValueError, match="settle_seconds"):
        InputSpec(from_step="score", settle_seconds=60)


@pytest.mark.parametrize("written", ["s3://raw/events/dt={{ ds }}", "s3://raw/events/dt={{ ds }}/"])
def test_an_input_prefix_is_a_folder_with_or_without_its_slash(written):
    # Without the "/", s3://raw/events/dt=2026-11-2 would also list dt=2026-11-20/ to dt=2026-11-29/.
    spec = parse_spec(minimal(steps=[{**minimal()["steps"][0], "input": {"prefix": written}}]), "p.yaml")
    assert spec.steps[0].input.prefix == "s3://raw/events/dt={{ ds }}/"


@pytest.mark.parametrize(
    ("input_settings", "words"),
    [
        ({"csv_header": False}, "input.csv_header: false needs input.features naming the files' columns"),
        ({"csv_header": False, "features": "file_order"}, "file_order has no names to take"),
        ({"csv_header": False, "features": ["a", "b"]}, r"input.passthrough \['id'\] not in input.features"),
        ({"csv_header": False, "features": ["id", "a"], "format": "parquet"}, "input.csv_header is for CSV"),
        ({"features": "file_order", "format": "jsonl"}, "a JSON object has no column order"),
    ],
)
def test_a_headerless_csv_or_file_order_on_json_lines_is_checked_at_import(input_settings, words):
    data = minimal()
    data["steps"][0]["input"].update(input_settings)
    with pytest.raises(SpecError, match=words):
        parse_spec(data, "p.yaml")
