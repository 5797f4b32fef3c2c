"""Model artifacts: find them, check their integrity, and load them as predictors.

:func:`prepare_model` runs once in the main process. It verifies the pinned sha256 and
unpacks ``model.tar.gz`` before anything is unpickled, and detects the model kind
without loading it. :func:`load_predictor` runs once in each worker process.

Kinds, in order of precedence when several are present:

- ``custom``: SageMaker-style ``code/inference.py`` (``model_fn``, ``input_fn``,
  ``predict_fn``, ``output_fn``), run unchanged.
- ``torch``: a TorchScript archive (``*.pt``, ``*.pth``, ``*.torchscript``).
- ``xgboost``: a Booster saved as ``*.json`` or ``*.ubj`` (also what the sklearn
  wrapper's ``save_model`` writes).
- ``sklearn``: ``*.joblib`` or ``*.pkl``, any estimator with ``predict`` (including a
  pickled xgboost sklearn wrapper).
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import logging
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from shardline.errors import HostSetupError, ModelIntegrityError, PredictionError, SetupError
from shardline.worker.io.formats import to_matrix
from shardline.worker.model.features import ModelInputs, is_numeric, recorded_inputs
from shardline.worker.model.guards import strict_model_load
from shardline.worker.model.script_codec import ScriptProtocol
from shardline.worker.model.script_runner import ScriptPredictor

log = logging.getLogger(__name__)

TARBALL = "model.tar.gz"
KIND_SUFFIXES = {"torch": (".pt", ".pth", ".torchscript"), "xgboost": (".json", ".ubj"), "sklearn": (".joblib", ".pkl")}


@dataclasses.dataclass(frozen=True)
class ModelArtifact:
    kind: str  # custom | torch | xgboost | sklearn
    path: str  # the model file (for custom: code/inference.py)
    root: str  # the model directory, after extraction
    sha256: str  # digest of what was verified: the tarball if one arrived, else the model file


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def prepare_model(model_dir: Path, expected_sha256: str | None, scratch: Path) -> ModelArtifact:
    """Verify, unpack and identify the model in ``model_dir``. Nothing is unpickled here."""
    if not model_dir.is_dir():
        raise SetupError(f"model directory {model_dir} does not exist; pass --model-dir")
    expected = (expected_sha256 or "").strip().lower() or None
    if expected is not None and (len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected)):
        raise SetupError(f"the pinned model sha256 {expected_sha256!r} is not 64 hex characters")

    # The artifact is read once, into a private copy (a fresh 0700 folder), and hashed as it is copied: what
    # is verified is what is unpacked or loaded. Reading the shared file twice, once to hash it and once to
    # load it, would let whoever can write there swap it in between.
    tarball = model_dir / TARBALL
    verified: str | None = None
    root = model_dir
    if tarball.is_file():
        private, verified = _verified_copy(tarball, scratch, expected)
        root = _extract(private, scratch, prefix=f"model-{verified[:16]}-")
        shutil.rmtree(private.parent, ignore_errors=True)

    kind, path = detect_kind(root)
    if verified is None:
        if expected is not None and kind == "custom":
            raise SetupError(
                "a sha256 pin covers one artifact, but custom code arrived as loose files; "
                f"package the model directory as {TARBALL} and pin the tarball's sha256"
            )
        if kind == "custom":  # unpinned loose code: nothing to verify, and a script imports its siblings
            verified = sha256_of(path)
        else:
            path, verified = _verified_copy(path, scratch, expected)
    log.info("model: %s at %s (sha256 %s%s)", kind, path, verified[:12], ", pinned" if expected else "")
    return ModelArtifact(kind=kind, path=str(path), root=str(root), sha256=verified)


def _verified_copy(source: Path, scratch: Path, expected: str | None) -> tuple[Path, str]:
    """``source`` copied into a new folder of our own (mode 0700) under ``scratch``, and the sha256 of the bytes
    copied: the digest is of exactly what the copy holds. A copy whose digest is not the pinned one is removed
    and refused (ModelIntegrityError)."""
    scratch.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="artifact-", dir=scratch))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    dest = folder / source.name
    digest = hashlib.sha256()
    try:
        with open(source, "rb") as src, open(dest, "xb") as out:
            while chunk := src.read(4 << 20):
                digest.update(chunk)
                out.write(chunk)
    except OSError as err:
        shutil.rmtree(folder, ignore_errors=True)
        raise HostSetupError(f"cannot copy the model {source} to {folder}: {err}") from err
    actual = digest.hexdigest()
    try:
        _verify(source, actual, expected)
    except ModelIntegrityError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return dest, actual


def _verify(path: Path, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise ModelIntegrityError(
            f"model artifact {path} has sha256 {actual}, but {expected} is pinned. Refusing to load it: "
            "check that the model URI and the pinned digest name the same version."
        )


def _extract(tarball: Path, scratch: Path, prefix: str) -> Path:
    """Unpack into a new directory of our own (mode 0700) under ``scratch``, and return it.

    Never into a path that may exist already: whoever can write to a shared scratch dir could
    have filled it beforehand with code of theirs, which the model would then load.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix=prefix, dir=scratch))
    # Nothing reuses it, so it goes with this process, not with the scratch dir's next cleanup.
    atexit.register(shutil.rmtree, dest, ignore_errors=True)
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            if hasattr(tarfile, "data_filter"):
                # The "data" filter refuses absolute paths, .. and device files.
                archive.extractall(dest, filter="data")
            else:  # Python before 3.11.4 (Debian bookworm's 3.11.2) has no filters: the same refusals, by hand
                archive.extractall(dest, members=_data_members(archive, dest))
    except (tarfile.TarError, EOFError) as err:
        raise SetupError(f"cannot extract {tarball}: {err}") from err
    except OSError as err:  # a full or read-only disk: this host's problem, not the model's
        raise HostSetupError(f"cannot extract {tarball}: {err}") from err
    return dest


def _data_members(archive: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """What tarfile's "data" filter lets through, for a Python that lacks it: regular files, folders and links
    that stay inside ``dest``, with no set-id bits; any other member refuses the whole archive."""
    root = dest.resolve()
    members = []
    for member in archive.getmembers():
        target = (root / member.name).resolve()
        if member.name.startswith("/") or not target.is_relative_to(root):
            raise tarfile.TarError(f"member {member.name!r} would land outside the model folder")
        if member.issym() or member.islnk():
            link = (target.parent / member.linkname) if member.issym() else (root / member.linkname)
            if member.linkname.startswith("/") or not link.resolve().is_relative_to(root):
                raise tarfile.TarError(f"link {member.name!r} -> {member.linkname!r} points outside the model folder")
        elif not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"member {member.name!r} is a device or special file")
        member.mode &= 0o755
        members.append(member)
    return members


def kind_of_name(relative: PurePosixPath) -> str | None:
    """The model kind a file's name (relative to the model directory) says, or None: the one rule for a
    directory's files and a model.tar.gz's member names alike. Files under code/ belong to a script, and an
    XGBoost config or metadata JSON is no model."""
    if "code" in relative.parts:
        return None
    for kind, suffixes in KIND_SUFFIXES.items():
        if relative.suffix.lower() in suffixes:
            return None if kind == "xgboost" and relative.name.startswith(("config", "metadata")) else kind
    return None


def detect_kind(root: Path) -> tuple[str, Path]:
    """The model kind and its file under ``root``, or a SetupError that lists what was found."""
    inference = root / "code" / "inference.py"
    if inference.is_file():
        return "custom", inference
    files = sorted(p for p in root.rglob("*") if p.is_file() and "code" not in p.relative_to(root).parts)
    kinds = {p: kind_of_name(PurePosixPath(p.relative_to(root).as_posix())) for p in files}
    for kind in KIND_SUFFIXES:
        matches = [p for p in files if kinds[p] == kind]
        if len(matches) == 1:
            return kind, matches[0]
        if len(matches) > 1:
            preferred = [p for p in matches if p.stem == "model"]
            if len(preferred) == 1:
                return kind, preferred[0]
            raise SetupError(
                f"several {kind} model files in {root}: {', '.join(p.name for p in matches)}; "
                "keep one, or name the one to use model.<ext>"
            )
    seen = ", ".join(p.relative_to(root).as_posix() for p in files[:10]) or "nothing"
    raise SetupError(
        f"no model found in {root} (found: {seen}). Expected code/inference.py, a TorchScript "
        "*.pt, an XGBoost *.json/*.ubj, or a *.joblib file, or a model.tar.gz holding one."
    )


# -- predictors (worker side) -----------------------------------------------------------


class Predictor(Protocol):
    """A loaded model. ``predict`` gets the feature columns, by name, in the order the model wants
    (see :mod:`shardline.worker.model.features`) and returns named output columns, one value per row."""

    kind: str
    inputs: ModelInputs
    device: str

    def predict(self, batch: pa.RecordBatch) -> list[tuple[str, Any]]: ...


def output_columns(values: Any, rows: int, name: str = "prediction") -> list[tuple[str, Any]]:
    """Name a model's output: a vector is ``prediction``, a matrix ``prediction_0..k``."""
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.shape[0] != rows:
        raise PredictionError(f"the model returned {array.shape[0]} predictions for a batch of {rows} rows")
    if array.ndim == 1:
        return [(name, array)]
    if array.ndim == 2:
        return [(f"{name}_{k}", np.ascontiguousarray(array[:, k])) for k in range(array.shape[1])]
    raise PredictionError(f"the model returned an array of shape {array.shape}; expected 1 or 2 dimensions")


class SklearnPredictor:
    kind = "sklearn"

    def __init__(self, path: str, threads: int, probabilities: bool):
        import joblib

        with strict_model_load(path):
            self.model = joblib.load(path)
        if not hasattr(self.model, "predict"):
            raise SetupError(f"{path} holds a {type(self.model).__name__}, which has no predict()")
        self.set_threads(threads)
        self.probabilities = probabilities and hasattr(self.model, "predict_proba")
        if probabilities and not self.probabilities:  # never silently ignored: the outputs would lack the columns
            raise SetupError(
                f"probabilities (--probabilities) asks for proba_<class> columns, but the model "
                f"({type(self.model).__name__}) has no predict_proba: remove probabilities from the "
                "step, or ship a classifier"
            )
        # scikit-learn converts to float64 internally; xgboost's wrapper wants float32.
        is_xgb = type(self.model).__module__.startswith("xgboost")
        self.dtype = np.dtype(np.float32 if is_xgb else np.float64)
        # scikit-learn's tree ensembles predict one tree over all rows at a time: column-major
        # input keeps those reads sequential (about 2x faster for HistGradientBoosting here).
        self.order = "C" if is_xgb else "F"
        self.device = "cpu"
        self.inputs = recorded_inputs(self.model)

    def set_threads(self, threads: int) -> None:
        """The model's own thread count (OpenMP and BLAS pools are capped by threadpoolctl in the worker)."""
        params = self.model.get_params() if hasattr(self.model, "get_params") else {}
        if "n_jobs" in params:
            self.model.set_params(n_jobs=threads)

    def _model_input(self, batch: pa.RecordBatch):

        names = batch.schema.names
        if self.inputs.names is None:
            return to_matrix(batch, names, self.dtype, self.order)
        import pandas as pd

        if not all(is_numeric(f.type) for f in batch.schema):  # a pipeline that encodes strings itself
            return batch.to_pandas()
        # A model fitted on a DataFrame gets one, with its own column names: scikit-learn then checks
        # the names itself, and a matrix wrapped without a copy costs nothing.
        return pd.DataFrame(to_matrix(batch, names, self.dtype, self.order), columns=names, copy=False)

    def predict(self, batch: pa.RecordBatch) -> list[tuple[str, Any]]:
        rows = batch.num_rows
        features = self._model_input(batch)
        if not self.probabilities:
            return output_columns(self.model.predict(features), rows)
        # One pass: the label is the argmax of the probabilities predict() would compute anyway.
        proba = np.asarray(self.model.predict_proba(features))
        classes = getattr(self.model, "classes_", np.arange(proba.shape[1]))
        columns = output_columns(np.asarray(classes)[proba.argmax(axis=1)], rows)
        return columns + [(f"proba_{c}", np.ascontiguousarray(proba[:, k])) for k, c in enumerate(classes)]


def import_xgboost_without_sklearn():
    """Import xgboost for Booster use without also importing scikit-learn.

    ``import xgboost`` imports scikit-learn when it is installed, only to define its
    sklearn-compatible wrappers; that is most of a worker's start-up time (about 0.9 s
    of 1.5 s here). A Booster never needs them, so scikit-learn is hidden for the
    duration of the import. A process that already imported scikit-learn is left alone.
    """
    if "xgboost" in sys.modules or "sklearn" in sys.modules:
        import xgboost

        return xgboost
    sys.modules["sklearn"] = None  # makes `import sklearn` raise ImportError, which xgboost handles
    try:
        import xgboost
    finally:
        del sys.modules["sklearn"]
    return xgboost


class XGBoostPredictor:
    kind = "xgboost"

    def __init__(self, path: str, threads: int, device: str):
        xgboost = import_xgboost_without_sklearn()
        self.booster = xgboost.Booster(model_file=path)
        params = {"nthread": threads}
        if device.startswith("cuda"):
            params["device"] = device
        self.booster.set_param(params)
        self.dtype = np.dtype(np.float32)
        self.order = "C"  # xgboost walks rows in blocks
        self.device = device
        self.inputs = recorded_inputs(self.booster)

    def set_threads(self, threads: int) -> None:
        self.booster.set_param({"nthread": threads})

    def predict(self, batch: pa.RecordBatch) -> list[tuple[str, Any]]:

        # The columns are already the model's, in its order (by name when it recorded names).
        # inplace_predict skips building a DMatrix: one less copy of the batch.
        features = to_matrix(batch, batch.schema.names, self.dtype, self.order)
        return output_columns(self.booster.inplace_predict(features), batch.num_rows)


CPU_CHUNK_ROWS = 4096


class TorchScriptPredictor:
    kind = "torch"

    def __init__(self, path: str, threads: int, device: str):
        import torch

        torch.set_num_threads(threads)
        self.torch = torch
        try:
            # TorchScript archives hold code and tensors, never arbitrary pickled objects.
            self.model = torch.jit.load(path, map_location=device)
        except RuntimeError as err:
            raise SetupError(
                f"{path} is not a TorchScript archive ({err}). Export the model with torch.jit.script "
                "or torch.jit.trace and torch.jit.save: Shardline never unpickles arbitrary objects."
            ) from err
        self.model.eval()
        first = next(iter(self.model.parameters()), None)
        self.dtype = np.dtype(str(first.dtype).removeprefix("torch.")) if first is not None else np.dtype(np.float32)
        self.order = "C"
        self.device = device
        # A TorchScript module records neither column names nor (reliably) how many it wants.
        self.inputs = ModelInputs(described_as="the TorchScript model")

    def set_threads(self, threads: int) -> None:
        self.torch.set_num_threads(threads)

    def predict(self, batch: pa.RecordBatch) -> list[tuple[str, Any]]:

        torch = self.torch
        features = to_matrix(batch, batch.schema.names, self.dtype, self.order)
        with torch.inference_mode():
            tensor = torch.from_numpy(features)
            if self.device != "cpu":
                # A GPU wants the whole batch at once; the batch size is what fills it.
                tensor = tensor.pin_memory().to(self.device, non_blocking=True)
                return output_columns(self._forward(tensor).to("cpu").numpy(), features.shape[0])
            # On a CPU, activations of a few thousand rows stay in cache: an MLP runs about
            # 2x faster in 4k-row chunks than on a 64k-row batch (see `make bench`).
            chunks = [self._forward(tensor[i : i + CPU_CHUNK_ROWS]) for i in range(0, len(tensor), CPU_CHUNK_ROWS)]
            output = torch.cat(chunks) if len(chunks) > 1 else chunks[0]
            return output_columns(output.numpy(), features.shape[0])

    def _forward(self, tensor):
        output = self.model(tensor)
        if isinstance(output, (tuple, list)):
            output = output[0]
        return output.detach()


def import_library(kind: str) -> None:
    """Import the model kind's library (no model is loaded), so its cost can be told from the load's."""
    if kind == "sklearn":
        import joblib  # noqa: F401
        import sklearn  # noqa: F401
    elif kind == "xgboost":
        import_xgboost_without_sklearn()
    elif kind == "torch":
        import torch  # noqa: F401


def check_probabilities(kind: str, probabilities: bool) -> None:
    """``--probabilities`` applies to scikit-learn classifiers only; anywhere else it is a setup error, never
    silently ignored."""
    if not probabilities or kind == "sklearn":
        return
    own = (
        "a custom script's predict_fn and output_fn decide what it returns: return the probabilities from them"
        if kind == "custom"
        else f"an {kind} model's prediction is what the model outputs "
        "(a binary:logistic booster's is the probability already)"
    )
    raise SetupError(
        f"probabilities (--probabilities) adds proba_<class> columns from a scikit-learn "
        f"classifier's predict_proba, and this model is {kind}: {own}. Remove probabilities from "
        "the step"
    )


def load_predictor(
    artifact: ModelArtifact, *, threads: int, device: str, probabilities: bool, protocol=None
) -> Predictor:
    check_probabilities(artifact.kind, probabilities)
    if artifact.kind == "sklearn":
        return SklearnPredictor(artifact.path, threads, probabilities)
    if artifact.kind == "xgboost":
        return XGBoostPredictor(artifact.path, threads, device)
    if artifact.kind == "torch":
        return TorchScriptPredictor(artifact.path, threads, device)
    if artifact.kind == "custom":
        return ScriptPredictor(artifact.path, artifact.root, protocol or ScriptProtocol(), device)
    raise SetupError(f"unknown model kind {artifact.kind!r}")
