"""What Airflow's providers manager learns about Shardline (``shardline.provider_info``): a card valid for Airflow's
runtime schema, naming modules and a plugin class that exist."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_provider_info_is_valid_for_airflows_runtime_schema():
    import importlib.resources

    import jsonschema

    from shardline.provider_info import get_provider_info

    schema = json.loads(importlib.resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == PROJECT["project"]["name"]
    for group in ("operators", "sensors", "triggers"):
        for entry in info.get(group, []):
            for module in entry["python-modules"]:
                assert (REPO / "src" / (module.replace(".", "/") + ".py")).is_file(), module
    (plugin,) = info["plugins"]
    module, _, name = plugin["plugin-class"].rpartition(".")
    assert f"class {name}(" in (REPO / "src" / (module.replace(".", "/") + ".py")).read_text()


def test_the_card_carries_the_packages_version_and_names_only_its_own_integration():
    from shardline import __version__
    from shardline.provider_info import INTEGRATION, get_provider_info

    info = get_provider_info()
    assert info["versions"] == [__version__]
    assert [i["integration-name"] for i in info["integrations"]] == [INTEGRATION]
    named = {entry["integration-name"] for group in ("operators", "triggers") for entry in info[group]}
    assert named == {INTEGRATION}
