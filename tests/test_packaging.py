"""The distribution as a stranger installs it: the wheel and sdist the standard PEP 517 hooks build, what
they hold and declare, a fresh virtualenv with only the core, and Airflow finding the provider.

The wheel is built from a copy of exactly the files the images' first stage copies, so a file the
package needs but the Dockerfiles leave out fails here, not in a registry push.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGES = {"shardline"}
ROOMS = {"spec", "planning", "backends", "worker", "ledger", "decision", "orchestration", "airflow", "oncall", "local"}
# What the images' wheel stage copies (inference_container/Dockerfile, infra/compose/airflow.Dockerfile).
BUILD_INPUTS = ["pyproject.toml", "README.md", "src"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, source / name)
    dist = tmp_path_factory.mktemp("dist")
    # The PEP 517 hooks themselves, each in a fresh process, as `python -m build` and `pip wheel` call them.
    for hook in ("build_wheel", "build_sdist"):
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; from setuptools import build_meta; build_meta.{hook}(sys.argv[1])",
                str(dist),
            ],
            cwd=source,
            check=True,
            capture_output=True,
            text=True,
        )
    (wheel,) = dist.glob("shardline-*.whl")
    (sdist,) = dist.glob("shardline-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def _metadata(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [n for n in archive.namelist() if n.endswith(f".dist-info/{name}")]
        return archive.read(member).decode()


def test_the_wheel_holds_every_package_and_no_tests_dags_or_repo_files(built):
    with zipfile.ZipFile(built["wheel"]) as archive:
        names = archive.namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == PACKAGES, tops
    assert {n.split("/")[1] for n in names if n.startswith("shardline/")} >= ROOMS
    assert "shardline/airflow/ui/static/oncall.html" in names
    assert "shardline/provider_info.py" in names and "shardline/__main__.py" in names


def test_the_sdist_rebuilds_the_same_packages(built):
    with tarfile.open(built["sdist"]) as archive:
        names = archive.getnames()
    assert any(n.endswith("/pyproject.toml") for n in names)
    for package in ["shardline", "shardline/worker", "shardline/ledger", "shardline/airflow/ui"]:
        assert any(n.endswith(f"/src/{package}/__init__.py") for n in names), package


def test_the_metadata_declares_ranges_extras_and_entry_points(built):
    metadata = _metadata(built["wheel"], "METADATA")
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    assert {r.split("<")[0].split(">")[0].split("=")[0].strip().lower() for r in core} >= {
        "boto3",
        "pynamodb",
        "pydantic",
        "pyyaml",
        "httpx",
        "rich",
    }, core
    assert not [r for r in requires if "==" in r.split(";")[0]], "exact pins belong in constraints.txt, not here"
    assert not [r for r in core if "airflow" in r or "torch" in r or "xgboost" in r], core
    extras = {line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Provides-Extra:")}
    assert extras >= {"airflow", "worker", "torch", "local", "dev"}, extras
    entry_points = _metadata(built["wheel"], "entry_points.txt")
    assert "provider_info = shardline.provider_info:get_provider_info" in entry_points
    assert "shardline_ui = shardline.airflow.ui.plugin:ShardlineUiPlugin" in entry_points
    assert "shardline = shardline.oncall.cli:main" in entry_points


def test_every_pin_the_extras_need_is_in_constraints():
    pins = {
        line.split("==")[0].strip().lower().replace("_", "-")
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    for extra, requirements in PROJECT["project"]["optional-dependencies"].items():
        for requirement in [*PROJECT["project"]["dependencies"], *requirements]:
            name = requirement.split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
            if name != "shardline":
                assert name.replace("_", "-") in pins, f"{name} ({extra}) has no pin in constraints.txt"


def test_every_pin_installs_on_every_python_the_project_accepts():
    """requires-python says >=3.11: every pinned release must say so too. A newer release of a deep dependency
    that needs 3.11.5 made the whole pinned tree unresolvable on Debian bookworm's 3.11.2 (pip backtracked for
    ever in the images' builds)."""
    import re
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    floor = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"].removeprefix(">=")
    refused = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        pinned = re.match(r"^([A-Za-z0-9_.-]+)==", line)
        if pinned:
            needs = metadata.metadata(pinned.group(1)).get("Requires-Python")
            if needs and not SpecifierSet(needs).contains(f"{floor}.0"):
                refused[pinned.group(1)] = needs
    assert not refused, f"pinned releases that Python {floor}.0 cannot install: {refused}"


@pytest.mark.slow
def test_a_fresh_virtualenv_with_the_core_runs_the_cli_without_airflow(built, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-c", str(REPO / "constraints.txt"), str(built["wheel"])],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    version = subprocess.run(
        [str(venv / "bin" / "shardline"), "--version"], check=False, capture_output=True, text=True, env=env
    )
    assert version.returncode == 0 and version.stdout.strip() == "shardline " + _version(built["wheel"]), version
    helped = subprocess.run(
        [str(venv / "bin" / "shardline"), "--help"], check=False, capture_output=True, text=True, env=env
    )
    assert helped.returncode == 0 and "resubmit" in helped.stdout, helped.stderr
    module = subprocess.run(
        [str(python), "-m", "shardline", "--version"], check=False, capture_output=True, text=True, env=env
    )
    assert module.returncode == 0 and module.stdout.startswith("shardline "), module.stderr
    # The core is the core: no Airflow, no model libraries came with it.
    absent = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; print([m for m in ('airflow', 'xgboost', 'torch', 'moto') if u.find_spec(m)])",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert absent.stdout.strip() == "[]", absent.stdout + absent.stderr


def _version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


@pytest.mark.slow
def test_airflow_lists_shardline_as_a_provider(tmp_path):
    """The editable install in .venv registers the same entry points as the wheel."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    listed = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "providers", "list", "-o", "json"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    providers = {p["package_name"]: p for p in json.loads(listed.stdout[listed.stdout.index("[") :])}
    from shardline import __version__

    assert providers["shardline"]["version"] == __version__, providers.get("shardline")
