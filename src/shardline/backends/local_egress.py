"""The one way out of the jobs' internal network when a local job's endpoints are AWS's own.

Against emulated endpoints the job's grant proxy is its way out (``shardline.grant``). Against AWS itself the
instances speak TLS to AWS, which no proxy here can read, and IAM checks each request against the job role's
session (``local_credentials``). What is left to this machine is where the instances may connect at all: an HTTP
``CONNECT`` proxy on the network's gateway that opens a tunnel to AWS's own endpoints on port 443 (and to an
endpoint the job was given), and to nothing else, so model code cannot send what it reads anywhere but AWS. AWS
includes other accounts' buckets: the tunnel cannot tell whose bucket a request names (TLS hides it), so this bounds
where the bytes go, not whose account receives them (on AWS, a VPC endpoint policy for S3 does that).
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from shardline.backends import local_container

log = logging.getLogger(__name__)

# AWS's own service endpoints (commercial, China, and the dual-stack api.aws names).
_AWS_HOST = re.compile(r"(?:[a-z0-9-]+\.)+(?:amazonaws\.com|amazonaws\.com\.cn|api\.aws)")
_CONNECT = re.compile(rb"CONNECT ([A-Za-z0-9.-]+):(\d{1,5}) HTTP/1\.[01]\r\n")
HEADER_LIMIT = 16 << 10


def aws_destinations(environ: Mapping[str, str]) -> Callable[[str, int], bool]:
    """Where a job's instances may open a tunnel to: any AWS endpoint on 443, and each endpoint its environment
    names (``AWS_ENDPOINT_URL*``) on its own port."""
    named = set()
    for name, url in environ.items():
        if name == "AWS_ENDPOINT_URL" or name.startswith("AWS_ENDPOINT_URL_"):
            parts = urlsplit(url)
            if parts.hostname:
                named.add((parts.hostname.lower(), parts.port or (443 if parts.scheme == "https" else 80)))

    def allowed(host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        return (host, port) in named or (port == 443 and _AWS_HOST.fullmatch(host) is not None)

    return allowed


class EgressProxy(local_container.CappedTcpServer):
    """A ``CONNECT``-only proxy on ``listen_host``:(a free port) that tunnels to the destinations ``allowed`` admits
    and answers 403 to the rest (405 to anything but CONNECT); at most ``connections`` tunnels at once."""

    def __init__(self, listen_host: str, allowed: Callable[[str, int], bool], connections: int = 256):
        self.allowed = allowed
        self.refusals: list[str] = []
        super().__init__(listen_host, connections)

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    def handle(self, client: socket.socket) -> None:
        client.settimeout(30)
        head, early = _read_head(client)
        found = _CONNECT.match(head)
        if found is None:
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            return
        host, port = found.group(1).decode(), int(found.group(2))
        if not self.allowed(host, port):
            self.refusals.append(f"{host}:{port}")
            log.warning("refused a tunnel to %s:%d: the instances reach AWS's endpoints only", host, port)
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            return
        try:
            upstream = socket.create_connection((host, port), timeout=10)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            return
        client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        if early:  # what the client sent before it heard the answer belongs to the tunnel
            upstream.sendall(early)
        client.settimeout(None)
        upstream.settimeout(None)
        local_container.splice(client, upstream)


def _read_head(client: socket.socket) -> tuple[bytes, bytes]:
    """(the request's head, to its blank line; what came after it). An empty head past ``HEADER_LIMIT`` or on a
    connection that ends first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(4096)
        if not chunk or len(data) + len(chunk) > HEADER_LIMIT:
            return b"", b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest
