"""script_runner.py: a SageMaker-style inference.py imported in this process and called as SageMaker calls it (its
requirements checked, one prediction per record, what the messages name); no subprocess.

The end-to-end runs of real scripts are in test_custom_scripts.py.
"""

from __future__ import annotations

import os
import sys
import textwrap
from importlib import metadata

import pyarrow as pa
import pytest

from shardline.errors import SetupError
from shardline.worker.model.script_codec import JSON, ResponseShapeError, ScriptProtocol
from shardline.worker.model.script_runner import ScriptError, ScriptPredictor, check_requirements, requirements_hint

# -- check_requirements ----------------------------------------------------------------------------------------------


def test_check_requirements(tmp_path):
    script = tmp_path / "code" / "inference.py"
    script.parent.mkdir()
    script.write_text("")
    assert check_requirements(str(script)) == []  # no requirements.txt
    assert requirements_hint(str(script)) == ""
    numpy_version = metadata.version("numpy")
    (script.parent / "requirements.txt").write_text(
        textwrap.dedent("""\
        # pinned when the model was trained
        numpy
        numpy>=1.0  # a comment after a met line
        numpy<1.0
        shardline-no-such-package==1.0

        -r other-requirements.txt
        --extra-index-url https://example.invalid/simple
        pywin32>=300; sys_platform == "win32"
        this is not a requirement
    """)
    )
    assert check_requirements(str(script)) == [
        f"numpy<1.0 (the image has {numpy_version})",
        "shardline-no-such-package==1.0 (not installed)",
        "this is not a requirement (not understood)",
    ]
    assert "requirements.txt is not installed at run time" in requirements_hint(str(script))


# -- ScriptPredictor: a real script, imported in this process --------------------------------------------------------


@pytest.fixture
def script_dir(tmp_path):
    """A model directory for an inference.py imported here; the import's traces are removed afterwards."""
    saved_path, saved_env = list(sys.path), os.environ.get("SM_MODEL_DIR")
    yield tmp_path
    sys.path[:] = saved_path
    sys.modules.pop("inference", None)
    if saved_env is None:
        os.environ.pop("SM_MODEL_DIR", None)


def _predictor(model_dir, source: str, **protocol) -> ScriptPredictor:
    path = model_dir / "code" / "inference.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return ScriptPredictor(str(path), str(model_dir), ScriptProtocol(**protocol), "cpu")


NUMBERS = pa.record_batch({"x": [1.0, 2.0, 3.0, 4.0], "y": [10.0, 20.0, 30.0, 40.0]})

ONE_RECORD_SCRIPT = """
    def model_fn(model_dir):
        return None

    def input_fn(body, content_type):
        x, y = (float(v) for v in body.strip().split(","))
        return x + y

    def predict_fn(data, model):
        return data
"""


def test_a_script_that_handles_one_record_per_call(script_dir):
    predictor = _predictor(script_dir, ONE_RECORD_SCRIPT, batch_strategy="single_record")
    assert predictor.predict(NUMBERS)[0][1].tolist() == [11.0, 22.0, 33.0, 44.0]
    predictor = _predictor(script_dir, ONE_RECORD_SCRIPT)
    with pytest.raises(ScriptError) as info:
        predictor.predict(NUMBERS)
    assert "model.batch_strategy: single_record (--batch-strategy single-record)" in str(info.value)


def test_a_script_that_returns_one_value_too_many_is_not_told_to_use_single_record(script_dir):
    predictor = _predictor(
        script_dir,
        """
        import io
        import numpy as np

        def model_fn(model_dir):
            return None

        def input_fn(body, content_type):
            return np.loadtxt(io.StringIO(body), delimiter=",", ndmin=2)

        def predict_fn(data, model):
            return np.append(data.sum(axis=1), 0.0)
    """,
    )
    with pytest.raises(ResponseShapeError) as info:
        predictor.predict(NUMBERS)
    message = str(info.value)
    assert "5 prediction(s) for 4 record(s)" in message
    assert "model.batch_strategy" not in message  # neither one record per call nor the strategy it has
    assert "one prediction too many" in message


def test_a_script_for_another_content_type_is_named(script_dir):
    predictor = _predictor(
        script_dir,
        """
        import json

        def model_fn(model_dir):
            return None

        def input_fn(body, content_type):
            return [row["x"] * row["y"] for row in json.loads(body)]

        def predict_fn(data, model):
            return data
    """,
    )
    with pytest.raises(ScriptError) as info:
        predictor.predict(NUMBERS)
    assert "model.content_type: application/json (--content-type application/json)" in str(info.value)


def test_handlers_with_context_and_a_tuple_response(script_dir):
    predictor = _predictor(
        script_dir,
        """
        def model_fn(model_dir, context):
            assert context.system_properties["model_dir"] == model_dir
            return 2.0

        def transform_fn(model, body, content_type, accept, context):
            lines = body.strip().splitlines()
            return "\\n".join(str(model * float(line.split(",")[0])) for line in lines), "text/csv"
    """,
        accept=JSON,
    )  # the tuple's content type wins over accept
    assert predictor.predict(NUMBERS)[0][1].tolist() == [2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def predict_fn(data, model):\n    return data\n", "defines no model_fn"),
        (
            "def model_fn(model_dir):\n    return 1\n\ndef transform_fn(m, b, c, a):\n    return b\n\n"
            "def input_fn(b, c):\n    return b\n",
            "defines transform_fn and also input_fn",
        ),
        (
            "def model_fn(model_dir, a, b):\n    return 1\n",
            r"takes 3 argument\(s\); SageMaker passes 1 \(or 2 with context\)",
        ),
        ("import shardline_no_such_module\n", "importing .* failed: ModuleNotFoundError"),
        ("def model_fn(model_dir):\n    raise FileNotFoundError('model.pth')\n", "model_fn in .* failed"),
    ],
)
def test_script_setup_errors(script_dir, source, message):
    with pytest.raises(SetupError, match=message):
        _predictor(script_dir, source)


def test_messages_name_what_the_script_was_really_given_and_what_really_ran(script_dir):
    """No "Sent as: text/csv" for a script without input_fn (its predict_fn gets a matrix, not a body), and no
    "raised in predict_fn" for a script without predict_fn (the toolkit's default, model.predict, ran)."""
    no_input_fn = _predictor(
        script_dir,
        """
        def model_fn(model_dir):
            return None

        def predict_fn(data, model):
            return list(data.sum(axis=1)) + [0.0]  # one value too many, which no other setting fixes
    """,
    )
    with pytest.raises(ResponseShapeError) as info:
        no_input_fn.predict(NUMBERS)
    said = str(info.value)
    assert "Sent as" not in said and "No input_fn: predict_fn got a float64 matrix of the feature columns" in said

    no_predict_fn = _predictor(
        script_dir,
        """
        class Model:
            def predict(self, data):
                raise ValueError("bad input")

        def model_fn(model_dir):
            return Model()
    """,
    )
    with pytest.raises(ScriptError) as info:
        no_predict_fn.predict(NUMBERS)
    said = str(info.value)
    assert "raised in the default predict_fn (model.predict(data)): ValueError: bad input" in said
    assert "raised in predict_fn" not in said
