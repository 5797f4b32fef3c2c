"""The one way out of the jobs' internal network when a local job's endpoints are AWS's own.

Against emulated endpoints the job's grant proxy is its way out (``shardline.grant``). Against AWS itself the
instances speak TLS to AWS, which no proxy here can read, and IAM checks each request against the job role's
session (``local_credentials``). What is left to this machine is where the instances may connect at all: an HTTP
``CONNECT`` proxy on the network's gateway that opens a tunnel, on port 443, to the endpoints of the services a job
calls (S3, DynamoDB, STS, CloudWatch Logs) in the job's region (and to an endpoint the job was given), and to nothing
else: not another service, not another region, not a name under ``amazonaws.com`` that is anyone's server (an EC2
instance's public name, an API Gateway, a load balancer). S3 serves every account: the tunnel cannot tell whose bucket
a path-style request names (TLS hides it), so this bounds where the bytes go, not whose account receives them (on
AWS, a VPC endpoint policy for S3 does that).
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from shardline.backends import local_container

log = logging.getLogger(__name__)

# The services a job's instances call: S3 (inputs, model, outputs), DynamoDB (the ledger), STS (their session) and
# CloudWatch Logs.
JOB_SERVICES = ("s3", "dynamodb", "sts", "logs")
_CONNECT = re.compile(rb"CONNECT ([A-Za-z0-9.-]+):(\d{1,5}) HTTP/1\.[01]\r\n")
# A bucket's name as a host's first label (botocore writes a bucket without dots so, virtual-hosted; one with dots
# goes path-style to the S3 endpoint itself).
_BUCKET_LABEL = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
HEADER_LIMIT = 16 << 10


def job_region(environ: Mapping[str, str], request: Mapping | None = None) -> str:
    """The region the instances' clients use: the request's own, else this machine's (us-east-1 without one)."""
    own = (request or {}).get("Environment", {})
    for env in (own, environ):
        if region := env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"):
            return region.lower()
    return "us-east-1"


def service_hosts(region: str) -> frozenset[str]:
    """The endpoints of :data:`JOB_SERVICES` in ``region``, as botocore names them (its older versions too): in
    us-east-1 S3's global name, and STS's global name in AWS's commercial partition."""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    hosts = {f"{service}.{region}.{suffix}" for service in JOB_SERVICES}
    if region == "us-east-1":
        hosts.add("s3.amazonaws.com")
    if suffix == "amazonaws.com":
        hosts.add("sts.amazonaws.com")
    return frozenset(hosts)


def _buckets_of(request: Mapping) -> frozenset[str]:
    """The buckets a request names anywhere (its inputs, outputs, manifests and the URIs in its environment)."""
    found: set[str] = set()

    def walk(value) -> None:
        if isinstance(value, str) and value.startswith("s3://"):
            found.add(value[len("s3://") :].split("/", 1)[0])
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(request)
    return frozenset(found)


def aws_destinations(environ: Mapping[str, str], request: Mapping | None = None) -> Callable[[str, int], bool]:
    """Where a job's instances may open a tunnel to: on 443, the endpoints of S3, DynamoDB, STS and CloudWatch Logs in
    the job's region (:func:`job_region`), and S3's virtual-hosted names (``<bucket>.s3.<region>.amazonaws.com``)
    of the request's own buckets, or of any bucket without ``request`` (a path-style request names any bucket inside
    the tunnel anyway); and each endpoint its environment names (``AWS_ENDPOINT_URL*``) on its own port."""
    named = set()
    for name, url in environ.items():
        if name == "AWS_ENDPOINT_URL" or name.startswith("AWS_ENDPOINT_URL_"):
            parts = urlsplit(url)
            if parts.hostname:
                named.add((parts.hostname.lower(), parts.port or (443 if parts.scheme == "https" else 80)))
    hosts = service_hosts(job_region(environ, request))
    s3_hosts = {h for h in hosts if h.startswith("s3.")}
    buckets = None if request is None else _buckets_of(request)

    def virtual_hosted(host: str) -> bool:
        bucket, _, rest = host.partition(".")
        if rest not in s3_hosts or not _BUCKET_LABEL.fullmatch(bucket):
            return False
        return buckets is None or bucket in buckets

    def allowed(host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        return (host, port) in named or (port == 443 and (host in hosts or virtual_hosted(host)))

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
