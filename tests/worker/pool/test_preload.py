"""The forkserver's side of the early start (worker/pool/preload.py): which library it imports before the model is
verified, and how it waits for the verified model. Pure file-system checks; the whole flow runs in
test_forkserver.py."""

from __future__ import annotations

import io
import os
import tarfile

from shardline.worker.pool.preload import await_handover, guess_kind


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


def test_a_custom_script_anywhere_among_the_first_members_means_no_library(tmp_path):
    _tarball(tmp_path / "script-last", "model.pth", "code/requirements.txt", "code/inference.py")
    assert guess_kind(str(tmp_path / "script-last")) == "custom"


def test_a_pinned_tarball_is_read_only_if_it_has_the_pinned_digest(tmp_path):
    from shardline.worker.model.loading import sha256_of

    _tarball(tmp_path / "m", "model.joblib")
    digest = sha256_of(tmp_path / "m" / "model.tar.gz")
    assert guess_kind(str(tmp_path / "m"), digest) == "sklearn"
    assert guess_kind(str(tmp_path / "m"), "0" * 64) is None


def test_no_guess_when_no_name_tells(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "model.tar.gz").write_bytes(b"not a tarball")
    _tarball(tmp_path / "readme", "README.md")
    for name in ("empty", "corrupt", "readme", "missing"):
        assert guess_kind(str(tmp_path / name)) is None, name


def test_the_handover_is_read_once_written(tmp_path):
    folder = tmp_path / "handover"
    folder.mkdir(mode=0o700)
    handover = folder / "model.json"
    handover.write_text('[{"kind": "sklearn"}, false]')
    assert await_handover(handover, parent=os.getppid()) == '[{"kind": "sklearn"}, false]'


def test_a_handover_not_the_main_processs_own_is_refused(tmp_path):
    """In a directory others may write to, or through a link, a key is no order: nothing is loaded."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (shared / "model.json").write_text('[{"kind": "sklearn"}, false]')
    assert await_handover(shared / "model.json", parent=os.getppid()) is None
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "model.json").symlink_to(shared / "model.json")
    assert await_handover(private / "model.json", parent=os.getppid()) is None


def test_a_main_process_that_gives_up_says_so(tmp_path):
    folder = tmp_path / "handover"
    folder.mkdir(mode=0o700)
    (folder / "model.json").write_text("null")
    assert await_handover(folder / "model.json", parent=os.getppid()) is None


def test_waiting_for_a_handover_stops_when_the_main_process_is_gone(tmp_path):
    """A forkserver whose main process ended (its parent is not the one named) loads nothing."""
    assert await_handover(tmp_path / "never-written", parent=os.getppid() + 1_000_000) is None
