"""A job's grant proxy in front of the session's moto_server, reached by the real boto3 and pynamodb clients and
the worker's own ledger code: what the job role allows goes through (streamed, multipart too), everything else
is refused as AWS refuses it, and a refused request changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError

from shardline.grant.job import JobGrant, JobScope
from shardline.grant.proxy import GrantProxy
from shardline.ledger.job_writes import FinishedFile, LedgerContext, WorkerLedger
from shardline.ledger.keys import StepRef
from shardline.ledger.states import FileStatus
from shardline.ledger.step_writes import ensure_run, start_attempt
from shardline.ledger.table import bind_ledger

PIPELINE, RUN = "daily_churn", "run-1"


@pytest.fixture
def job(aws_env, ledger_table):
    """Buckets with an input, the job's model, another pipeline's output and a secret; a planned attempt in the
    ledger; and the job's grant proxy in front of moto_server."""
    s3 = boto3.client("s3")
    data, models, secrets = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("data", "models", "secrets"))
    for bucket in (data, models, secrets):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=data, Key="events/dt=1/part-0.csv", Body=b"a,b\n1,2\n")
    s3.put_object(Bucket=data, Key="scores/weekly_ltv/dt=1/part-0.parquet", Body=b"the other pipeline's rows")
    s3.put_object(Bucket=models, Key="churn/model.tar.gz", Body=b"model")
    s3.put_object(Bucket=secrets, Key="airflow.cfg", Body=b"fernet_key = secret")
    model = bind_ledger(ledger_table)
    ensure_run(model, PIPELINE, RUN)
    start_attempt(model, StepRef(PIPELINE, RUN, "score"), 1, [(f"s3://{data}/events/dt=1/part-0.csv", 8)])
    scope = JobScope(
        PIPELINE,
        ledger_table,
        "us-east-1",
        f"s3://{data}/events/dt=1/",
        f"s3://{models}/churn/model.tar.gz",
        f"s3://{data}/scores/daily_churn/dt=1/",
    )
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    refusals: list[str] = []
    with GrantProxy(JobGrant.of(scope), {"s3": endpoint, "dynamodb": endpoint}, on_refusal=refusals.append) as proxy:
        yield {
            "proxy": proxy,
            "s3": boto3.client("s3", endpoint_url=proxy.url),  # the job's view
            "direct": s3,  # the orchestrator's
            "data": data,
            "models": models,
            "secrets": secrets,
            "table": ledger_table,
            "model": model,
            "refusals": refusals,
        }


def _denied(call) -> str:
    with pytest.raises(ClientError) as refused:
        call()
    error = refused.value.response["Error"]
    assert error["Code"] in ("AccessDenied", "AccessDeniedException", "403"), error
    return str(refused.value)


def test_what_the_job_needs_goes_through(job, tmp_path):
    s3, data = job["s3"], job["data"]
    out = "scores/daily_churn/dt=1/"
    s3.put_object(Bucket=data, Key=out + "part-0.parquet", Body=b"rows")
    # A large output, in parts, with the checksum the worker asks for: streamed through, byte for byte.
    big = tmp_path / "big.parquet"
    big.write_bytes(os.urandom(12 << 20))
    config = boto3.s3.transfer.TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    s3.upload_file(str(big), data, out + "part-1.parquet", ExtraArgs={"ChecksumAlgorithm": "SHA256"}, Config=config)
    body = job["direct"].get_object(Bucket=data, Key=out + "part-1.parquet")["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256(big.read_bytes()).digest()
    assert s3.get_object(Bucket=data, Key="events/dt=1/part-0.csv")["Body"].read() == b"a,b\n1,2\n"
    assert s3.head_object(Bucket=job["models"], Key="churn/model.tar.gz")["ContentLength"] == 5
    listed = s3.list_objects_v2(Bucket=data, Prefix="events/dt=1/")["Contents"]
    assert [o["Key"] for o in listed] == ["events/dt=1/part-0.csv"]
    assert job["refusals"] == []


def test_the_workers_own_ledger_writes_go_through(job, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    context = LedgerContext(
        table=job["table"],
        pipeline=PIPELINE,
        run_id=RUN,
        step="score",
        attempt=1,
        input_uri=f"s3://{job['data']}/events/dt=1/",
        output_uri=f"s3://{job['data']}/scores/daily_churn/dt=1/",
    )
    worker = WorkerLedger(context, "algo-1", endpoint=job["proxy"].url)
    worker.claim_file("part-0.csv")
    worker.finish_file("part-0.csv", FinishedFile(FileStatus.SUCCEEDED, rows_in=1, rows_out=1, output_key="k"))
    from shardline.ledger.step_reads import read_step

    (record,) = read_step(job["model"], StepRef(PIPELINE, RUN, "score")).files
    assert record.status is FileStatus.SUCCEEDED
    assert job["refusals"] == []


ATTACKS = {
    "read another pipeline's outputs": lambda j: j["s3"].get_object(
        Bucket=j["data"], Key="scores/weekly_ltv/dt=1/part-0.parquet"
    ),
    "overwrite another pipeline's outputs": lambda j: j["s3"].put_object(
        Bucket=j["data"], Key="scores/weekly_ltv/dt=1/part-0.parquet", Body=b"forged"
    ),
    "write its own _SUCCESS": lambda j: j["s3"].put_object(
        Bucket=j["data"], Key="scores/daily_churn/dt=1/_SUCCESS", Body=b"{}"
    ),
    "write its run report": lambda j: j["s3"].put_object(
        Bucket=j["data"], Key="scores/daily_churn/dt=1/_shardline/reports/run-1/score/report.json", Body=b"{}"
    ),
    "copy a secret into its outputs": lambda j: j["s3"].copy_object(
        Bucket=j["data"], Key="scores/daily_churn/dt=1/x", CopySource={"Bucket": j["secrets"], "Key": "airflow.cfg"}
    ),
    "tag its own output for expiry": lambda j: j["s3"].put_object(
        Bucket=j["data"],
        Key="scores/daily_churn/dt=1/part-9.parquet",
        Body=b"rows",
        Tagging="shardline-retention=metadata",
    ),
    "read a secret": lambda j: j["s3"].get_object(Bucket=j["secrets"], Key="airflow.cfg"),
    "list every bucket": lambda j: j["s3"].list_buckets(),
    "list the whole bucket": lambda j: j["s3"].list_objects_v2(Bucket=j["data"]),
    "delete its input": lambda j: j["s3"].delete_objects(
        Bucket=j["data"], Delete={"Objects": [{"Key": "events/dt=1/part-0.csv"}]}
    ),
    "create a bucket": lambda j: j["s3"].create_bucket(Bucket="attacker-" + uuid.uuid4().hex[:6]),
    "write another pipeline's ledger item": lambda j: boto3.client("dynamodb", endpoint_url=j["proxy"].url).put_item(
        TableName=j["table"], Item={"pk": {"S": "RUN#weekly_ltv#run-1"}, "sk": {"S": "RUN"}}
    ),
    "mark its own run succeeded": lambda j: boto3.client("dynamodb", endpoint_url=j["proxy"].url).update_item(
        TableName=j["table"],
        Key={"pk": {"S": f"RUN#{PIPELINE}#{RUN}"}, "sk": {"S": "RUN"}},
        UpdateExpression="SET #m = :m",
        ExpressionAttributeNames={"#m": "msg"},
        ExpressionAttributeValues={":m": {"S": "all good"}},
    ),
    "read the ledger": lambda j: boto3.client("dynamodb", endpoint_url=j["proxy"].url).scan(TableName=j["table"]),
    "delete the ledger": lambda j: boto3.client("dynamodb", endpoint_url=j["proxy"].url).delete_table(
        TableName=j["table"]
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_everything_else_is_refused_as_aws_refuses_it_and_changes_nothing(job, attack):
    before = {
        k["Key"]: k["ETag"]
        for b in (job["data"], job["secrets"])
        for k in job["direct"].list_objects_v2(Bucket=b).get("Contents", [])
    }
    message = _denied(lambda: ATTACKS[attack](job))
    assert "not authorized to perform" in message, message
    after = {
        k["Key"]: k["ETag"]
        for b in (job["data"], job["secrets"])
        for k in job["direct"].list_objects_v2(Bucket=b).get("Contents", [])
    }
    assert after == before
    assert len(job["direct"].list_buckets()["Buckets"]) >= 3
    assert job["table"] in boto3.client("dynamodb").list_tables()["TableNames"]
    assert len(job["refusals"]) == 1, job["refusals"]


def test_the_emulators_own_api_is_out_of_reach(job):
    answer = httpx.post(f"{job['proxy'].url}/moto-api/reset", timeout=30)
    assert answer.status_code == 403 and b"moto-api" in answer.content
    assert job["data"] in [b["Name"] for b in job["direct"].list_buckets()["Buckets"]]  # nothing was reset
    assert job["table"] in boto3.client("dynamodb").list_tables()["TableNames"]


def test_an_unsigned_request_is_refused(job):
    answer = httpx.get(f"{job['proxy'].url}/{job['data']}/events/dt=1/part-0.csv", timeout=30)
    assert answer.status_code == 403 and b"Signature Version 4" in answer.content
    assert json.dumps(job["refusals"]).count("refused") == 1


def _raw(proxy_url: str, request: bytes) -> bytes:
    """One request, byte for byte as a hostile client may write it; the proxy's answer."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(proxy_url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


SIG = "Signature=00"


def test_a_request_the_endpoint_would_read_another_way_than_the_check_is_refused(job):
    """Found by review: each of these got moto to do what the grant refuses, before the proxy read requests
    only one way. After: refused, and nothing written."""
    data, secrets = job["data"], job["secrets"]
    update = json.dumps(
        {
            "TableName": job["table"],
            "Key": {"pk": {"S": f"RUN#{PIPELINE}#{RUN}"}, "sk": {"S": "FILE#x"}},
            "UpdateExpression": "SET #s = :v",
            "ExpressionAttributeNames": {"#s": "st"},
            "ExpressionAttributeValues": {":v": {"S": "X"}},
        }
    ).encode()
    s3_auth = (
        f"Authorization: AWS4-HMAC-SHA256 Credential=AK/20261128/us-east-1/s3/aws4_request, SignedHeaders=host, {SIG}"
    )
    ddb_auth = s3_auth.replace("/s3/", "/dynamodb/")
    attempts = {
        # a DynamoDB body under an S3 signature: moto's POST upload, writing the body at ?key=
        "service confusion": (
            f"POST /{data}?key=scores/daily_churn/dt=1/_SUCCESS HTTP/1.1\r\nHost: x\r\n"
            f"X-Amz-Target: DynamoDB_20120810.UpdateItem\r\n{s3_auth}\r\nContent-Length: {len(update)}\r\n\r\n"
        ).encode()
        + update,
        "the emulator's API, percent-encoded": (
            f"POST /%6Doto-api/reset HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.UpdateItem\r\n"
            f"{ddb_auth}\r\nContent-Length: {len(update)}\r\n\r\n"
        ).encode()
        + update,
        # moto reads the first of two copy sources, the check the last
        "a repeated copy source": (
            f"PUT /{data}/scores/daily_churn/dt=1/stolen HTTP/1.1\r\nHost: x\r\n{s3_auth}\r\n"
            f"x-amz-copy-source: {secrets}/airflow.cfg\r\nx-amz-copy-source: {data}/events/dt=1/part-0.csv\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode(),
        "a length that is no length": (
            f"PUT /{data}/scores/daily_churn/dt=1/x HTTP/1.1\r\nHost: x\r\n{s3_auth}\r\nContent-Length: -1\r\n\r\n"
        ).encode(),
    }
    for name, request in attempts.items():
        answer = _raw(job["proxy"].url, request)
        status = int(answer.split(b" ", 2)[1])
        assert status in (400, 403), (name, answer[:300])
    keys = [o["Key"] for o in job["direct"].list_objects_v2(Bucket=data)["Contents"]]
    assert not [k for k in keys if k.endswith(("_SUCCESS", "stolen", "/x"))], keys
    assert data in [b["Name"] for b in job["direct"].list_buckets()["Buckets"]]  # nothing was reset
    assert len(job["refusals"]) == len(attempts), job["refusals"]


def test_a_copy_reads_from_the_bucket_its_grant_was_checked_for(aws_env):
    """Found by review: ``x-amz-copy-source: //data/<secrets>/...`` was checked as bucket data, key <secrets>/...
    (inside the job's input prefix) and copied by the endpoint from bucket <secrets>: a secret landed in the job's
    outputs. After: refused, nothing written; a copy boto3 writes (its key percent-encoded) still goes through."""
    direct = boto3.client("s3")
    data, secrets = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("data", "secrets"))
    for bucket in (data, secrets):
        direct.create_bucket(Bucket=bucket)
    # The job's input prefix starts with the other bucket's name: the one thing the misreading needed.
    inputs, out = f"{secrets}/dt=1/", "scores/daily_churn/dt=1/"
    direct.put_object(Bucket=data, Key=inputs + "a b+c.csv", Body=b"a,b\n1,2\n")
    direct.put_object(Bucket=secrets, Key="dt=1/airflow.cfg", Body=b"fernet_key = secret")
    scope = JobScope(
        PIPELINE, "ledger", "us-east-1", f"s3://{data}/{inputs}", f"s3://{data}/model.tar.gz", f"s3://{data}/{out}"
    )
    endpoint, refusals = os.environ["AWS_ENDPOINT_URL"], []
    with GrantProxy(JobGrant.of(scope), {"s3": endpoint, "dynamodb": endpoint}, on_refusal=refusals.append) as proxy:
        auth = (
            "Authorization: AWS4-HMAC-SHA256 Credential=AK/20261128/us-east-1/s3/aws4_request, "
            f"SignedHeaders=host, {SIG}"
        )
        for source in (f"//{data}/{secrets}/dt=1/airflow.cfg", f"/%2F{data}/{secrets}/dt=1/airflow.cfg"):
            answer = _raw(
                proxy.url,
                (
                    f"PUT /{data}/{out}stolen HTTP/1.1\r\nHost: x\r\n{auth}\r\n"
                    f"x-amz-copy-source: {source}\r\nContent-Length: 0\r\n\r\n"
                ).encode(),
            )
            assert int(answer.split(b" ", 2)[1]) == 403, (source, answer[:300])
        job_s3 = boto3.client("s3", endpoint_url=proxy.url)
        job_s3.copy_object(
            Bucket=data, Key=out + "copied.csv", CopySource={"Bucket": data, "Key": inputs + "a b+c.csv"}
        )
    assert direct.get_object(Bucket=data, Key=out + "copied.csv")["Body"].read() == b"a,b\n1,2\n"
    keys = [o["Key"] for o in direct.list_objects_v2(Bucket=data)["Contents"]]
    assert out + "stolen" not in keys, keys
    assert len(refusals) == 2 and "bucket's name" in refusals[0], refusals


def test_the_proxy_serves_at_most_its_cap_of_connections_and_frees_a_slot_when_one_ends():
    """A thread per connection, and at most the cap at once: one past it is closed as it comes; once a connection
    ends its slot serves the next (here an unsigned request, answered with the refusal, no endpoint needed)."""
    import socket

    from shardline.waiting import wait_for

    scope = JobScope("p", "t", "us-east-1", "s3://b/in/", "s3://b/model.tar.gz", "s3://b/out/")
    dead = "http://127.0.0.1:9"
    with GrantProxy(JobGrant.of(scope), {"s3": dead, "dynamodb": dead}, connections=1) as proxy:
        address = ("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))
        held = socket.create_connection(address, timeout=30)  # idle: its thread waits for a request line
        past = socket.create_connection(address, timeout=30)
        assert past.recv(1) == b""  # closed at once: the cap is taken
        past.close()
        held.close()

        def answer() -> int | None:
            try:
                return httpx.get(f"{proxy.url}/b/in/x", timeout=5).status_code
            except httpx.TransportError:
                return None  # the slot is not free yet

        assert wait_for(answer, lambda code: code is not None, timeout=30) == 403


def _template_without_request_counts() -> dict:
    """The shipped template as a stack from before the request counts has it: the worker may not write ``rq``."""
    import copy

    from shardline.grant.template import shipped

    template = copy.deepcopy(shipped())
    found = 0
    for statement in template["Resources"]["SageMakerExecutionRole"]["Properties"]["Policies"][0]["PolicyDocument"][
        "Statement"
    ]:
        attributes = statement.get("Condition", {}).get("ForAllValues:StringEquals", {}).get("dynamodb:Attributes")
        if statement.get("Sid") == "LedgerWorkerAttributes" and "rq" in attributes:
            attributes.remove("rq")
            found += 1
    assert found == 1
    return template


@pytest.mark.parametrize("stack", ["this release's", "an older one"])
def test_an_instance_records_its_request_counts_where_the_stack_allows_and_beats_on_without_where_not(
    aws_env, ledger_table, stack
):
    from shardline.ledger.requests import RequestCounter
    from shardline.ledger.states import ShardStatus

    model = bind_ledger(ledger_table)
    ensure_run(model, PIPELINE, RUN)
    start_attempt(model, StepRef(PIPELINE, RUN, "score"), 1, [("s3://d/events/dt=1/part-0.csv", 8)])
    scope = JobScope(PIPELINE, ledger_table, "us-east-1", "s3://d/events/dt=1/", "s3://m/model.tar.gz", "s3://d/o/")
    template = None if stack == "this release's" else _template_without_request_counts()
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    refusals: list[str] = []
    grant = JobGrant.of(scope, template)
    with GrantProxy(grant, {"s3": endpoint, "dynamodb": endpoint}, on_refusal=refusals.append) as proxy:
        context = LedgerContext(
            table=ledger_table, pipeline=PIPELINE, run_id=RUN, step="score", attempt=1, input_uri="s3://d/events/dt=1/"
        )
        counter = RequestCounter()
        worker = WorkerLedger(context, "algo-1", endpoint=proxy.url, requests=counter)
        worker.heartbeat(ShardStatus.RUNNING, files_assigned=1, files_done=0, files_failed=0, rows_done=0)
        worker.heartbeat(ShardStatus.SUCCEEDED, files_assigned=1, files_done=1, files_failed=0, rows_done=8)
    from shardline.ledger.step_reads import read_step

    [shard] = read_step(model, StepRef(PIPELINE, RUN, "score"), files=False).shards
    assert shard.status == "SUCCEEDED" and shard.rows_done == 8  # the heartbeats landed either way
    if template is None:
        assert refusals == [] and shard.requests == {"dynamodb.transact": 2}  # the two heartbeats
    else:
        assert len(refusals) == 1 and "dynamodb:UpdateItem" in refusals[0]  # the first, with its counts
        assert shard.requests is None and worker.requests is None
