"""Custom SageMaker-style inference.py scripts, and models that recorded their feature names, end to end.

Every test runs the real worker (``python -m shardline.worker``) as a subprocess on real parquet and
CSV files, whose columns are in another order than the model was trained with and which carry an
extra numeric ``label`` column and a string ``segment`` column. The scripts are written the way
public SageMaker examples write them, not in the shapes Shardline produces. Every prediction is
compared, row by row by id, with calling the model directly on the same rows in this process.

Wrong configurations either fail the file with a message naming the setting to change, or are
caught by ``--preview``, which writes nothing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardline.contract import EXIT_FILES_FAILED, EXIT_OK, EXIT_SETUP_ERROR
from tests.support.helpers import (
    describe,
    load_manifest,
    read_table,
    reports_by_input,
    run_worker,
    write_inference_script,
)

FEATURES = ["age", "income", "balance", "tenure"]  # the training order
FILE_ORDER = ["id", "tenure", "label", "segment", "balance", "income", "age"]  # what the input files hold
SEGMENTS = ["north", "south", "east", "west"]
# scikit-learn's linear models sum a dot product in an order that depends on the matrix layout and the batch
# size, so the same rows give results a few ulp apart; tree models and xgboost are compared exactly.
ULP = 1e-12


# -- data and models, made once per module ----------------------------------------------------------------


def _frame(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "age": rng.integers(18, 80, rows),  # int64, the others float64
            "income": rng.normal(3.0, 1.0, rows),
            "balance": rng.normal(0.0, 2.0, rows),
            "tenure": rng.uniform(0.0, 10.0, rows),
            "segment": rng.choice(SEGMENTS, rows),
        }
    )


def _target(frame: pd.DataFrame, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).normal(0.0, 0.5, len(frame))
    score = (frame.income - 3) + 0.5 * frame.balance - 0.1 * (frame.tenure - 5) + 0.05 * (frame.age - 50)
    score = score + frame.segment.map({"north": 0.5, "south": -0.5, "east": 0.0, "west": 0.25})
    return (score + noise).to_numpy()


def _write(frame: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    else:
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, path)
    return path


def _input_frame(rows: int, seed: int, first_id: int) -> pd.DataFrame:
    frame = _frame(rows, seed)
    frame["id"] = np.arange(first_id, first_id + rows, dtype=np.int64)
    frame["label"] = np.random.default_rng(seed + 1).integers(0, 2, rows)
    return frame[FILE_ORDER]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A parquet and a CSV file, columns in another order than training, plus label and segment."""
    root = tmp_path_factory.mktemp("script-inputs")
    _write(_input_frame(2000, seed=21, first_id=0), root / "part-0.parquet")
    _write(_input_frame(1500, seed=22, first_id=2000), root / "part-1.csv")
    return root


@pytest.fixture(scope="module")
def small_inputs(tmp_path_factory) -> Path:
    """For one-record-per-request runs: two small files, parquet and CSV."""
    root = tmp_path_factory.mktemp("script-small-inputs")
    _write(_input_frame(600, seed=31, first_id=0), root / "part-0.parquet")
    _write(_input_frame(400, seed=32, first_id=600), root / "part-1.csv")
    return root


@pytest.fixture(scope="module")
def train() -> pd.DataFrame:
    return _frame(400, seed=1)


@pytest.fixture(scope="module")
def classifier(train):
    """A LogisticRegression fitted on a DataFrame: it records feature_names_in_ in the training order."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=1000).fit(train[FEATURES], _target(train, 2) > 0)
    assert list(model.feature_names_in_) == FEATURES
    return model


@pytest.fixture(scope="module")
def regressor(train):
    from sklearn.linear_model import Ridge

    return Ridge(alpha=0.1).fit(train[FEATURES], _target(train, 3))


@pytest.fixture(scope="module")
def model_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("script-models")


@pytest.fixture(scope="module")
def classifier_file(model_root, classifier) -> Path:
    path = model_root / "classifier.joblib"
    joblib.dump(classifier, path)
    return path


@pytest.fixture(scope="module")
def regressor_file(model_root, regressor) -> Path:
    path = model_root / "regressor.joblib"
    joblib.dump(regressor, path)
    return path


@pytest.fixture(scope="module")
def torch_net(model_root):
    """A small torch module's state_dict saved as model.pth (random weights: the test checks plumbing).

    TORCH_SCRIPT's model_fn builds the same architecture and loads these weights.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1), nn.Sigmoid())
    net.eval()
    path = model_root / "net.pth"
    torch.save(net.state_dict(), path)
    return net, path


# -- running the worker and checking its outputs --------------------------------------------------------------


def _model_dir(
    tmp_path: Path, script: str, files: dict[str, Path] | None = None, siblings: dict[str, str] | None = None
) -> Path:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name, source in (files or {}).items():
        shutil.copy(source, model_dir / name)
    write_inference_script(model_dir, script)
    for name, text in (siblings or {}).items():
        (model_dir / "code" / name).write_text(textwrap.dedent(text))
    return model_dir


def _run(inputs: Path, tmp_path: Path, model_dir: Path, *args: str, passthrough: str = "id"):
    # One pool worker: it runs the script's model_fn once and scores both files, one after the other, so whatever
    # a script keeps between files is exercised too. (The pool's own tests cover several workers; each worker
    # loads a script's model itself, which cost every run here about 0.8 CPU-s.)
    out = tmp_path / "out"
    result = run_worker(inputs, out, model_dir, "--passthrough", passthrough, *args, workers=1)
    return result, out


def _run_ok(inputs: Path, tmp_path: Path, model_dir: Path, *args: str) -> tuple[dict, Path, str]:
    """Run the worker; it must exit 0 with every file SUCCEEDED. Returns the manifest, output dir and log."""
    result, out = _run(inputs, tmp_path, model_dir, *args)
    assert result.returncode == EXIT_OK, describe(result)
    manifest = load_manifest(out)
    assert manifest["failed"] == 0, describe(result)
    return manifest, out, result.stderr


Expected = Callable[[pd.DataFrame], dict[str, np.ndarray]]


def _source(path: Path) -> pd.DataFrame:
    """An input file as the worker reads it: feature columns of text files as float64."""
    return read_table(path, float_columns=FEATURES).to_pandas()


def check_predictions(inputs: Path, out: Path, manifest: dict, expected: Expected, *, rtol: float = 0.0) -> None:
    """Each input's output holds, for every id, exactly what ``expected`` computes on that input's rows.

    ``rtol=0`` means exact equality.
    """
    reports = reports_by_input(manifest)
    names = sorted(p.relative_to(inputs).as_posix() for p in inputs.rglob("*") if p.is_file())
    assert sorted(reports) == names
    for rel in names:
        report = reports[rel]
        assert report["status"] == "SUCCEEDED", report
        source = _source(inputs / rel)
        result = read_table(out / report["output"]).to_pandas()
        assert len(result) == len(source) == report["rows_out"], rel
        assert result["id"].is_unique
        # Row by row by id, whatever order the output has.
        by_id = result.set_index("id").loc[source["id"]]
        want = expected(source)
        assert list(by_id.columns) == list(want), f"{rel}: output columns {list(by_id.columns)}"
        for name, column in want.items():
            got, values = by_id[name].to_numpy(), np.asarray(column)
            if values.dtype == np.float32:
                # float32 predictions written to CSV come back as float64 of their shortest decimal form
                got = got.astype(np.float32)
            if values.dtype.kind == "f" and rtol:
                np.testing.assert_allclose(got, values, rtol=rtol, atol=0, err_msg=f"{rel}: {name}")
            else:
                np.testing.assert_array_equal(got, values, err_msg=f"{rel}: {name}")


def assert_failed(result, out: Path, *settings: str) -> list[dict]:
    """The job failed its files (exit 3) with a message naming each of ``settings``, and wrote no output."""
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    manifest = load_manifest(out)
    assert manifest["succeeded"] == 0, manifest["file_reports"]
    for report in manifest["file_reports"]:
        assert report["status"] == "FAILED", report
        for setting in settings:
            assert setting in report["error_message"], (setting, report["error_message"])
    written = [p for p in out.rglob("*") if p.is_file() and "_shardline" not in p.parts]
    assert written == [], f"a failed file must leave no output: {written}"
    return manifest["file_reports"]


def preview(inputs: Path, tmp_path: Path, model_dir: Path, *args: str, rows: int = 20) -> tuple[dict, str]:
    """Run ``--preview``; return its JSON report and printed text. It must write nothing to the output dir."""
    out = tmp_path / "preview-out"
    report_path = tmp_path / "preview.json"
    result = run_worker(
        inputs, out, model_dir, "--passthrough", "id", "--preview", str(rows), "--preview-json", str(report_path), *args
    )
    assert result.returncode in (EXIT_OK, EXIT_FILES_FAILED), describe(result)
    assert not out.exists() or not any(out.rglob("*")), "a preview must not write outputs"
    return json.loads(report_path.read_text()), result.stdout


# -- the scripts, as public SageMaker examples write them ---------------------------------------------------------

PANDAS_JSON_SCRIPT = """
    import json
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        if request_content_type == "application/json":
            return pd.DataFrame(json.loads(request_body))
        raise ValueError(f"Unsupported content type: {request_content_type}")


    def predict_fn(input_data, model):
        return model.predict_proba(input_data[FEATURES])[:, 1]


    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""

NUMPY_INSTANCES_SCRIPT = """
    import json
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        payload = json.loads(request_body)
        return np.array(payload["instances"])


    def predict_fn(input_data, model):
        return model.predict_proba(input_data)[:, 1]


    def output_fn(prediction, response_content_type):
        return json.dumps({"predictions": prediction.tolist()})
"""

CSV_JOINED_LINE_SCRIPT = """
    import io
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(input_data, content_type):
        if content_type == "text/csv":
            return np.loadtxt(io.StringIO(input_data), delimiter=",")
        raise ValueError("This model only supports text/csv input")


    def predict_fn(input_data, model):
        return model.predict(input_data)


    def output_fn(prediction, accept):
        return ",".join(str(x) for x in prediction)
"""

SINGLE_RECORD_SCRIPT = """
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        values = [float(v) for v in request_body.strip().split(",")]
        return np.array(values).reshape(1, -1)


    def predict_fn(input_data, model):
        return model.predict_proba(input_data)[:, 1]


    def output_fn(prediction, accept):
        return str(prediction[0])
"""

OBJECTS_SCRIPT = """
    import json
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        return pd.DataFrame(json.loads(request_body))


    def predict_fn(input_data, model):
        return model.predict_proba(input_data[FEATURES])[:, 1]


    def output_fn(prediction, accept):
        return json.dumps([
            {"probability": float(p), "label": int(p > 0.5), "model_version": "v3"} for p in prediction
        ])
"""

TORCH_SCRIPT = """
    import io
    import os

    import numpy as np
    import torch
    from torch import nn


    def model_fn(model_dir):
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1), nn.Sigmoid())
        with open(os.path.join(model_dir, "model.pth"), "rb") as f:
            model.load_state_dict(torch.load(f))
        model.eval()
        return model


    def input_fn(request_body, request_content_type):
        if request_content_type == "application/x-npy":
            array = np.load(io.BytesIO(request_body))
            return torch.from_numpy(array.astype(np.float32))
        raise ValueError(f"unsupported content type {request_content_type}")


    def predict_fn(input_data, model):
        with torch.no_grad():
            return model(input_data)


    def output_fn(prediction, accept):
        buffer = io.BytesIO()
        np.save(buffer, prediction.numpy())
        return buffer.getvalue()
"""

TRANSFORM_FN_SCRIPT = """
    import io
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def transform_fn(model, request_body, content_type, accept):
        data = np.loadtxt(io.StringIO(request_body), delimiter=",", ndmin=2)
        prediction = model.predict(data)
        return "\\n".join(repr(float(p)) for p in prediction) + "\\n", "text/csv"
"""

CONTEXT_SCRIPT = """
    import io
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir, context):
        assert context.system_properties.get("model_dir") == model_dir
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type, context):
        return pd.read_csv(io.StringIO(request_body), float_precision="round_trip")


    def predict_fn(input_data, model, context):
        return model.predict_proba(input_data[FEATURES])[:, 1]


    def output_fn(prediction, accept, context):
        return "\\n".join(repr(float(p)) for p in prediction)
"""

SIBLING_PREPROCESS = """
    import json

    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def to_frame(body):
        return pd.DataFrame(json.loads(body))[FEATURES]
"""

SIBLING_IMPORT_SCRIPT = """
    import json
    import os

    import joblib
    from preprocess import FEATURES, to_frame


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        frame = to_frame(request_body)
        assert list(frame.columns) == FEATURES
        return frame


    def predict_fn(input_data, model):
        return model.predict_proba(input_data)[:, 1]


    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""

WRAPPER_MODULE = """
    class ScaledProbability:
        \"\"\"A model class of the user's own: pickled by reference to this module, code/scaled.py.\"\"\"

        def __init__(self, estimator, scale):
            self.estimator = estimator
            self.scale = scale

        def predict(self, frame):
            return self.estimator.predict_proba(frame)[:, 1] * self.scale
"""

WRAPPER_SCRIPT = """
    import json
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "wrapped.joblib"))  # unpickles scaled.ScaledProbability


    def input_fn(request_body, request_content_type):
        return pd.DataFrame(json.loads(request_body))[FEATURES]


    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""

PRINTING_SCRIPT = """
    import json
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        print("loading model from", model_dir)
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        frame = pd.DataFrame(json.loads(request_body))
        print(f"Invoked with {len(frame)} records")
        return frame


    def predict_fn(input_data, model):
        return model.predict_proba(input_data[FEATURES])[:, 1]


    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""


def _proba(model) -> Expected:
    return lambda frame: {"prediction": model.predict_proba(frame[FEATURES])[:, 1]}


ECHO_SCRIPT = """
    import io
    import json
    import os

    import joblib
    import numpy as np
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        if request_content_type == "text/csv":
            return pd.read_csv(io.StringIO(request_body), header=None, names=FEATURES, float_precision="round_trip")
        if request_content_type == "application/json":
            return pd.DataFrame(json.loads(request_body))
        if request_content_type == "application/jsonlines":
            return pd.read_json(io.BytesIO(request_body), lines=True, precise_float=True)
        if request_content_type == "application/x-npy":
            return pd.DataFrame(np.load(io.BytesIO(request_body)), columns=FEATURES)
        raise ValueError(request_content_type)


    def predict_fn(input_data, model):
        return input_data  # what the script received, returned as a DataFrame: one output column per feature
"""


@pytest.mark.slow
@pytest.mark.parametrize("content_type", ["text/csv", "application/json", "application/jsonlines", "application/x-npy"])
def test_the_script_receives_the_files_values_exactly(inputs, tmp_path, classifier_file, content_type):
    model_dir = _model_dir(tmp_path, ECHO_SCRIPT, {"model.joblib": classifier_file})
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--content-type", content_type)
    check_predictions(inputs, out, manifest, lambda frame: {name: frame[name].to_numpy() for name in FEATURES})


# -- a. pandas, JSON records keyed by column name --------------------------------------------------------------


@pytest.mark.slow
def test_pandas_script_with_named_json_records(inputs, tmp_path, classifier, classifier_file):
    model_dir = _model_dir(tmp_path, PANDAS_JSON_SCRIPT, {"model.joblib": classifier_file})
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--content-type", "application/json")
    assert manifest["model"]["kind"] == "custom"
    # The model's own names chose the columns, in its order; label and segment were left out.
    assert [(f["source"], f["columns"], f["unused"]) for f in manifest["features"]] == [
        ("model", FEATURES, ["label", "segment"])
    ]
    check_predictions(inputs, out, manifest, _proba(classifier), rtol=ULP)
    # The preview of this setup finds nothing to warn about.
    report, text = preview(inputs, tmp_path, model_dir, "--content-type", "application/json")
    assert report["error"] is None and report["warnings"] == [], text
    assert "no warnings" in text


# -- b. numpy, {"instances": [[...]]} in, {"predictions": [...]} out ------------------------------------------------


@pytest.mark.slow
def test_numpy_script_with_instances_and_predictions(inputs, tmp_path, classifier, classifier_file):
    model_dir = _model_dir(tmp_path, NUMPY_INSTANCES_SCRIPT, {"model.joblib": classifier_file})
    manifest, out, log = _run_ok(
        inputs, tmp_path, model_dir, "--content-type", "application/json", "--json-layout", "instances"
    )
    check_predictions(inputs, out, manifest, _proba(classifier), rtol=ULP)
    # The bare array lost the names, which scikit-learn notes; the columns were in the model's order anyway.
    assert "does not have valid feature names" in log


@pytest.mark.slow
def test_instances_script_sent_records_fails_naming_json_layout(inputs, tmp_path, classifier_file):
    model_dir = _model_dir(tmp_path, NUMPY_INSTANCES_SCRIPT, {"model.joblib": classifier_file})
    result, out = _run(inputs, tmp_path, model_dir, "--content-type", "application/json")
    assert_failed(result, out, "model.json_layout: instances")


# -- c. text/csv in, ONE joined CSV line out ---------------------------------------------------------------------------


@pytest.mark.slow
def test_csv_script_returning_one_joined_line(inputs, tmp_path, regressor, regressor_file):
    model_dir = _model_dir(tmp_path, CSV_JOINED_LINE_SCRIPT, {"model.joblib": regressor_file})
    # Its output_fn writes CSV whatever it is asked for; the toolkit asks for application/json by default.
    result, out = _run(inputs, tmp_path / "default", model_dir)
    assert_failed(result, out, "The same records work with model.accept: text/csv (--accept text/csv)")
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--accept", "text/csv")
    check_predictions(inputs, out, manifest, lambda frame: {"prediction": regressor.predict(frame[FEATURES])}, rtol=ULP)


# -- d. one record per request ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_single_record_script(small_inputs, tmp_path, classifier, classifier_file):
    model_dir = _model_dir(tmp_path, SINGLE_RECORD_SCRIPT, {"model.joblib": classifier_file})
    manifest, out, _ = _run_ok(small_inputs, tmp_path, model_dir, "--batch-strategy", "single-record")
    check_predictions(
        small_inputs,
        out,
        manifest,
        lambda frame: {"prediction": classifier.predict_proba(frame[FEATURES])[:, 1]},
        rtol=ULP,
    )


@pytest.mark.slow
def test_single_record_script_sent_many_records_fails_naming_batch_strategy(small_inputs, tmp_path, classifier_file):
    model_dir = _model_dir(tmp_path, SINGLE_RECORD_SCRIPT, {"model.joblib": classifier_file})
    result, out = _run(small_inputs, tmp_path, model_dir)
    assert_failed(result, out, "batch_strategy: single_record", "--batch-strategy single-record")


# -- e. JSON objects with extra fields: each field an output column --------------------------------------------------


@pytest.mark.slow
def test_json_objects_with_extra_fields_become_columns(inputs, tmp_path, classifier, classifier_file):
    model_dir = _model_dir(tmp_path, OBJECTS_SCRIPT, {"model.joblib": classifier_file})
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--content-type", "application/json")

    def expected(frame):
        p = classifier.predict_proba(frame[FEATURES])[:, 1]
        return {
            "probability": p,
            "label": (p > 0.5).astype(np.int64),
            "model_version": np.array(["v3"] * len(frame), dtype=object),
        }

    check_predictions(inputs, out, manifest, expected, rtol=ULP)


@pytest.mark.slow
def test_an_output_field_named_like_a_passthrough_column_fails_naming_passthrough(inputs, tmp_path, classifier_file):
    model_dir = _model_dir(tmp_path, OBJECTS_SCRIPT, {"model.joblib": classifier_file})
    result, out = _run(inputs, tmp_path, model_dir, "--content-type", "application/json", passthrough="id,label")
    assert_failed(result, out, "input.passthrough", "label")


# -- f. torch ------------------------------------------------------------------------------------------------------


def _torch_expected(net) -> Expected:
    import torch

    def expected(frame):
        with torch.no_grad():
            tensor = torch.from_numpy(frame[FEATURES].to_numpy(np.float32, copy=True))
            return {"prediction": net(tensor).numpy()[:, 0]}

    return expected


@pytest.mark.slow
def test_torch_script(inputs, tmp_path, torch_net):
    net, path = torch_net
    model_dir = _model_dir(tmp_path, TORCH_SCRIPT, {"model.pth": path})
    # A torch module records no column names: the spec names them, in training order.
    manifest, out, _ = _run_ok(
        inputs,
        tmp_path,
        model_dir,
        "--content-type",
        "application/x-npy",
        "--accept",
        "application/x-npy",
        "--features",
        ",".join(FEATURES),
    )
    assert [f["source"] for f in manifest["features"]] == ["spec"]
    check_predictions(inputs, out, manifest, _torch_expected(net), rtol=1e-6)


@pytest.mark.slow
def test_torch_script_without_names_and_extra_columns_fails_naming_input_features(inputs, tmp_path, torch_net):
    _, path = torch_net
    model_dir = _model_dir(tmp_path, TORCH_SCRIPT, {"model.pth": path})
    result, out = _run(inputs, tmp_path, model_dir, "--content-type", "application/x-npy")
    assert_failed(result, out, "input.features")


@pytest.fixture(scope="module")
def inputs_with_nulls(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("script-null-inputs")
    frame = _input_frame(1000, seed=41, first_id=0)
    frame.loc[frame.index % 7 == 3, "balance"] = np.nan  # parquet: nulls
    _write(frame, root / "part-0.parquet")
    return root


@pytest.mark.slow
def test_torch_nan_predictions_fail_naming_allow_nan_predictions(inputs_with_nulls, tmp_path, torch_net):
    net, path = torch_net
    model_dir = _model_dir(tmp_path, TORCH_SCRIPT, {"model.pth": path})
    args = ("--content-type", "application/x-npy", "--accept", "application/x-npy", "--features", ",".join(FEATURES))
    result, out = _run(inputs_with_nulls, tmp_path, model_dir, *args)
    (report,) = assert_failed(result, out, "allow_nan_predictions", "missing (null or NaN) feature")
    assert "NaN for 143 of 1000 row(s)" in report["error_message"]

    # Allowed, the NaN predictions are exactly the rows with a null feature.
    manifest, out, _ = _run_ok(inputs_with_nulls, tmp_path / "allowed", model_dir, *args, "--allow-nan-predictions")
    check_predictions(inputs_with_nulls, out, manifest, _torch_expected(net), rtol=1e-6)
    result = read_table(out / "part-0.parquet").to_pandas()
    source = _source(inputs_with_nulls / "part-0.parquet")
    np.testing.assert_array_equal(result["prediction"].isna().to_numpy(), source["balance"].isna().to_numpy())


# -- g. transform_fn, context, sibling modules, requirements.txt, prints ------------------------------------------


@pytest.mark.slow
def test_transform_fn_only(inputs, tmp_path, regressor, regressor_file):
    model_dir = _model_dir(tmp_path, TRANSFORM_FN_SCRIPT, {"model.joblib": regressor_file})
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir)
    check_predictions(inputs, out, manifest, lambda frame: {"prediction": regressor.predict(frame[FEATURES])}, rtol=ULP)


@pytest.mark.slow
def test_handlers_taking_context_with_a_csv_header(inputs, tmp_path, classifier, classifier_file):
    model_dir = _model_dir(tmp_path, CONTEXT_SCRIPT, {"model.joblib": classifier_file})
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--csv-header")
    check_predictions(inputs, out, manifest, _proba(classifier), rtol=ULP)


@pytest.mark.slow
def test_script_importing_a_sibling_module(inputs, tmp_path, classifier, classifier_file):
    model_dir = _model_dir(
        tmp_path, SIBLING_IMPORT_SCRIPT, {"model.joblib": classifier_file}, {"preprocess.py": SIBLING_PREPROCESS}
    )
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--content-type", "application/json")
    check_predictions(inputs, out, manifest, _proba(classifier), rtol=ULP)


@pytest.fixture(scope="module")
def wrapped_model(model_root, classifier) -> Path:
    """A ScaledProbability from code/scaled.py, pickled as the user would: by reference to module ``scaled``."""
    code = model_root / "wrapper-code"
    code.mkdir()
    (code / "scaled.py").write_text(textwrap.dedent(WRAPPER_MODULE))
    spec = importlib.util.spec_from_file_location("scaled", code / "scaled.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaled"] = module
    try:
        spec.loader.exec_module(module)
        path = model_root / "wrapped.joblib"
        joblib.dump(module.ScaledProbability(classifier, 100.0), path)
    finally:
        del sys.modules["scaled"]
    return path


@pytest.mark.slow
def test_model_pickling_a_class_from_a_sibling_module(inputs, tmp_path, classifier, wrapped_model):
    model_dir = _model_dir(tmp_path, WRAPPER_SCRIPT, {"wrapped.joblib": wrapped_model}, {"scaled.py": WRAPPER_MODULE})
    manifest, out, _ = _run_ok(
        inputs, tmp_path, model_dir, "--content-type", "application/json", "--features", ",".join(FEATURES)
    )
    check_predictions(
        inputs,
        out,
        manifest,
        lambda frame: {"prediction": classifier.predict_proba(frame[FEATURES])[:, 1] * 100.0},
        rtol=ULP,
    )


@pytest.mark.slow
def test_requirements_txt_is_reported_not_installed(inputs, tmp_path, classifier, classifier_file):
    model_dir = _model_dir(tmp_path, PANDAS_JSON_SCRIPT, {"model.joblib": classifier_file})
    (model_dir / "code" / "requirements.txt").write_text(
        "# what the model was developed with\nscikit-learn\nnumpy>=1.20\nshardline-no-such-package==1.0\n"
        "pandas==0.1.0\n"
    )
    manifest, out, log = _run_ok(inputs, tmp_path, model_dir, "--content-type", "application/json")
    assert "requirements.txt is not installed at run time" in log
    assert "shardline-no-such-package==1.0 (not installed)" in log
    assert f"pandas==0.1.0 (the image has {pd.__version__})" in log
    assert "scikit-learn (" not in log and "numpy>=1.20 (" not in log  # met lines are not listed
    check_predictions(inputs, out, manifest, _proba(classifier), rtol=ULP)


@pytest.mark.slow
def test_a_line_printed_for_every_batch_is_logged_once_per_file_with_a_count(
    inputs, tmp_path, classifier, classifier_file
):
    model_dir = _model_dir(tmp_path, PRINTING_SCRIPT, {"model.joblib": classifier_file})
    manifest, out, log = _run_ok(
        inputs, tmp_path, model_dir, "--content-type", "application/json", "--batch-rows", "500"
    )
    check_predictions(inputs, out, manifest, _proba(classifier), rtol=ULP)
    said = [line for line in log.splitlines() if "Invoked with" in line]
    # 2000 rows in batches of 500 is 4 calls; 1500 rows is 3: one log line per file, with the count.
    assert len(said) == 2, log
    assert any("(4 times) while processing part-0.parquet: Invoked with 500 records" in line for line in said), said
    assert any("(3 times) while processing part-1.csv: Invoked with 500 records" in line for line in said), said


# -- wrong configurations: the file fails naming the setting, or the preview warns -----------------------------------


@pytest.mark.slow
def test_wrong_content_type_fails_naming_model_content_type(inputs, tmp_path, classifier_file):
    model_dir = _model_dir(tmp_path, PANDAS_JSON_SCRIPT, {"model.joblib": classifier_file})
    result, out = _run(inputs, tmp_path, model_dir)  # the script wants application/json; text/csv is the default
    assert_failed(result, out, "Unsupported content type: text/csv", "model.content_type: application/json")


HEADER_EXPECTING_SCRIPT = """
    import io
    import os

    import joblib
    import pandas as pd


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        return pd.read_csv(io.StringIO(request_body))


    def predict_fn(input_data, model):
        return model.predict(input_data.values)


    def output_fn(prediction, accept):
        return "\\n".join(str(p) for p in prediction)
"""


@pytest.mark.slow
def test_script_reading_a_header_fails_naming_csv_header(inputs, tmp_path, regressor, regressor_file):
    model_dir = _model_dir(tmp_path, HEADER_EXPECTING_SCRIPT, {"model.joblib": regressor_file})
    result, out = _run(inputs, tmp_path, model_dir)
    assert_failed(result, out, "model.csv_header: true")
    # As the message says, with a header line it works (and the first row is not lost).
    manifest, out, _ = _run_ok(inputs, tmp_path / "fixed", model_dir, "--csv-header")
    check_predictions(inputs, out, manifest, lambda frame: {"prediction": regressor.predict(frame[FEATURES])}, rtol=ULP)


WRONG_SETTINGS = {
    # a header line sent to a script that reads every line as a record
    "csv_header": (CSV_JOINED_LINE_SCRIPT, "regressor_file", ("--csv-header",), "model.csv_header: false"),
    # one record per call sent to a script that parses a list of records
    "single_record": (
        PANDAS_JSON_SCRIPT,
        "classifier_file",
        ("--content-type", "application/json", "--batch-strategy", "single-record"),
        "model.batch_strategy: multi_record (--batch-strategy multi-record)",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(WRONG_SETTINGS))
def test_a_setting_the_script_does_not_expect_fails_naming_the_right_one(inputs, tmp_path, request, case):
    script, model, args, named = WRONG_SETTINGS[case]
    model_dir = _model_dir(tmp_path, script, {"model.joblib": request.getfixturevalue(model)})
    result, out = _run(inputs, tmp_path, model_dir, *args)
    assert_failed(result, out, named)


@pytest.mark.slow
def test_json_response_read_as_csv_fails_naming_model_accept(inputs, tmp_path, classifier_file):
    model_dir = _model_dir(tmp_path, PANDAS_JSON_SCRIPT, {"model.joblib": classifier_file})
    result, out = _run(inputs, tmp_path, model_dir, "--content-type", "application/json", "--accept", "text/csv")
    assert_failed(result, out, "model.accept: application/json")


FILLING_SCRIPT = """
    import json
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        frame = pd.DataFrame(json.loads(request_body))
        return frame.reindex(columns=FEATURES, fill_value=0)  # a column the request lacks becomes 0


    def predict_fn(input_data, model):
        return model.predict_proba(input_data)[:, 1]


    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""


@pytest.fixture(scope="module")
def inputs_without_balance(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("script-no-balance")
    _write(_input_frame(500, seed=51, first_id=0).drop(columns=["balance"]), root / "part-0.parquet")
    return root


@pytest.fixture(scope="module")
def inputs_renamed(tmp_path_factory) -> Path:
    """The features under other names (upper case): a script that fills what it misses gets nothing."""
    root = tmp_path_factory.mktemp("script-renamed")
    frame = _input_frame(500, seed=52, first_id=0)
    _write(frame.rename(columns={name: name.upper() for name in FEATURES}), root / "part-0.parquet")
    return root


@pytest.mark.slow
def test_script_filling_a_missing_feature_is_refused_naming_the_models_order(
    inputs_without_balance, tmp_path, classifier_file
):
    model_dir = _model_dir(tmp_path, FILLING_SCRIPT, {"model.joblib": classifier_file})
    report, text = preview(inputs_without_balance, tmp_path, model_dir, "--content-type", "application/json")
    assert "lacks column(s) balance, which the model" in report["error"], text
    assert "The model's recorded order: age, income, balance, tenure" in report["error"], text
    assert "finds no key 'balance'" in report["error"], text
    # The job fails every file the same way, naming the missing column and the settings.
    job = run_worker(
        inputs_without_balance, tmp_path / "out", model_dir, "--passthrough", "id", "--content-type", "application/json"
    )
    assert job.returncode == EXIT_FILES_FAILED, describe(job)
    failed = list(reports_by_input(load_manifest(tmp_path / "out")).values())
    assert failed and all(
        f["error_class"] == "InputSchemaError"
        and "lacks column(s) balance" in f["error_message"]
        and "model.derives_features" in f["error_message"]
        for f in failed
    ), describe(job)
    # file_order cannot stand in for a recorded name; nor can the file's columns pasted as input.features.
    report, text = preview(
        inputs_without_balance, tmp_path, model_dir, "--content-type", "application/json", "--features", "file_order"
    )
    assert "lacks column(s) balance" in report["error"], text
    pasted = run_worker(
        inputs_without_balance,
        tmp_path / "out-pasted",
        model_dir,
        "--passthrough",
        "id",
        "--content-type",
        "application/json",
        "--features",
        "age,income,tenure,label",
    )
    assert pasted.returncode == EXIT_SETUP_ERROR, describe(pasted)
    assert "missing: balance; not in the model: label" in pasted.stderr, describe(pasted)
    # Said out loud that the script makes the model's features itself, file_order runs, with its WARNING.
    job = run_worker(
        inputs_without_balance,
        tmp_path / "out2",
        model_dir,
        "--passthrough",
        "id",
        "--content-type",
        "application/json",
        "--features",
        "file_order",
        "--derives-features",
    )
    lines = [line for line in job.stderr.splitlines() if "the model gets" in line]
    assert lines and all(" WARNING " in line and "file_order" in line for line in lines), describe(job)


@pytest.mark.slow
def test_script_filling_every_feature_is_caught_by_the_preview(inputs_renamed, tmp_path, classifier_file):
    model_dir = _model_dir(tmp_path, FILLING_SCRIPT, {"model.joblib": classifier_file})
    report, _ = preview(
        inputs_renamed, tmp_path, model_dir, "--content-type", "application/json", "--features", "file_order"
    )
    assert "lacks column(s) age, income, balance, tenure" in report["error"]
    # Even where the spec says the script derives its features, the preview shows that nothing reaches the model.
    _, text = preview(
        inputs_renamed,
        tmp_path,
        model_dir,
        "--content-type",
        "application/json",
        "--features",
        "file_order",
        "--derives-features",
    )
    assert "WARNING: prediction is the same for all 20 rows of the sample" in text, text
    assert "WARNING: no feature column changes any prediction" in text, text


CONSTANT_SCRIPT = """
    import io
    import os

    import joblib
    import numpy as np
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        return pd.read_csv(io.StringIO(request_body), header=None)


    def predict_fn(input_data, model):
        try:
            return model.predict_proba(input_data[FEATURES])[:, 1]
        except KeyError:
            return np.full(len(input_data), 0.5)  # "never fail in production"
"""


@pytest.mark.slow
def test_script_silently_returning_a_constant_is_caught_by_the_preview(inputs, tmp_path, classifier_file):
    model_dir = _model_dir(tmp_path, CONSTANT_SCRIPT, {"model.joblib": classifier_file})
    report, text = preview(inputs, tmp_path, model_dir)
    assert report["file"] == "part-0.parquet"
    assert "WARNING: prediction is the same for all 20 rows of the sample" in text, text
    assert "WARNING: no feature column changes any prediction" in text, text
    # The job itself cannot tell a constant from a valid answer, but its log says it loudly, per file.
    job = run_worker(inputs, tmp_path / "out", model_dir, "--passthrough", "id")
    assert "WARNING" in job.stderr and "every prediction (prediction) is 0.5 over all" in job.stderr, describe(job)
    assert "shardline preview" in job.stderr


OFF_BY_ONE_SCRIPTS = {
    "one short": """
        import io
        import os

        import joblib
        import numpy as np


        def model_fn(model_dir):
            return joblib.load(os.path.join(model_dir, "model.joblib"))


        def input_fn(request_body, request_content_type):
            return np.loadtxt(io.StringIO(request_body), delimiter=",", skiprows=1, ndmin=2)  # "skip the header"


        def predict_fn(input_data, model):
            return model.predict(input_data)
    """,
    "one extra": """
        import io
        import json
        import os

        import joblib
        import numpy as np


        def model_fn(model_dir):
            return joblib.load(os.path.join(model_dir, "model.joblib"))


        def input_fn(request_body, request_content_type):
            return np.loadtxt(io.StringIO(request_body), delimiter=",", ndmin=2)


        def predict_fn(input_data, model):
            prediction = model.predict(input_data)
            return np.append(prediction, prediction.mean())  # a summary value appended


        def output_fn(prediction, accept):
            return json.dumps(prediction.tolist()), "application/json"
    """,
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(OFF_BY_ONE_SCRIPTS))
def test_script_returning_one_prediction_too_few_or_too_many_fails(inputs, tmp_path, regressor_file, case):
    model_dir = _model_dir(tmp_path, OFF_BY_ONE_SCRIPTS[case], {"model.joblib": regressor_file})
    result, out = _run(inputs, tmp_path, model_dir)
    reports = {r["input"]: r for r in assert_failed(result, out)}
    delta = -1 if case == "one short" else 1
    for rel, rows in (("part-0.parquet", 2000), ("part-1.csv", 1500)):
        assert f"{rows + delta} prediction(s) for {rows} record(s)" in reports[rel]["error_message"], reports[rel]
    if case == "one short":
        # The likely cause is named: the first line read as a header.
        assert "model.csv_header: true" in reports["part-0.parquet"]["error_message"]


# -- builtin model kinds that recorded their feature names -----------------------------------------------------------


def _builtin_dir(tmp_path: Path, name: str, source: Path) -> Path:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(source, model_dir / name)
    return model_dir


@pytest.mark.slow
def test_sklearn_fitted_on_a_dataframe_gets_its_columns_by_name(inputs, tmp_path, model_root, train):
    from sklearn.ensemble import HistGradientBoostingClassifier

    model = HistGradientBoostingClassifier(max_iter=30, random_state=0).fit(train[FEATURES], _target(train, 8) > 0)
    path = model_root / "trees.joblib"
    joblib.dump(model, path)
    model_dir = _builtin_dir(tmp_path, "model.joblib", path)
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--probabilities")
    assert manifest["model"]["kind"] == "sklearn"
    assert [(f["source"], f["columns"]) for f in manifest["features"]] == [("model", FEATURES)]

    def expected(frame):
        proba = model.predict_proba(frame[FEATURES])
        return {"prediction": model.predict(frame[FEATURES]), "proba_False": proba[:, 0], "proba_True": proba[:, 1]}

    check_predictions(inputs, out, manifest, expected)  # exact


@pytest.mark.slow
def test_sklearn_linear_model_fitted_on_a_dataframe(inputs, tmp_path, classifier, classifier_file):
    model_dir = _builtin_dir(tmp_path, "model.joblib", classifier_file)
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--probabilities")
    assert [(f["source"], f["columns"]) for f in manifest["features"]] == [("model", FEATURES)]

    def expected(frame):
        proba = classifier.predict_proba(frame[FEATURES])
        return {
            "prediction": classifier.predict(frame[FEATURES]),
            "proba_False": proba[:, 0],
            "proba_True": proba[:, 1],
        }

    check_predictions(inputs, out, manifest, expected, rtol=ULP)


@pytest.mark.slow
def test_sklearn_missing_named_column_fails_naming_it(inputs_without_balance, tmp_path, classifier_file):
    model_dir = _builtin_dir(tmp_path, "model.joblib", classifier_file)
    result, out = _run(inputs_without_balance, tmp_path, model_dir)
    assert_failed(result, out, "lacks column(s) balance", "was fitted with")


@pytest.fixture(scope="module")
def pipeline(train):
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    columns = ["segment", *FEATURES]
    encode = ColumnTransformer(
        [("segment", OneHotEncoder(handle_unknown="ignore"), ["segment"])], remainder="passthrough"
    )
    model = Pipeline([("encode", encode), ("model", LogisticRegression(max_iter=2000))])
    return model.fit(train[columns], _target(train, 4) > 0)


@pytest.mark.slow
def test_sklearn_pipeline_with_a_column_transformer(inputs, tmp_path, model_root, pipeline):
    path = model_root / "pipeline.joblib"
    joblib.dump(pipeline, path)
    model_dir = _builtin_dir(tmp_path, "model.joblib", path)
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir, "--probabilities")
    assert [(f["source"], f["columns"]) for f in manifest["features"]] == [("model", ["segment", *FEATURES])]
    check_predictions(
        inputs,
        out,
        manifest,
        lambda frame: {
            "prediction": pipeline.predict(frame[["segment", *FEATURES]]),
            "proba_False": pipeline.predict_proba(frame[["segment", *FEATURES]])[:, 0],
            "proba_True": pipeline.predict_proba(frame[["segment", *FEATURES]])[:, 1],
        },
        rtol=ULP,
    )


@pytest.mark.slow
def test_xgboost_booster_trained_with_feature_names(inputs, tmp_path, model_root, train):
    import xgboost

    dtrain = xgboost.DMatrix(train[FEATURES].to_numpy(np.float32), label=_target(train, 5) > 0, feature_names=FEATURES)
    booster = xgboost.train({"objective": "binary:logistic", "max_depth": 3, "nthread": 1}, dtrain, num_boost_round=20)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    booster.save_model(model_dir / "model.json")
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir)
    assert manifest["model"]["kind"] == "xgboost"
    assert [(f["source"], f["columns"]) for f in manifest["features"]] == [("model", FEATURES)]
    loaded = xgboost.Booster(model_file=str(model_dir / "model.json"))
    check_predictions(
        inputs,
        out,
        manifest,
        lambda frame: {
            "prediction": loaded.predict(xgboost.DMatrix(frame[FEATURES].to_numpy(np.float32), feature_names=FEATURES))
        },
    )


@pytest.mark.slow
def test_xgboost_sklearn_wrapper_saved_with_joblib(inputs, tmp_path, model_root, train):
    import xgboost

    model = xgboost.XGBRegressor(n_estimators=20, max_depth=3, n_jobs=1).fit(train[FEATURES], _target(train, 6))
    path = model_root / "xgb-regressor.joblib"
    joblib.dump(model, path)
    model_dir = _builtin_dir(tmp_path, "model.joblib", path)
    manifest, out, _ = _run_ok(inputs, tmp_path, model_dir)
    assert manifest["model"]["kind"] == "sklearn"
    assert [(f["source"], f["columns"]) for f in manifest["features"]] == [("model", FEATURES)]
    check_predictions(inputs, out, manifest, lambda frame: {"prediction": model.predict(frame[FEATURES])})


@pytest.mark.slow
def test_spec_features_other_than_the_models_names_are_refused(inputs, tmp_path, classifier_file):
    model_dir = _builtin_dir(tmp_path, "model.joblib", classifier_file)
    result, out = _run(inputs, tmp_path, model_dir, "--features", "age,income,balance,label")
    assert result.returncode == EXIT_SETUP_ERROR, describe(result)
    assert "input.features (--features) does not match the feature names" in result.stderr
    assert "not in the model: label" in result.stderr
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_model_without_names_and_an_extra_column_needs_input_features(inputs, tmp_path, model_root, train):
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=1000).fit(train[FEATURES].to_numpy(np.float64), _target(train, 7) > 0)
    assert not hasattr(model, "feature_names_in_")
    path = model_root / "numpy-fitted.joblib"
    joblib.dump(model, path)
    model_dir = _builtin_dir(tmp_path, "model.joblib", path)
    result, out = _run(inputs, tmp_path, model_dir)
    assert_failed(result, out, "input.features", "records no feature names", "Name its 4 features")

    manifest, out, _ = _run_ok(
        inputs, tmp_path / "named", model_dir, "--features", ",".join(FEATURES), "--probabilities"
    )
    assert [f["source"] for f in manifest["features"]] == ["spec"]

    def expected(frame):
        matrix = frame[FEATURES].to_numpy(np.float64)
        proba = model.predict_proba(matrix)
        return {"prediction": model.predict(matrix), "proba_False": proba[:, 0], "proba_True": proba[:, 1]}

    check_predictions(inputs, out, manifest, expected, rtol=ULP)


@pytest.mark.slow
def test_probabilities_is_never_silently_ignored(inputs, tmp_path, regressor_file, xgboost_model):
    """--probabilities adds a scikit-learn classifier's predict_proba columns. Asked of a custom script, an
    XGBoost model or a regressor, the job fails at setup naming the setting, instead of writing outputs
    without the columns the spec asked for."""
    script = tmp_path / "script"
    write_inference_script(
        script,
        """
        def model_fn(model_dir):
            return None

        def predict_fn(data, model):
            return [0.5] * len(data)
    """,
    )
    (tmp_path / "reg").mkdir()
    cases = {
        "custom": script,
        "xgboost": xgboost_model.parent,
        "regressor": _builtin_dir(tmp_path / "reg", "model.joblib", regressor_file),
    }
    for name, model_dir in cases.items():
        (tmp_path / name).mkdir()
        result, out = _run(inputs, tmp_path / name, model_dir, "--probabilities")
        assert result.returncode == EXIT_SETUP_ERROR, (name, describe(result))
        said = result.stderr.lower()
        assert "probabilities (--probabilities)" in said and "remove probabilities" in said, (name, said[-2000:])
        assert not list(out.rglob("*.parquet")), name


# -- JSON lines labelled application/json; a response no accept type reads; a body in an error --------------------

# As SageMaker's example notebooks write it for a Batch Transform of a JSON lines file with ContentType
# application/json and SplitType Line: the body is JSON lines, and the script refuses any other content type.
JSON_LINES_AS_JSON_SCRIPT = """
    import json
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        if request_content_type != "application/json":
            raise ValueError(f"Unsupported content type: {request_content_type}")
        return pd.DataFrame([json.loads(line) for line in request_body.split("\\n") if line])


    def predict_fn(input_data, model):
        return model.predict_proba(input_data[FEATURES])[:, 1]


    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""


@pytest.mark.slow
def test_json_lines_labelled_application_json_have_a_setting_the_failure_names(
    inputs, tmp_path, classifier, classifier_file
):
    model_dir = _model_dir(tmp_path, JSON_LINES_AS_JSON_SCRIPT, {"model.joblib": classifier_file})
    result, out = _run(inputs, tmp_path, model_dir, "--content-type", "application/json")
    assert_failed(result, out, "model.json_layout: lines (--json-layout lines)")
    manifest, out, _ = _run_ok(
        inputs, tmp_path / "fixed", model_dir, "--content-type", "application/json", "--json-layout", "lines"
    )
    check_predictions(inputs, out, manifest, _proba(classifier), rtol=ULP)


NUMPY_TEXT_SCRIPT = """
    import io
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        return np.loadtxt(io.StringIO(request_body), delimiter=",", ndmin=2)


    def predict_fn(input_data, model):
        return model.predict(input_data)


    def output_fn(prediction, accept):
        return str(prediction)  # numpy's text: "[0.1 0.2 ...]", which neither CSV nor JSON reads
"""


@pytest.mark.slow
def test_numpy_text_is_answered_with_what_to_return_never_with_the_setting_that_failed(
    inputs, tmp_path, regressor_file
):
    """The first run (accept application/json, the default) fails; the second, with the accept type a person tries
    next, must not send them back to the first."""
    model_dir = _model_dir(tmp_path, NUMPY_TEXT_SCRIPT, {"model.joblib": regressor_file})
    for accept in ("application/json", "text/csv"):
        result, out = _run(
            inputs, tmp_path / accept.replace("/", "-"), model_dir, "--features", ",".join(FEATURES), "--accept", accept
        )
        for report in assert_failed(result, out, "numpy's text of an array", "array.tolist()"):
            assert "set model.accept" not in report["error_message"], report["error_message"]


BODY_IN_ERROR_SCRIPT = """
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        return np.array(request_body)  # the body as one string: scikit-learn's error quotes all of it


    def predict_fn(input_data, model):
        return model.predict(input_data)
"""


@pytest.mark.slow
def test_an_error_quoting_the_request_body_is_clipped_in_the_message_the_log_and_the_summary(
    inputs, tmp_path, regressor_file
):
    """scikit-learn's "Expected 2D array, got scalar array instead: array=..." holds the whole body: quoted whole,
    three small files made a 583 KB log line, 3.5 MB of log and a 1.9 MB summary."""
    from shardline.errors import QUOTED_CHARS

    model_dir = _model_dir(tmp_path, BODY_IN_ERROR_SCRIPT, {"model.joblib": regressor_file})
    summary = tmp_path / "summary.json"
    result, out = _run(inputs, tmp_path, model_dir, "--features", ",".join(FEATURES), "--summary-json", str(summary))
    for report in assert_failed(result, out, "Expected 2D array", "more characters)", "Sent as: content_type text/csv"):
        assert len(report["error_message"]) < QUOTED_CHARS + 500, len(report["error_message"])
    assert len(result.stderr) < 20_000 and summary.stat().st_size < 20_000
