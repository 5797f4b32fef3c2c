"""The AWS requests a job makes, by kind: what its control plane costs (DynamoDB, S3, SQS, CloudWatch).

A worker counts every HTTP request its own clients send (:class:`RequestCounter`, on botocore's ``before-send``
event: a retry is a request, as AWS bills it) and records the counts on its SHARD item with each heartbeat. The local
backend's grant proxy, which every request of a job passes through, counts the same requests from the wire
(:func:`kind_of_http`): the two are compared by a test. The kinds are those AWS prices apart (``report.cost``).
Pure but for the counter's hook, which takes any botocore client and imports nothing.
"""

from __future__ import annotations

import collections
import threading
from urllib.parse import parse_qs, urlsplit

# DynamoDB: reads, writes, and the items of a transaction (each billed as two units: report.cost).
DYNAMODB_READS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})
DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"})
# S3's two request tiers (PUT, COPY, POST, LIST; GET and the rest), and DELETE, which is free.
S3_PUTS = frozenset(
    {"PutObject", "CopyObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "PostObject"}
)
S3_LISTS = frozenset({"ListObjectsV2", "ListObjects", "ListObjectVersions", "ListMultipartUploads", "ListParts"})
S3_DELETES = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})


def kind_of(service: str, operation: str) -> str:
    """The billing kind of one request of ``service`` (botocore's name: ``s3``, ``dynamodb``...) and ``operation``."""
    if service == "dynamodb":
        if operation == "TransactWriteItems":
            return "dynamodb.transact"
        if operation in DYNAMODB_READS:
            return "dynamodb.read"
        return "dynamodb.write" if operation in DYNAMODB_WRITES else "other.request"
    if service == "s3":
        if operation in S3_PUTS:
            return "s3.put"
        if operation in S3_LISTS:
            return "s3.list"
        return "s3.delete" if operation in S3_DELETES else "s3.get"
    if service == "sqs":
        return "sqs.request"
    if service in ("cloudwatch", "logs"):
        return "cloudwatch.request"
    return "other.request"


def kind_of_http(method: str, path: str, headers: dict[str, str]) -> str:
    """The billing kind of one HTTP request as the wire shows it (headers by lower-case name): a DynamoDB call by its
    ``X-Amz-Target``, an S3 request by its method, key and query (path-style, as the emulated endpoints take it)."""
    target = headers.get("x-amz-target", "")
    if target.startswith("DynamoDB_"):
        return kind_of("dynamodb", target.split(".", 1)[1])
    if target:
        return "sqs.request" if target.startswith("AmazonSQS") else "other.request"
    parts = urlsplit(path)
    query = parse_qs(parts.query, keep_blank_values=True)
    has_key = "/" in parts.path.strip("/")
    if method == "DELETE" or (method == "POST" and "delete" in query):
        return "s3.delete"
    if method in ("PUT", "POST"):
        return "s3.put"
    if method == "GET" and not has_key and ("list-type" in query or "versions" in query or not query):
        return "s3.list"
    if method == "GET" and has_key and "uploadId" in query:
        return "s3.list"  # ListParts
    return "s3.get"


class RequestCounter:
    """Counts the HTTP requests the clients it watches send, by billing kind. Thread-safe."""

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def watch(self, client) -> None:
        """Count every request ``client`` (a botocore client) sends from now on, retries included."""
        client.meta.events.register("before-send", self._sent)

    def _sent(self, event_name: str = "", **_) -> None:
        # event_name: "before-send.<service>.<Operation>"
        _, service, operation = [*event_name.split("."), "", ""][:3]
        kind = kind_of(service, operation)
        with self._lock:
            self._counts[kind] += 1

    def counts(self, **ahead: int) -> dict[str, int]:
        """The counts so far, plus ``ahead`` (kind with its dot as an underscore: ``dynamodb_transact=1``): requests
        about to be sent that the counts are recorded with (the heartbeat that carries them)."""
        with self._lock:
            found = collections.Counter(self._counts)
        for name, n in ahead.items():
            found[name.replace("_", ".", 1)] += n
        return {kind: n for kind, n in sorted(found.items()) if n}
