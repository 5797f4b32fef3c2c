"""The embedded endpoint's state kept in a folder: S3 and the ledger's tables survive a restart and a ``kill -9``."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from shardline.local.embedded_aws import EmbeddedAwsError, env_for, moto_server_command, start_moto
from shardline.local.moto_state import LOG_NAME

pytestmark = pytest.mark.integration  # each test starts endpoints of its own


@contextlib.contextmanager
def endpoint(folder: Path, log: Path) -> Iterator[tuple[subprocess.Popen, dict]]:
    """An endpoint keeping its state in ``folder``: (its process, S3 and DynamoDB clients); killed at the end."""
    proc, url = start_moto(log, tethered=True, state_dir=folder)
    env = env_for(url)
    session = boto3.session.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    clients = {name: session.client(name, endpoint_url=url) for name in ("s3", "dynamodb")}
    try:
        yield proc, clients
    finally:
        kill(proc)


def kill(proc: subprocess.Popen) -> None:
    """``kill -9`` of the endpoint's whole session: no handler runs, nothing is flushed on the way out."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _table(dynamodb) -> None:
    dynamodb.create_table(
        TableName="ledger",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def _item(dynamodb, pk: str, sk: str) -> dict | None:
    return dynamodb.get_item(TableName="ledger", Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True).get(
        "Item"
    )


def _head(s3, key: str) -> dict | None:
    try:
        head = s3.head_object(Bucket="kept", Key=key)
    except ClientError as err:
        if err.response["Error"]["Code"] in {"404", "NoSuchKey"}:
            return None
        raise
    return {name: head[name] for name in ("ETag", "LastModified", "ContentLength", "Metadata")}


def test_objects_and_items_survive_a_kill_9_unchanged(tmp_path):
    folder = tmp_path / "aws"
    big = os.urandom(9 << 20)  # a multipart upload (boto3's parts are 8 MiB)
    (tmp_path / "big.bin").write_bytes(big)
    with endpoint(folder, tmp_path / "first.log") as (proc, aws):
        s3, dynamodb = aws["s3"], aws["dynamodb"]
        s3.create_bucket(Bucket="kept")
        s3.put_object(Bucket="kept", Key="out/part 0.parquet", Body=b"rows", Metadata={"sha256": "abc"}, Tagging="a=1")
        s3.upload_file(str(tmp_path / "big.bin"), "kept", "out/big.bin")
        s3.put_object(Bucket="kept", Key="deleted", Body=b"x")
        s3.delete_objects(Bucket="kept", Delete={"Objects": [{"Key": "deleted"}]})
        _table(dynamodb)
        dynamodb.update_time_to_live(
            TableName="ledger", TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"}
        )
        dynamodb.put_item(TableName="ledger", Item={"pk": {"S": "RUN#r"}, "sk": {"S": "FILE#1"}, "n": {"N": "1"}})
        dynamodb.update_item(  # a conditional update, as the ledger's fencing makes them
            TableName="ledger",
            Key={"pk": {"S": "RUN#r"}, "sk": {"S": "FILE#1"}},
            UpdateExpression="SET n = n + :one",
            ConditionExpression="n = :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
        )
        dynamodb.transact_write_items(
            TransactItems=[{"Put": {"TableName": "ledger", "Item": {"pk": {"S": "RUN#r"}, "sk": {"S": "STEP#s"}}}}]
        )
        dynamodb.batch_write_item(
            RequestItems={"ledger": [{"DeleteRequest": {"Key": {"pk": {"S": "RUN#r"}, "sk": {"S": "STEP#s"}}}}]}
        )
        before = {key: _head(s3, key) for key in ("out/part 0.parquet", "out/big.bin")}
        item = _item(dynamodb, "RUN#r", "FILE#1")
        kill(proc)

    with endpoint(folder, tmp_path / "second.log") as (_, aws):
        s3, dynamodb = aws["s3"], aws["dynamodb"]
        assert {key: _head(s3, key) for key in before} == before  # ETag, LastModified, size and metadata too
        assert s3.get_object(Bucket="kept", Key="out/big.bin")["Body"].read() == big
        assert s3.get_object(Bucket="kept", Key="out/part 0.parquet")["Body"].read() == b"rows"
        assert s3.get_object_tagging(Bucket="kept", Key="out/part 0.parquet")["TagSet"] == [{"Key": "a", "Value": "1"}]
        assert _head(s3, "deleted") is None
        assert _item(dynamodb, "RUN#r", "FILE#1") == item and item["n"] == {"N": "2"}
        assert _item(dynamodb, "RUN#r", "STEP#s") is None
        assert dynamodb.describe_time_to_live(TableName="ledger")["TimeToLiveDescription"]["TimeToLiveStatus"] == (
            "ENABLED"
        )
        # What is deleted after a restart stays deleted after the next.
        s3.delete_object(Bucket="kept", Key="out/big.bin")
        dynamodb.delete_table(TableName="ledger")

    with endpoint(folder, tmp_path / "third.log") as (_, aws):
        assert _head(aws["s3"], "out/big.bin") is None and _head(aws["s3"], "out/part 0.parquet") is not None
        assert aws["dynamodb"].list_tables()["TableNames"] == []
        _table(aws["dynamodb"])  # a table made again holds none of the old one's items
        assert _item(aws["dynamodb"], "RUN#r", "FILE#1") is None


def test_a_record_cut_short_by_a_kill_mid_write_is_dropped_and_the_rest_kept(tmp_path):
    folder = tmp_path / "aws"
    with endpoint(folder, tmp_path / "first.log") as (proc, aws):
        aws["s3"].create_bucket(Bucket="kept")
        aws["s3"].put_object(Bucket="kept", Key="answered", Body=b"a")
        size = (folder / LOG_NAME).stat().st_size
        aws["s3"].put_object(Bucket="kept", Key="cut", Body=b"b" * 5000)
        kill(proc)
    # What a kill in the middle of the last write leaves: its record cut short (its request was never answered).
    log = folder / LOG_NAME
    whole = log.read_bytes()
    log.write_bytes(whole[: size + (len(whole) - size) // 2])

    with endpoint(folder, tmp_path / "second.log") as (proc, aws):
        s3 = aws["s3"]
        assert s3.get_object(Bucket="kept", Key="answered")["Body"].read() == b"a"
        assert _head(s3, "cut") is None
        s3.put_object(Bucket="kept", Key="after", Body=b"c")  # written after the cut: not lost behind it
        kill(proc)
    with endpoint(folder, tmp_path / "third.log") as (_, aws):
        assert [o["Key"] for o in aws["s3"].list_objects_v2(Bucket="kept")["Contents"]] == ["after", "answered"]


def test_a_folder_another_moto_wrote_is_refused_with_how_to_wipe_it(tmp_path):
    folder = tmp_path / "aws"
    folder.mkdir()
    (folder / LOG_NAME).write_bytes(b"shardline moto state 1 moto 4.0.0\n")
    log = tmp_path / "moto.log"
    with pytest.raises(EmbeddedAwsError, match="exited"):
        start_moto(log, tethered=True, state_dir=folder)
    assert f"delete {folder}" in log.read_text()


def test_without_a_state_folder_the_endpoint_keeps_nothing_on_disk():
    # The suite's endpoints start as before: empty, in memory only, with no state to read at start.
    assert "--state-dir" not in moto_server_command(5000)
    assert moto_server_command(5000, Path("/x"))[-2:] == ["--state-dir", "/x"]


def test_shardline_local_up_keeps_its_state_across_down_and_up(tmp_path):
    from tests.support.cli import REPO, run

    user = {"SHARDLINE_STATE_DIR": str(tmp_path / "state")}

    def up() -> boto3.client:
        started = run("--dags-folder", str(REPO / "dags"), "local", "up", env=user)
        assert started.returncode == 0, started.stderr
        assert f"kept in {tmp_path / 'state' / 'aws'}" in started.stdout and "rm -rf" in started.stdout
        url = re.search(r"export AWS_ENDPOINT_URL=(\S+)", started.stdout).group(1)
        return boto3.client(
            "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
        )

    try:
        up().put_object(Bucket="shardline-demo", Key="kept.txt", Body=b"kept")
        assert run("local", "down", env=user).returncode == 0
        # The next `up` waits for the endpoint stopping to let go of the folder, then finds what it kept.
        assert up().get_object(Bucket="shardline-demo", Key="kept.txt")["Body"].read() == b"kept"
    finally:
        run("local", "down", env=user)
