"""An unpinned model runs only with a WARNING that names the missing pin; a pinned one runs quietly."""

from __future__ import annotations

import pytest

from examples import synthetic
from shardline.contract import EXIT_OK
from tests.support.helpers import clean_env, describe, run_worker


@pytest.fixture(scope="module")
def one_file(tmp_path_factory):
    return synthetic.make_dataset(tmp_path_factory.mktemp("in"), files=1, rows=200)[0].parent


@pytest.mark.parametrize("pinned", [False, True])
def test_an_unpinned_model_is_named_in_a_warning(one_file, xgboost_model, tmp_path, pinned):
    packed = tmp_path / "packed"
    digest = synthetic.pack(xgboost_model.parent, packed / "model.tar.gz")
    env = clean_env(**({"SHARDLINE_MODEL_SHA256": digest} if pinned else {}))
    result = run_worker(one_file, tmp_path / "out", packed, env=env)
    assert result.returncode == EXIT_OK, describe(result)
    warned = [line for line in result.stderr.splitlines() if "WARNING" in line and "NOT pinned" in line]
    if pinned:
        assert warned == [], describe(result)
    else:
        assert len(warned) == 1 and digest in warned[0] and "model.sha256 or model.versions" in warned[0], describe(
            result
        )
