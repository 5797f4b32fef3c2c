"""A spec's ``trigger: {on: ready_marker, queue: ...}``: what a DAG author writes, and the errors a bad one gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shardline.spec import SpecError, parse_spec

HOURLY = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "tabular_scoring_hourly.yaml"
TRIGGER = "trigger: {on: ready_marker, queue: score-markers}\n"


def _spec(text: str = TRIGGER, marker: str | None = "_SUCCESS", **changes):
    data = yaml.safe_load(HOURLY.read_text())
    data.update(yaml.safe_load(text) or {})
    data.update(changes)
    if marker:
        data["steps"][0]["input"]["ready_marker"] = marker
    return parse_spec(data, "pipelines/hourly.yaml")


def _error(**kwargs) -> str:
    with pytest.raises(SpecError) as err:
        _spec(**kwargs)
    return str(err.value)


def test_on_is_read_as_written_although_yaml_makes_a_bare_on_key_true():
    trigger = _spec().trigger
    assert (trigger.on, trigger.queue, trigger.lookback) == ("ready_marker", "score-markers", 86400)
    assert _spec('trigger: {"on": ready_marker, queue: q, lookback: 6h}').trigger.lookback == 6 * 3600


@pytest.mark.parametrize(
    "queue", ["score-markers", "markers.fifo", "https://sqs.eu-west-1.amazonaws.com/123456789012/score-markers"]
)
def test_a_queue_is_a_name_or_a_url(queue):
    assert _spec(f"trigger: {{on: ready_marker, queue: '{queue}'}}").trigger.queue == queue


def test_a_pipeline_without_a_trigger_has_none():
    assert _spec("", marker=None).trigger is None


@pytest.mark.parametrize(
    ("text", "changes", "marker", "says"),
    [
        ("trigger: {on: file, queue: q}", {}, "_SUCCESS", "trigger.on: Input should be 'ready_marker'"),
        ("trigger: {on: ready_marker, queue: 'a queue'}", {}, "_SUCCESS", "trigger.queue: String should match"),
        (
            f"trigger: {{on: ready_marker, queue: {'q' * 76}.fifo}}",
            {},
            "_SUCCESS",
            "trigger.queue: String should match",
        ),
        ("trigger: {on: ready_marker}", {}, "_SUCCESS", "trigger.queue: Field required"),
        ("trigger: {on: ready_marker, queue: q, lookback: 9d}", {}, "_SUCCESS", "trigger.lookback"),
        (TRIGGER, {"schedule": None}, "_SUCCESS", "trigger needs a schedule"),
        (TRIGGER, {"catchup": True}, "_SUCCESS", "trigger and catchup: true cannot go together"),
        (TRIGGER, {}, None, "needs steps[0].input.prefix and steps[0].input.ready_marker"),
    ],
)
def test_a_bad_trigger_is_an_error_naming_the_file_and_the_field(text, changes, marker, says):
    message = _error(text=text, marker=marker, **changes)
    assert "pipelines/hourly.yaml" in message and says in message, message


@pytest.mark.parametrize(
    "prefix",
    ["s3://b/events/dt={{ ds }}/", "s3://b/events/hour={{ data_interval_start.strftime('%H') }}/", "s3://b/events/"],
)
def test_a_prefix_that_two_intervals_share_names_no_partition(prefix):
    data = yaml.safe_load(HOURLY.read_text())
    data["steps"][0]["input"].update(prefix=prefix, ready_marker="_SUCCESS")
    data.update(yaml.safe_load(TRIGGER))
    with pytest.raises(SpecError) as err:
        parse_spec(data, "pipelines/hourly.yaml")
    assert "names no partition: two intervals share its folder" in str(err.value), err.value


def test_a_prefix_may_use_what_a_task_renders_with_pendulum():
    data = yaml.safe_load(HOURLY.read_text())
    prefix = "s3://b/events/{{ data_interval_start.add(hours=1).format('YYYY-MM-DD/HH') }}/{{ ts_nodash }}/"
    data["steps"][0]["input"].update(prefix=prefix, ready_marker="_SUCCESS")
    data.update(yaml.safe_load(TRIGGER))
    assert parse_spec(data, "pipelines/hourly.yaml").trigger is not None


def test_a_templated_bucket_is_refused_the_watcher_reads_one_buckets_events():
    data = yaml.safe_load(HOURLY.read_text())
    prefix = "s3://data-{{ ds_nodash }}/events/hour={{ data_interval_start.strftime('%H') }}/"
    data["steps"][0]["input"].update(prefix=prefix, ready_marker="_SUCCESS")
    data.update(yaml.safe_load(TRIGGER))
    with pytest.raises(SpecError) as err:
        parse_spec(data, "pipelines/hourly.yaml")
    assert "bucket" in str(err.value) and "template" in str(err.value), err.value


def test_a_prefix_that_renders_only_in_a_task_is_refused_naming_what_it_uses():
    data = yaml.safe_load(HOURLY.read_text())
    data["steps"][0]["input"].update(prefix="s3://b/events/{{ macros.ds_add(ds, 1) }}/", ready_marker="_SUCCESS")
    data.update(yaml.safe_load(TRIGGER))
    with pytest.raises(SpecError) as err:
        parse_spec(data, "pipelines/hourly.yaml")
    assert "cannot be rendered outside a task" in str(err.value) and "macros" in str(err.value), err.value
