"""The embedded endpoint serves one request at a time, so a conditional write is atomic there as on AWS."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import threading
import uuid
import zlib
from urllib.parse import urlsplit

import boto3
import pytest

from shardline.local.moto_atomic import one_at_a_time


def test_a_request_holds_the_lock_for_its_whole_call_so_the_next_one_waits():
    lock = threading.Lock()
    inside, release = threading.Event(), threading.Event()
    seen = []

    def app(environ, start_response):
        seen.append(lock.locked())
        inside.set()
        release.wait()
        return [b"done"]

    call = one_at_a_time(app, lock)
    first = threading.Thread(target=call, args=({}, None))
    first.start()
    inside.wait()
    assert not lock.acquire(blocking=False)  # a second request cannot start its read-check-write now
    release.set()
    first.join()
    assert seen == [True]
    assert lock.acquire(blocking=False)  # and is let in once the first has answered
    lock.release()
    assert call({}, None) == [b"done"]


def test_the_endpoint_runs_moto_s_own_server_application_under_the_lock():
    from moto import server

    from shardline.local import moto_atomic
    from shardline.local.embedded_aws import is_moto_command, moto_server_command

    moto_atomic.install()
    moto_atomic.install()  # once only: a second wrap would be harmless, but is not made
    call = server.DomainDispatcherApplication.__call__
    assert getattr(call, "one_at_a_time", False)
    assert not getattr(call.__wrapped__, "one_at_a_time", False)  # moto's own, wrapped once
    command = moto_server_command(5000)
    assert command[1:3] == ["-m", "shardline.local.moto_atomic"]
    assert is_moto_command(command)  # what `shardline local down` recognises as the server it started
    assert is_moto_command(["/venv/bin/python", "/venv/bin/moto_server", "-p", "5000"])
    assert not is_moto_command(["/usr/bin/python3", "-m", "http.server"])


class _SlowUpload:
    """A request body that arrives only when the test lets it: a client stalled halfway through an upload."""

    def __init__(self, body: bytes, arrived: threading.Event, reading: threading.Event):
        self.body, self.arrived, self.reading = body, arrived, reading

    def read(self, size: int = -1) -> bytes:
        self.reading.set()
        self.arrived.wait()
        return self.body if size < 0 else self.body[:size]


def test_a_stalled_upload_is_read_before_the_lock_so_it_holds_up_no_other_request():
    lock = threading.Lock()
    got = []

    def app(environ, start_response):
        got.append((lock.locked(), environ["wsgi.input"].read()))
        return [b"ok"]

    call = one_at_a_time(app, lock)
    arrived, reading = threading.Event(), threading.Event()
    stalled = threading.Thread(
        target=call, args=({"wsgi.input": _SlowUpload(b"x" * 10, arrived, reading), "CONTENT_LENGTH": "10"}, None)
    )
    stalled.start()
    reading.wait()
    # While its body has not arrived, the lock is free: another request runs its whole call.
    assert not lock.locked()
    assert call({"wsgi.input": io.BytesIO(b"quick"), "CONTENT_LENGTH": "5"}, None) == [b"ok"]
    assert got == [(True, b"quick")]
    arrived.set()
    stalled.join()
    assert got[1] == (True, b"x" * 10)  # the app still gets the whole body, under the lock


def test_a_body_over_the_cap_is_refused_unread_with_413():
    lock = threading.Lock()
    called, answered = [], []

    def app(environ, start_response):
        called.append(True)
        return [b"ok"]

    call = one_at_a_time(app, lock, max_body=100)
    stream = io.BytesIO(b"y" * 1000)
    with lock:  # another request holds the endpoint: the refusal does not wait for it
        reply = call({"wsgi.input": stream, "CONTENT_LENGTH": "1000"}, lambda status, headers: answered.append(status))
    assert answered == ["413 Request Entity Too Large"] and b"cap" in b"".join(reply)
    assert not called and stream.tell() == 0  # never read, never passed on
    chunked = one_at_a_time(app, lock, max_body=100)(
        {"wsgi.input": io.BytesIO(b"z" * 101), "wsgi.input_terminated": True},
        lambda status, headers: answered.append(status),
    )
    assert answered[-1].startswith("413") and not called and b"cap" in b"".join(chunked)


def test_every_connection_has_a_socket_timeout():
    from werkzeug import serving

    from shardline.local import moto_atomic

    moto_atomic.install()
    assert serving.WSGIRequestHandler.timeout == moto_atomic.SOCKET_TIMEOUT_SECONDS


def test_a_request_without_length_or_chunks_has_no_body_and_is_not_waited_for():
    class NeverEnds:
        def read(self, size: int = -1) -> bytes:
            raise AssertionError("a GET's body was read: the server would wait for the client to hang up")

    call = one_at_a_time(lambda environ, start_response: [environ["wsgi.input"].read()], threading.Lock())
    assert call({"wsgi.input": NeverEnds(), "REQUEST_METHOD": "GET"}, None) == [b""]


# -- bodies checked as S3 checks them, against the real endpoint ----------------------------------------------


def _bucket(s3) -> str:
    name = f"strict-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def _raw_put(endpoint: str, path: str, headers: dict[str, str], body: bytes, length: int | None = None) -> bytes:
    """A PUT sent by hand on a socket, with ``length`` as its Content-Length, then the client's side closed (as a
    dying uploader's is); the whole answer the endpoint gave."""
    url = urlsplit(endpoint)
    lines = [
        f"PUT {path} HTTP/1.1",
        f"Host: {url.netloc}",
        f"Content-Length: {len(body) if length is None else length}",
    ]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((url.hostname, url.port), timeout=120) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        sock.shutdown(socket.SHUT_WR)  # no more bytes will come: what was sent is all the endpoint gets
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _absent(s3, bucket: str, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as err:
        return err.response["Error"]["Code"] in {"404", "NoSuchKey"}
    return False


@pytest.mark.parametrize("with_checksum", [False, True], ids=["plain", "with-x-amz-checksum-sha256"])
def test_a_put_cut_short_by_its_client_is_refused_and_nothing_is_stored(aws_env, with_checksum):
    s3 = boto3.client("s3")
    bucket = _bucket(s3)
    whole = bytes(range(250)) * 4  # the 1,000 bytes the uploader meant to send; 400 arrive before it dies
    headers = (
        {"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(whole).digest()).decode()} if with_checksum else {}
    )
    answer = _raw_put(aws_env["AWS_ENDPOINT_URL"], f"/{bucket}/out/part-0.parquet", headers, whole[:400], 1000)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"<Code>IncompleteBody</Code>" in answer and b"400 of 1000 bytes" in answer
    assert _absent(s3, bucket, "out/part-0.parquet")
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0  # no half object for a reader listing the prefix


class _Crc32:
    """zlib's CRC32 as a hashlib-like object: S3's checksum header carries it big-endian."""

    def __init__(self, data: bytes):
        self.value = zlib.crc32(data)

    def digest(self) -> bytes:
        return self.value.to_bytes(4, "big")


@pytest.mark.parametrize(
    ("argument", "digest"),
    [
        ("ChecksumSHA256", hashlib.sha256),
        ("ChecksumSHA1", hashlib.sha1),
        ("ChecksumCRC32", _Crc32),
        ("ContentMD5", hashlib.md5),
    ],
)
def test_a_body_its_checksum_header_disagrees_with_is_refused_and_nothing_is_stored(aws_env, argument, digest):
    from botocore.exceptions import ClientError

    s3 = boto3.client("s3")
    bucket = _bucket(s3)
    body = b"the bytes that arrived"
    wrong = base64.b64encode(digest(b"the bytes that were meant").digest()).decode()
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key="k", Body=body, **{argument: wrong})
    assert refused.value.response["Error"]["Code"] == "BadDigest"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert _absent(s3, bucket, "k")
    right = base64.b64encode(digest(body).digest()).decode()
    s3.put_object(Bucket=bucket, Key="k", Body=body, **{argument: right})
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == body


def test_a_wrong_payload_hash_or_a_malformed_checksum_is_refused(aws_env):
    s3 = boto3.client("s3")
    bucket = _bucket(s3)
    endpoint = aws_env["AWS_ENDPOINT_URL"]
    other = hashlib.sha256(b"something else").hexdigest()
    answer = _raw_put(endpoint, f"/{bucket}/a", {"x-amz-content-sha256": other}, b"payload")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"<Code>XAmzContentSHA256Mismatch</Code>" in answer
    answer = _raw_put(endpoint, f"/{bucket}/b", {"x-amz-checksum-sha256": "not base64!"}, b"payload")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"<Code>InvalidRequest</Code>" in answer
    answer = _raw_put(endpoint, f"/{bucket}/c", {"Content-MD5": "AAAA"}, b"payload")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"<Code>InvalidDigest</Code>" in answer
    assert all(_absent(s3, bucket, key) for key in "abc")
    # The same requests with the right values are stored.
    right = {
        "x-amz-content-sha256": hashlib.sha256(b"payload").hexdigest(),
        "x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(b"payload").digest()).decode(),
        "Content-MD5": base64.b64encode(hashlib.md5(b"payload").digest()).decode(),
    }
    assert _raw_put(endpoint, f"/{bucket}/d", right, b"payload").startswith(b"HTTP/1.1 200 ")
    assert s3.get_object(Bucket=bucket, Key="d")["Body"].read() == b"payload"


def test_boto3_s_own_uploads_still_go_through_whole(aws_env, tmp_path):
    """What boto3 sends over HTTP (a CRC32 or SHA256 checksum header and the payload's hash, a multipart upload's
    parts, DeleteObjects' body) passes the checks: the worker's uploads and provisioning's are not refused."""
    from boto3.s3.transfer import TransferConfig

    s3 = boto3.client("s3")
    bucket = _bucket(s3)
    data = os.urandom(3 << 20) * 7  # 21 MiB
    s3.put_object(Bucket=bucket, Key="put", Body=data[: 5 << 20])
    s3.put_object(Bucket=bucket, Key="put-sha256", Body=data[: 5 << 20], ChecksumAlgorithm="SHA256")
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    s3.upload_file(str(path), bucket, "multipart", Config=TransferConfig(multipart_threshold=8 << 20))
    s3.upload_file(  # as the worker uploads an output (worker/job/uploads.py)
        str(path), bucket, "whole", ExtraArgs={"ChecksumAlgorithm": "SHA256"}, Config=TransferConfig(use_threads=False)
    )
    for key, want in [("put", data[: 5 << 20]), ("put-sha256", data[: 5 << 20]), ("multipart", data), ("whole", data)]:
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == want, key
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "put"}]})
    assert _absent(s3, bucket, "put")


def test_an_aws_chunked_body_is_left_to_moto_and_a_stalled_one_answered_as_s3_does():
    from shardline.local.moto_atomic import Refused, check_body

    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    # Its checksum describes the decoded payload (or trails it): not checked against the framed bytes.
    check_body({"HTTP_CONTENT_ENCODING": "aws-chunked", "HTTP_X_AMZ_CHECKSUM_SHA256": wrong}, b"5\r\nhello\r\n0\r\n")
    check_body({"HTTP_X_AMZ_CONTENT_SHA256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER"}, b"5\r\nhello\r\n0\r\n")
    with pytest.raises(Refused):
        check_body({"HTTP_X_AMZ_CHECKSUM_SHA256": wrong}, b"hello")

    class Stalled:
        def read(self, size: int = -1) -> bytes:
            raise TimeoutError("timed out")

    answered = []
    called = []
    call = one_at_a_time(lambda environ, start_response: called.append(True), threading.Lock())
    reply = call({"wsgi.input": Stalled(), "CONTENT_LENGTH": "10"}, lambda status, headers: answered.append(headers))
    assert b"<Code>RequestTimeout</Code>" in b"".join(reply) and ("Connection", "close") in answered[0]
    assert not called
