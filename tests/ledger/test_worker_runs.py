"""The worker CLI writing to the ledger on moto_server: file records, the shard heartbeat, fencing of a
stale attempt (exit 5), a partial environment (exit 4), and no AWS at all without a ledger."""

from __future__ import annotations

import socket

import boto3
import pytest

from examples import synthetic
from shardline.contract import EXIT_FENCED, EXIT_FILES_FAILED, EXIT_OK, EXIT_SETUP_ERROR
from shardline.ledger.keys import failures_pk, file_sk_prefix, run_pk, shard_sk, step_sk
from shardline.ledger.table import bind_ledger
from shardline.orchestration.step.outputs import object_sha256
from tests.support.helpers import (
    HOST,
    clean_env,
    describe,
    load_manifest,
    reports_by_input,
    run_worker,
    shard_sk_prefix,
)
from tests.support.records import hold_run

pytestmark = pytest.mark.slow

PIPELINE, RUN_ID, STEP = "nightly", "run-42", "score"
BUCKET = "worker-runs"


def _ledger_env(aws_env: dict, table: str, attempt: int, **extra: str) -> dict[str, str]:
    return clean_env(
        **aws_env,
        SHARDLINE_LEDGER_TABLE=table,
        SHARDLINE_PIPELINE=PIPELINE,
        SHARDLINE_RUN_ID=RUN_ID,
        SHARDLINE_STEP=STEP,
        SHARDLINE_ATTEMPT=str(attempt),
        **extra,
    )


def _items(model, prefix: str) -> dict[str, object]:
    return {item.sk: item for item in model.query(run_pk(PIPELINE, RUN_ID), model.sk.startswith(prefix))}


def test_file_records_and_heartbeat(tmp_path, aws_env, ledger_table, xgboost_model):
    inputs, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(inputs, files=2, rows=3000)
    (inputs / "zz-corrupt.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    hold_run(bind_ledger(ledger_table), PIPELINE, RUN_ID, STEP, f"s3://{BUCKET}/out/")
    env = _ledger_env(
        aws_env,
        ledger_table,
        1,
        SHARDLINE_OUTPUT_URI=f"s3://{BUCKET}/out/",
        SHARDLINE_MANIFEST_URI=f"s3://{BUCKET}/out/_shardline/instances/run-42/score/attempt-0001",
    )
    result = run_worker(inputs, out, xgboost_model.parent, "--passthrough", "id", env=env)
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    assert "ledger write failed" not in result.stderr

    model = bind_ledger(ledger_table, "us-east-1", aws_env["AWS_ENDPOINT_URL"])
    files = _items(model, file_sk_prefix(STEP))
    assert sorted(files) == [
        f"{file_sk_prefix(STEP)}{name}" for name in ("part-00000.parquet", "part-00001.parquet", "zz-corrupt.parquet")
    ]
    assert not (out / "_shardline" / "manifest-algo-1.json").exists()  # per attempt: never overwritten by the next
    # The instance's manifest goes to the folder its job names (its run, step and attempt).
    s3.head_object(Bucket=BUCKET, Key=f"out/_shardline/instances/run-42/score/attempt-0001/manifest-{HOST}.json")
    reports = reports_by_input(load_manifest(out, attempt=1))
    for name in ("part-00000.parquet", "part-00001.parquet"):
        item = files[file_sk_prefix(STEP) + name]
        assert (item.status, item.attempt, item.host) == ("SUCCEEDED", 1, HOST)
        assert item.rows_in == item.rows_out == 1500
        assert item.bytes_in == (inputs / name).stat().st_size
        # Uploaded as it finished, with S3's checksum; its local copy is gone.
        head = s3.head_object(Bucket=BUCKET, Key=f"out/{name}", ChecksumMode="ENABLED")
        assert item.bytes_out == head["ContentLength"] == reports[name]["bytes_out"]
        assert item.output_sha256 == reports[name]["sha256"] == object_sha256(head)
        assert not (out / name).exists()
        assert item.seconds is not None and item.seconds >= 0
        assert item.output_key == f"s3://{BUCKET}/out/{name}"
        assert item.started_at is not None and item.finished_at is not None
        assert item.error_class is None and item.error_message is None
    bad = files[file_sk_prefix(STEP) + "zz-corrupt.parquet"]
    assert (bad.status, bad.attempt, bad.error_class) == ("FAILED", 1, "CorruptInputError")
    assert "zz-corrupt.parquet" in bad.error_message
    assert bad.rows_out == 0 and bad.output_key is None
    assert [f.input_key for f in model.failures.query(failures_pk(PIPELINE))] == ["zz-corrupt.parquet"]

    shards = _items(model, shard_sk_prefix(STEP))
    assert list(shards) == [shard_sk(STEP, 1, HOST)]
    shard = shards[shard_sk(STEP, 1, HOST)]
    assert (shard.status, shard.attempt, shard.host, shard.pipeline, shard.run_id, shard.step) == (
        "PARTIAL",
        1,
        HOST,
        PIPELINE,
        RUN_ID,
        STEP,
    )
    assert (shard.files_assigned, shard.files_done, shard.files_failed, shard.rows_done) == (3, 3, 1, 3000)
    assert shard.heartbeat_at is not None

    # The orchestrator retries the step as attempt 2 after the bad file was replaced.
    model.Control(run_pk(PIPELINE, RUN_ID), step_sk(STEP), attempt=2, status="RUNNING").save()
    synthetic.write_table(synthetic.make_table(500, first_id=3000), inputs / "zz-corrupt.parquet", "parquet")
    retry = run_worker(
        inputs,
        tmp_path / "out2",
        xgboost_model.parent,
        "--passthrough",
        "id",
        env=_ledger_env(aws_env, ledger_table, 2, SHARDLINE_OUTPUT_URI=f"s3://{BUCKET}/out/"),
    )
    assert retry.returncode == EXIT_OK, describe(retry)
    files = _items(model, file_sk_prefix(STEP))
    assert {(item.status, item.attempt) for item in files.values()} == {("SUCCEEDED", 2)}
    fixed = files[file_sk_prefix(STEP) + "zz-corrupt.parquet"]
    assert (fixed.rows_out, fixed.error_class, fixed.failed_pk) == (500, None, None)
    assert list(model.failures.query(failures_pk(PIPELINE))) == []
    shards = _items(model, shard_sk_prefix(STEP))
    assert [(item.sk, item.status) for item in shards.values()] == [
        (shard_sk(STEP, 1, HOST), "PARTIAL"),
        (shard_sk(STEP, 2, HOST), "SUCCEEDED"),
    ]


def test_a_stale_attempt_is_fenced_out_and_exits_5(tmp_path, aws_env, ledger_table, xgboost_model):
    inputs, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(inputs, files=3, rows=1500)
    model = bind_ledger(ledger_table, "us-east-1", aws_env["AWS_ENDPOINT_URL"])
    model.Control(run_pk(PIPELINE, RUN_ID), step_sk(STEP), attempt=2, status="RUNNING").save()
    result = run_worker(
        inputs, out, xgboost_model.parent, "--passthrough", "id", env=_ledger_env(aws_env, ledger_table, 1)
    )
    assert result.returncode == EXIT_FENCED, describe(result)
    assert "fenced" in result.stderr
    # The zombie's first write is its heartbeat, which the STEP item rejects; nothing after it is sent.
    assert _items(model, shard_sk_prefix(STEP)) == {}
    assert _items(model, file_sk_prefix(STEP)) == {}
    assert list(out.rglob("*.shardline-tmp")) == []


def test_a_partial_ledger_environment_exits_4_naming_the_missing_variables(tmp_path, xgboost_model):
    (tmp_path / "in").mkdir()
    env = clean_env(SHARDLINE_LEDGER_TABLE="ledger", SHARDLINE_PIPELINE=PIPELINE, SHARDLINE_ATTEMPT="1")
    result = run_worker(tmp_path / "in", tmp_path / "out", xgboost_model.parent, env=env)
    assert result.returncode == EXIT_SETUP_ERROR, describe(result)
    assert "SHARDLINE_RUN_ID" in result.stderr and "SHARDLINE_STEP" in result.stderr
    assert not (tmp_path / "out").exists()


def test_without_a_ledger_table_the_worker_makes_no_aws_calls(tmp_path, xgboost_model):
    inputs, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(inputs, files=2, rows=1000)
    # A listening socket nobody accepts on: any AWS call would complete a TCP handshake into its backlog.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sentinel:
        sentinel.bind(("127.0.0.1", 0))
        sentinel.listen(16)
        sentinel.setblocking(False)
        endpoint = f"http://127.0.0.1:{sentinel.getsockname()[1]}"
        env = clean_env(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ENDPOINT_URL_DYNAMODB=endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_EC2_METADATA_DISABLED="true",
        )
        result = run_worker(inputs, out, xgboost_model.parent, "--passthrough", "id", env=env)
        assert result.returncode == EXIT_OK, describe(result)
        with pytest.raises(BlockingIOError):
            conn, peer = sentinel.accept()
            conn.close()
            pytest.fail(f"the worker connected to the AWS endpoint from {peer} without a ledger configured")
    assert load_manifest(out)["succeeded"] == 2
    assert "ledger write failed" not in result.stderr


def test_an_output_that_cannot_be_uploaded_fails_its_file_with_what_to_check(
    tmp_path, aws_env, ledger_table, xgboost_model
):
    """The ledger never calls a file SUCCEEDED whose output is not in S3: here its bucket does not exist."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(inputs, files=2, rows=1000)
    env = _ledger_env(aws_env, ledger_table, 1, SHARDLINE_OUTPUT_URI="s3://no-such-bucket-here/out/")
    hold_run(bind_ledger(ledger_table), PIPELINE, RUN_ID, STEP, "s3://no-such-bucket-here/out/")
    result = run_worker(inputs, out, xgboost_model.parent, "--passthrough", "id", env=env)
    assert result.returncode == EXIT_FILES_FAILED, describe(result)
    model = bind_ledger(ledger_table, "us-east-1", aws_env["AWS_ENDPOINT_URL"])
    files = list(_items(model, file_sk_prefix(STEP)).values())
    assert [(f.status, f.error_class, f.output_key) for f in files] == [("FAILED", "OutputUploadError", None)] * 2
    assert "s3:PutObject" in files[0].error_message and "NoSuchBucket" in files[0].error_message
    assert [p for p in out.rglob("*.parquet")] == []  # nothing of them stays
