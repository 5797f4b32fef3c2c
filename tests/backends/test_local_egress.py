"""The jobs' one way out when their endpoints are AWS's own: a CONNECT-only proxy on the jobs' network's gateway
that opens tunnels to AWS's endpoints (and an endpoint the job was given) and to nothing else."""

from __future__ import annotations

import socket
import threading

import pytest

from shardline.backends import local_egress


@pytest.mark.parametrize(
    ("host", "port", "allowed"),
    [
        ("s3.us-east-1.amazonaws.com", 443, True),
        ("my-bucket.s3.eu-west-1.amazonaws.com", 443, True),
        ("dynamodb.eu-west-1.amazonaws.com", 443, True),
        ("s3.cn-north-1.amazonaws.com.cn", 443, True),
        ("S3.US-EAST-1.AMAZONAWS.COM.", 443, True),
        ("s3.us-east-1.amazonaws.com", 80, False),  # TLS only
        ("amazonaws.com.attacker.example", 443, False),
        ("attacker.example", 443, False),
        ("169.254.169.254", 80, False),  # the instance metadata service: Airflow's own role
        ("vpce.internal.example", 8443, True),  # named by the job's own endpoint variable
    ],
)
def test_tunnels_go_to_aws_and_the_jobs_own_endpoints_only(host, port, allowed):
    destinations = local_egress.aws_destinations({"AWS_ENDPOINT_URL_S3": "https://vpce.internal.example:8443"})
    assert destinations(host, port) is allowed


def _echo_server() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(
                target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(4096), b"")], daemon=True
            ).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


def _ask(proxy: local_egress.EgressProxy, head: bytes) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(proxy.address, timeout=30)
    sock.sendall(head)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    return sock, answer


def test_the_proxy_tunnels_to_an_admitted_destination_and_refuses_the_rest():
    echo = _echo_server()
    port = echo.getsockname()[1]
    proxy = local_egress.EgressProxy("127.0.0.1", lambda host, p: (host, p) == ("127.0.0.1", port))
    try:
        # Bytes sent with the request, before the answer, belong to the tunnel too.
        sock, answer = _ask(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\nearly".encode())
        # The echo of "early" may come in the same read as the answer's head: it is the tunnel's first bytes.
        head, _, received = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        sock.sendall(b"-and-late")
        while len(received) < len(b"early-and-late"):
            received += sock.recv(4096)
        assert received == b"early-and-late"
        sock.close()

        refused, answer = _ask(proxy, f"CONNECT 127.0.0.1:{port + 1} HTTP/1.1\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 403") and refused.recv(1) == b""
        assert proxy.refusals == [f"127.0.0.1:{port + 1}"]
        plain, answer = _ask(proxy, b"GET http://attacker.example/ HTTP/1.1\r\nHost: attacker.example\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 405")
        for s in (refused, plain):
            s.close()
    finally:
        proxy.close()
        echo.close()
