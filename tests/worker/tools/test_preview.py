"""``python -m shardline.worker --preview``'s report (``shardline.worker.tools.preview``): a custom inference.py run on
the first rows of a file in this process, and what the report warns about (constant predictions, ignored columns,
what the script said, a file that would fail). The on-call command that runs it is in tests/oncall/test_preview.py."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from shardline.worker.io.work_units import InputFile
from shardline.worker.model.loading import ModelArtifact, load_predictor
from shardline.worker.model.script_codec import ScriptProtocol
from shardline.worker.pool.process import JobSettings
from shardline.worker.tools.preview import preview_file, render

USES_BOTH = """
    import numpy as np

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        data = np.atleast_2d(data)  # one record per call (single_record) comes as one row
        return data[:, 0] * 10 + data[:, 1]
"""

IGNORES_ALL = """
    import sys

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        print("scoring with the default weights", file=sys.stderr)
        return data[:, 0] * 0 + 0.5
"""


@pytest.fixture
def model_dir(tmp_path):
    """A model folder for an inference.py imported here; the import's traces are removed afterwards."""
    saved_path, saved_env = list(sys.path), os.environ.get("SM_MODEL_DIR")
    yield tmp_path / "model"
    sys.path[:] = saved_path
    sys.modules.pop("inference", None)
    if saved_env is None:
        os.environ.pop("SM_MODEL_DIR", None)


def _preview(model_dir, tmp_path, source: str, csv: str):
    script = model_dir / "code" / "inference.py"
    script.parent.mkdir(parents=True)
    script.write_text(textwrap.dedent(source))
    artifact = ModelArtifact("custom", str(script), str(model_dir), "ab" * 32)
    protocol = ScriptProtocol()
    predictor = load_predictor(artifact, threads=1, device="cpu", probabilities=False, protocol=protocol)
    (tmp_path / "scratch").mkdir()
    settings = JobSettings(
        artifact=artifact,
        output_dir=str(tmp_path / "out"),
        scratch_dir=str(tmp_path / "scratch"),
        features=("f0", "f1"),
        passthrough=("id",),
        batch_rows=3,
        gpu_batch_rows=3,
        output_format="same",
        probabilities=False,
        protocol=protocol,
        allow_nan_predictions=True,
    )
    path = tmp_path / "a.csv"
    path.write_text(csv)
    report = preview_file(
        InputFile("a.csv", str(path), "csv", False, path.stat().st_size), predictor, settings, 3, allow_nan=False
    )
    report.model = {"kind": artifact.kind, "sha256": artifact.sha256}
    return report


ROWS = "id,f0,f1,extra\n1,1.0,2.0,x\n2,3.0,4.0,y\n3,5.0,6.0,z\n4,7.0,8.0,w\n"


def test_the_sample_is_predicted_and_shown_with_its_summary_and_no_warning(model_dir, tmp_path):
    report = _preview(model_dir, tmp_path, USES_BOTH, ROWS)
    assert (report.rows, report.columns, report.error) == (3, ["id", "f0", "f1", "prediction"], None)
    assert report.table == [[1, 1.0, 2.0, 12.0], [2, 3.0, 4.0, 34.0], [3, 5.0, 6.0, 56.0]]  # the first 3 rows only
    assert report.summary == [
        {"column": "prediction", "rows": 3, "nans": 0, "distinct": 3, "min": 12.0, "mean": 34.0, "max": 56.0}
    ]
    assert report.warnings == []
    assert "columns the model does not get (dropped): extra" in report.notes
    assert "single-record and multi-record calls agree on all 3 rows" in report.notes
    text = render(report)
    assert text.startswith("preview of a.csv: 3 row(s), model custom (sha256 abababababab)\n")
    assert "  prediction: rows 3, NaN 0, distinct 3, min 12, mean 34, max 56\n" in text
    assert text.endswith("no warnings\n")


def test_constant_predictions_ignored_columns_and_what_the_script_said_are_warned_about(model_dir, tmp_path):
    report = _preview(model_dir, tmp_path, IGNORES_ALL, ROWS)
    assert report.warnings[0].startswith("prediction is the same for all 3 rows of the sample")
    assert "the model code said: scoring with the default weights" in report.warnings[1]
    assert report.warnings[2].startswith("no feature column changes any prediction")
    assert "WARNING: prediction is the same for all 3 rows" in render(report)


def test_a_file_the_job_would_fail_is_reported_with_the_reason(model_dir, tmp_path):
    report = _preview(model_dir, tmp_path, USES_BOTH, "id,f0\n1,1.0\n")  # no f1
    assert report.error is not None and "f1" in report.error and report.table == []
    assert "FAILS: " in render(report) and not render(report).endswith("no warnings\n")


def test_a_file_with_no_rows_is_a_note_not_a_failure(model_dir, tmp_path):
    report = _preview(model_dir, tmp_path, USES_BOTH, "id,f0,f1\n")
    assert (report.rows, report.error) == (0, None)
    assert report.notes == ["a.csv has no rows: the job writes an empty output for it"]
