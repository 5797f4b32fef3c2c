"""A spec's deadline and partitioned asset: what a DAG author writes, and the errors a bad value gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shardline.spec import SpecError, parse_spec

HOURLY = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "tabular_scoring_hourly.yaml"


def _spec(**changes):
    data = yaml.safe_load(HOURLY.read_text())
    data.update(changes)
    return parse_spec(data, "pipelines/hourly.yaml")


@pytest.mark.parametrize(
    ("written", "seconds"), [("20m", 1200), ("1h30m", 5400), ("90s", 90), ("2h", 7200), (" 45s ", 45), (600, 600)]
)
def test_a_deadline_is_written_as_a_duration_or_seconds(written, seconds):
    assert _spec(deadline={"after": written}).deadline.after == seconds


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("20x", "'20x' is no duration: write it as 20m, 1h30m, 90s"),
        ("", "is no duration"),
        ("m", "is no duration"),
        ("0s", "greater than or equal to 1"),
        ("200h", "less than or equal to 604800"),
    ],
)
def test_a_bad_deadline_is_an_error_naming_the_file_and_the_field(written, says):
    with pytest.raises(SpecError) as err:
        _spec(deadline={"after": written})
    assert "pipelines/hourly.yaml" in str(err.value) and "deadline.after" in str(err.value) and says in str(err.value)


def test_a_deadline_needs_its_after_and_a_notify_written_as_an_import_path():
    with pytest.raises(SpecError, match=r"deadline\.after: Field required"):
        _spec(deadline={"notify": "alerts.page"})
    with pytest.raises(SpecError, match=r"deadline\.notify: String should match pattern"):
        _spec(deadline={"after": "20m", "notify": "alerts/page.py"})
    assert _spec(deadline={"after": "20m", "notify": "alerts.page"}).deadline.notify == "alerts.page"


def test_a_spec_without_them_has_no_deadline_and_an_asset_without_partition_keys():
    spec = _spec()
    assert spec.deadline is None and spec.partitioned_asset is False


def test_a_partitioned_asset_needs_a_schedule():
    assert _spec(partitioned_asset=True).partitioned_asset is True
    with pytest.raises(SpecError, match="partitioned_asset needs a schedule"):
        _spec(partitioned_asset=True, schedule=None)
