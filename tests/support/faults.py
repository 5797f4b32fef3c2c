"""Real faults for tests: a moto_server of a test's own to freeze, and a TCP proxy that can refuse.

Nothing here is a mock. :class:`MotoServer` is the project's own ``start_moto`` in a process the
test owns, so it can be frozen (SIGSTOP) without disturbing the session's moto_server. :class:`TcpProxy`
forwards real TCP connections to it; ``refuse()`` closes its listening socket (a client's connect
then fails with ECONNREFUSED at once) and resets every connection it carries, ``accept()`` listens
again on the same port.
"""

from __future__ import annotations

import contextlib
import os
import random
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from shardline.local.embedded_aws import start_moto

# -- a dedicated moto_server ----------------------------------------------------------------------------------


class MotoServer:
    """A moto_server process of one test's own (``start_moto``), in its own process group."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path):
        self.proc, self.url, self.log_path = proc, url, log_path
        self.frozen = False

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def _signal(self, sig: signal.Signals) -> None:
        os.killpg(self.proc.pid, sig)  # start_moto starts it in a session of its own: pgid == pid

    def freeze(self) -> None:
        """SIGSTOP: the kernel still completes TCP handshakes, but nothing is answered."""
        self._signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)
        self.frozen = False

    def freeze_for(self, seconds: float) -> None:
        """Freeze for ``seconds``, then thaw (thawed even if the wait is interrupted)."""
        self.freeze()
        try:
            time.sleep(seconds)
        finally:
            self.thaw()

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.thaw()  # a stopped process does not act on SIGTERM until it runs again
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


@contextlib.contextmanager
def moto_server(directory: Path) -> Iterator[MotoServer]:
    """Start a dedicated moto_server logging under ``directory``; stop it (thawed first) at the end."""
    log_path = Path(directory) / "moto_server.log"
    proc, url = start_moto(log_path, tethered=True)  # never left running by a test killed mid-way
    server = MotoServer(proc, url, log_path)
    try:
        yield server
    finally:
        server.stop()


# -- a TCP proxy that can refuse ------------------------------------------------------------------------------


def _port_outside_ephemeral_range() -> int:
    """A free loopback port below the kernel's ephemeral range.

    While the proxy refuses, its port has no listener; a port of the ephemeral range could
    meanwhile be taken as the source port of some outgoing connection, and the proxy could not
    listen on it again.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    low = max(low, 2048)
    for _ in range(200):
        port = random.randrange(1024, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0): the peer's next read or write fails at once.

    ``shutdown(SHUT_RD)`` first wakes a thread blocked reading it (a plain close does not).
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class _Pair:
    """A client connection and the upstream connection it is forwarded to."""

    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.directions_done = 0


class TcpProxy:
    """Forwards every TCP connection on ``127.0.0.1:<port>`` to ``upstream`` (host, port), byte for byte.

    ``refuse()``: stop listening (new connections are refused by the kernel) and reset every open one.
    ``accept()``: listen again on the same port. Counts what it did in ``accepted`` and ``cut``.
    ``before_forwarding``: called with each chunk a client sends, before the chunk goes upstream (a test's
    hook to act at the moment a request is made, e.g. to change what the endpoint holds first).
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        port: int | None = None,
        before_forwarding: Callable[[bytes], None] | None = None,
    ):
        self.upstream = upstream
        self.before_forwarding = before_forwarding
        self.port = port or _port_outside_ephemeral_range()
        self.accepted = 0
        self.cut = 0
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stop_accepting = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def refusing(self) -> bool:
        return self._listener is None

    def __enter__(self) -> TcpProxy:
        self.accept()
        return self

    def __exit__(self, *exc) -> None:
        self.refuse()

    # -- toggles -------------------------------------------------------------------------------------------------

    def accept(self, timeout: float = 30.0) -> None:
        """Listen (again) on the proxy's port."""
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + timeout
        while True:
            try:
                listener.bind(("127.0.0.1", self.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    listener.close()
                    raise
                time.sleep(0.2)
        listener.listen(128)
        self._stop_accepting.clear()
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept_loop, args=(listener,), name="proxy-accept", daemon=True)
        self._acceptor.start()

    def refuse(self) -> None:
        """Stop listening, then reset every connection the proxy carries (both of its ends)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            self._stop_accepting.set()
            if self._acceptor is not None:
                self._acceptor.join(10)
            listener.close()  # connections queued in its backlog are reset by the kernel
        with self._lock:
            pairs, self._pairs = self._pairs, set()
            self.cut += len(pairs)
        for pair in pairs:
            _reset(pair.client)
            _reset(pair.upstream)

    # -- forwarding ----------------------------------------------------------------------------------------------

    def _accept_loop(self, listener: socket.socket) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(listener, selectors.EVENT_READ)
            while not self._stop_accepting.is_set():
                if not sel.select(timeout=0.1):
                    continue
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                threading.Thread(target=self._connect, args=(client,), name="proxy-conn", daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            _reset(client)  # the upstream is gone: the client sees its connection reset
            return
        upstream.settimeout(None)
        pair = _Pair(client, upstream)
        with self._lock:
            if self._stop_accepting.is_set():  # refuse() ran meanwhile
                cut = True
            else:
                cut = False
                self._pairs.add(pair)
                self.accepted += 1
        if cut:
            _reset(client)
            _reset(upstream)
            return
        threading.Thread(target=self._pump, args=(pair, client, upstream, True), name="proxy-up", daemon=True).start()
        self._pump(pair, upstream, client)

    def _pump(self, pair: _Pair, source: socket.socket, dest: socket.socket, from_client: bool = False) -> None:
        try:
            while data := source.recv(65536):
                if from_client and (hook := self.before_forwarding) is not None:
                    hook(data)
                dest.sendall(data)
            dest.shutdown(socket.SHUT_WR)  # pass the half-close on
        except OSError:
            self._end(pair, reset=True)  # one side broke, or refuse() cut the pair
            return
        with self._lock:
            pair.directions_done += 1
            both = pair.directions_done == 2
        if both:
            self._end(pair, reset=False)

    def _end(self, pair: _Pair, *, reset: bool) -> None:
        with self._lock:
            if pair not in self._pairs:
                return  # ended already (refuse() resets what it cuts)
            self._pairs.discard(pair)
        for sock in (pair.client, pair.upstream):
            if reset:
                _reset(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()


class ClearDenyingProxy:
    """An HTTP proxy in front of Airflow's API server that answers every real (not dry-run)
    ``clearTaskInstances`` with 403 and passes everything else through: a caller that may clear
    tasks when asked beforehand, and is then refused (a token revoked or expired in between).

    Use as a context manager; ``url`` is what the client talks to, ``denied`` counts refusals.
    """

    def __init__(self, upstream: str):
        import http.server
        import json as _json

        import httpx

        self.upstream = upstream.rstrip("/")
        self.denied = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.command == "POST" and self.path.split("?")[0].endswith("/clearTaskInstances"):
                    try:
                        dry_run = bool(_json.loads(body or b"{}").get("dry_run", True))
                    except ValueError:
                        dry_run = True
                    if not dry_run:
                        proxy.denied += 1
                        self._answer(403, b'{"detail": "Forbidden (denied by the test\'s proxy)"}')
                        return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(
                    self.command, proxy.upstream + self.path, headers=headers, content=body, timeout=60
                )
                self._answer(answer.status_code, answer.content, answer.headers.get("content-type"))

            def _answer(self, status: int, body: bytes, content_type: str | None = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type or "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _relay

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="clear-denying-proxy", daemon=True)

    def __enter__(self) -> ClearDenyingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
