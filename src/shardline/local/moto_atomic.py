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

    python -m shardline.local.moto_atomic -p PORT -H 127.0.0.1
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

WsgiApp = Callable[[dict, Callable], Any]


MAX_BODY_BYTES = 1 << 30  # 1 GiB: boto3 uploads large objects in parts of 8 MiB; a request body is held in memory
SOCKET_TIMEOUT_SECONDS = 120  # a connection silent this long (mid-request or idle) is closed


def one_at_a_time(app_call: WsgiApp, lock: threading.Lock, max_body: int = MAX_BODY_BYTES) -> WsgiApp:
    """``app_call`` (a WSGI ``__call__``) run under ``lock``: the backend's work for one request at a time.

    The request's body is read first, outside the lock, so a slow upload holds up no other client; a body
    over ``max_body`` bytes is refused with 413 before it is read. The response is built inside the call
    (moto answers with a complete body), so holding the lock for the call holds it for the whole
    read-check-write of a request.
    """

    def call(*args: Any) -> Any:
        environ, start_response = args[-2:]  # (self, environ, start_response) as a method, or the last two
        try:
            body = _read_body(environ, max_body)
        except _TooLarge as err:
            start_response("413 Request Entity Too Large", [("Content-Type", "text/plain"), ("Connection", "close")])
            return [str(err).encode()]
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        with lock:
            return app_call(*args)

    call.one_at_a_time = True
    call.__wrapped__ = app_call
    return call


class _TooLarge(Exception):
    pass


def _read_body(environ: dict, max_body: int) -> bytes:
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    length = environ.get("CONTENT_LENGTH") or ""
    if length.strip():
        wanted = int(length)
        if wanted > max_body:
            raise _TooLarge(f"request body of {wanted} bytes is over the embedded endpoint's cap of {max_body}")
        return stream.read(wanted) if wanted else b""
    if not environ.get("wsgi.input_terminated"):
        return b""  # no length and not chunked: no body (reading would wait for the client to hang up)
    # A chunked upload (the server ends the stream at its last chunk): read to its end, within the cap.
    body = stream.read(max_body + 1)
    if len(body) > max_body:
        raise _TooLarge(f"request body is over the embedded endpoint's cap of {max_body} bytes")
    return body


def install() -> None:
    """Make moto's server application handle one request at a time (idempotent), each connection with a
    socket timeout."""
    from moto import server
    from werkzeug import serving

    dispatcher = server.DomainDispatcherApplication
    if not getattr(dispatcher.__call__, "one_at_a_time", False):
        dispatcher.__call__ = one_at_a_time(dispatcher.__call__, threading.Lock())
    serving.WSGIRequestHandler.timeout = SOCKET_TIMEOUT_SECONDS  # socketserver sets it on each connection


def main(argv: list[str] | None = None) -> None:
    from moto import server

    install()
    server.main(argv)


if __name__ == "__main__":
    main()
