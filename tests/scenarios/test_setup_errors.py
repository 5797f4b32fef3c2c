"""A model that cannot be set up fails its step at once, in the worker's own words, and is never retried.

Real jobs on the local backend against moto_server: the worker finds its model broken (a digest that is not
the pinned one, a file no library can load), records why on its SHARD item, and exits. The watch's decision
is FAIL on the first attempt with that reason, and `shardline failed` shows it against every file.
"""

from __future__ import annotations

import time

import boto3
import pytest

from shardline.decision.policy import Action
from shardline.oncall.service import OnCall
from shardline.oncall.values import RunRef
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step import watch
from tests.support.pipelines import parquet_bytes, plan_request, stage_step

pytestmark = pytest.mark.slow


@pytest.fixture
def pipeline(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return stage_step(
        "setup_errors",
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {f"part-{i}.parquet": parquet_bytes(200, 200 * i) for i in range(3)},
    )


def _decide_until_not_waiting(spec, attempt, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while True:
        decision = watch.decide_now(spec, attempt)
        if decision.action is not Action.WAIT:
            return decision
        assert time.monotonic() < deadline, f"still waiting (safety deadline): {decision.reason}"
        time.sleep(0.5)


def _break_model(spec, bucket: str, tmp_path, how: str) -> str:
    """Replace the staged model; return the spec with the pin the step now needs."""
    import tarfile

    s3 = boto3.client("s3")
    if how == "another artifact":  # someone overwrote the model: the spec's pin no longer matches it
        s3.put_object(Bucket=bucket, Key="model/model.tar.gz", Body=b"not the pinned model")
        return spec
    # A model.tar.gz that unpacks, is pinned by its digest, and holds a file no library can load.
    from examples import synthetic

    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "model.json").write_text("{ this is not an XGBoost model")
    sha = synthetic.pack(folder, tmp_path / "broken.tar.gz")
    assert tarfile.is_tarfile(tmp_path / "broken.tar.gz")
    s3.upload_file(str(tmp_path / "broken.tar.gz"), bucket, "model/model.tar.gz")
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["model"]["sha256"] = sha
    from shardline.spec import parse_spec

    return parse_spec(data, "setup_errors.yaml")


@pytest.mark.parametrize("how", ["another artifact", "a file no library can load"])
def test_a_model_that_cannot_be_set_up_fails_the_first_attempt_with_the_workers_reason(pipeline, tmp_path, how):
    spec, bucket = pipeline
    spec = _break_model(spec, bucket, tmp_path, how)
    run_id = f"run-{how.split()[1]}"
    # Two instances: each fails the same way, in its own folder, and each file shows its own instance's reason.
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request(run_id, bucket, instances=2))).attempt
    decision = _decide_until_not_waiting(spec, attempt)

    assert decision.action is Action.FAIL, decision  # not RESUBMIT: the same model fails the same way again
    assert "could not start" in decision.reason and "is not retried" in decision.reason, decision.reason
    assert len(decision.failed_files) == 3
    assert {f.error_class for f in decision.failed_files} == {"SetupError"}
    worker_words = decision.failed_files[0].error_message
    assert worker_words and worker_words in decision.reason
    assert f"(model s3://{bucket}/model/model.tar.gz)" in worker_words  # the URI, beside the worker's local path
    print(f"{how}: {decision.reason}")

    step_end.finish(spec, attempt, decision.action.value, decision.reason)
    assert worker_words in step_end.step_message(spec, attempt)
    # Each file shows the reason its own instance gave (every instance fails the same way, in its own folder).
    failed = OnCall({spec.pipeline: spec}).failed(RunRef(spec.pipeline, run_id))
    assert len(failed) == 3 and {f.error_class for f in failed} == {"SetupError"}, failed
    assert all(f.error_message and f.status in ("PENDING", "RUNNING") for f in failed), failed
