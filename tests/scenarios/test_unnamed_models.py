"""Models that record no feature names never give a wrong number without an error (issue 22).

A model fitted on a numpy array, a TorchScript or ``state_dict`` module, or most custom scripts
cannot say which columns they were trained on, or in which order. Here each one reads files
whose columns are shuffled, with an extra numeric and an extra string column, under every
combination of ``--features``, ``--passthrough``, ``--content-type`` and ``--json-layout`` a user
might try. Each combination is either right row for row, or fails its file with a message
naming the setting to change, and ``input.features`` whenever the features were not named.

The matrix runs the worker's own per-file path in this process (feature choice, then
``predict_batch``, as ``process.run_unit`` does) so that hundreds of combinations take seconds;
the end-to-end tests below run the routes from the issue through ``python -m shardline.worker``.
"""

from __future__ import annotations

import itertools
import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardline.contract import EXIT_FILES_FAILED, EXIT_OK
from shardline.errors import SetupError
from shardline.worker.model import guards
from shardline.worker.model.features import choose_features
from shardline.worker.model.loading import load_predictor, prepare_model
from shardline.worker.model.predict import file_failure, predict_batch
from shardline.worker.model.script_codec import ScriptProtocol
from shardline.worker.pool.process import JobSettings
from tests.support.helpers import describe, load_manifest, run_worker

TRAINED = ["age", "income", "balance", "tenure"]  # the training order
ROWS = 120
# A setting a failure may name: the features always, when they were not named; else the request settings.
NAMES_A_SETTING = re.compile(r"input\.features|model\.(content_type|accept|json_layout|batch_strategy|csv_header)")


def _training(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.column_stack(
        [
            rng.uniform(18, 80, 2000),
            rng.lognormal(10, 0.5, 2000),
            rng.normal(5000, 2000, 2000),
            rng.integers(0, 120, 2000).astype(np.float64),
        ]
    )
    y = 0.3 * x[:, 0] + 0.0001 * x[:, 1] - 0.002 * x[:, 2] + 0.05 * x[:, 3] + rng.normal(0, 0.1, 2000)
    return x, y


def _file_table() -> pa.Table:
    """The scoring file: the trained columns shuffled, an id, and an extra string and numeric column."""
    x, _ = _training(seed=7)
    x = x[:ROWS]
    columns = {
        "segment": pa.array([f"s{i % 3}" for i in range(ROWS)]),
        "tenure": x[:, 3],
        "id": pa.array(np.arange(ROWS, dtype=np.int64)),
        "balance": x[:, 2],
        "extra": np.linspace(-1, 1, ROWS),
        "age": x[:, 0],
        "income": x[:, 1],
    }
    return pa.table(columns)


CSV_SCRIPT = """
    import io, os
    import joblib
    import pandas as pd

    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))

    def input_fn(request_body, request_content_type):
        return pd.read_csv(io.StringIO(request_body), header=None).to_numpy()

    def predict_fn(data, model):
        return model.predict(data)
"""

JSON_SCRIPT = """
    import json, os
    import joblib
    import pandas as pd

    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))

    def input_fn(request_body, request_content_type):
        data = json.loads(request_body)
        if isinstance(data, dict):
            data = data["instances"]
        return pd.DataFrame(data).to_numpy(dtype=float)

    def predict_fn(data, model):
        return model.predict(data)
"""

NPY_SCRIPT = """
    import io, os
    import numpy as np
    import torch

    def model_fn(model_dir):
        net = torch.nn.Linear(4, 1).double()
        net.load_state_dict(torch.load(os.path.join(model_dir, "weights.pth")))
        return net.eval()

    def input_fn(request_body, request_content_type):
        assert request_content_type == "application/x-npy"
        return torch.from_numpy(np.load(io.BytesIO(request_body)))

    def predict_fn(data, model):
        with torch.no_grad():
            return model(data.reshape(-1, 4)).numpy().ravel()
"""

INPUTS_SCRIPT = """
    import json, os
    import torch

    def model_fn(model_dir):
        net = torch.nn.Linear(4, 1).double()
        net.load_state_dict(torch.load(os.path.join(model_dir, "weights.pth")))
        return net.eval()

    def input_fn(request_body, request_content_type):
        payload = json.loads(request_body)
        return torch.tensor(payload["inputs"], dtype=torch.float64)

    def predict_fn(data, model):
        with torch.no_grad():
            return model(data.reshape(-1, 4)).numpy().ravel()
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """Each unnamed model's directory, and a function giving its predictions on a training-order matrix."""
    import joblib
    import torch
    import xgboost
    from sklearn.linear_model import Ridge

    root = tmp_path_factory.mktemp("unnamed")
    x, y = _training()
    ridge = Ridge().fit(x, y)  # a numpy array: no feature names
    assert not hasattr(ridge, "feature_names_in_")
    booster = xgboost.train({"max_depth": 3, "nthread": 1}, xgboost.DMatrix(x, label=y), num_boost_round=10)
    assert booster.feature_names is None
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1).double().eval()

    def torch_expected(matrix):
        with torch.no_grad():
            return net(torch.from_numpy(matrix)).numpy().ravel()

    found = {}

    def folder(name: str) -> Path:
        path = root / name
        path.mkdir()
        return path

    joblib.dump(ridge, folder("sklearn") / "model.joblib")
    found["sklearn"] = (root / "sklearn", ridge.predict)
    booster.save_model(folder("xgboost") / "model.json")
    found["xgboost"] = (root / "xgboost", lambda m: booster.predict(xgboost.DMatrix(m)))
    torch.jit.script(net).save(str(folder("torch") / "model.pt"))
    found["torch"] = (root / "torch", torch_expected)
    for name, script, artefact in (
        ("script-csv", CSV_SCRIPT, "model.joblib"),
        ("script-json", JSON_SCRIPT, "model.joblib"),
        ("script-npy", NPY_SCRIPT, "weights.pth"),
        ("script-inputs", INPUTS_SCRIPT, "weights.pth"),
    ):
        path = folder(name)
        (path / "code").mkdir()
        (path / "code" / "inference.py").write_text(textwrap.dedent(script))
        if artefact == "model.joblib":
            joblib.dump(ridge, path / artefact)
            found[name] = (path, ridge.predict)
        else:
            torch.save(net.state_dict(), path / artefact)
            found[name] = (path, torch_expected)
    return found


def _score(
    model_dir: Path, scratch: Path, table: pa.Table, features, passthrough, protocol: dict
) -> tuple[str, object]:
    """One file through the worker's per-file path: ("ok", predictions) or ("failed", message)."""
    artifact = prepare_model(model_dir, None, scratch)
    try:
        predictor = load_predictor(
            artifact, threads=1, device="cpu", probabilities=False, protocol=ScriptProtocol(**protocol)
        )
    except SetupError as err:  # a setting combination the worker refuses before any file
        return "failed", f"SetupError: {err}"
    settings = JobSettings(
        artifact=artifact,
        output_dir=str(scratch),
        scratch_dir=str(scratch),
        features=features,
        passthrough=passthrough,
        batch_rows=ROWS,
        gpu_batch_rows=ROWS,
        output_format="same",
        probabilities=False,
        protocol=predictor_protocol(predictor),
    )
    choice = None
    try:
        choice = choose_features(table.schema, predictor.inputs, features, passthrough, "part-0.parquet")
        batch = table.select(list(dict.fromkeys([*passthrough, *choice.columns]))).to_batches()[0]
        out = predict_batch(predictor, batch, choice, settings, guards.OutputTally())
    except SetupError as err:
        return "failed", f"SetupError: {err}"
    except Exception as err:
        failure = file_failure(err, "part-0.parquet", choice, predictor)
        return "failed", f"{type(failure).__name__}: {failure}"
    return "ok", out


def predictor_protocol(predictor) -> ScriptProtocol:
    return getattr(predictor, "protocol", ScriptProtocol())


PASSTHROUGH = [("id",), ("id", "extra"), ("id", "segment", "extra")]
SCRIPT_PROTOCOLS = [
    {},
    {"content_type": "text/csv"},
    {"content_type": "application/x-npy"},
    *[
        {"content_type": ct, **({"json_layout": layout} if layout else {})}
        for ct in ("application/json", "application/jsonlines")
        for layout in (None, "records", "instances", "inputs", "array")
    ],
]


def _matrix():
    for kind in ("sklearn", "xgboost", "torch"):
        for features, passthrough in itertools.product((None, tuple(TRAINED)), PASSTHROUGH):
            yield kind, features, passthrough, {}
    for kind in ("script-csv", "script-json", "script-npy", "script-inputs"):
        for features, passthrough, protocol in itertools.product((None, tuple(TRAINED)), PASSTHROUGH, SCRIPT_PROTOCOLS):
            yield kind, features, passthrough, protocol


@pytest.mark.slow
def test_every_combination_is_right_row_for_row_or_fails_naming_the_setting(models, tmp_path):
    table = _file_table()
    trained = np.column_stack([table.column(name).to_numpy() for name in TRAINED])
    worked, failed, wrong = set(), 0, []
    for kind, features, passthrough, protocol in _matrix():
        model_dir, expected = models[kind]
        result, value = _score(model_dir, tmp_path / "scratch", table, features, passthrough, protocol)
        case = f"{kind} features={features and 'trained'} passthrough={passthrough} {protocol}"
        if result == "ok":
            assert features is not None, f"{case}: exit 0 with the features not named"
            got = value.column(value.schema.names[len(passthrough)]).to_numpy(zero_copy_only=False)
            if not np.allclose(got, expected(trained), rtol=1e-9, atol=1e-9):
                wrong.append(case)
            assert value.column("id").to_pylist() == list(range(ROWS)), case
            worked.add(kind)
        else:
            failed += 1
            assert NAMES_A_SETTING.search(value), f"{case}: the failure names no setting: {value}"
            # A file that fails names input.features when they were not named. (A SetupError refuses a
            # contradictory request setting before any file is read: it names that setting.)
            if features is None and not value.startswith("SetupError"):
                assert "input.features" in value, f"{case}: {value}"
    assert not wrong, f"exit 0 with wrong numbers: {wrong}"
    # Every model and script is right in some setting (the matrix is not all failures), and most guesses fail.
    assert worked == set(models), set(models) - worked
    assert failed > len(list(_matrix())) // 2


@pytest.mark.slow
def test_file_order_is_taken_only_when_asked_and_then_said_as_a_warning(models, tmp_path):
    table = _file_table().select(["id", *TRAINED])  # columns in training order: what file_order promises
    trained = np.column_stack([table.column(name).to_numpy() for name in TRAINED])
    model_dir, expected = models["sklearn"]
    result, message = _score(model_dir, tmp_path, table, None, ("id",), {})
    assert result == "failed" and "input.features" in message, message
    result, out = _score(model_dir, tmp_path, table, "file_order", ("id",), {})
    assert result == "ok"
    np.testing.assert_allclose(out.column("prediction").to_numpy(), expected(trained))


def _write(table: pa.Table, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet")
    return folder


# -- the three routes, end to end ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_routes_that_gave_wrong_numbers_now_fail_naming_input_features(models, tmp_path):
    inputs = _write(_file_table(), tmp_path / "in")
    routes = {
        # the worker's old advice: list the extra columns as passthrough
        "plain joblib, extras as passthrough": ("sklearn", ("--passthrough", "id,segment,extra")),
        # a script with the extra column moved to passthrough
        "script, extras as passthrough": ("script-csv", ("--passthrough", "id,segment,extra")),
        # a torch script that asks for x-npy, and only that is set
        "torch script, only the content type": (
            "script-npy",
            ("--passthrough", "id", "--content-type", "application/x-npy"),
        ),
    }
    for route, (kind, args) in routes.items():
        out = tmp_path / route.replace(" ", "-").replace(",", "")
        result = run_worker(inputs, out, models[kind][0], *args)
        assert result.returncode == EXIT_FILES_FAILED, f"{route}: {describe(result)}"
        [report] = load_manifest(out)["file_reports"]
        assert report["error_class"] == "InputSchemaError", route
        assert "input.features" in report["error_message"] and "training order" in report["error_message"], route
        assert "input.passthrough" not in report["error_message"], route
        assert not list(out.glob("*.parquet")), route


@pytest.mark.slow
def test_one_failed_run_names_the_features_and_the_script_settings_together(models, tmp_path):
    inputs = _write(_file_table(), tmp_path / "in")
    # The {"inputs": ...} script, sent the default text/csv: it needs input.features and a JSON layout.
    result = run_worker(inputs, tmp_path / "out", models["script-inputs"][0], "--passthrough", "id,segment,extra")
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    [report] = load_manifest(tmp_path / "out")["file_reports"]
    message = report["error_message"]
    assert "input.features" in message, message
    assert (
        "the script also needs model.content_type: application/json (--content-type application/json) and "
        "model.json_layout: inputs (--json-layout inputs)" in message
    ), message
    # Both set, with the features in training order: right row for row.
    table = _file_table()
    result = run_worker(
        inputs,
        tmp_path / "fixed",
        models["script-inputs"][0],
        "--passthrough",
        "id",
        "--features",
        ",".join(TRAINED),
        "--content-type",
        "application/json",
        "--json-layout",
        "inputs",
    )
    assert result.returncode == EXIT_OK, describe(result)
    got = pq.read_table(tmp_path / "fixed" / "part-0.parquet").column("prediction").to_numpy()
    trained = np.column_stack([table.column(name).to_numpy() for name in TRAINED])
    np.testing.assert_allclose(got, models["script-inputs"][1](trained), rtol=1e-12)


@pytest.mark.slow
def test_file_order_end_to_end_warns_in_the_log_and_the_preview(models, tmp_path):
    inputs = _write(_file_table().select(["id", *TRAINED]), tmp_path / "in")
    result = run_worker(
        inputs, tmp_path / "out", models["sklearn"][0], "--passthrough", "id", "--features", "file_order"
    )
    assert result.returncode == EXIT_OK, describe(result)
    [line] = [line for line in result.stderr.splitlines() if "the model gets" in line]
    assert " WARNING " in line and "input.features is file_order" in line, line
    preview = run_worker(
        inputs,
        tmp_path / "preview",
        models["sklearn"][0],
        "--passthrough",
        "id",
        "--features",
        "file_order",
        "--preview",
        "10",
    )
    assert preview.returncode == EXIT_OK, describe(preview)
    assert "WARNING: the model gets 4 feature column(s), in the file's own order" in preview.stdout, preview.stdout
    assert "no warnings" not in preview.stdout
    # Unasked, the preview fails naming input.features (it used to end with "no warnings").
    preview = run_worker(inputs, tmp_path / "preview2", models["sklearn"][0], "--passthrough", "id", "--preview", "10")
    assert preview.returncode == EXIT_FILES_FAILED, describe(preview)
    assert "FAILS: InputSchemaError" in preview.stdout and "input.features" in preview.stdout, preview.stdout


KEYED_SCRIPT = """
    import json, logging, os
    import joblib
    import numpy as np

    log = logging.getLogger("inference")

    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))

    def input_fn(request_body, request_content_type):
        log.info("got a request of %d bytes", len(request_body))  # routine
        print("parsing the request")  # routine
        return np.array(json.loads(request_body)["{key}"], dtype=float)

    def predict_fn(data, model):
        return model.predict(data)
"""


def _keyed_model(models, tmp_path, key: str) -> Path:
    import shutil

    folder = tmp_path / f"keyed-{key}"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(textwrap.dedent(KEYED_SCRIPT.replace("{key}", key)))
    shutil.copy(models["script-csv"][0] / "model.joblib", folder / "model.joblib")
    return folder


@pytest.mark.slow
def test_a_script_looking_for_a_key_the_worker_cannot_send_is_told_the_layouts_it_can(models, tmp_path):
    inputs = _write(_file_table(), tmp_path / "in")
    result = run_worker(
        inputs,
        tmp_path / "out",
        _keyed_model(models, tmp_path, "features"),
        "--passthrough",
        "id",
        "--features",
        ",".join(TRAINED),
        "--content-type",
        "application/json",
    )
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    [report] = load_manifest(tmp_path / "out")["file_reports"]
    message = report["error_message"]
    # Sent records (a list), the script's ["features"] is a TypeError; sent {"instances": ...}, a KeyError.
    assert "raised in input_fn: TypeError: list indices must be integers" in message, message
    assert "the JSON layouts the worker can send are records" in message and '{"inputs": [[...], ...]}' in message


@pytest.mark.slow
def test_a_script_reading_inputs_gets_them_and_its_routine_logs_are_notes_not_warnings(models, tmp_path):
    inputs = _write(_file_table(), tmp_path / "in")
    model_dir = _keyed_model(models, tmp_path, "inputs")
    args = (
        "--passthrough",
        "id",
        "--features",
        ",".join(TRAINED),
        "--content-type",
        "application/json",
        "--json-layout",
        "inputs",
    )
    preview_json = tmp_path / "preview.json"
    preview = run_worker(
        inputs, tmp_path / "preview", model_dir, *args, "--preview", "5", "--preview-json", str(preview_json)
    )
    assert preview.returncode == EXIT_OK, describe(preview)
    report = json.loads(preview_json.read_text())
    assert report["warnings"] == [], report["warnings"]
    said = [note for note in report["notes"] if note.startswith("the model code said")]
    assert any("got a request of" in note for note in said) and any("parsing the request" in note for note in said)
    assert "no warnings" in preview.stdout
    result = run_worker(inputs, tmp_path / "out", model_dir, *args)
    assert result.returncode == EXIT_OK, describe(result)
    table = _file_table()
    got = pq.read_table(tmp_path / "out" / "part-0.parquet").column("prediction").to_numpy()
    trained = np.column_stack([table.column(name).to_numpy() for name in TRAINED])
    np.testing.assert_allclose(got, models["script-csv"][1](trained))  # the scikit-learn model the script loads
