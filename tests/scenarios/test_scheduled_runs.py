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
from collections import Counter

import pyarrow.parquet as pq
import pytest
import yaml

from examples import synthetic
from shardline.ledger.table import create_ledger_table
from shardline.planning import naming
from tests.scenarios.test_faults import gated_model, summing_model
from tests.scenarios.test_oncall_airflow import shardline
from tests.support.pipelines import parquet_bytes

pytestmark = pytest.mark.slow

PIPELINE = "minutely_scoring"
DOWNSTREAM = "minutely_downstream"
SETTLE = 10
DEADLINE = 30  # seconds past a minute's end by which its run must have succeeded
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
    s3.upload_file(str(tmp_path / "model.tar.gz"), bucket, "model/v1/model.tar.gz")
    # Version v2 (a manual run's conf can choose it) predicts twice what v1 does: whose outputs these are shows.
    sha2 = synthetic.pack(summing_model(tmp_path / "model-v2", "data = data * 2"), tmp_path / "model-v2.tar.gz")
    s3.upload_file(str(tmp_path / "model-v2.tar.gz"), bucket, "model/v2/model.tar.gz")
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
        # A run not green DEADLINE seconds after its minute is reported, and notify (a module of the DAG folder)
        # writes each report down; the report's Asset event carries the minute as its partition key.
        "deadline": {"after": f"{DEADLINE}s", "notify": "minutely_notify.record"},
        "partitioned_asset": True,
        "steps": [
            {
                "name": "score",
                "model": {
                    "uri": f"s3://{bucket}/model/{{{{ params.model_version }}}}/model.tar.gz",
                    "version": "v1",
                    "versions": {"v1": sha, "v2": sha2},
                },
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
    notified = tmp_path / "notified.jsonl"
    notify_file = airflow_stack.dags / "minutely_notify.py"
    notify_file.write_text(NOTIFY_MODULE.format(path=str(notified)))
    downstream_file = airflow_stack.dags / f"{DOWNSTREAM}.py"
    downstream_file.write_text(DOWNSTREAM_DAG.format(dag_id=DOWNSTREAM, asset=f"s3://{bucket}/scores/"))
    dag_file = airflow_stack.dags / f"{PIPELINE}.py"
    dag_file.write_text(
        f"from shardline.airflow.dag_factory import dag_from_spec\n\ndag = dag_from_spec(__file__, '{PIPELINE}.yaml')\n"
    )
    client = airflow_stack.client()
    for dag_id in (DOWNSTREAM, PIPELINE):
        airflow_stack.wait_for_dag(dag_id)
    yield {"s3": s3, "bucket": bucket, "gate": gate, "notified": notified}
    gate.touch()  # release any job still held
    for dag_id in (PIPELINE, DOWNSTREAM):
        client._call("PATCH", f"/dags/{dag_id}", json={"is_paused": True})
    for path in (dag_file, downstream_file, notify_file):
        path.unlink()


# What deadline.notify calls: one JSON line per missed deadline.
NOTIFY_MODULE = """import json


def record(missed):
    with open({path!r}, "a") as out:
        out.write(json.dumps({{"run_id": missed.run_id, "state": missed.state, "message": missed.message}}) + "\\n")
"""

# A downstream DAG as Airflow 3.2+ users write one: a run per partition of the pipeline's asset.
DOWNSTREAM_DAG = """import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, IdentityMapper, PartitionedAssetTimetable

with DAG(
    {dag_id!r},
    schedule=PartitionedAssetTimetable(assets=Asset({asset!r}), default_partition_mapper=IdentityMapper()),
    start_date=datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc),
    catchup=False,
):
    EmptyOperator(task_id="use_the_scores")
"""


def _notified(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _run_for(client, start: dt.datetime, timeout: float = 180, run_types=("scheduled",)) -> dict:
    """The scheduled run (or a run of ``run_types``) whose data interval starts at ``start`` (the scheduler creates
    a scheduled one once the interval ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = client._call("GET", f"/dags/{PIPELINE}/dagRuns", params={"limit": 100})["dag_runs"]
        for run in runs:
            if run["run_type"] in run_types and _utc(run["data_interval_start"]) == start:
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


def _ids(s3, bucket: str, out: str) -> list[int]:
    """Every id in the outputs under ``out`` (metadata files left out), sorted."""
    ids = []
    for o in s3.list_objects_v2(Bucket=bucket, Prefix=out).get("Contents", []):
        if o["Key"].endswith(".parquet") and "/_" not in o["Key"]:
            body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            ids += pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist()
    return sorted(ids)


def _cli_until(stack, args: tuple[str, ...], text: str, timeout: float = 240, **env: str) -> str:
    """A `shardline` command (in a wide terminal: `runs` shortens messages to the width), asked again until its
    output shows ``text``."""
    deadline = time.monotonic() + timeout
    while True:
        said = shardline(stack, *args, env={"COLUMNS": "400", **env})
        if text in said.stdout:
            return said.stdout
        assert time.monotonic() < deadline, (
            f"`shardline {' '.join(args)}` never showed {text!r}:\n{said.stdout}{said.stderr}"
        )
        time.sleep(2)


def _predictions_are(s3, bucket: str, inputs: str, outputs: str, factor: float) -> bool:
    """Whether every output row's prediction is ``factor`` times its input row's feature sum (the test models)."""
    features = synthetic.feature_names()
    sums: dict[int, float] = {}
    for o in s3.list_objects_v2(Bucket=bucket, Prefix=inputs)["Contents"]:
        table = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()))
        rows = table.select(["id", *features]).to_pylist()
        sums.update({r["id"]: sum(r[f] for f in features) for r in rows})
    predicted = {}
    for o in s3.list_objects_v2(Bucket=bucket, Prefix=outputs)["Contents"]:
        if o["Key"].endswith(".parquet") and "/_" not in o["Key"]:
            table = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()))
            predicted.update(zip(table.column("id").to_pylist(), table.column("prediction").to_pylist(), strict=True))
    return predicted.keys() == sums.keys() and all(
        abs(predicted[i] - factor * sums[i]) <= 1e-3 * max(1.0, abs(sums[i])) for i in sums
    )


def _json(s3, bucket: str, key: str) -> dict:
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_every_interval_is_scored_whole_once_by_one_run_at_a_time_and_none_is_skipped(airflow_stack, minutely):
    """One timeline of a per-minute schedule, minute S first:

    1. The scheduled run of S plans only once S has ended and settled, and scores every file of it; a file that
       lands after the plan, and one replaced under its key, go to attempt 2 before ``_SUCCESS``.
    2. A second run of S with another model version, triggered the way the docs warn against (a round logical date,
       S+1, with Airflow's own inference), waits while the scheduled run holds S's output prefix, saying so in
       `shardline status`; it plans once that run has ended, each run's manifest lists only its own objects, and
       the partition's outputs and ``_SUCCESS`` are then the second run's.
    3. Its logical date stops the scheduler from creating S+1's run: `shardline runs` lists S+1 MISSING with the
       command that scores it; that command (the docs' way, once the blocking run is deleted) scores S+1, and the
       scheduler still creates and scores S+2's run.
    4. The spec's deadline (DEADLINE seconds): S's run, held on its gate until then, is reported once by the
       Deadline Alert's callback, and every run Airflow holds as late is reported once, no other.
    5. With ``partitioned_asset``, a downstream DAG on a PartitionedAssetTimetable runs once per scored minute.
    """
    s3, bucket, client = minutely["s3"], minutely["bucket"], airflow_stack.client()
    # The interval under test: this minute if most of it is left, else the next. Its files land one by one
    # while the scheduler runs (a file that slips past the minute's end is still before its settle time).
    now = dt.datetime.now(dt.UTC)
    start = now.replace(second=0, microsecond=0)
    if now.second > 35:
        start += dt.timedelta(minutes=1)
        time.sleep(max(0.0, (start - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    minute = [start + dt.timedelta(minutes=i) for i in range(3)]
    prefix = [f"events/{m:%Y%m%dT%H%M}/" for m in minute]
    out = [f"scores/{m:%Y%m%dT%H%M}/" for m in minute]
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"{prefix[0]}part-{i}.parquet", Body=parquet_bytes(ROWS, i * ROWS))
        time.sleep(2)
    s3.put_object(Bucket=bucket, Key=f"{prefix[1]}part-0.parquet", Body=parquet_bytes(ROWS, 1000))
    s3.put_object(Bucket=bucket, Key=f"{prefix[2]}part-0.parquet", Body=parquet_bytes(ROWS, 2000))

    # 1. The scheduled run of S.
    run = _run_for(client, start)
    run_id = run["dag_run_id"]
    assert _utc(run["data_interval_end"]) == start + dt.timedelta(minutes=1)
    # The run starts once its minute has ended, and plans only SETTLE seconds later.
    plan = _wait_task(airflow_stack, run_id, "plan_score", ("success",))
    complete = start + dt.timedelta(minutes=1, seconds=SETTLE)
    assert _utc(plan["end_date"]) >= complete, (plan["end_date"], complete)
    attempt = client._call(
        "GET", f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/plan_score/xcomEntries/return_value"
    )["value"]
    assert attempt["files"] == 3, attempt  # every file of the minute, not the first to land

    # 2. A second run of S while the first's job is held on the gate: it waits for the output prefix.
    second = client.trigger(PIPELINE, {"model_version": "v2"}, logical_date=minute[1].isoformat())
    second_id = second["dag_run_id"]
    assert _utc(second["data_interval_start"]) == start, second  # Airflow's inference: the minute before
    held = f"scores/{start:%Y%m%dT%H%M}/ is being written by run {PIPELINE}/{run_id}"
    _cli_until(airflow_stack, ("status", f"{PIPELINE}/{second_id}"), held)
    assert client.task_instance(PIPELINE, second_id, "plan_score")["state"] == "deferred"

    # While attempt 1's job is held on the gate, a file lands after the plan and another is replaced under its key
    # (other rows): attempt 2 scores both before _SUCCESS.
    s3.put_object(Bucket=bucket, Key=f"{prefix[0]}part-late.parquet", Body=parquet_bytes(ROWS, 3 * ROWS))
    s3.put_object(Bucket=bucket, Key=f"{prefix[0]}part-1.parquet", Body=parquet_bytes(ROWS, 5000))
    # Held on the gate, S's run is past its deadline: the alert fires (once: checked at the end).
    _wait_for(lambda: run_id in {n["run_id"] for n in _notified(minutely["notified"])}, "S's alert", airflow_stack)
    minutely["gate"].touch()
    airflow_stack.assert_succeeds(PIPELINE, run_id, 300)
    manifest = naming.outputs_manifest_key(f"s3://{bucket}/{out[0]}", run_id, "score")
    first_outputs = _json(s3, bucket, manifest.removeprefix(f"s3://{bucket}/"))
    by_attempt = {o["input"].rsplit("/", 1)[1]: o["attempt"] for o in first_outputs["outputs"]}
    assert by_attempt == {"part-0.parquet": 1, "part-1.parquet": 2, "part-2.parquet": 1, "part-late.parquet": 2}
    airflow_stack.assert_succeeds(PIPELINE, second_id, 300)
    second_plan = client.task_instance(PIPELINE, second_id, "plan_score")
    first_end = client.dag_run(PIPELINE, run_id)["end_date"]
    assert _utc(second_plan["end_date"]) >= _utc(first_end)  # it planned only once the first run had ended
    scored = [*range(ROWS), *range(5000, 5000 + ROWS), *range(2 * ROWS, 4 * ROWS)]
    assert _ids(s3, bucket, out[0]) == sorted(scored)  # every row of every file as it is now, once
    marker = _json(s3, bucket, f"{out[0]}_SUCCESS")
    assert (marker["run_id"], marker["outputs"], marker["attempts"]) == (second_id, 4, 1), marker
    # Each run's manifest lists its own objects (another model: other bytes), and S3 holds the second's, whose
    # predictions are v2's: twice each row's feature sum.
    manifest = naming.outputs_manifest_key(f"s3://{bucket}/{out[0]}", second_id, "score")
    second_outputs = _json(s3, bucket, manifest.removeprefix(f"s3://{bucket}/"))
    first_sha = {o["output"]: o["sha256"] for o in first_outputs["outputs"]}
    second_sha = {o["output"]: o["sha256"] for o in second_outputs["outputs"]}
    assert first_sha.keys() == second_sha.keys() and all(first_sha[k] != second_sha[k] for k in first_sha)
    for key, sha256 in second_sha.items():
        head = s3.head_object(Bucket=bucket, Key=key.removeprefix(f"s3://{bucket}/"))
        assert head["Metadata"]["sha256"] == sha256
    assert _predictions_are(s3, bucket, prefix[0], out[0], factor=2.0)

    # 3. S+1 has no run (the second run took its logical date): listed MISSING, with the command that scores it.
    command = f"shardline trigger {PIPELINE} --partition {minute[1]:%Y-%m-%dT%H:%M}"
    runs = ("runs", "--pipeline", PIPELINE)
    listed = _cli_until(airflow_stack, runs, "MISSING", timeout=180, SHARDLINE_MISSING_GRACE_SECONDS="15")
    assert command in listed, listed
    said = shardline(airflow_stack, *command.split()[1:])
    # Refused, naming the run in the way (no placeholder) and the command that moves it to its own interval's start.
    refused = said.stdout + said.stderr
    assert said.returncode != 0 and f"{PIPELINE}/{second_id}, a manual run of the interval before" in refused, said
    assert f"`shardline rerun {PIPELINE}/{second_id} --conf '" in refused, said
    client.delete_run(PIPELINE, second_id)
    said = shardline(airflow_stack, *command.split()[1:])
    # Refused only where the scheduler, free of the blocking run, created S+1's own run first: one run scores S+1.
    assert said.returncode == 0 or "has the logical date" in said.stdout + said.stderr, said
    third = _run_for(client, minute[1], run_types=("manual", "scheduled"))
    airflow_stack.assert_succeeds(PIPELINE, third["dag_run_id"], 300)
    assert _ids(s3, bucket, out[1]) == list(range(1000, 1000 + ROWS))
    # The docs' way takes S+1's own logical date, so the scheduler creates S+2's run, and it scores its minute.
    after = _run_for(client, minute[2], timeout=240)
    airflow_stack.assert_succeeds(PIPELINE, after["dag_run_id"], 300)
    assert _ids(s3, bucket, out[2]) == list(range(2000, 2000 + ROWS))
    assert "MISSING" not in shardline(airflow_stack, *runs, env={"SHARDLINE_MISSING_GRACE_SECONDS": "15"}).stdout

    # 4. Deadlines: S's run, held past its deadline, was reported once, naming its partition, its state and the
    # on-call command, and `shardline runs` marks it. Every run Airflow holds as late was reported once, and no other
    # (Airflow drops the deadline of a run that succeeded in time). The second run of S was deleted, deadline and all.
    def reported_as_airflow_holds() -> bool:
        counts = Counter(n["run_id"] for n in _notified(minutely["notified"]))
        counts.pop(second_id, None)
        missed = {r for r, d in airflow_stack.deadlines(PIPELINE).items() if d["missed"]}
        return set(counts) == missed and set(counts.values()) == {1}

    _wait_for(reported_as_airflow_holds, "a report for each deadline Airflow holds as missed", airflow_stack)
    # A scheduled run's partition is due at its interval's end: S's deadline is DEADLINE seconds past it.
    held = airflow_stack.deadlines(PIPELINE, run_id)[run_id]
    assert held["missed"] and _utc(held["deadline_time"]) == start + dt.timedelta(minutes=1, seconds=DEADLINE), held
    first = [n for n in _notified(minutely["notified"]) if n["run_id"] == run_id]
    assert len(first) == 1 and first[0]["state"] == "running", first
    assert f"partition {start:%Y-%m-%dT%H:%M:%S}" in first[0]["message"], first
    assert f"shardline status {PIPELINE}/{run_id}" in first[0]["message"], first
    listed = shardline(airflow_stack, *runs, env={"COLUMNS": "400"}).stdout
    assert any(run_id in line and "past its deadline" in line for line in listed.splitlines()), listed

    # 5. Partitions: each scored minute's Asset event carries it as its partition key (and in its extra), and the
    # downstream DAG ran once per scored minute (S at most twice: two runs scored it), for no other minute.
    keys = [f"{m:%Y-%m-%dT%H:%M:%S}" for m in minute]
    events = client._call(
        "GET", "/assets/events", params={"source_dag_id": PIPELINE, "source_run_id": after["dag_run_id"]}
    )
    assert [(e["partition_key"], e["extra"]["partition"]) for e in events["asset_events"]] == [(keys[2], keys[2])]

    def downstream_keys() -> Counter:
        runs = client._call("GET", f"/dags/{DOWNSTREAM}/dagRuns", params={"limit": 100})["dag_runs"]
        return Counter(r["partition_key"] for r in runs)

    _wait_for(lambda: set(downstream_keys()) == set(keys), "a downstream run for each scored minute", airflow_stack)
    got = downstream_keys()
    assert got[keys[1]] == got[keys[2]] == 1 and got[keys[0]] in (1, 2), got


def _wait_for(check, what: str, stack, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}\n{stack.tail()}"
        time.sleep(2)
