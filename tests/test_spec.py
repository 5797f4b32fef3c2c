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
            "'records', 'instances', 'inputs' or 'array'",
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


# -- Trust boundary: models are pinned, and trigger Params stay inside what the spec allows ---------------

OTHER = "b" * 64


def _model(**model) -> dict:
    data = minimal()
    data["steps"][0]["model"] = model
    return data


def test_an_unpinned_model_is_an_import_error_naming_the_field():
    with pytest.raises(SpecError) as err:
        parse_spec(_model(uri="s3://models/xgb/model.tar.gz"), "p.yaml")
    assert "steps[0].model" in str(err.value) and "model.sha256" in str(err.value)
    assert "allow_unpinned" in str(err.value)
    with pytest.raises(SpecError, match=r"model\.versions"):  # a versioned URI is pinned per version
        parse_spec(_model(uri="s3://models/xgb/{{ params.model_version }}/model.tar.gz", version="v1"), "p.yaml")


def test_allow_unpinned_is_accepted_on_the_local_backend_only():
    data = _model(uri="s3://models/xgb/model.tar.gz", allow_unpinned=True)
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
        parse_spec(_model(**model), "p.yaml")
    assert words in str(err.value), str(err.value)


def test_the_model_version_param_picks_its_pinned_digest():
    model = (
        parse_spec(
            _model(
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


def _first_step(prefix: str, **model):
    data = minimal()
    data["steps"][0]["input"]["prefix"] = prefix
    data["steps"][0]["model"].update(model)
    return parse_spec(data, "p.yaml").steps[0]


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        ("s3://data/events/", True),
        ("s3://data/events/dt=2026-11-01/hour=03/", True),
        ("s3://data/events/backfill", True),
        ("s3://data/events/a..b/", True),  # ".." inside a name is just a name
        ("s3://data/eventsX/", False),
        ("s3://other-bucket/events/", False),
        ("s3://data/events/../models/", False),
        ("s3://data/events/./x/", False),
        ("s3://data/events//tmp/x", False),
        ("s3://data/events/..", False),
        ("s3://data/events/a b/", False),
        ("/local/path", False),
    ],
)
def test_input_override_path_escape_is_refused_by_the_param_and_at_plan_time(override, allowed):
    from airflow.sdk.definitions.param import ParamValidationError

    from shardline.airflow.dag_factory import params_for
    from shardline.spec.conf import input_prefix_param_problem

    step = _first_step("s3://data/events/dt={{ ds }}/hour={{ logical_date.strftime('%H') }}/")
    spec_with_step = parse_spec({**minimal(), "steps": [step.model_dump()]}, "p.yaml")
    param = params_for(spec_with_step)["input_prefix"]
    assert (input_prefix_param_problem(step, override) is None) is allowed
    if allowed:
        assert param.resolve(override) == override
    else:
        with pytest.raises(ParamValidationError):
            param.resolve(override)


@pytest.mark.parametrize(
    ("version", "allowed"),
    [
        ("v1", True),
        ("2026-11-01.3", True),
        ("..", False),
        ("../../other/model", False),
        ("v1/../../x", False),
        (".hidden", False),
        ("", False),
    ],
)
def test_model_version_param_refuses_path_segments(version, allowed):
    from airflow.sdk.definitions.param import ParamValidationError

    from shardline.airflow.dag_factory import params_for
    from shardline.spec.conf import model_version_problem

    spec = parse_spec(
        _model(uri="s3://m/{{ params.model_version }}/model.tar.gz", version="v1", allow_unpinned=True), "p.yaml"
    )
    assert (model_version_problem(spec.steps[0], version) is None) is allowed
    param = params_for(spec)["model_version"]
    if allowed:
        assert param.resolve(version) == version
    else:
        with pytest.raises(ParamValidationError):
            param.resolve(version)


def test_a_pinned_versions_table_makes_the_model_version_param_a_choice():
    from airflow.sdk.definitions.param import ParamValidationError

    from shardline.airflow.dag_factory import params_for
    from shardline.spec.conf import model_version_problem

    spec = parse_spec(
        _model(uri="s3://m/{{ params.model_version }}/model.tar.gz", version="v1", versions={"v1": SHA, "v2": OTHER}),
        "p.yaml",
    )
    param = params_for(spec)["model_version"]
    assert param.resolve("v2") == "v2"
    with pytest.raises(ParamValidationError):
        param.resolve("v3")  # a well-formed version with no digest is refused too
    assert "not pinned in model.versions" in model_version_problem(spec.steps[0], "v3")


def test_an_unknown_trigger_conf_key_is_named_with_the_key_it_was_probably_meant_to_be():
    from shardline.spec import TRIGGER_PARAMS
    from shardline.spec.conf import unknown_conf_problem

    assert unknown_conf_problem(None) is None and unknown_conf_problem({}) is None
    assert unknown_conf_problem({"instance_count": 1, "dry_run": True}) is None
    said = unknown_conf_problem({"instance_cnt": 1, "colour": "red"})
    assert said.startswith(
        "the trigger conf has unknown key(s) 'colour', 'instance_cnt' (did you mean "
        "'instance_count'?); this pipeline reads only " + ", ".join(TRIGGER_PARAMS)
    ), said
    assert "unknown_conf: warn" in said
    assert parse_spec(minimal(), "p.yaml").unknown_conf == "fail"
    with pytest.raises(SpecError, match="unknown_conf"):
        parse_spec(minimal(unknown_conf="ignore"), "p.yaml")


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


@pytest.mark.parametrize(
    ("conf", "problem"),
    [
        ({}, None),
        ({"instance_count": None, "dry_run": True, "model_version": "v1", "input_prefix": ""}, None),
        ({"instance_count": 0}, "instance_count 0"),
        ({"instance_count": 101}, "instance_count 101"),
        ({"instance_count": True}, "instance_count True"),
        ({"instance_count": "3"}, "instance_count '3'"),
        ({"dry_run": "yes"}, "dry_run 'yes'"),
        ({"model_version": 2}, "model_version 2"),
    ],
)
def test_a_conf_is_checked_as_the_trigger_forms_params_check_it(conf, problem):
    from shardline.spec.conf import param_type_problem

    said = param_type_problem(conf)
    assert (said is None) if problem is None else (problem in said), said


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


@pytest.mark.parametrize("written", ["s3://raw/events/dt={{ ds }}", "s3://raw/events/dt={{ ds }}/"])
def test_an_input_prefix_is_a_folder_with_or_without_its_slash(written):
    # Without the "/", s3://raw/events/dt=2026-11-2 would also list dt=2026-11-20/ to dt=2026-11-29/.
    spec = parse_spec(minimal(steps=[{**minimal()["steps"][0], "input": {"prefix": written}}]), "p.yaml")
    assert spec.steps[0].input.prefix == "s3://raw/events/dt={{ ds }}/"


@pytest.mark.parametrize(
    ("rendered", "expected"),
    [(None, (3, None)), ("None", (3, None)), ("", (3, None)), ("7", (7, None)), (" 100 ", (100, None)), (5, (5, None))],
)
def test_the_plan_task_takes_an_instance_count_param_within_bounds(rendered, expected):
    from shardline.spec.conf import instance_count_override

    assert instance_count_override(rendered, 3) == expected


@pytest.mark.parametrize("rendered", ["0", "-2", "101", "1000000", "2.5", "seven", "{{ params.instance_count }}"])
def test_the_plan_task_refuses_an_instance_count_param_out_of_bounds_naming_it(rendered):
    from shardline.spec.conf import instance_count_override

    count, problem = instance_count_override(rendered, 3)
    assert count == 3 and problem.startswith(f"Param instance_count {rendered!r} must be null or a whole number")


def test_a_run_of_a_step_admitted_by_its_count_may_ask_fewer_instances_never_more():
    """A pooled or capped step's watch is admitted by the spec's instance_count (its pool's slots): a run of more
    would use instances no slot admitted, past the account's quota."""
    from shardline.spec.conf import admitted_count_problem

    step = _first_step("s3://data/events/")
    assert admitted_count_problem(step, 5, None) is None  # nothing counts this step's instances
    assert admitted_count_problem(step, 2, 2) is None and admitted_count_problem(step, 1, 2) is None
    problem = admitted_count_problem(step, 3, 2)
    assert problem.startswith("Param instance_count 3 is above steps.score.resources.instance_count (2)")
    assert "raise resources.instance_count in the spec" in problem


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        ("s3://data/events/dt=2026-11-22/hour=10/", True),  # the run's own partition
        ("s3://data/events/dt=2026-11-22/hour=10/retry/", True),  # a folder inside it
        ("s3://data/events/dt=2026-11-22/hour=05/", False),  # another partition: its rows under hour 10
        ("s3://data/events/dt=2026-11-22/hour=1", False),
        ("s3://data/events/backfill/", False),
    ],
)
def test_a_partitioned_runs_input_override_stays_in_its_own_partition(override, allowed):
    """The run writes its outputs and _SUCCESS to its partition's output prefix: an input from another partition
    would make that partition complete with other rows."""
    from shardline.spec.conf import partition_override_problem

    step = _first_step("s3://data/events/dt={{ ds }}/hour={{ logical_date.strftime('%H') }}/")
    found = partition_override_problem(step, override, "s3://data/events/dt=2026-11-22/hour=10/", "hourly")
    assert (found is None) is allowed, found
    if not allowed:
        assert "shardline trigger hourly --partition START" in found
    unpartitioned = _first_step("s3://data/events/")
    assert partition_override_problem(unpartitioned, override, "s3://data/events/", "p") is None


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
