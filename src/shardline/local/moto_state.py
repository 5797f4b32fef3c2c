"""The embedded endpoint's state on disk: S3's buckets and objects and DynamoDB's tables and items, kept in a folder.

moto keeps its state in memory only. With a state folder (``python -m shardline.local.moto_atomic --state-dir
DIR``), every write request leaves, before its answer goes out, a record of what it changed in ``DIR/state.log``:
the new state of each object key (all its versions, its body and tags) or item it touched, or of a bucket's or
table's settings, or that it is gone. Records are moto's own objects, pickled (moto's S3 keys pickle their body).
At start the log is read and the latest record of each thing put back into moto, so a restart, or a ``kill -9``
mid-write, finds every answered write. A record cut short by a kill is dropped (its request was never
answered). The log is rewritten with only the live records when more than half of it is superseded.

Why not moto's own request recorder: it appends every request (each body too), grows with every byte ever
written and replays requests, whose clock and random ids (LastModified, multipart upload ids) come out new.
Records of resulting state put back the same objects, ETags and times.

Left out: multipart uploads in progress (an upload under way when the endpoint stops starts again, as after S3
aborts it), SQS queues and SageMaker jobs, and S3 or DynamoDB features the project does not use (streams,
backups). The folder holds one moto version's objects: another version refuses it and says how to wipe it.
"""

from __future__ import annotations

import copy
import fcntl
import json
import logging
import os
import pickle
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from shardline.errors import PermanentError
from shardline.waiting import wait_for

log = logging.getLogger("shardline.local.moto_state")

LOG_NAME = "state.log"
FORMAT = 1
RECORD_HEADER = struct.Struct(">II")  # payload length, its CRC32
READS = ("GET", "HEAD", "OPTIONS")
LOCK_WAIT_SECONDS = 30  # a restart finds the endpoint it replaces still stopping
# DynamoDB calls that change nothing; any other call is a write (an unknown one is saved in full).
DYNAMODB_READS = frozenset(
    {
        "GetItem",
        "BatchGetItem",
        "Query",
        "Scan",
        "DescribeTable",
        "ListTables",
        "DescribeTimeToLive",
        "ListTagsOfResource",
        "TransactGetItems",
        "DescribeContinuousBackups",
        "DescribeEndpoints",
        "DescribeLimits",
        "ListBackups",
        "DescribeBackup",
        "ListExports",
        "ListImports",
        "DescribeKinesisStreamingDestination",
        "DescribeExport",
        "DescribeImport",
        "GetResourcePolicy",
    }
)


class StateError(PermanentError):
    """The state folder cannot be read back as it was written (another moto version, a damaged log)."""


def _header() -> bytes:
    from moto import __version__

    return f"shardline moto state {FORMAT} moto {__version__}\n".encode()


def _backends(service: str) -> list[tuple[str, str, Any]]:
    """(account, region or partition, backend) of every backend of ``service`` moto has made."""
    from moto.backends import get_backend

    return [
        (account, region, backend)
        for account, regions in get_backend(service).items()
        for region, backend in regions.items()
    ]


def _backend(service: str, account: str, region: str) -> Any:
    from moto.backends import get_backend

    return get_backend(service)[account][region]


def _bucket_shell(bucket: Any) -> Any:
    """The bucket's settings without its keys (saved one by one) and multipart uploads (not saved)."""
    shell = copy.copy(bucket)
    shell.keys = type(bucket.keys)()
    shell.multiparts = type(bucket.multiparts)()
    return shell


def _table_shell(table: Any) -> Any:
    shell = copy.copy(table)
    shell.items = type(table.items)(dict)
    return shell


def _typed(value: dict) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


class StateLog:
    """The state folder of one endpoint process: loaded once at start, then appended after each write request."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / LOG_NAME
        self.file = None
        self.buckets: dict[tuple, tuple[Any, bytes]] = {}  # (account, partition, name) -> (bucket, its shell pickled)
        self.keys: dict[tuple, dict[str, tuple]] = {}  # bucket id -> {key: the versions saved last}
        self.tables: dict[tuple, tuple[Any, bytes]] = {}  # (account, region, name) -> (table, its shell pickled)
        self.items: dict[tuple, set[str]] = {}  # table id -> the item keys saved

    # -- start ---------------------------------------------------------------------------------------------

    def load(self, wait: float = LOCK_WAIT_SECONDS) -> dict[str, int]:
        """Put the folder's state back into moto, rewrite the log when it is mostly superseded, open it for writes;
        what was put back, counted. One endpoint at a time holds a folder: a restart waits for the one stopping."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock(wait)
        latest, size, good = self._read()
        counts = self._restore(latest)
        live = sum(len(payload) + RECORD_HEADER.size for payload in latest.values())
        if size != good:
            log.warning("dropped %d bytes of a record cut short at the end of %s", size - good, self.path)
        if not self.path.exists() or live * 2 < good or size != good:
            self._rewrite(latest.values())  # also cuts off a torn record, so that new ones follow whole ones
        self.file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held for the process's life
        return counts

    def _lock(self, wait: float) -> None:

        self.lock = open(self.folder / "lock", "a+")  # noqa: SIM115 - held (and so locked) for the process's life

        def locked() -> bool:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        if not wait_for(locked, timeout=wait):
            raise StateError(
                f"another endpoint keeps its state in {self.folder} and is still running after {wait:.0f}s: stop it "
                "first (shardline local down, or docker compose stop aws)"
            )

    def _read(self) -> tuple[dict[tuple, bytes], int, int]:
        """The latest record of each thing, the log's size, and where its last whole record ends."""
        if not self.path.exists():
            return {}, 0, 0
        data = self.path.read_bytes()
        header = _header()
        first = data.split(b"\n", 1)[0] + b"\n"
        if first != header:
            raise StateError(
                f"{self.path} was written by {first.decode(errors='replace').strip()!r}, and this endpoint is "
                f"{header.decode().strip()!r}: it cannot read it. Wipe the state (delete {self.folder}) and start "
                "again, or start the endpoint with the moto version that wrote it"
            )
        latest: dict[tuple, bytes] = {}
        at = len(header)
        while at + RECORD_HEADER.size <= len(data):
            length, crc = RECORD_HEADER.unpack_from(data, at)
            payload = data[at + RECORD_HEADER.size : at + RECORD_HEADER.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break  # cut short by a kill mid-write: that request was never answered
            what, value = pickle.loads(payload)
            if value is None:
                latest.pop(what, None)  # gone: nothing to put back
            else:
                latest[what] = payload
            at += RECORD_HEADER.size + length
        return latest, len(data), at

    def _restore(self, latest: dict[tuple, bytes]) -> dict[str, int]:
        counts = {"buckets": 0, "objects": 0, "tables": 0, "items": 0}
        ordered = sorted(latest.items(), key=lambda pair: pair[0][0] in ("s3-key", "ddb-item"))
        for what, payload in ordered:
            value = pickle.loads(pickle.loads(payload)[1])
            kind, account, region, name = what[:4]
            if kind == "s3-bucket":
                backend = _backend("s3", account, region)
                backend.buckets[name] = value
                self.buckets[what[1:]] = (value, pickle.dumps(_bucket_shell(value)))
                counts["buckets"] += 1
            elif kind == "ddb-table":
                _backend("dynamodb", account, region).tables[name] = value
                self.tables[what[1:]] = (value, pickle.dumps(_table_shell(value)))
                counts["tables"] += 1
            elif kind == "s3-key":
                bucket = _backend("s3", account, region).buckets.get(name)
                if bucket is None:
                    continue
                versions, tags = value
                bucket.keys.setlist(what[4], versions)
                tagger = _backend("s3", account, region).tagger
                for arn, tag_dict in tags.items():
                    tagger.tags[arn] = tag_dict
                self.keys.setdefault(what[1:4], {})[what[4]] = tuple(versions)
                counts["objects"] += 1
            elif kind == "ddb-item":
                table = _backend("dynamodb", account, region).tables.get(name)
                if table is None:
                    continue
                hash_key, range_key, item = value
                if range_key is None:
                    table.items[hash_key] = item
                else:
                    table.items[hash_key][range_key] = item
                self.items.setdefault(what[1:4], set()).add(what[4])
                counts["items"] += 1
        return counts

    def _rewrite(self, payloads) -> None:
        temporary = self.path.with_name(LOG_NAME + ".new")
        with open(temporary, "wb") as out:
            out.write(_header())
            for payload in payloads:
                out.write(RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)

    # -- after each write request ------------------------------------------------------------------------

    def after(self, environ: dict, status: str, body: bytes) -> None:
        """Record what a request changed, before its answer goes out (called under the endpoint's lock)."""
        method = environ.get("REQUEST_METHOD", "GET")
        if method in READS:
            return
        target = environ.get("HTTP_X_AMZ_TARGET") or ""
        if target.startswith("DynamoDB_"):
            operation = target.rsplit(".", 1)[-1]
            if operation not in DYNAMODB_READS:
                self._dynamodb(operation, body)
        elif not target and not (environ.get("PATH_INFO") or "").startswith("/moto-api/"):
            self._s3(environ, status)
        elif (environ.get("PATH_INFO") or "").startswith("/moto-api/reset"):
            self._s3(environ, status)
            self._dynamodb("Reset", b"")

    def _append(self, what: tuple, value: Any) -> None:
        payload = pickle.dumps((what, None if value is None else pickle.dumps(value)))
        record = RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        view = memoryview(record)
        while view:
            view = view[self.file.write(view) :]

    def _s3(self, environ: dict, status: str) -> None:
        named = _named_keys(environ)
        for account, partition, backend in _backends("s3"):
            for where, bucket in self._containers("s3-bucket", (account, partition), backend.buckets, self.buckets):
                keys = [key for bucket_name, key in named if bucket_name == where[2]]
                if keys and all(keys):
                    for key in keys:
                        self._save_key(backend, bucket, where, key, force=status.startswith("2"))
                elif keys:  # a request on the bucket (DeleteObjects among them): every key it holds is checked
                    self._diff_keys(backend, bucket, where)

    def _containers(self, record: str, place: tuple, found: dict, saved: dict) -> Iterator[tuple[tuple, Any]]:
        """Each bucket or table ``found`` in one account and region (``place``), as ``(where, container)``; its
        shell (its settings, without its keys or items) saved when new or changed, and those gone recorded gone.
        A container made again holds none of the old one's keys or items: they are forgotten."""
        shell_of, forget = (
            (_bucket_shell, self._forget_keys) if record == "s3-bucket" else (_table_shell, self._forget_items)
        )
        seen = set()
        for name, container in list(found.items()):
            where = (*place, name)
            seen.add(where)
            before = saved.get(where)
            shell = shell_of(container)
            pickled = pickle.dumps(shell)
            if before is None or before[0] is not container:
                forget(where)
            if before is None or before[0] is not container or before[1] != pickled:
                self._append((record, *where), shell)
                saved[where] = (container, pickled)
            yield where, container
        for where in [w for w in saved if w[:2] == place and w not in seen]:
            forget(where)
            self._append((record, *where), None)
            del saved[where]

    def _save_key(self, backend: Any, bucket: Any, where: tuple, key: str, force: bool) -> None:
        versions = bucket.keys.getlist(key)
        saved = self.keys.setdefault(where, {})
        if not versions:
            if key in saved:
                self._append(("s3-key", *where, key), None)
                del saved[key]
            return
        if not force and _same(saved.get(key), versions):
            return
        tags = {
            version.arn: backend.tagger.tags[version.arn] for version in versions if version.arn in backend.tagger.tags
        }
        self._append(("s3-key", *where, key), (list(versions), tags))
        saved[key] = tuple(versions)

    def _diff_keys(self, backend: Any, bucket: Any, where: tuple) -> None:
        saved = self.keys.setdefault(where, {})
        for key in set(saved) | set(dict.keys(bucket.keys)):
            self._save_key(backend, bucket, where, key, force=False)

    def _forget_keys(self, where: tuple) -> None:
        for key in self.keys.pop(where, {}):
            self._append(("s3-key", *where, key), None)

    def _dynamodb(self, operation: str, body: bytes) -> None:
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        touched = _touched_items(operation, request)
        for account, region, backend in _backends("dynamodb"):
            for where, table in self._containers("ddb-table", (account, region), backend.tables, self.tables):
                if touched is None:  # a write this module does not read (PartiQL): the whole table is saved
                    for hash_key, value in list(table.items.items()):
                        for range_key, item in value.items() if table.has_range_key else [(None, value)]:
                            self._save_item(where, hash_key, range_key, item)
                    continue
                for attributes in touched.get(where[2], []):
                    self._save_touched(table, where, attributes)

    def _save_touched(self, table: Any, where: tuple, attributes: dict) -> None:
        from moto.dynamodb.models.dynamo_type import DynamoType

        try:
            hash_key = DynamoType(attributes[table.hash_key_attr])
            range_key = DynamoType(attributes[table.range_key_attr]) if table.has_range_key else None
        except (KeyError, TypeError):
            return  # a request moto refused: it changed nothing
        found = table.items.get(hash_key)
        item = found.get(range_key) if table.has_range_key and found is not None else found
        self._save_item(where, hash_key, range_key, item)

    def _save_item(self, where: tuple, hash_key: Any, range_key: Any, item: Any) -> None:
        key = _typed({"h": hash_key.to_json(), "r": None if range_key is None else range_key.to_json()})
        saved = self.items.setdefault(where, set())
        if item is None:
            if key in saved:
                self._append(("ddb-item", *where, key), None)
                saved.discard(key)
            return
        self._append(("ddb-item", *where, key), (hash_key, range_key, item))
        saved.add(key)

    def _forget_items(self, where: tuple) -> None:
        for key in self.items.pop(where, set()):
            self._append(("ddb-item", *where, key), None)


def _same(saved: tuple | None, versions: list) -> bool:
    return (
        saved is not None and len(saved) == len(versions) and all(a is b for a, b in zip(saved, versions, strict=True))
    )


def _named_keys(environ: dict) -> list[tuple[str, str]]:
    """(bucket, key) pairs an S3 request's URL may name, path-style and virtual-host style (``key`` is "" for a
    request on the bucket); only pairs whose bucket exists are acted on."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO") or "/"
    path = unquote(urlsplit(raw).path).lstrip("/")
    bucket, _, key = path.partition("/")
    named = [(bucket, key)] if bucket else []
    host = (environ.get("HTTP_HOST") or "").rsplit(":", 1)[0]
    if "." in host:
        named.append((host.split(".", 1)[0], path))
    return named


def _touched_items(operation: str, request: dict) -> dict[str, list[dict]] | None:
    """The items a DynamoDB write names, by table (their key attributes among others); None when this module does
    not read the call (it is then saved whole)."""
    touched: dict[str, list[dict]] = {}

    def add(table: str | None, attributes: dict | None) -> None:
        if table and isinstance(attributes, dict):
            touched.setdefault(table.rsplit("table/", 1)[-1], []).append(attributes)

    if operation in ("PutItem", "UpdateItem", "DeleteItem"):
        add(request.get("TableName"), request.get("Item") or request.get("Key"))
    elif operation == "BatchWriteItem":
        for table, writes in (request.get("RequestItems") or {}).items():
            for write in writes:
                add(table, (write.get("PutRequest") or {}).get("Item") or (write.get("DeleteRequest") or {}).get("Key"))
    elif operation == "TransactWriteItems":
        for entry in request.get("TransactItems") or []:
            for kind in ("Put", "Update", "Delete"):
                if kind in entry:
                    add(entry[kind].get("TableName"), entry[kind].get("Item") or entry[kind].get("Key"))
    elif operation in ("ExecuteStatement", "BatchExecuteStatement", "ExecuteTransaction", "Reset"):
        return None
    return touched
