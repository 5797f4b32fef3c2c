"""The forkserver's side of the early start (worker/preload.py): which library it imports before the model is
verified, and how it waits for the verified model. Pure file-system checks; the whole flow runs in
test_startup.py."""

from __future__ import annotations

import io
import os
import tarfile

from shardline.worker.preload import await_handover, guess_kind


def _tarball(path, *names: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path / "model.tar.gz", "w:gz") as archive:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))


def test_the_library_is_guessed_from_loose_files(tmp_path):
    for kind, name in [("sklearn", "model.joblib"), ("xgboost", "model.json"), ("torch", "model.pt")]:
        (tmp_path / kind).mkdir()
        (tmp_path / kind / name).write_bytes(b"x")
        assert guess_kind(str(tmp_path / kind)) == kind


def test_the_library_is_guessed_from_a_tarballs_member_names_without_extracting(tmp_path):
    _tarball(tmp_path / "xgb", "config.json", "model.ubj")
    _tarball(tmp_path / "sk", "./model.joblib")
    _tarball(tmp_path / "script", "code/inference.py", "code/helpers.pkl", "model.pt")
    assert guess_kind(str(tmp_path / "xgb")) == "xgboost"
    assert guess_kind(str(tmp_path / "sk")) == "sklearn"
    assert guess_kind(str(tmp_path / "script")) == "custom", "custom code: no library is imported for it"
    assert not any(p.name != "model.tar.gz" for p in (tmp_path / "sk").iterdir()), "nothing was extracted"


def test_no_guess_when_no_name_tells(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "model.tar.gz").write_bytes(b"not a tarball")
    _tarball(tmp_path / "readme", "README.md")
    for name in ("empty", "corrupt", "readme", "missing"):
        assert guess_kind(str(tmp_path / name)) is None, name


def test_the_handover_is_read_once_written(tmp_path):
    handover = tmp_path / "model.json"
    handover.write_text('[{"kind": "sklearn"}, false]')
    assert await_handover(handover, parent=os.getppid()) == '[{"kind": "sklearn"}, false]'


def test_waiting_for_a_handover_stops_when_the_main_process_is_gone(tmp_path):
    """A forkserver whose main process ended (its parent is not the one named) loads nothing."""
    assert await_handover(tmp_path / "never-written", parent=os.getppid() + 1_000_000) is None
