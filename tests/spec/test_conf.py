"""What a run's conf may hold (``shardline.spec.conf``): the trigger form's Params, checked in Python as their schema
checks them, each problem naming the Param and what it allows."""

from __future__ import annotations

import pytest

from shardline.spec import SpecError, parse_spec
from tests.support.specs import OTHER, SHA, first_step, minimal, with_model


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

    step = first_step("s3://data/events/dt={{ ds }}/hour={{ logical_date.strftime('%H') }}/")
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
        with_model(uri="s3://m/{{ params.model_version }}/model.tar.gz", version="v1", allow_unpinned=True), "p.yaml"
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
        with_model(
            uri="s3://m/{{ params.model_version }}/model.tar.gz", version="v1", versions={"v1": SHA, "v2": OTHER}
        ),
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
        ({"input_prefix": None}, None),  # the form's default: the field left empty
        ({"input_prefix": 5}, "input_prefix 5 must be null or a string"),
        ({"model_version": None}, "model_version None"),
    ],
)
def test_a_conf_is_checked_as_the_trigger_forms_params_check_it(conf, problem):
    from shardline.spec.conf import param_type_problem

    said = param_type_problem(conf)
    assert (said is None) if problem is None else (problem in said), said


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

    step = first_step("s3://data/events/")
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

    step = first_step("s3://data/events/dt={{ ds }}/hour={{ logical_date.strftime('%H') }}/")
    found = partition_override_problem(step, override, "s3://data/events/dt=2026-11-22/hour=10/", "hourly")
    assert (found is None) is allowed, found
    if not allowed:
        assert "shardline trigger hourly --partition START" in found
    unpartitioned = first_step("s3://data/events/")
    assert partition_override_problem(unpartitioned, override, "s3://data/events/", "p") is None


def test_the_trigger_form_links_to_the_quote_of_the_run_it_would_start():
    from shardline.airflow.dag_factory import params_for

    spec = parse_spec(minimal(), "p.yaml")
    param = params_for(spec)["dry_run"]
    # Airflow's form renders description_md (as Markdown, links included) only where a Param has no plain description.
    assert param.description is None
    text = param.dump()["schema"]["description_md"]
    assert f"[quote it](/shardline/#/pipelines/{spec.pipeline}/quote)" in text, text
    assert f"`shardline quote {spec.pipeline}`" in text
    # The form's defaults trigger as they are: the input prefix may be left empty (null), and an override is checked.
    prefix = params_for(spec)["input_prefix"]
    assert prefix.resolve(None) is None and "null" in prefix.dump()["schema"]["type"]
