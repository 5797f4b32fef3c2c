"""Routes that once ended with exit 0 and wrong numbers: each now ends in a clear refusal or in exact predictions.

Every test runs the real worker (``python -m shardline.worker``) on real files, with scripts written the way
public SageMaker ``inference.py`` examples write them. The input files hold the features in another order than
training (plus ``label`` and ``segment``), as ``test_custom_scripts.py`` lays them out.

- V1: a script's model recorded its feature names, and input.features names the same set in another order.
- V2/V3: a file with a renamed column, and a script that fills a missing JSON key with 0.
- V4: a CSV without a header line, and file_order on JSON lines.
- V5: a predict_fn that returns a DataFrame whose rows were regrouped.
"""

from __future__ import annotations

import json
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest

from shardline.contract import EXIT_OK, EXIT_SETUP_ERROR
from shardline.worker.model.script_runner import RowOrderError, check_row_order
from tests.scenarios import test_custom_scripts as scripts
from tests.scenarios.test_custom_scripts import (
    FEATURES,
    NUMPY_INSTANCES_SCRIPT,
    ULP,
    _builtin_dir,
    _input_frame,
    _model_dir,
    _run,
    _run_ok,
    _target,
    assert_failed,
    check_predictions,
    preview,
)
from tests.support.helpers import describe, load_manifest, read_table, reports_by_input, run_worker

# The module-scoped fixtures (data, models) of test_custom_scripts.py, shared.
inputs, train, classifier, classifier_file, model_root = (
    scripts.inputs,
    scripts.train,
    scripts.classifier,
    scripts.classifier_file,
    scripts.model_root,
)

FILE_ORDER_FEATURES = "tenure,balance,income,age"  # the order the files hold them in: a natural thing to paste


# -- V1: input.features in another order than the model recorded -------------------------------------------------

LOADTXT_SCRIPT = """
    import io
    import os

    import joblib
    import numpy as np


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        return np.loadtxt(io.StringIO(request_body), delimiter=",", ndmin=2)


    def predict_fn(input_data, model):
        return model.predict_proba(input_data)[:, 1]
"""

XGBOOST_SCRIPT = """
    import io
    import os

    import numpy as np
    import xgboost as xgb


    def model_fn(model_dir):
        booster = xgb.Booster()
        booster.load_model(os.path.join(model_dir, "xgboost-model.json"))
        return booster


    def input_fn(request_body, request_content_type):
        return np.loadtxt(io.StringIO(request_body), delimiter=",", ndmin=2)


    def predict_fn(input_data, model):
        # The booster wants its names: give them to the columns as they come.
        return model.predict(xgb.DMatrix(input_data, feature_names=model.feature_names))
"""


@pytest.fixture(scope="module")
def named_booster_file(model_root, train) -> Path:
    """An XGBoost Booster trained on named data: it keeps feature_names in the training order."""
    import xgboost as xgb

    matrix = xgb.DMatrix(train[FEATURES].to_numpy(np.float64), label=_target(train, 8), feature_names=FEATURES)
    booster = xgb.train({"max_depth": 3, "nthread": 1}, matrix, num_boost_round=15)
    path = model_root / "named-booster.json"
    booster.save_model(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, content",
    [
        (LOADTXT_SCRIPT, ()),
        (NUMPY_INSTANCES_SCRIPT, ("--content-type", "application/json", "--json-layout", "instances")),
    ],
    ids=["loadtxt-csv", "json-instances"],
)
def test_script_features_in_another_order_than_the_model_recorded_are_refused(
    inputs, tmp_path, classifier, classifier_file, script, content
):
    model_dir = _model_dir(tmp_path, script, {"model.joblib": classifier_file})
    refused, out = _run(inputs, tmp_path, model_dir, "--features", FILE_ORDER_FEATURES, *content)
    assert refused.returncode == EXIT_SETUP_ERROR, describe(refused)
    assert (
        "input.features: tenure, balance, income, age; the model's recorded order: age, income, balance, tenure"
        in refused.stderr
    ), describe(refused)
    assert not out.exists() or not [p for p in out.rglob("*.parquet")]
    # In the model's order, exact; the scikit-learn warning about a bare array is a WARNING that says what is true
    # (input.features equal to the recorded names: the model's order chose the columns).
    manifest, out, log = _run_ok(inputs, tmp_path / "ordered", model_dir, "--features", ",".join(FEATURES), *content)
    check_predictions(
        inputs, out, manifest, lambda f: {"prediction": classifier.predict_proba(f[FEATURES])[:, 1]}, rtol=ULP
    )
    said = [line for line in log.splitlines() if "does not have valid feature names" in line]
    assert said and all(" WARNING " in line and "in the order the model recorded" in line for line in said), log[-3000:]


@pytest.mark.slow
def test_xgboost_script_that_logs_nothing_is_refused_for_another_order(inputs, tmp_path, named_booster_file):
    import xgboost as xgb

    model_dir = _model_dir(tmp_path, XGBOOST_SCRIPT, {"xgboost-model.json": named_booster_file})
    refused, _ = _run(inputs, tmp_path, model_dir, "--features", FILE_ORDER_FEATURES)
    assert refused.returncode == EXIT_SETUP_ERROR, describe(refused)
    assert "the model's recorded order: age, income, balance, tenure" in refused.stderr, describe(refused)
    # Unset, the recorded names choose the columns by name, in the model's order.
    manifest, out, _ = _run_ok(inputs, tmp_path / "unset", model_dir)
    assert [(f["source"], f["columns"]) for f in manifest["features"]] == [("model", FEATURES)]
    booster = xgb.Booster()
    booster.load_model(named_booster_file)

    def expected(frame):
        matrix = xgb.DMatrix(frame[FEATURES].to_numpy(np.float64), feature_names=FEATURES)
        return {"prediction": booster.predict(matrix)}

    check_predictions(inputs, out, manifest, expected)


# -- V3: a script's own WARNING stays a WARNING ----------------------------------------------------------------------

WARNING_SCRIPT = """
    import json
    import logging
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        frame = pd.DataFrame(json.loads(request_body))
        logging.info("got %d records", len(frame))
        for name in FEATURES:
            if name not in frame:
                logging.warning("Missing feature %s, using default value 0", name)
                frame[name] = 0
        return frame[FEATURES]


    def predict_fn(input_data, model):
        return model.predict_proba(input_data)[:, 1]
"""


@pytest.mark.slow
def test_a_scripts_warning_lines_stay_warnings_in_the_job_log(inputs, tmp_path, classifier_file):
    model_dir = _model_dir(tmp_path, WARNING_SCRIPT, {"model.joblib": classifier_file})
    # The script derives what it lacks (said out loud), and is sent age, income and tenure only.
    manifest, _, log = _run_ok(
        inputs,
        tmp_path,
        model_dir,
        "--content-type",
        "application/json",
        "--features",
        "age,income,tenure",
        "--derives-features",
    )
    warned = [line for line in log.splitlines() if "Missing feature balance" in line]
    assert warned and all(" WARNING " in line and "inference.py said" in line for line in warned), log[-3000:]
    routine = [line for line in log.splitlines() if "got" in line and "records" in line and "said" in line]
    assert routine and all(" INFO " in line for line in routine), log[-3000:]
    assert manifest["failed"] == 0


# -- V4: CSV without a header line; file_order on JSON lines ---------------------------------------------------------


@pytest.fixture(scope="module")
def headerless(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """9,000 rows in three CSV files with no header line: id, then the features in the file's order."""
    root = tmp_path_factory.mktemp("headerless")
    frames = []
    for k in range(3):
        frame = _input_frame(3000, seed=70 + k, first_id=3000 * k)[["id", "tenure", "balance", "income", "age"]]
        frame.to_csv(root / f"part-{k}.csv", header=False, index=False)
        frames.append(frame)
    return root, pd.concat(frames, ignore_index=True)


@pytest.mark.slow
def test_a_csv_without_a_header_line_is_refused_until_its_columns_are_named(headerless, tmp_path, classifier_file):
    root, frame = headerless
    model_dir = _builtin_dir(tmp_path, "model.joblib", classifier_file)
    for extra in ((), ("--features", "file_order")):
        (tmp_path / f"try{len(extra)}").mkdir()
        result, out = _run(root, tmp_path / f"try{len(extra)}", model_dir, *extra)
        assert_failed(result, out, "reads as numbers", "input.csv_header: false")
    named = tmp_path / "named"
    result = run_worker(
        root,
        named,
        model_dir,
        "--input-csv-header",
        "false",
        "--features",
        "id,tenure,balance,income,age",
        "--passthrough",
        "id",
        "--probabilities",
    )
    assert result.returncode == EXIT_OK, describe(result)
    manifest = load_manifest(named)
    assert manifest["rows_out"] == 9000 == len(frame)  # no first line lost
    written = pd.concat(
        [read_table(named / r["output"]).to_pandas() for r in reports_by_input(manifest).values()], ignore_index=True
    )
    got = written.set_index("id").loc[frame["id"]]
    model = joblib.load(classifier_file)
    np.testing.assert_allclose(
        got["proba_True"].to_numpy(), model.predict_proba(frame[FEATURES])[:, 1], rtol=ULP, atol=0
    )


@pytest.mark.slow
def test_a_headerless_csv_with_another_column_count_fails_naming_the_setting(headerless, tmp_path, classifier_file):
    root, _ = headerless
    model_dir = _builtin_dir(tmp_path, "model.joblib", classifier_file)
    result, out = _run(
        root,
        tmp_path,
        model_dir,
        "--input-csv-header",
        "false",
        "--features",
        "id,tenure,balance,income,age,note",
        passthrough="id,note",
    )
    assert_failed(result, out, "input.csv_header is false", "exactly that many fields")


def test_a_header_of_decimals_is_refused_and_one_of_years_passes_or_is_vouched_for(tmp_path):
    from shardline.errors import InputSchemaError
    from shardline.worker.io import formats
    from shardline.worker.io.work_units import discover_inputs

    (tmp_path / "decimals.csv").write_text("A12,0.53,1.5e-3\nB7,0.1,0.2\n")  # a data line with a text id
    (tmp_path / "years.csv").write_text("id,2019,2020\n1,0.1,0.2\n")
    (tmp_path / "numbers.csv").write_text("7,3,5\n1,2,3\n")
    files = {f.relative_path: f for f in discover_inputs(tmp_path)[0]}
    with pytest.raises(InputSchemaError, match=r"reads as numbers \(A12, 0.53, 1.5e-3\)"):
        formats.read_schema(files["decimals.csv"], tmp_path)
    assert formats.read_schema(files["years.csv"], tmp_path).names == ["id", "2019", "2020"]
    with pytest.raises(InputSchemaError, match=r"if these really are its column names, set input\.csv_header: true"):
        formats.read_schema(files["numbers.csv"], tmp_path)
    vouched = {f.relative_path: f for f in discover_inputs(tmp_path, trust_header=True)[0]}
    assert formats.read_schema(vouched["numbers.csv"], tmp_path).names == ["7", "3", "5"]


def test_pandas_default_names_are_a_header_and_other_numbers_are_not(tmp_path):
    from shardline.errors import InputSchemaError
    from shardline.worker.io import formats
    from shardline.worker.io.work_units import discover_inputs

    pd.DataFrame(np.arange(12.0).reshape(4, 3)).to_csv(tmp_path / "named.csv", index=False)  # header 0,1,2
    (tmp_path / "data.csv").write_text("0.5,1.5,2\n3,4,5\n")
    files = {f.relative_path: f for f in discover_inputs(tmp_path)[0]}
    assert formats.read_schema(files["named.csv"], tmp_path).names == ["0", "1", "2"]
    with pytest.raises(InputSchemaError, match=r"first line of data.csv reads as numbers \(0.5, 1.5, 2\)"):
        formats.read_schema(files["data.csv"], tmp_path)
    headerless = {f.relative_path: f for f in discover_inputs(tmp_path, csv_names=("a", "b", "c"))[0]}
    assert formats.read_schema(headerless["data.csv"], tmp_path).names == ["a", "b", "c"]


@pytest.mark.slow
def test_file_order_is_refused_for_json_lines(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    rows = [{"id": i, "b": 1.0 * i, "a": 2.0 * i} for i in range(5)]
    (root / "part-0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    model_dir = _model_dir(
        tmp_path,
        """
        def model_fn(model_dir):
            return None

        def predict_fn(data, model):
            return data[:, 0]
        """,
    )
    result, out = _run(root, tmp_path, model_dir, "--features", "file_order")
    assert_failed(result, out, "JSON lines", "a JSON object has no column order")


# -- V5: a predict_fn that regroups its rows -------------------------------------------------------------------------

REGROUPING_SCRIPT = """
    import json
    import os

    import joblib
    import pandas as pd

    FEATURES = ["age", "income", "balance", "tenure"]


    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))


    def input_fn(request_body, request_content_type):
        return pd.DataFrame(json.loads(request_body))[FEATURES]


    def predict_fn(input_data, model):
        # Score each age band on its own (a per-segment model in real life), then put the bands together.
        parts = []
        for _, group in input_data.groupby(input_data["age"] // 20):
            parts.append(pd.DataFrame({"score": model.predict_proba(group)[:, 1]}, index=group.index))
        return pd.concat(parts){sort}


    def output_fn(prediction, accept):
        return json.dumps(prediction["score"].tolist())
"""


@pytest.mark.slow
def test_a_dataframe_whose_rows_were_regrouped_is_refused_and_sorted_back_is_exact(
    inputs, tmp_path, classifier, classifier_file
):
    model_dir = _model_dir(tmp_path, REGROUPING_SCRIPT.replace("{sort}", ""), {"model.joblib": classifier_file})
    report, text = preview(inputs, tmp_path, model_dir, "--content-type", "application/json")
    assert report["error"] and "not in the request's order" in report["error"], text
    result, out = _run(inputs, tmp_path, model_dir, "--content-type", "application/json")
    assert_failed(result, out, "not in the request's order", ".sort_index()")

    (tmp_path / "fixed").mkdir()
    sorted_back = REGROUPING_SCRIPT.replace("{sort}", ".sort_index()")
    fixed = _model_dir(tmp_path / "fixed", sorted_back, {"model.joblib": classifier_file})
    manifest, out, _ = _run_ok(inputs, tmp_path / "fixed", fixed, "--content-type", "application/json")
    check_predictions(
        inputs, out, manifest, lambda f: {"prediction": classifier.predict_proba(f[FEATURES])[:, 1]}, rtol=ULP
    )


def test_row_order_check_accepts_the_requests_positions_or_the_given_index():
    data = pd.DataFrame({"x": [1.0, 2.0, 3.0]}, index=[10, 11, 12])
    check_row_order(pd.Series([0.1, 0.2, 0.3]), data, "predict_fn")  # positions
    check_row_order(pd.Series([0.1, 0.2, 0.3], index=data.index), data, "predict_fn")  # the index it was given
    check_row_order(np.array([0.1, 0.2, 0.3]), data, "predict_fn")  # not pandas: nothing to check
    check_row_order(pd.Series([0.1, 0.2]), data, "predict_fn")  # another length: the row count refuses it
    with pytest.raises(RowOrderError, match="its index begins 12, 10, 11"):
        check_row_order(pd.Series([0.3, 0.1, 0.2], index=[12, 10, 11]), data, "predict_fn")
    with pytest.raises(RowOrderError, match="begins 2, 0, 1"):
        check_row_order(pd.DataFrame({"p": [1, 2, 3]}, index=[2, 0, 1]), np.zeros((3, 1)), "predict_fn")
    # An index of the script's own (ids it set) says nothing of the order.
    check_row_order(pd.Series([0.1, 0.2, 0.3], index=["c", "a", "b"]), data, "predict_fn")


@pytest.mark.slow
def test_a_headerless_csv_for_a_script_is_named_by_position_and_sent_in_the_models_order(
    headerless, tmp_path, classifier, classifier_file
):
    root, frame = headerless
    model_dir = _model_dir(tmp_path, LOADTXT_SCRIPT, {"model.joblib": classifier_file})
    out = tmp_path / "out"
    args = ("--input-csv-header", "false", "--features", "id,tenure,balance,income,age", "--passthrough", "id")
    result = run_worker(root, out, model_dir, *args)
    assert result.returncode == EXIT_OK, describe(result)
    manifest = load_manifest(out)
    assert [(f["source"], f["columns"]) for f in manifest["features"]] == [("model", FEATURES)]
    written = pd.concat([read_table(out / r["output"]).to_pandas() for r in reports_by_input(manifest).values()])
    got = written.set_index("id").loc[frame["id"], "prediction"].to_numpy()
    np.testing.assert_allclose(got, classifier.predict_proba(frame[FEATURES])[:, 1], rtol=ULP, atol=0)
