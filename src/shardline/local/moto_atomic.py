"""moto's standalone server, with each request handled alone, so a conditional write is atomic as on AWS.

moto's UpdateItem reads the item, checks the condition, then validates and applies the update,
with no lock in between, and its server runs every request in a thread of its own. Two
conditional writes racing for one item can then both pass their check: two resubmissions of a
step both planned attempt 2 (``test_fencing_two_resubmissions_at_once...``, on a busy machine).
DynamoDB never lets that happen, and the ledger's fencing relies on it. So the project starts
moto's own server (``moto.server.main``, the ``moto_server`` command) through this module, with
its application wrapped so that one request runs at a time. Connections are still served by
threads, so an idle keep-alive connection never holds up another client; moto's work was
serialized by the GIL already, so little is lost. A request's body is read inside the lock, so
a client that stalls halfway through an upload holds up the others until it goes on or its
connection drops: the clients here are the project's own, on loopback.

    python -m shardline.local.moto_atomic -p PORT -H 127.0.0.1
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

WsgiApp = Callable[[dict, Callable], Any]


def one_at_a_time(app_call: WsgiApp, lock: threading.Lock) -> WsgiApp:
    """``app_call`` (a WSGI ``__call__``) run under ``lock``: the backend's work for one request at a time.

    The response is built inside the call (moto answers with a complete body), so holding the lock
    for the call holds it for the whole read-check-write of a request.
    """

    def call(*args: Any) -> Any:
        with lock:
            return app_call(*args)

    call.one_at_a_time = True
    call.__wrapped__ = app_call
    return call


def install() -> None:
    """Make moto's server application handle one request at a time (idempotent)."""
    from moto import server

    dispatcher = server.DomainDispatcherApplication
    if not getattr(dispatcher.__call__, "one_at_a_time", False):
        dispatcher.__call__ = one_at_a_time(dispatcher.__call__, threading.Lock())


def main(argv: list[str] | None = None) -> None:
    from moto import server

    install()
    server.main(argv)


if __name__ == "__main__":
    main()
