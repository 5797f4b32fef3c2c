"""A two-step pipeline staged on moto_server for the orchestration modules' own tests, planned with the project's own
planner and never run: ``score`` over ``in/`` writes ``out/``, ``calibrate`` over ``in/`` too writes ``calibrated/``
(its own input prefix, so it plans without score's outputs manifest). The model is packed, never loaded."""

from __future__ import annotations

import pytest

from shardline.spec import parse_spec
from tests.support.pipelines import parquet_bytes, stage_step
from tests.support.scoring import unloaded_model

TWO_STEP_INPUTS = {f"part-{i}.parquet": f"input {i} ".encode() * (10 + i) for i in range(2)}


@pytest.fixture
def two_steps(aws_env, ledger_table, tmp_path, monkeypatch):
    """(spec, bucket) of the two-step pipeline; nothing planned yet."""
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    spec, bucket = stage_step("two_steps", ledger_table, unloaded_model(tmp_path / "model"), tmp_path, TWO_STEP_INPUTS)
    data = spec.model_dump(mode="json", exclude_defaults=True)
    score = data["steps"][0]
    data["steps"].append(
        {
            **score,
            "name": "calibrate",
            "input": {**score["input"], "prefix": f"s3://{bucket}/in/"},
            "output": {"prefix": f"s3://{bucket}/calibrated/"},
        }
    )
    return parse_spec(data, "two_steps.yaml"), bucket


QUOTED_ROWS = 3_000  # a file's, in the `quoted` pipeline


@pytest.fixture
def quoted(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    """(spec, bucket) with three inputs staged: a/ (2 files), b/ (5 files), c/ (3 files)."""
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    inputs = {}
    for folder, files in (("a", 2), ("b", 5), ("c", 3)):
        for i in range(files):
            inputs[f"{folder}/part-{i}.parquet"] = parquet_bytes(QUOTED_ROWS, len(inputs) * QUOTED_ROWS)
    return stage_step("quoted", ledger_table, xgboost_model.parent, tmp_path, inputs)
