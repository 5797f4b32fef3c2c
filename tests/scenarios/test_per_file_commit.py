"""Per-file durability and the step's last look, in a real `airflow standalone`.

1. An instance killed mid-job (SIGKILL, as a lost machine) keeps every file it finished: each output went to S3
   before its FILE item was marked SUCCEEDED, so attempt 2 scores exactly the unfinished files, and the run ends
   green with every row once.
2. A file that lands while the step's end is looking at its outputs, after the watch found no late input, is
   not covered by a ``_SUCCESS``: the step's last look sends it to attempt 2, and the run ends green with a
   ``_SUCCESS`` that counts it. "While the step's end looks" is a fact of the test, not a race: the orchestrator's
   S3 calls go through a proxy (its Airflow connection's S3 endpoint) that puts the late file in place at the
   moment the step's end lists its output prefix (only the step's end lists it), before that request goes on.

The module runs in the suite's shared `airflow standalone`, whose S3 endpoint is that proxy
(``AWS_ENDPOINT_URL_S3``, a session fixture of tests/conftest.py); its hook is set only while a test here needs it.
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid

import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from examples import synthetic
from shardline.ledger.states import FileStatus
from shardline.ledger.table import create_ledger_table
from shardline.planning import naming
from shardline.spec import load_spec
from tests.scenarios.test_faults import file_items, stalling_until, summing_model
from tests.support.pipelines import parquet_bytes

pytestmark = pytest.mark.slow

ROWS = 200
RUN_TIMEOUT = 420


@pytest.fixture(scope="module")
def proxied(airflow_stack, airflow_s3_proxy):
    """(the suite's `airflow standalone`, the proxy its S3 calls go through): the proxy forwards everything to the
    session's moto_server, and calls its ``before_forwarding`` hook, when a test sets one, with each request
    first."""
    return airflow_stack, airflow_s3_proxy


@pytest.fixture
def pipeline(proxied, tmp_path, monkeypatch):
    """``make(name, model_dir, files, **step)``: a manual pipeline over ``files`` parquet inputs and the packed
    model, added to the module's Airflow; returns (spec, bucket). Paused and removed after."""
    stack, proxy = proxied
    stack.use_aws(monkeypatch)
    s3, client, made = stack.s3(), stack.client(), []

    def make(name: str, model_dir, files: int, **step_settings):
        bucket = f"{name.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        for i in range(files):
            s3.put_object(Bucket=bucket, Key=f"in/part-{i:02d}.parquet", Body=parquet_bytes(ROWS, i * ROWS))
        sha = synthetic.pack(model_dir, tmp_path / f"{name}.tar.gz")
        s3.upload_file(str(tmp_path / f"{name}.tar.gz"), bucket, "model/model.tar.gz")
        table = f"shardline-{name.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
        create_ledger_table(table, "us-east-1", stack.env["AWS_ENDPOINT_URL"])
        step = {
            "name": "score",
            "model": {"uri": f"s3://{bucket}/model/model.tar.gz", "sha256": sha},
            "input": {"prefix": f"s3://{bucket}/in/", "passthrough": ["id"], "features": synthetic.feature_names()},
            "output": {"prefix": f"s3://{bucket}/out/"},
            "resources": {"instance_count": 1, "workers_per_instance": 1},
            "retry": {"max_attempts": 3, "backoff_seconds": 0},
        }
        for key, value in step_settings.items():
            step[key] = {**step[key], **value} if isinstance(value, dict) else value
        data = {
            "pipeline": name,
            "backend": "local",
            "ledger_table": table,
            "poll_interval_seconds": 1,
            "steps": [step],
        }
        spec_path = stack.dags / "pipelines" / f"{name}.yaml"
        spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
        dag_file = stack.dags / f"{name}.py"
        dag_file.write_text(
            f"from shardline.airflow.dag_factory import dag_from_spec\n\ndag = dag_from_spec(__file__, '{name}.yaml')\n"
        )
        made.append((name, dag_file))
        stack.wait_for_dag(name)
        return load_spec(spec_path), bucket

    yield make
    proxy.before_forwarding = None
    for name, dag_file in made:
        client._call("PATCH", f"/dags/{name}", json={"is_paused": True})
        dag_file.unlink()


def _output_ids(s3, bucket: str) -> list[int]:
    ids = []
    for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", []):
        if o["Key"].endswith(".parquet") and "/_" not in o["Key"]:
            body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            ids += pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist()
    return sorted(ids)


def _task_log(stack, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
    return str(
        stack.client()._call(
            "GET",
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
        )
    )


def test_a_killed_instances_finished_files_are_not_scored_again(proxied, pipeline, tmp_path):
    """Two instances of four files each finish two files, then wait; one is killed whole. The backend says it died:
    attempt 2 takes exactly its two unfinished files at once, while the other instance goes on with its own two in
    attempt 1; never the four finished ones. The run ends green with each of the 1,600 rows once."""
    stack = proxied[0]
    name = "lost_instance"
    gate = tmp_path / "gate"
    spec, bucket = pipeline(
        name,
        stalling_until(tmp_path / "model", 2, gate),
        8,
        resources={"instance_count": 2},
        heartbeat_timeout_seconds=30,
    )
    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    stack.client().trigger(name, {}, run_id=run_id)
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        files = file_items(spec, run_id)
        if sum(f.status == FileStatus.SUCCEEDED for f in files) >= 4:
            break
        assert time.monotonic() < deadline, (files, stack.tail())
        time.sleep(0.5)
    finished = {f.input_key for f in files if f.status == FileStatus.SUCCEEDED}
    assert len(finished) == 4, files  # each worker hangs on its third file

    job = naming.job_name(name, run_id, "score", 1)
    instance_dir = str(stack.home / "shardline-local" / "jobs" / job / "algo-2")
    lost = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "shardline.worker" in (p.info["cmdline"] or []) and any(instance_dir in a for a in p.info["cmdline"])
    ]
    assert lost, f"no worker process of {instance_dir}"
    for proc in lost:
        for victim in [proc, *proc.children(recursive=True)]:
            victim.kill()
    while not any(f.attempt == 2 for f in file_items(spec, run_id)):  # the watch starts attempt 2 beside the job
        assert time.monotonic() < deadline, (file_items(spec, run_id), stack.tail())
        time.sleep(0.5)
    gate.touch()  # the instance that lives goes on with its own files

    run = stack.wait_for_run(name, run_id, timeout=RUN_TIMEOUT)
    assert run["state"] == "success", stack.tail()
    by_attempt = {f.input_key: f.attempt for f in file_items(spec, run_id)}
    assert {k: a for k, a in by_attempt.items() if k in finished} == dict.fromkeys(finished, 1)  # never redone
    retried = {k for k, a in by_attempt.items() if a == 2}
    assert len(retried) == 2 and not retried & finished, by_attempt  # the lost instance's two unfinished files
    assert sum(a == 1 for a in by_attempt.values()) == 6, by_attempt  # the other instance's went on in attempt 1
    log = _task_log(stack, name, run_id, "watch_score", 1)
    assert "algo-2 died (exited with code -9) while the job went on" in log, log[-3000:]
    s3 = stack.s3()
    assert _output_ids(s3, bucket) == list(range(8 * ROWS))  # every row once
    marker = json.loads(s3.get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert (marker["outputs"], marker["attempts"]) == (8, 2)


# The moments a late file lands at, each the first request of its kind to the test's bucket: while the step's end
# lists its output prefix (after the watch's look at the inputs), and while it writes _SUCCESS (after the end's
# last look at the inputs: the look after the marker is the fence).
LANDING_MOMENTS = {
    "at_the_ends_listing": lambda chunk, bucket: (
        b"list-type=2" in chunk and b"prefix=out%2F" in chunk and f"/{bucket}?".encode() in chunk
    ),
    "at_the_success_marker": lambda chunk, bucket: f"PUT /{bucket}/out/_SUCCESS ".encode() in chunk,
}


@pytest.mark.parametrize("moment", sorted(LANDING_MOMENTS))
def test_a_file_that_lands_at_the_steps_last_look_is_scored_by_a_next_attempt_and_the_run_ends_green(
    proxied, pipeline, tmp_path, moment
):
    stack, proxy = proxied
    name = {"at_the_ends_listing": "last_look_listing", "at_the_success_marker": "last_look_marker"}[moment]
    spec, bucket = pipeline(name, summing_model(tmp_path / "model", "pass"), 4)
    direct = stack.s3()  # straight to moto_server, not through the proxy
    landed: list[str] = []
    lock = threading.Lock()
    lands_now = LANDING_MOMENTS[moment]

    def land(chunk: bytes) -> None:
        # The late file lands just before that request reaches the endpoint, so the looks at the inputs before it
        # could not have seen it.
        if not lands_now(chunk, bucket):
            return
        with lock:
            if not landed:
                direct.put_object(Bucket=bucket, Key="in/part-late.parquet", Body=parquet_bytes(ROWS, 4 * ROWS))
                landed.append("in/part-late.parquet")

    proxy.before_forwarding = land
    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    stack.client().trigger(name, {}, run_id=run_id)
    run = stack.wait_for_run(name, run_id, timeout=RUN_TIMEOUT)
    assert landed == ["in/part-late.parquet"], f"the step's end never made the request {moment} names"
    assert run["state"] == "success", stack.tail()
    log = _task_log(stack, name, run_id, "watch_score", 1)
    assert "its last look before _SUCCESS found that 1 input(s) landed or changed after planning" in log, log[-3000:]
    if moment == "at_the_success_marker":  # attempt 1's marker was written, and withdrawn at the look after it
        assert "withdrew s3://" in log and "(attempt 1 wrote it)" in log, log[-3000:]
    by_attempt = {f.input_key.rsplit("/", 1)[1]: f.attempt for f in file_items(spec, run_id)}
    assert by_attempt == {**{f"part-{i:02d}.parquet": 1 for i in range(4)}, "part-late.parquet": 2}
    marker = json.loads(direct.get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert (marker["outputs"], marker["rows_out"], marker["attempts"]) == (5, 5 * ROWS, 2)
    assert _output_ids(direct, bucket) == list(range(5 * ROWS))
