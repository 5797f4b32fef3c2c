"""The demos' work folders are their owner's alone: the Airflow demo's holds a run's conf (lineage.jsonl) and
Airflow's metadata database, and both hold the data and the model."""

from __future__ import annotations

import os
import stat

import pytest

from examples import private_folder


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    """The umask most machines run with (0022): what made the work folders world-readable."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def test_a_new_work_folder_and_the_folders_made_above_it_are_0700(tmp_path, open_umask):
    above = _mode(tmp_path)
    work = private_folder(tmp_path / ".shardline" / "demo-airflow")
    assert work.is_dir()
    assert _mode(work) == 0o700 and _mode(work.parent) == 0o700
    assert _mode(tmp_path) == above  # a folder it did not make is left as it was


@pytest.mark.parametrize("fresh", [False, True])
def test_an_existing_work_folder_is_tightened_and_emptied_only_when_fresh(tmp_path, open_umask, fresh):
    work = tmp_path / "demo"
    work.mkdir(mode=0o755)
    work.chmod(0o755)
    (work / "input").mkdir()
    private_folder(work, fresh=fresh)
    assert _mode(work) == 0o700
    assert (work / "input").exists() is not fresh  # the worker demo reuses its data; the Airflow demo starts over
