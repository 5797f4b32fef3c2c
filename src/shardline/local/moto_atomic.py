"""moto's standalone server, with each request handled alone, so a conditional write is atomic as on AWS.

moto's UpdateItem reads the item, checks the condition, then validates and applies the update,
with no lock in between, and its server runs every request in a thread of its own. Two
conditional writes racing for one item can then both pass their check: two resubmissions of a
step both planned attempt 2 (``test_fencing_two_resubmissions_at_once...``, on a busy machine).
DynamoDB never lets that happen, and the ledger's fencing relies on it. So the project starts
moto's own server (``moto.server.main``, the ``moto_server`` command) through this module, with
its application wrapped so that one request runs at a time. Connections are still served by
threads, so an idle keep-alive connection never holds up another client; moto's work was
serialized by the GIL already, so little is lost. A request's body is read before the lock is
taken, up to a size cap (a larger one is answered 413 without reading it), and every connection
has a socket timeout: a client that stalls halfway through an upload holds up nobody else, and
its thread gives up on it.

A body is also checked as S3 checks it, before moto sees it (moto stores whatever arrives): one shorter than its
Content-Length (an uploader that died mid-PUT) is refused with 400 ``IncompleteBody``, and one that disagrees with
its ``Content-MD5``, ``x-amz-content-sha256`` or ``x-amz-checksum-{crc32,sha1,sha256}`` header with 400
``BadDigest`` (or S3's code for that header); nothing is stored. A reader never finds half an object.

    python -m shardline.local.moto_atomic -p PORT -H 127.0.0.1 [--state-dir DIR]

With ``--state-dir``, its S3 and DynamoDB state is kept in DIR and survives a restart (:mod:`moto_state`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from shardline.local.moto_state import StateError, StateLog

WsgiApp = Callable[[dict, Callable], Any]


MAX_BODY_BYTES = 1 << 30  # 1 GiB: boto3 uploads large objects in parts of 8 MiB; a request body is held in memory
SOCKET_TIMEOUT_SECONDS = 120  # a connection silent this long (mid-request or idle) is closed


def one_at_a_time(
    app_call: WsgiApp, lock: threading.Lock, max_body: int = MAX_BODY_BYTES, state: StateLog | None = None
) -> WsgiApp:
    """``app_call`` (a WSGI ``__call__``) run under ``lock``: the backend's work for one request at a time.

    The request's body is read first, outside the lock, so a slow upload holds up no other client; a body
    over ``max_body`` bytes is refused with 413 before it is read, and one cut short or failing its checksum
    header is refused as S3 refuses it (:func:`check_body`), never passed on. The response is built inside the call
    (moto answers with a complete body), so holding the lock for the call holds it for the whole
    read-check-write of a request. With a ``state`` (:mod:`shardline.local.moto_state`), what a write changed is
    on disk before its answer goes out.
    """

    def call(*args: Any) -> Any:
        environ, start_response = args[-2:]  # (self, environ, start_response) as a method, or the last two
        try:
            body = _read_body(environ, max_body)
            check_body(environ, body)
        except Refused as refused:
            return refused.answer(environ, start_response)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        with lock:
            if state is None:
                return app_call(*args)
            statuses = []

            def started(status: str, headers: list, *rest: Any) -> Any:
                statuses.append(status)
                return start_response(status, headers, *rest)

            answer = app_call(*args[:-1], started)
            # Raised, this fails the request (500): a write not on disk is not answered as done.
            state.after(environ, statuses[0] if statuses else "", body)
            return answer

    call.one_at_a_time = True
    call.__wrapped__ = app_call
    return call


class Refused(Exception):
    """A request answered as S3 answers it, without reaching moto: ``status``, S3's error ``code`` and message."""

    def __init__(self, status: str, code: str, message: str, *, close: bool = False):
        super().__init__(message)
        self.status, self.code, self.message, self.close = status, code, message, close

    def answer(self, environ: dict, start_response: Callable) -> list[bytes]:
        if environ.get("HTTP_X_AMZ_TARGET"):  # DynamoDB (and every other JSON protocol) reads errors as JSON
            body = json.dumps({"__type": self.code, "message": self.message}).encode()
            headers = [("Content-Type", "application/x-amz-json-1.0")]
        else:
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{self.code}</Code>'
                f"<Message>{escape(self.message)}</Message></Error>"
            ).encode()
            headers = [("Content-Type", "application/xml")]
        # Where a cut-short body ends is not known: the connection is not read again.
        headers += [("Content-Length", str(len(body)))] + ([("Connection", "close")] if self.close else [])
        start_response(self.status, headers)
        return [body]


BAD_REQUEST = "400 Bad Request"
INCOMPLETE = "You did not provide the number of bytes specified by the Content-Length HTTP header"


def _read_body(environ: dict, max_body: int) -> bytes:
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    length = (environ.get("CONTENT_LENGTH") or "").strip()
    try:
        if length:
            if not length.isdigit():
                raise Refused(
                    BAD_REQUEST, "InvalidArgument", f"Content-Length {length[:20]!r} is no length", close=True
                )
            wanted = int(length)
            if wanted > max_body:
                raise Refused(
                    "413 Request Entity Too Large",
                    "EntityTooLarge",
                    f"request body of {wanted} bytes is over the embedded endpoint's cap of {max_body}",
                    close=True,
                )
            body = stream.read(wanted) if wanted else b""
            if len(body) < wanted:
                # The client closed its side before sending it all (an uploader that died mid-PUT): S3 stores
                # nothing and says so; storing what arrived would leave half an object under the key.
                raise Refused(
                    BAD_REQUEST,
                    "IncompleteBody",
                    f"{INCOMPLETE} ({len(body)} of {wanted} bytes arrived before the connection closed); nothing "
                    "was stored: send the request again",
                    close=True,
                )
            return body
        if not environ.get("wsgi.input_terminated"):
            return b""  # no length and not chunked: no body (reading would wait for the client to hang up)
        # A chunked upload (the server ends the stream at its last chunk): read to its end, within the cap.
        body = stream.read(max_body + 1)
    except TimeoutError as err:
        raise Refused(
            BAD_REQUEST,
            "RequestTimeout",
            "Your socket connection to the server was not read from or written to within the timeout period "
            f"({err or 'the body stalled'}); nothing was stored: send the request again",
            close=True,
        ) from err
    except OSError as err:  # a chunked body cut short, or the connection reset
        raise Refused(
            BAD_REQUEST, "IncompleteBody", f"the request body ended early ({err}); nothing was stored", close=True
        ) from err
    if len(body) > max_body:
        raise Refused(
            "413 Request Entity Too Large",
            "EntityTooLarge",
            f"request body is over the embedded endpoint's cap of {max_body} bytes",
            close=True,
        )
    return body


# The checksum headers S3 checks on a plain body: (the name S3 gives it, the digest). CRC32C and CRC64NVME need a
# library this environment may lack (moto falls back to CRC32 then), so they are left to moto.
CHECKSUMS = {
    "crc32": ("CRC32", lambda body: zlib.crc32(body).to_bytes(4, "big")),
    "sha1": ("SHA1", lambda body: hashlib.sha1(body, usedforsecurity=False).digest()),
    "sha256": ("SHA256", lambda body: hashlib.sha256(body).digest()),
}


def check_body(environ: dict, body: bytes) -> None:
    """Refuse (:class:`Refused`) a body its checksum headers disagree with, as S3 does; nothing is stored then.

    An ``aws-chunked`` body (``Content-Encoding: aws-chunked``, or a ``STREAMING-...`` payload hash) carries its
    own framing and trailing checksums, which moto decodes: its headers describe the decoded payload, so it is
    left to moto (boto3 sends one only over HTTPS, and this endpoint speaks HTTP)."""
    content_sha256 = (environ.get("HTTP_X_AMZ_CONTENT_SHA256") or "").strip()
    if "aws-chunked" in (environ.get("HTTP_CONTENT_ENCODING") or "") or content_sha256.startswith("STREAMING-"):
        return
    # boto3 sends the sha256 twice over HTTP when asked for a SHA256 checksum: the payload's hash and its checksum.
    wants_sha256 = len(content_sha256) == 64 or "HTTP_X_AMZ_CHECKSUM_SHA256" in environ
    sha256 = hashlib.sha256(body).digest() if wants_sha256 else b""
    md5 = environ.get("HTTP_CONTENT_MD5")
    if md5 is not None:
        given = _base64_digest(md5, 16)
        if given is None:
            raise Refused(BAD_REQUEST, "InvalidDigest", "The Content-MD5 you specified is not valid.")
        if given != hashlib.md5(body, usedforsecurity=False).digest():
            raise Refused(BAD_REQUEST, "BadDigest", "The Content-MD5 you specified did not match what we received.")
    if len(content_sha256) == 64 and content_sha256.lower() != sha256.hex():
        raise Refused(
            BAD_REQUEST,
            "XAmzContentSHA256Mismatch",
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        )
    # CompleteMultipartUpload's checksum header is the whole object's, not its body's.
    if environ.get("REQUEST_METHOD") == "POST" and "uploadId=" in (environ.get("QUERY_STRING") or ""):
        return
    for suffix, (name, digest) in CHECKSUMS.items():
        value = environ.get(f"HTTP_X_AMZ_CHECKSUM_{suffix.upper()}")
        if value is None:
            continue
        computed = sha256 if suffix == "sha256" else digest(body)
        given = _base64_digest(value, len(computed))
        if given is None:
            raise Refused(BAD_REQUEST, "InvalidRequest", f"Value for x-amz-checksum-{suffix} header is invalid.")
        if given != computed:
            raise Refused(BAD_REQUEST, "BadDigest", f"The {name} you specified did not match the calculated checksum.")


def _base64_digest(value: str, size: int) -> bytes | None:
    """The digest a header gives in base64, or None when it is not one of ``size`` bytes."""
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return digest if len(digest) == size else None


def install(state_dir: Path | None = None) -> None:
    """Make moto's server application handle one request at a time (idempotent), each connection with a
    socket timeout; with ``state_dir``, its state is put back from that folder and kept there."""
    from moto import server
    from werkzeug import serving

    dispatcher = server.DomainDispatcherApplication
    if not getattr(dispatcher.__call__, "one_at_a_time", False):
        state = None
        if state_dir is not None:
            started = time.monotonic()
            state = StateLog(state_dir)
            counts = state.load()
            took = time.monotonic() - started
            print(f"state kept in {state_dir}: put back {counts} in {took:.3f}s", flush=True)
        dispatcher.__call__ = one_at_a_time(dispatcher.__call__, threading.Lock(), state=state)
    serving.WSGIRequestHandler.timeout = SOCKET_TIMEOUT_SECONDS  # socketserver sets it on each connection


def main(argv: list[str] | None = None) -> None:
    """moto's server; ``--state-dir DIR`` (ours, taken out before moto reads the rest) keeps its state in DIR."""
    from moto import server

    argv = list(sys.argv[1:] if argv is None else argv)
    state_dir = None
    if "--state-dir" in argv:
        at = argv.index("--state-dir")
        state_dir = Path(argv[at + 1])
        del argv[at : at + 2]
    try:
        install(state_dir)
    except StateError as err:
        sys.exit(f"shardline: {err}")
    server.main(argv)


if __name__ == "__main__":
    main()
