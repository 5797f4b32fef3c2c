"""model/loading.py: model detection and integrity (unit), and every model kind end to end through the CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import joblib
import numpy as np
import pytest

from examples import synthetic
from shardline.contract import EXIT_OK, EXIT_SETUP_ERROR
from shardline.errors import ModelIntegrityError, SetupError
from shardline.worker.model.loading import detect_kind, prepare_model, sha256_of
from tests.support.helpers import (
    SYNTHETIC_COLUMNS,
    check_outputs,
    clean_env,
    describe,
    feature_matrix,
    load_manifest,
    read_table,
    reports_by_input,
    run_worker,
    sklearn_predict,
    torch_predict,
    write_inference_script,
    xgboost_predict,
)

# -- detect_kind / prepare_model: pure apart from the files they look at ------------------------------------


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


@pytest.mark.parametrize(
    ("names", "kind", "chosen"),
    [
        (["model.joblib"], "sklearn", "model.joblib"),
        (["estimator.pkl"], "sklearn", "estimator.pkl"),
        (["model.json"], "xgboost", "model.json"),
        (["booster.ubj"], "xgboost", "booster.ubj"),
        (["net.pt"], "torch", "net.pt"),
        # custom code wins over any model file beside it
        (["code/inference.py", "model.joblib", "model.pt"], "custom", "code/inference.py"),
        # torch beats xgboost beats sklearn
        (["model.pt", "model.json", "model.joblib"], "torch", "model.pt"),
        (["model.json", "model.joblib"], "xgboost", "model.json"),
        # config*.json / metadata*.json are not boosters
        (["config.json", "metadata.json", "model.joblib"], "sklearn", "model.joblib"),
        (["config.json", "model.json"], "xgboost", "model.json"),
        # several candidates, one named model.<ext>
        (["a.joblib", "model.joblib"], "sklearn", "model.joblib"),
        (["nested/dir/model.pt"], "torch", "nested/dir/model.pt"),
    ],
)
def test_detect_kind(tmp_path, names, kind, chosen):
    _touch(tmp_path, *names)
    assert detect_kind(tmp_path) == (kind, tmp_path / chosen)


def test_detect_kind_ambiguous_names_every_candidate(tmp_path):
    _touch(tmp_path, "first.joblib", "second.joblib")
    with pytest.raises(SetupError, match="several sklearn model files") as info:
        detect_kind(tmp_path)
    assert "first.joblib" in str(info.value)
    assert "second.joblib" in str(info.value)


def test_detect_kind_nothing_found_lists_what_is_there(tmp_path):
    _touch(tmp_path, "README.txt", "weights.bin")
    with pytest.raises(SetupError, match="no model found") as info:
        detect_kind(tmp_path)
    assert "README.txt" in str(info.value)
    assert "weights.bin" in str(info.value)


def test_detect_kind_empty_directory(tmp_path):
    with pytest.raises(SetupError, match=r"no model found .*found: nothing"):
        detect_kind(tmp_path)


def test_detect_kind_ignores_model_files_under_code(tmp_path):
    _touch(tmp_path, "code/helper.joblib")
    with pytest.raises(SetupError, match="no model found"):
        detect_kind(tmp_path)


def test_prepare_model_checks_the_pin(tmp_path):
    model_dir, scratch = tmp_path / "model", tmp_path / "scratch"
    _touch(model_dir, "model.joblib")
    digest = sha256_of(model_dir / "model.joblib")
    artifact = prepare_model(model_dir, digest.upper(), scratch)
    assert (artifact.kind, artifact.sha256) == ("sklearn", digest)
    with pytest.raises(ModelIntegrityError, match="sha256"):
        prepare_model(model_dir, "0" * 64, scratch)
    with pytest.raises(SetupError, match="not 64 hex characters"):
        prepare_model(model_dir, "abc", scratch)


def test_prepare_model_refuses_a_pin_on_loose_custom_code(tmp_path):
    _touch(tmp_path, "code/inference.py")
    with pytest.raises(SetupError, match=r"model\.tar\.gz"):
        prepare_model(tmp_path, "0" * 64, tmp_path / "scratch")


def test_prepare_model_unpacks_a_tarball(tmp_path, xgboost_model):
    model_dir = tmp_path / "model"
    digest = synthetic.pack(xgboost_model.parent, model_dir / "model.tar.gz")
    artifact = prepare_model(model_dir, digest, tmp_path / "scratch")
    assert artifact.kind == "xgboost"
    assert artifact.sha256 == digest
    assert Path(artifact.path).read_bytes() == xgboost_model.read_bytes()
    assert Path(artifact.root).is_relative_to(tmp_path / "scratch")


def test_prepare_model_refuses_a_tarball_before_unpacking_it(tmp_path, xgboost_model):
    model_dir = tmp_path / "model"
    synthetic.pack(xgboost_model.parent, model_dir / "model.tar.gz")
    with pytest.raises(ModelIntegrityError, match="sha256"):
        prepare_model(model_dir, "f" * 64, tmp_path / "scratch")
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())


def test_prepare_model_never_loads_a_prefilled_extraction_dir_and_unpacks_into_a_private_one(tmp_path, xgboost_model):
    model_dir, scratch = tmp_path / "model", tmp_path / "scratch"
    digest = synthetic.pack(xgboost_model.parent, model_dir / "model.tar.gz")
    # Another user of a shared scratch dir plants code where the digest says the model would be unpacked.
    planted = scratch / f"model-{digest[:16]}"
    write_inference_script(planted, "raise SystemExit('planted code ran')\n")
    artifact = prepare_model(model_dir, digest, scratch)
    assert artifact.kind == "xgboost", artifact
    root = Path(artifact.root)
    assert root != planted and not Path(artifact.path).is_relative_to(planted)
    assert root.parent == scratch
    assert root.stat().st_mode & 0o777 == 0o700
    # Each run unpacks afresh: a directory left by an earlier run is not reused either.
    assert Path(prepare_model(model_dir, digest, scratch).root) != root


@pytest.mark.parametrize("packed", [True, False])
def test_the_pinned_model_is_hashed_and_loaded_from_one_private_copy(tmp_path, xgboost_model, packed):
    """Whoever can write the model folder could swap the file between the hash and the load: the worker reads
    it once, into a 0700 folder of its own, hashing as it copies, and loads only that copy."""
    model_dir, scratch = tmp_path / "model", tmp_path / "scratch"
    model_dir.mkdir()
    if packed:
        digest = synthetic.pack(xgboost_model.parent, model_dir / "model.tar.gz")
    else:
        shutil.copy(xgboost_model, model_dir / "model.json")
        digest = sha256_of(model_dir / "model.json")
    artifact = prepare_model(model_dir, digest, scratch)
    loaded = Path(artifact.path)
    assert not loaded.is_relative_to(model_dir) and loaded.is_relative_to(scratch)
    assert loaded.parent.stat().st_mode & 0o777 == 0o700
    # The shared file is swapped after the check: what the worker loads is still what was verified.
    for shared in model_dir.iterdir():
        shared.write_bytes(b"swapped after the hash")
    if not packed:
        assert sha256_of(loaded) == digest
    assert loaded.read_bytes() == xgboost_model.read_bytes()
    if packed:
        assert not list(scratch.glob("artifact-*"))  # the tarball's copy goes once it is unpacked


# -- end to end, one run per model kind ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Three parquet files, one in a subdirectory, with unique ids."""
    root = tmp_path_factory.mktemp("model-inputs")
    synthetic.make_dataset(root, files=2, rows=3000, seed=10)
    synthetic.write_table(
        synthetic.make_table(1500, first_id=3000, seed=99), root / "sub" / "late.parquet", "parquet", row_group_rows=500
    )
    return root


def _run_ok(inputs: Path, out: Path, model_dir: Path, *args: str, env=None) -> dict:
    result = run_worker(inputs, out, model_dir, *SYNTHETIC_COLUMNS, *args, env=env)
    assert result.returncode == EXIT_OK, describe(result)
    return load_manifest(out)


@pytest.mark.slow
def test_sklearn_joblib(inputs, tmp_path, sklearn_model):
    manifest = _run_ok(inputs, tmp_path / "out", sklearn_model.parent)
    assert manifest["model"]["kind"] == "sklearn"
    assert manifest["model"]["sha256"] == sha256_of(sklearn_model)
    check_outputs(inputs, tmp_path / "out", manifest, sklearn_predict(sklearn_model), exact=True)
    assert manifest["rows_in"] == manifest["rows_out"] == 4500


@pytest.mark.slow
def test_xgboost_json_booster(inputs, tmp_path, xgboost_model):
    manifest = _run_ok(inputs, tmp_path / "out", xgboost_model.parent)
    assert manifest["model"]["kind"] == "xgboost"
    check_outputs(inputs, tmp_path / "out", manifest, xgboost_predict(xgboost_model))


@pytest.mark.slow
def test_torchscript(inputs, tmp_path, torch_model):
    manifest = _run_ok(inputs, tmp_path / "out", torch_model.parent)
    assert manifest["model"]["kind"] == "torch"
    check_outputs(inputs, tmp_path / "out", manifest, torch_predict(torch_model), rtol=1e-5, atol=1e-6)


FULL_SCRIPT = """
    import io
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, content_type):
        if content_type != "text/csv":
            raise ValueError(f"unsupported content type {content_type}")
        return np.loadtxt(io.StringIO(request_body), delimiter=",", ndmin=2)


    def predict_fn(data, model):
        return model.predict_proba(data)[:, 1]


    def output_fn(prediction, accept):
        if accept != "text/csv":
            raise ValueError(f"unsupported accept {accept}")
        return "\\n".join(repr(float(v)) for v in prediction) + "\\n"
"""

MINIMAL_SCRIPT = """
    import os

    import joblib


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def predict_fn(data, model):
        assert data.dtype.kind == "f" and data.ndim == 2, (data.dtype, data.shape)
        return model.predict(data)
"""


def _custom_model(tmp_path: Path, sklearn_model: Path, script: str) -> Path:
    model_dir = tmp_path / "custom-model"
    model_dir.mkdir()
    shutil.copy(sklearn_model, model_dir / "model.joblib")
    write_inference_script(model_dir, script)
    return model_dir


@pytest.mark.slow
def test_custom_inference_script_with_all_four_functions(inputs, tmp_path, sklearn_model):
    model_dir = _custom_model(tmp_path, sklearn_model, FULL_SCRIPT)
    manifest = _run_ok(inputs, tmp_path / "out", model_dir, "--content-type", "text/csv", "--accept", "text/csv")
    assert manifest["model"]["kind"] == "custom"
    model = joblib.load(sklearn_model)
    check_outputs(
        inputs, tmp_path / "out", manifest, lambda table: model.predict_proba(feature_matrix(table))[:, 1], rtol=1e-9
    )


@pytest.mark.slow
def test_custom_inference_script_with_model_fn_and_predict_fn_only(inputs, tmp_path, sklearn_model):
    model_dir = _custom_model(tmp_path, sklearn_model, MINIMAL_SCRIPT)
    manifest = _run_ok(inputs, tmp_path / "out", model_dir)
    assert manifest["model"]["kind"] == "custom"
    check_outputs(inputs, tmp_path / "out", manifest, sklearn_predict(sklearn_model), exact=True)


@pytest.mark.slow
def test_model_tarball_with_correct_pin(inputs, tmp_path, xgboost_model):
    model_dir = tmp_path / "model"
    digest = synthetic.pack(xgboost_model.parent, model_dir / "model.tar.gz")
    manifest = _run_ok(inputs, tmp_path / "out", model_dir, "--model-sha256", digest)
    assert manifest["model"] == {"kind": "xgboost", "sha256": digest}
    check_outputs(inputs, tmp_path / "out", manifest, xgboost_predict(xgboost_model))


@pytest.mark.slow
def test_custom_code_tarball_pinned_through_the_environment(inputs, tmp_path, sklearn_model):
    source = _custom_model(tmp_path, sklearn_model, MINIMAL_SCRIPT)
    model_dir = tmp_path / "packed"
    digest = synthetic.pack(source, model_dir / "model.tar.gz")
    manifest = _run_ok(inputs, tmp_path / "out", model_dir, env=clean_env(SHARDLINE_MODEL_SHA256=digest))
    assert manifest["model"] == {"kind": "custom", "sha256": digest}
    check_outputs(inputs, tmp_path / "out", manifest, sklearn_predict(sklearn_model), exact=True)


@pytest.mark.slow
def test_sklearn_probabilities(inputs, tmp_path, sklearn_model):
    out = tmp_path / "out"
    manifest = _run_ok(inputs, out, sklearn_model.parent, "--probabilities")
    model = joblib.load(sklearn_model)
    assert list(model.classes_) == [0, 1]
    for rel, report in reports_by_input(manifest).items():
        assert report["status"] == "SUCCEEDED"
        source = read_table(inputs / rel)
        result = read_table(out / report["output"])
        assert result.column_names == ["id", "prediction", "proba_0", "proba_1"]
        assert result.column("id").to_pylist() == source.column("id").to_pylist()
        proba = model.predict_proba(feature_matrix(source))
        np.testing.assert_allclose(result.column("proba_0").to_numpy(), proba[:, 0], rtol=1e-12)
        np.testing.assert_allclose(result.column("proba_1").to_numpy(), proba[:, 1], rtol=1e-12)
        np.testing.assert_array_equal(result.column("prediction").to_numpy(), model.predict(feature_matrix(source)))


# -- integrity: a pinned sha256 that does not match is refused, nothing is written ---------------------------


def _assert_refused(result, out: Path) -> None:
    assert result.returncode == EXIT_SETUP_ERROR, describe(result)
    assert "sha256" in result.stderr
    written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert written == [], f"a refused model must not produce outputs: {written}"


def test_sha256_mismatch_is_refused(inputs, tmp_path, sklearn_model):
    out = tmp_path / "out"
    right = sha256_of(sklearn_model)
    wrong = right[:-1] + ("0" if right[-1] != "0" else "1")
    result = run_worker(inputs, out, sklearn_model.parent, *SYNTHETIC_COLUMNS, "--model-sha256", wrong)
    _assert_refused(result, out)
    assert wrong in result.stderr


def test_sha256_mismatch_from_the_environment_is_refused(inputs, tmp_path, xgboost_model):
    out = tmp_path / "out"
    model_dir = tmp_path / "model"
    synthetic.pack(xgboost_model.parent, model_dir / "model.tar.gz")
    result = run_worker(inputs, out, model_dir, *SYNTHETIC_COLUMNS, env=clean_env(SHARDLINE_MODEL_SHA256="ab" * 32))
    _assert_refused(result, out)


@pytest.mark.slow
def test_sha256_pin_through_the_environment_accepts_the_right_model(inputs, tmp_path, sklearn_model):
    manifest = _run_ok(
        inputs, tmp_path / "out", sklearn_model.parent, env=clean_env(SHARDLINE_MODEL_SHA256=sha256_of(sklearn_model))
    )
    assert manifest["model"]["sha256"] == sha256_of(sklearn_model)
    assert manifest["succeeded"] == 3


def _tar_with(tmp_path, name: str, add) -> Path:
    import tarfile

    path = tmp_path / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        add(archive)
    return path


def test_without_tarfiles_data_filter_the_same_members_are_refused(tmp_path):
    """Python before 3.11.4 (Debian bookworm's python3) has no extraction filters: the worker applies the same
    refusals itself, so a crafted model.tar.gz never writes outside its folder there either."""
    import io
    import tarfile

    from shardline.worker.model.loading import _data_members

    def member(name: str, **fields) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        for key, value in fields.items():
            setattr(info, key, value)
        return info

    def file(archive, name, data=b"x", mode=0o644):
        archive.addfile(member(name, size=len(data), mode=mode), io.BytesIO(data))

    cases = {
        "dotdot": lambda a: file(a, "../evil.pth"),
        "absolute": lambda a: file(a, "/tmp/evil.pth"),
        "symlink out": lambda a: a.addfile(member("code", type=tarfile.SYMTYPE, linkname="/usr/lib")),
        "device": lambda a: a.addfile(member("dev", type=tarfile.CHRTYPE)),
    }
    for name, add in cases.items():
        with tarfile.open(_tar_with(tmp_path, name.replace(" ", "-"), add)) as archive, pytest.raises(tarfile.TarError):
            _data_members(archive, tmp_path / "dest")

    def good(archive):
        file(archive, "model.json", b"{}", mode=0o4777)
        archive.addfile(member("code", type=tarfile.DIRTYPE, mode=0o755))
        file(archive, "code/inference.py", b"pass")
        archive.addfile(member("latest.json", type=tarfile.SYMTYPE, linkname="model.json"))

    with tarfile.open(_tar_with(tmp_path, "good", good)) as archive:
        members = _data_members(archive, tmp_path / "dest")
    assert [m.name for m in members] == ["model.json", "code", "code/inference.py", "latest.json"]
    assert members[0].mode == 0o755  # no set-id bit, no write for others
