"""The fleet file (``shardline.spec.fleet``, ``dags/fleet.yaml``): the account's quotas, or a clear error."""

from __future__ import annotations

import pytest

from shardline.spec import SpecError
from shardline.spec.fleet import FleetSpec, load_fleet


def test_no_file_or_an_empty_one_is_a_fleet_without_quotas(tmp_path):
    assert load_fleet(tmp_path) == FleetSpec()
    (tmp_path / "fleet.yaml").write_text("# quotas to come\n")
    assert load_fleet(tmp_path).quotas == {}


def test_quotas_per_instance_type(tmp_path):
    (tmp_path / "fleet.yaml").write_text("quotas:\n  ml.c5.2xlarge: 20\n  ml.g5.12xlarge: 2\n")
    assert load_fleet(tmp_path).quotas == {"ml.c5.2xlarge": 20, "ml.g5.12xlarge": 2}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("quotas:\n  ml.c5.2xlarge: -1\n", "quotas.ml.c5.2xlarge"),
        ("quotas:\n  ml.c5.2xlarge: lots\n", "quotas.ml.c5.2xlarge"),
        ("quotas:\n  m5.xlarge: 4\n", "quotas.m5.xlarge"),
        ("quotas: [ml.c5.2xlarge]\n", "quotas"),
        ("quota: {}\n", "quota"),
        ("quotas: {ml.c5.2xlarge: 4\n", "not valid YAML"),
        ("[1, 2]\n", "a fleet file must be a YAML mapping"),
    ],
)
def test_a_bad_fleet_file_names_the_file_and_the_field(tmp_path, text, field):
    (tmp_path / "fleet.yaml").write_text(text)
    with pytest.raises(SpecError) as err:
        load_fleet(tmp_path)
    assert str(tmp_path / "fleet.yaml") in str(err.value) and field in str(err.value)
