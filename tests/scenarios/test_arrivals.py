"""Start on arrival in the real ``airflow standalone``: a pipeline with ``trigger: {on: ready_marker, queue: ...}``
(tests/conftest.py's ``arrivals_hourly``) runs each partition when its ready marker's S3 event reaches its SQS
queue. moto_server delivers the bucket's event notifications to the queue itself, as S3 does."""

from __future__ import annotations

import datetime as dt
import io
import json
import time

import pyarrow.parquet as pq
import pytest

from tests.conftest import ARRIVALS_BUCKET, ARRIVALS_PIPELINE, ARRIVALS_QUEUE

ARRIVALS_DAG = ARRIVALS_PIPELINE + "__arrivals"
ROWS = 2_000  # a file of each partition


def _runs(stack, dag_id: str) -> list[dict]:
    return stack.client()._call("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100})["dag_runs"]


def _wait(what: str, check, stack, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} never happened:\n{stack.tail()}"
        time.sleep(2)


def _hour_prefix(hour: dt.datetime) -> str:
    return f"dt={hour:%Y-%m-%d}/hour={hour:%H}/"


def _scored_ids(s3, hour: dt.datetime) -> list[int]:
    ids = []
    listing = s3.list_objects_v2(Bucket=ARRIVALS_BUCKET, Prefix="scores/" + _hour_prefix(hour))
    for item in listing.get("Contents", []):
        if item["Key"].endswith(".parquet") and "/_" not in item["Key"]:
            body = s3.get_object(Bucket=ARRIVALS_BUCKET, Key=item["Key"])["Body"].read()
            ids += pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist()
    return ids


@pytest.fixture(scope="module")
def arrivals(airflow_stack, tmp_path_factory, xgboost_model):
    """The pipeline's bucket, its queue, the bucket's notifications to it, and the model."""
    from examples import synthetic
    from shardline.ledger.table import create_ledger_table
    from shardline.spec import load_spec

    work = tmp_path_factory.mktemp("arrivals")
    patch = pytest.MonkeyPatch()
    airflow_stack.use_aws(patch)
    s3, sqs = airflow_stack.s3(), airflow_stack.aws_client("sqs")
    spec = load_spec(airflow_stack.dags / "pipelines" / f"{ARRIVALS_PIPELINE}.yaml")
    create_ledger_table(spec.ledger_table, "us-east-1", airflow_stack.env["AWS_ENDPOINT_URL"])
    s3.create_bucket(Bucket=ARRIVALS_BUCKET)
    queue_url = sqs.create_queue(QueueName=ARRIVALS_QUEUE)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    # Every object created in the bucket is announced, the data files too: the watcher picks the markers out.
    s3.put_bucket_notification_configuration(
        Bucket=ARRIVALS_BUCKET,
        NotificationConfiguration={"QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]},
    )
    synthetic.pack(xgboost_model.parent, work / "model.tar.gz")
    s3.upload_file(str(work / "model.tar.gz"), ARRIVALS_BUCKET, "models/v1/model.tar.gz")
    files = synthetic.make_dataset(work / "data", files=1, rows=ROWS)
    yield {"s3": s3, "sqs": sqs, "queue_url": queue_url, "file": files[0]}
    patch.undo()


def test_each_partition_starts_once_when_its_marker_lands_whatever_the_order_and_repeats(airflow_stack, arrivals):
    s3, sqs, queue_url = arrivals["s3"], arrivals["sqs"], arrivals["queue_url"]
    airflow_stack.wait_for_dag(ARRIVALS_PIPELINE)
    airflow_stack.wait_for_dag(ARRIVALS_DAG)
    now = dt.datetime.now(dt.UTC)
    newer = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)  # the last whole hour
    older = newer - dt.timedelta(hours=1)
    for hour in (older, newer):
        s3.upload_file(str(arrivals["file"]), ARRIVALS_BUCKET, f"events/{_hour_prefix(hour)}part-0.parquet")
    # Out of order (the newer hour's marker first), the newer one written twice (two S3 events), the older one's
    # event sent again by hand (a queue may deliver a message twice), and a message that is no S3 event at all.
    s3.put_object(Bucket=ARRIVALS_BUCKET, Key=f"events/{_hour_prefix(newer)}_SUCCESS", Body=b"")
    s3.put_object(Bucket=ARRIVALS_BUCKET, Key=f"events/{_hour_prefix(older)}_SUCCESS", Body=b"")
    s3.put_object(Bucket=ARRIVALS_BUCKET, Key=f"events/{_hour_prefix(newer)}_SUCCESS", Body=b"")
    again = {
        "Records": [
            {
                "eventName": "ObjectCreated:Put",
                "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                "s3": {"bucket": {"name": ARRIVALS_BUCKET}, "object": {"key": f"events/{_hour_prefix(older)}_SUCCESS"}},
            }
        ]
    }
    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(again))
    sqs.send_message(QueueUrl=queue_url, MessageBody="hello, not an event")

    expected = {f"arrival__{hour:%Y-%m-%dT%H:%M:%S}": hour for hour in (older, newer)}
    for run_id in expected:
        _wait(
            f"run {run_id}",
            lambda run_id=run_id: run_id in {r["dag_run_id"] for r in _runs(airflow_stack, ARRIVALS_PIPELINE)},
            airflow_stack,
        )
        airflow_stack.assert_succeeds(ARRIVALS_PIPELINE, run_id)

    # Every message is read and deleted once Airflow has stored it (or refused it as no S3 event).
    def drained():
        attributes = sqs.get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        return all(int(value) == 0 for value in attributes.values())

    _wait("an empty queue", drained, airflow_stack)
    # Every arrivals run that the events started has ended.
    _wait(
        "every arrivals run ending",
        lambda: all(r["state"] in ("success", "failed") for r in _runs(airflow_stack, ARRIVALS_DAG)) or None,
        airflow_stack,
    )
    arrival_runs = _runs(airflow_stack, ARRIVALS_DAG)
    assert arrival_runs and all(r["state"] == "success" for r in arrival_runs), arrival_runs

    # One run per partition, whatever the order and the repeats: no other run of the pipeline, none by the clock.
    runs = {r["dag_run_id"]: r for r in _runs(airflow_stack, ARRIVALS_PIPELINE)}
    assert set(runs) == set(expected), sorted(runs)
    for run_id, hour in expected.items():
        run = runs[run_id]
        assert dt.datetime.fromisoformat(run["data_interval_start"]) == hour
        assert dt.datetime.fromisoformat(run["data_interval_end"]) == hour + dt.timedelta(hours=1)
        assert dt.datetime.fromisoformat(run["logical_date"]) == hour
        assert sorted(_scored_ids(s3, hour)) == list(range(ROWS)), run_id  # every row scored, once
    # The repeats were refused where the run already existed (a skipped start), not started again.
    started = [
        ti["state"]
        for r in arrival_runs
        for ti in airflow_stack.client().task_instances(ARRIVALS_DAG, r["dag_run_id"])
        if ti["task_id"] == "start_partition"
    ]
    assert started.count("success") == 2, started
    assert set(started) <= {"success", "skipped"}, started


def test_a_marker_of_no_partition_within_the_lookback_fails_the_arrivals_run_naming_it(airflow_stack, arrivals):
    s3 = arrivals["s3"]
    airflow_stack.wait_for_dag(ARRIVALS_DAG)
    before = {r["dag_run_id"] for r in _runs(airflow_stack, ARRIVALS_DAG)}
    pipeline_runs = {r["dag_run_id"] for r in _runs(airflow_stack, ARRIVALS_PIPELINE)}
    old = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(days=3)
    key = f"events/{_hour_prefix(old)}_SUCCESS"
    s3.put_object(Bucket=ARRIVALS_BUCKET, Key=key, Body=b"")

    def failed_run():
        ended = [r for r in _runs(airflow_stack, ARRIVALS_DAG) if r["dag_run_id"] not in before]
        return next((r for r in ended if r["state"] == "failed"), None)

    run = _wait("a failed arrivals run", failed_run, airflow_stack)
    log = airflow_stack.failed_logs(ARRIVALS_DAG, run["dag_run_id"])
    assert "unmatched_markers" in log and f"s3://{ARRIVALS_BUCKET}/{key}" in log, log
    assert "trigger.lookback" in log, log
    assert {r["dag_run_id"] for r in _runs(airflow_stack, ARRIVALS_PIPELINE)} == pipeline_runs  # it started nothing


def test_a_marker_that_lands_before_its_files_waits_for_them_as_a_scheduled_run_does(airflow_stack, arrivals):
    """A producer that writes its ready marker first: the run it starts waits for the partition's files (as the
    partition's scheduled run would wait for late data), then scores them. It used to fail at once."""
    s3 = arrivals["s3"]
    airflow_stack.wait_for_dag(ARRIVALS_PIPELINE)
    airflow_stack.wait_for_dag(ARRIVALS_DAG)
    hour = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=3)
    run_id = f"arrival__{hour:%Y-%m-%dT%H:%M:%S}"
    s3.put_object(Bucket=ARRIVALS_BUCKET, Key=f"events/{_hour_prefix(hour)}_SUCCESS", Body=b"")
    _wait(
        f"run {run_id}",
        lambda: run_id in {r["dag_run_id"] for r in _runs(airflow_stack, ARRIVALS_PIPELINE)},
        airflow_stack,
    )
    client = airflow_stack.client()
    _wait(
        "plan_score waiting for the files",
        lambda: client.task_instance(ARRIVALS_PIPELINE, run_id, "plan_score").get("state") == "deferred",
        airflow_stack,
    )
    assert client.dag_run(ARRIVALS_PIPELINE, run_id)["state"] == "running"  # not failed, not green
    s3.upload_file(str(arrivals["file"]), ARRIVALS_BUCKET, f"events/{_hour_prefix(hour)}part-0.parquet")
    airflow_stack.assert_succeeds(ARRIVALS_PIPELINE, run_id)
    assert sorted(_scored_ids(s3, hour)) == list(range(ROWS))
