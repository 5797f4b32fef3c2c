"""What a file fails with: the class the ledger records and the hint that names the setting to change."""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import pytest

from shardline.errors import OutputWriteError, PredictionError, is_permanent_file_failure
from shardline.worker.model.predict import file_failure


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_the_disk_not_the_model_and_names_the_volume_setting(code):
    """A write that failed for want of room read "PredictionError ... while predicting": the model was blamed."""
    full = OSError(code, os.strerror(code), "/opt/ml/processing/output/part-7.parquet.tmp")
    failed = file_failure(full, "part-7.parquet", None, SimpleNamespace(kind="xgboost"))
    assert isinstance(failed, OutputWriteError) and not isinstance(failed, PredictionError)
    assert "disk is full" in str(failed) and "resources.volume_size_gb" in str(failed)
    assert not is_permanent_file_failure(type(failed).__name__)  # a next attempt scores it again


def test_any_other_error_of_the_model_is_a_prediction_error():
    failed = file_failure(ValueError("bad shape"), "part-7.parquet", None, SimpleNamespace(kind="xgboost"))
    assert isinstance(failed, PredictionError) and "ValueError while predicting part-7.parquet" in str(failed)
    other_os = file_failure(OSError(errno.EIO, "I/O error"), "part-7.parquet", None, SimpleNamespace(kind="xgboost"))
    assert isinstance(other_os, PredictionError)
