"""The endpoint a local job's instances reach AWS through: each request is checked against the job's grant
(:class:`~shardline.grant.job.JobGrant`) before it goes on to the real endpoint; the rest is refused as AWS
refuses it (S3: 403 ``AccessDenied``; DynamoDB: 400 ``AccessDeniedException``), so the worker and a model's code
see what they would see on SageMaker with the job role.

Bodies stream through (an output of gigabytes is never held in memory); only a DynamoDB call's JSON and an S3
DeleteObjects' XML, which the decision reads, are read whole (both are small: AWS caps them at 16 MB and 1,000
keys). Every request goes on with the endpoint's own Host, so the endpoint reads each the way the check did.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import json
import logging
import re
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

from shardline.grant.job import JobGrant, JobScope
from shardline.grant.policy import IamRequest
from shardline.grant.requests import Unreadable, access_key_of, requests_of, service_of
from shardline.ledger.requests import kind_of_http

log = logging.getLogger(__name__)

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}
COPY_CHUNK = 1 << 20
CONNECTION_LIMIT = 512  # at once, per proxy: a job's pool opens a few per process
SMALL_BODY_LIMIT = 32 << 20  # a DynamoDB call's JSON or a DeleteObjects' XML: far above AWS's own limits


class Refused(Exception):
    def __init__(self, service: str, reason: str):
        super().__init__(reason)
        self.service = service


def emulated_endpoints(environ) -> dict[str, str] | None:
    """The S3 and DynamoDB endpoints of ``environ`` when both are emulated (plain HTTP, as moto_server is), so a
    proxy can read each request; None when either is AWS's own (HTTPS), where IAM enforces the job role."""
    found = {
        "s3": environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL"),
        "dynamodb": environ.get("AWS_ENDPOINT_URL_DYNAMODB") or environ.get("AWS_ENDPOINT_URL"),
    }
    if all(url and urlsplit(url).scheme == "http" for url in found.values()):
        return found
    return None


class GrantProxy:
    """One job's endpoint on ``host``:``port`` (0: a free one). ``upstreams``: the real endpoint per service
    (``s3``, ``dynamodb``). ``refusals`` counts what it refused; ``on_refusal`` hears each (the job's log).
    ``grant_for`` instead of ``grant``: many jobs' endpoint, each request checked against the grant of the job
    whose name signs it (its access key id), refused when there is none."""

    def __init__(
        self,
        grant: JobGrant | None,
        upstreams: dict[str, str],
        host: str = "127.0.0.1",
        on_refusal: Callable[[str], None] | None = None,
        *,
        port: int = 0,
        grant_for: Callable[[str], JobGrant | None] | None = None,
        connections: int = CONNECTION_LIMIT,
    ):
        if (grant is None) == (grant_for is None):
            raise ValueError("a grant proxy checks one job's grant or finds each job's: give grant or grant_for")
        self.grant_for = grant_for or (lambda _key: grant)
        self._many = grant_for is not None
        self.upstreams = {service: urlsplit(url) for service, url in upstreams.items()}
        self.refusals = 0
        self.requests: collections.Counter[str] = collections.Counter()  # let through, by kind (:meth:`count`)
        self.on_refusal = on_refusal or (lambda text: log.warning("%s", text))
        self._lock = threading.Lock()
        handler = type("Handler", (_GrantHandler,), {"proxy": self})
        self._server = _BoundedServer((host, port), handler, connections)
        self._thread = threading.Thread(target=self._server.serve_forever, name="grant-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> GrantProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def check(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> str:
        """The service to send the request on to; :class:`Refused` when the grant does not allow it."""
        try:
            service, _ = service_of(path, headers)
            key = access_key_of(path, headers)
            found = requests_of(method, path, headers, body or b"")
        except Unreadable as err:
            raise self.refuse("s3" if "x-amz-target" not in headers else "dynamodb", str(err)) from None
        grant = self.grant_for(key)
        if grant is None:
            raise self.refuse(service, f"no job's grant is filed for the access key {key!r}: a job signs with its name")
        denied = [r for r in found if not grant.allows(r)]
        if denied:
            raise self.refuse(service, (f"job {key}: " if self._many else "") + _not_authorized(denied[0]))
        return service

    def count(self, kind: str) -> None:
        """One request let through, by billing kind (``ledger.requests``): what the job's control plane costs, as the
        wire shows it."""
        with self._lock:
            self.requests[kind] += 1

    def refuse(self, service: str, reason: str) -> Refused:
        with self._lock:
            self.refusals += 1
        self.on_refusal(f"refused (the job role's grant): {reason}")
        return Refused(service, reason)


class _BoundedServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most ``connections`` at once: one past that is closed as it comes (the client
    retries as it would), so a model that opens connections without end costs this machine no more than that."""

    daemon_threads = True

    def __init__(self, address, handler, connections: int = CONNECTION_LIMIT):
        self._slots = threading.BoundedSemaphore(connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _not_authorized(request: IamRequest) -> str:
    return (
        f"the job's role is not authorized to perform: {request.action} on resource: {request.resource} "
        "because no statement of the job role (the CloudFormation template's SageMakerExecutionRole, enforced "
        "here as on AWS) allows it"
    )


class _Unframed(Exception):
    """A request whose headers or framing can be read more than one way."""


def _framing(message) -> tuple[dict[str, str], bool, int]:
    """(headers by lower-case name, chunked, Content-Length) of a request; :class:`_Unframed` when a header is
    repeated (the endpoint may read another of its values than the check did) or the length is no plain number."""
    names = [name.lower() for name in message]  # a Message iterates over every header, repeats too
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise _Unframed(f"the header(s) {', '.join(repeated)} given more than once")
    headers = {k.lower(): v for k, v in message.items()}
    encoding = headers.get("transfer-encoding", "").strip().lower()
    if encoding not in ("", "chunked"):
        raise _Unframed(f"a Transfer-Encoding {encoding!r} the proxy does not read")
    declared = headers.get("content-length", "0").strip() or "0"
    if not declared.isdigit() or not declared.isascii():
        raise _Unframed(f"a Content-Length {declared[:20]!r} that is no length")
    if encoding and "content-length" in headers:
        raise _Unframed("both a Content-Length and a Transfer-Encoding")
    return headers, encoding == "chunked", int(declared)


def _needs_body(method: str, path: str, headers: dict[str, str]) -> bool:
    """Whether the decision reads the body: a DynamoDB call, or an S3 DeleteObjects (POST ?delete)."""
    if "x-amz-target" in headers:
        return True
    query = urlsplit(path).query
    return method == "POST" and any(part.split("=", 1)[0] == "delete" for part in query.split("&"))


class _GrantHandler(http.server.BaseHTTPRequestHandler):
    """Relays one client connection's requests, each checked by ``proxy`` first."""

    proxy: GrantProxy  # set on the subclass each GrantProxy makes
    protocol_version = "HTTP/1.1"
    upstream_connections: dict[str, http.client.HTTPConnection]

    def setup(self) -> None:
        super().setup()
        self.upstream_connections = {}

    def finish(self) -> None:
        for connection in self.upstream_connections.values():
            connection.close()
        super().finish()

    def log_message(self, *args) -> None:  # quiet: refusals are logged, each with its reason
        pass

    def _relay(self) -> None:
        try:
            headers, chunked, length = _framing(self.headers)
            body = None
            if _needs_body(self.command, self.path, headers):
                body = self._read_chunked() if chunked else self._read(length)
                chunked, length = False, len(body)
        except _Unframed as err:
            # The request cannot be read one way only (a repeated header, a length that is no length): refused, and
            # the connection closed, since where its body ends is not known.
            self.close_connection = True
            self.proxy.refuse("s3", str(err))
            self._answer(
                400,
                f"<Error><Code>BadRequest</Code><Message>{escape(str(err))}</Message></Error>".encode(),
                {"Content-Type": "application/xml", "Connection": "close"},
            )
            return
        try:
            service = self.proxy.check(self.command, self.path, headers, body)
        except Refused as refused:
            if body is None:
                self._drain(chunked, length)
            self._refusal(refused)
            return
        self.proxy.count(kind_of_http(self.command, self.path, headers))
        try:
            self._forward(service, headers, body, chunked, length)
        except (OSError, http.client.HTTPException):
            # The endpoint is down, frozen or cut off: the client sees its connection end, as it would without a
            # proxy (and retries as it would), never an answer the endpoint did not give.
            self.upstream_connections.pop(service, None)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _relay

    def _connection(self, service: str) -> http.client.HTTPConnection:
        if service not in self.upstream_connections:
            upstream = self.proxy.upstreams[service]
            self.upstream_connections[service] = http.client.HTTPConnection(
                upstream.hostname, upstream.port or 80, timeout=300
            )
        return self.upstream_connections[service]

    def _forward(self, service: str, headers: dict, body: bytes | None, chunked: bool, length: int) -> None:
        upstream = self._connection(service)
        upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() not in HOP_BY_HOP:
                upstream.putheader(name, value)
        upstream.putheader("Host", self.proxy.upstreams[service].netloc)
        if chunked:
            upstream.putheader("Transfer-Encoding", "chunked")
        else:
            upstream.putheader("Content-Length", str(length if body is None else len(body)))
        upstream.endheaders()
        if body is not None:
            upstream.send(body)
        elif chunked:
            self._copy_chunked(upstream)
        else:
            self._copy(upstream, length)
        answer = upstream.getresponse()
        self.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD" or answer.status in (204, 304):
            declared = answer.getheader("Content-Length")
            if declared is not None:
                self.send_header("Content-Length", declared)
            self.end_headers()
            answer.read()
        elif answer.chunked or answer.length is None:
            data = answer.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_header("Content-Length", str(answer.length))
            self.end_headers()
            while data := answer.read(COPY_CHUNK):
                self.wfile.write(data)
        if answer.will_close:
            self.upstream_connections.pop(service, None)

    def _copy(self, upstream: http.client.HTTPConnection, length: int) -> None:
        left = length
        while left > 0:
            data = self.rfile.read(min(COPY_CHUNK, left))
            if not data:
                raise ConnectionError("the client sent less than its Content-Length")
            upstream.send(data)
            left -= len(data)

    def _read(self, length: int) -> bytes:
        if length > SMALL_BODY_LIMIT:
            raise _Unframed(f"a body of {length} bytes, larger than any this call takes")
        return self.rfile.read(length)

    def _chunks(self, limit: int | None = None):
        total = 0
        while True:
            size_text = self.rfile.readline(1024).split(b";", 1)[0].strip()
            if not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", size_text):
                raise _Unframed(f"a chunk size {size_text[:20]!r} that is no hexadecimal length")
            size = int(size_text, 16)
            total += size
            if limit is not None and total > limit:
                raise _Unframed(f"a body of more than {limit} bytes, larger than any this call takes")
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            data = self.rfile.read(size)
            self.rfile.readline(1024)  # the CRLF after the chunk
            yield data

    def _read_chunked(self) -> bytes:
        return b"".join(self._chunks(SMALL_BODY_LIMIT))

    def _copy_chunked(self, upstream: http.client.HTTPConnection) -> None:
        for data in self._chunks():
            upstream.send(b"%x\r\n%s\r\n" % (len(data), data))
        upstream.send(b"0\r\n\r\n")

    def _drain(self, chunked: bool, length: int) -> None:
        """Read a refused request's body, so the connection can carry the next request."""
        if chunked:
            for _ in self._chunks():
                pass
            return
        left = length
        while left > 0 and (data := self.rfile.read(min(COPY_CHUNK, left))):
            left -= len(data)

    def _refusal(self, refused: Refused) -> None:
        if refused.service == "dynamodb":
            body = json.dumps(
                {"__type": "com.amazon.coral.service#AccessDeniedException", "message": str(refused)}
            ).encode()
            self._answer(
                400, body, {"Content-Type": "application/x-amz-json-1.0", "x-amzn-ErrorType": "AccessDeniedException"}
            )
            return
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            f"<Message>{escape(str(refused))}</Message><RequestId>shardline-local-grant</RequestId></Error>"
        ).encode()
        self._answer(403, body, {"Content-Type": "application/xml"})

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response_only(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def main(argv: list[str]) -> int:
    """``python -m shardline.grant.proxy REQUEST_JSON HOST``: serve one job's grant proxy on ``HOST`` (a free
    port) until terminated; the first line on stdout is its URL. Its own process, so that the job's network does
    not stop when its supervisor does (a supervisor a test freezes, or one that is busy)."""
    import os
    import signal
    import sys
    from pathlib import Path

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [grant] %(message)s")
    request = json.loads(Path(argv[0]).read_text())
    upstreams = emulated_endpoints(os.environ)
    if upstreams is None:
        print("none", flush=True)  # AWS's own endpoints: IAM enforces the job role there
        return 0
    stop, supervisor = threading.Event(), os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with GrantProxy(JobGrant.of(JobScope.of_request(request, os.environ)), upstreams, host=argv[1]) as proxy:
        print(proxy.url, flush=True)
        sys.stdout.close()
        # Until the supervisor ends it, or dies without a word (killed with -9): a job's proxy never outlives it.
        counted = Path(argv[0]).with_name(REQUESTS_FILE)
        while not stop.wait(1.0) and os.getppid() == supervisor:
            _write_counts(proxy, counted)
        _write_counts(proxy, counted)
    return 0


REQUESTS_FILE = "grant-requests.json"  # beside the job's request: what its proxy let through, by kind


def _write_counts(proxy: GrantProxy, path) -> None:
    """The requests the proxy let through so far, by kind, written whole (a reader never sees half a file)."""
    with proxy._lock:
        text = json.dumps(dict(sorted(proxy.requests.items())))
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
