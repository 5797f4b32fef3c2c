"""The staged step the step functions' tests share: four parquet files on moto_server, an XGBoost model."""

from __future__ import annotations

import pytest

from tests.support.pipelines import parquet_bytes, stage_step


@pytest.fixture
def pipeline(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return stage_step(
        "steps_test",
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {f"part-{i}.parquet": parquet_bytes(300, i * 300) for i in range(4)},
    )
