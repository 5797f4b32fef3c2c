"""A scheduled pipeline in a real `airflow standalone`: each run scores one whole, finished interval.

A per-minute pipeline stands in for the hourly one (the same timetable and readiness rules, a minute instead
of an hour). Files for minute M land one by one while the scheduler runs; the run for M must not plan
before M has ended plus ``input.settle_seconds``, must score every file, and a file that lands after the plan
must be scored by a later attempt before ``_SUCCESS`` is written. The job is held on a gate (a file the test
creates), so "after the plan, before the job ends" is a fact of the test, not a race.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import time
import uuid

import pyarrow.parquet as pq
import pytest
import yaml

from examples import synthetic
from shardline.ledger.table import create_ledger_table
from tests.orchestration.test_faults import gated_model
from tests.support.pipelines import parquet_bytes

pytestmark = pytest.mark.slow

PIPELINE = "minutely_scoring"
SETTLE = 10
ROWS = 50


def _utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def minutely(airflow_stack, tmp_path, monkeypatch):
    """A per-minute pipeline over a gated model, added to the running Airflow's DAG folder; paused after."""
    env = airflow_stack.env
    airflow_stack.use_aws(monkeypatch)
    s3 = airflow_stack.s3()
    bucket = f"minutely-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    gate = tmp_path / "gate"
    sha = synthetic.pack(gated_model(tmp_path / "model", gate), tmp_path / "model.tar.gz")
    s3.upload_file(str(tmp_path / "model.tar.gz"), bucket, "model/model.tar.gz")
    table = f"shardline-minutely-{uuid.uuid4().hex[:8]}"
    create_ledger_table(table, "us-east-1", env["AWS_ENDPOINT_URL"])
    minute = "{{ data_interval_start.strftime('%Y%m%dT%H%M') }}"
    spec = {
        "pipeline": PIPELINE,
        "schedule": "* * * * *",
        "start_date": "2026-11-01",
        "catchup": False,
        "backend": "local",
        "ledger_table": table,
        "poll_interval_seconds": 1,
        "steps": [
            {
                "name": "score",
                "model": {"uri": f"s3://{bucket}/model/model.tar.gz", "sha256": sha},
                # Minutes with no input (every one but the test's) skip once they are complete.
                "input": {
                    "prefix": f"s3://{bucket}/events/{minute}/",
                    "passthrough": ["id"],
                    "settle_seconds": SETTLE,
                    "when_missing": "skip",
                    "features": synthetic.feature_names(),
                },
                "output": {"prefix": f"s3://{bucket}/scores/{minute}/"},
                "resources": {"instance_count": 1, "workers_per_instance": 1},
                "retry": {"max_attempts": 3, "backoff_seconds": 0},
            }
        ],
    }
    (airflow_stack.dags / "pipelines" / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    dag_file = airflow_stack.dags / f"{PIPELINE}.py"
    dag_file.write_text(
        f"from shardline.airflow.dag_factory import dag_from_spec\n\ndag = dag_from_spec(__file__, '{PIPELINE}.yaml')\n"
    )
    client = airflow_stack.client()
    deadline = time.monotonic() + 120
    while True:
        try:
            client._call("GET", f"/dags/{PIPELINE}")
            break
        except Exception:
            assert time.monotonic() < deadline, f"the DAG never appeared:\n{airflow_stack.tail()}"
            time.sleep(2)
    yield {"s3": s3, "bucket": bucket, "gate": gate}
    gate.touch()  # release any job still held
    client._call("PATCH", f"/dags/{PIPELINE}", json={"is_paused": True})
    dag_file.unlink()


def _run_for(client, start: dt.datetime, timeout: float = 180) -> dict:
    """The scheduled run whose data interval starts at ``start`` (the scheduler creates it once it ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = client._call("GET", f"/dags/{PIPELINE}/dagRuns", params={"limit": 100})["dag_runs"]
        for run in runs:
            if run["run_type"] == "scheduled" and _utc(run["data_interval_start"]) == start:
                return run
        time.sleep(1)
    raise AssertionError(f"no scheduled run for the interval starting {start}")


def _wait_task(stack, run_id: str, task_id: str, states: tuple[str, ...], timeout: float = 240) -> dict:
    client = stack.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ti = client.task_instance(PIPELINE, run_id, task_id)
        if ti.get("state") in states:
            return ti
        assert ti.get("state") not in ("failed", "upstream_failed", "skipped"), (ti, stack.tail())
        time.sleep(1)
    raise AssertionError(f"{task_id} of {run_id} never reached {states}:\n{stack.tail()}")


def test_a_scheduled_run_scores_its_whole_interval_and_a_file_that_lands_after_the_plan(airflow_stack, minutely):
    s3, bucket = minutely["s3"], minutely["bucket"]
    # The interval under test: this minute if most of it is left, else the next. Its files land one by one
    # while the scheduler runs (a file that slips past the minute's end is still before its settle time).
    now = dt.datetime.now(dt.UTC)
    start = now.replace(second=0, microsecond=0)
    if now.second > 35:
        start += dt.timedelta(minutes=1)
        time.sleep(max(0.0, (start - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    prefix = f"events/{start:%Y%m%dT%H%M}/"
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"{prefix}part-{i}.parquet", Body=parquet_bytes(ROWS, i * ROWS))
        time.sleep(2)

    run = _run_for(airflow_stack.client(), start)
    run_id = run["dag_run_id"]
    assert _utc(run["data_interval_end"]) == start + dt.timedelta(minutes=1)
    # The run starts once its minute has ended, and plans only SETTLE seconds later.
    plan = _wait_task(airflow_stack, run_id, "plan_score", ("success",))
    complete = start + dt.timedelta(minutes=1, seconds=SETTLE)
    assert _utc(plan["end_date"]) >= complete, (plan["end_date"], complete)
    attempt = airflow_stack.client()._call(
        "GET", f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/plan_score/xcomEntries/return_value"
    )["value"]
    assert attempt["files"] == 3, attempt  # every file of the minute, not the first to land

    # A file lands after the plan, while attempt 1's job is held on the gate: it is scored by attempt 2.
    s3.put_object(Bucket=bucket, Key=f"{prefix}part-late.parquet", Body=parquet_bytes(ROWS, 3 * ROWS))
    minutely["gate"].touch()
    assert airflow_stack.wait_for_run(PIPELINE, run_id, timeout=300)["state"] == "success", airflow_stack.tail()

    ids = []
    out = f"scores/{start:%Y%m%dT%H%M}/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=out).get("Contents", [])]
    for key in keys:
        if key.endswith(".parquet") and "/_" not in key:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            ids += pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(4 * ROWS))  # every row of every file, once
    marker = json.loads(s3.get_object(Bucket=bucket, Key=f"{out}_SUCCESS")["Body"].read())
    assert marker["outputs"] == 4 and marker["attempts"] == 2, marker
