"""A budget stop and the resubmit after it, in the real `airflow standalone`: a run of the ``budgeted`` pipeline
(tests/conftest.py: a run budget of $8 at a dollar an instance-second, a model that takes 1.5 s a file) passes its
budget part way; its watch stops the job between files and the run ends red, the step's message saying what it spent
and the command to finish. The printed `shardline resubmit ... --budget-usd X` raises the budget and finishes the
unfinished files only: the same DAG run turns green with every row once, and no file scored twice."""

from __future__ import annotations

import collections
import io
import json
import shlex

import pyarrow.parquet as pq
import pytest

from shardline.ledger.keys import StepRef
from shardline.ledger.states import FileStatus
from shardline.orchestration.step.files import latest_attempt, read_step_files
from shardline.report.model import RunReport
from shardline.s3uri import parse_s3_uri
from shardline.spec import load_spec
from tests.conftest import BUDGETED_PIPELINE, BUDGETED_RUN_USD
from tests.orchestration.test_budget import SLOW_SCRIPT
from tests.scenarios.test_admission import _shardline

pytestmark = pytest.mark.slow
BUCKET = "shardline-demo"
FILES, ROWS = 12, 200


def _stage(stack, tmp_path) -> None:
    from examples import synthetic
    from shardline.ledger.table import create_ledger_table
    from tests.support.helpers import write_inference_script

    s3 = stack.s3()
    if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=BUCKET)
    create_ledger_table("shardline-jobs", "us-east-1", stack.env["AWS_ENDPOINT_URL"])
    write_inference_script(tmp_path / "slow", SLOW_SCRIPT)
    synthetic.pack(tmp_path / "slow", tmp_path / "model.tar.gz")
    s3.upload_file(str(tmp_path / "model.tar.gz"), BUCKET, f"models/{BUDGETED_PIPELINE}/model.tar.gz")
    for i in range(FILES):
        buf = io.BytesIO()
        pq.write_table(synthetic.make_table(ROWS, first_id=i * ROWS, n_features=4, seed=i), buf)
        s3.put_object(Bucket=BUCKET, Key=f"{BUDGETED_PIPELINE}/in/part-{i:02d}.parquet", Body=buf.getvalue())


def _report(spec, ref: StepRef, s3) -> RunReport:
    bucket, key = parse_s3_uri(latest_attempt(spec, ref).report_uri("json"))
    return RunReport.from_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_a_run_past_its_budget_stops_red_and_the_printed_resubmit_turns_it_green_every_row_once(
    airflow_stack, tmp_path, monkeypatch
):
    stack, client = airflow_stack, airflow_stack.client()
    stack.use_aws(monkeypatch)
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", stack.env["SHARDLINE_LOCAL_ROOT"])
    _stage(stack, tmp_path)
    spec = load_spec(stack.dags / "pipelines" / f"{BUDGETED_PIPELINE}.yaml")
    run_id, ref = "budget-1", StepRef(BUDGETED_PIPELINE, "budget-1", "score")
    client.trigger(BUDGETED_PIPELINE, {}, run_id=run_id)
    assert stack.wait_for_run(BUDGETED_PIPELINE, run_id)["state"] == "failed", stack.tail()

    status = _shardline(stack, "status", f"{BUDGETED_PIPELINE}/{run_id}", "--json")
    assert status.returncode == 0, status.stderr
    [step] = json.loads(status.stdout)["steps"]
    message = step["message"]
    assert step["status"] == "FAILED" and message.startswith("over budget: the run spent $"), step
    assert f"of its ${BUDGETED_RUN_USD:,.4f} (budget.run_usd), so this step was stopped between files" in message
    command = shlex.split(message.split("`")[1])
    assert command[:6] == ["shardline", "resubmit", f"{BUDGETED_PIPELINE}/{run_id}", "--step", "score", "--budget-usd"]

    first = read_step_files(spec, ref, file_attributes=None).files
    done = {f.input_key for f in first if f.status is FileStatus.SUCCEEDED}
    assert 0 < len(done) < FILES, "the budget stops the run part way"
    # Spent at the stop, as the run's report priced it (each instance from its start to its last heartbeat): no more
    # than one file's worth past the budget (a file holds the instance 1.5 s: $1.50 at a dollar a second).
    file_usd = max(f.seconds for f in first if f.input_key in done) * 3600.0 / 3600
    spent = _report(spec, ref, stack.s3()).cost.total
    assert BUDGETED_RUN_USD < spent <= BUDGETED_RUN_USD + file_usd, (spent, file_usd)

    resubmitted = _shardline(stack, *command[1:])
    assert resubmitted.returncode == 0, resubmitted.stdout + resubmitted.stderr
    stack.assert_succeeds(BUDGETED_PIPELINE, run_id)
    files = read_step_files(spec, ref, file_attributes=None).files
    assert all(f.status is FileStatus.SUCCEEDED for f in files) and len(files) == FILES
    # The files the stop kept were never scored again: their records are still the first attempt's.
    assert {f.input_key for f in files if f.attempt == 1} == done
    s3 = stack.s3()
    ids: collections.Counter = collections.Counter()
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{BUDGETED_PIPELINE}/out/{run_id}/")["Contents"]
    for item in listed:
        if item["Key"].endswith(".parquet") and "/_" not in item["Key"]:
            body = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
            ids.update(pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist())
    assert sorted(ids) == list(range(FILES * ROWS)) and set(ids.values()) == {1}, "every row once"
