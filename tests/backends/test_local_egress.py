"""The jobs' one way out when their endpoints are AWS's own: a CONNECT-only proxy on the jobs' network's gateway
that opens tunnels to the endpoints of the services a job calls, in its region (and an endpoint the job was given),
and to nothing else."""

from __future__ import annotations

import socket
import threading

import pytest

from shardline.backends import local_egress

MACHINE = {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL_S3": "https://vpce.internal.example:8443"}


@pytest.mark.parametrize(
    ("host", "port", "allowed"),
    [
        ("s3.eu-west-1.amazonaws.com", 443, True),
        ("my-bucket.s3.eu-west-1.amazonaws.com", 443, True),  # virtual-hosted, as botocore addresses a bucket
        ("dynamodb.eu-west-1.amazonaws.com", 443, True),
        ("sts.eu-west-1.amazonaws.com", 443, True),
        ("sts.amazonaws.com", 443, True),  # older botocore's STS name
        ("logs.eu-west-1.amazonaws.com", 443, True),
        ("S3.EU-WEST-1.AMAZONAWS.COM.", 443, True),
        ("vpce.internal.example", 8443, True),  # named by the job's own endpoint variable
        ("s3.eu-west-1.amazonaws.com", 80, False),  # TLS only
        # Found by review: any name under amazonaws.com was let through, and many are anyone's own server.
        ("ec2-203-0-113-5.eu-west-1.compute.amazonaws.com", 443, False),
        ("abc123.execute-api.eu-west-1.amazonaws.com", 443, False),
        ("my-lb-1234.eu-west-1.elb.amazonaws.com", 443, False),
        ("123456789012.dkr.ecr.eu-west-1.amazonaws.com", 443, False),
        ("sqs.eu-west-1.amazonaws.com", 443, False),  # a service the job never calls
        ("s3.us-east-1.amazonaws.com", 443, False),  # another region
        ("s3.amazonaws.com", 443, False),  # S3's global name is us-east-1's
        ("a.b.s3.eu-west-1.amazonaws.com", 443, False),  # a dotted bucket goes path-style
        ("amazonaws.com.attacker.example", 443, False),
        ("attacker.example", 443, False),
        ("169.254.169.254", 80, False),  # the instance metadata service: Airflow's own role
    ],
)
def test_tunnels_go_to_the_jobs_services_in_its_region_and_its_own_endpoints_only(host, port, allowed):
    assert local_egress.aws_destinations(MACHINE)(host, port) is allowed


REQUEST = {
    "ProcessingInputs": [{"InputName": "model", "S3Input": {"S3Uri": "s3://models/churn/model.tar.gz"}}],
    "ProcessingOutputConfig": {"Outputs": [{"S3Output": {"S3Uri": "s3://scores/daily_churn/"}}]},
    "Environment": {"AWS_REGION": "us-east-1", "SHARDLINE_INPUT_URI": "s3://events/dt=1/"},
}


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("s3.amazonaws.com", True),  # us-east-1: botocore's global name
        ("s3.us-east-1.amazonaws.com", True),
        ("events.s3.amazonaws.com", True),
        ("scores.s3.us-east-1.amazonaws.com", True),
        ("models.s3.amazonaws.com", True),
        ("dynamodb.us-east-1.amazonaws.com", True),
        ("attacker-drop.s3.amazonaws.com", False),  # a bucket the request does not name
        ("dynamodb.eu-west-1.amazonaws.com", False),  # the machine's region: the request's own comes first
    ],
)
def test_with_its_request_a_job_reaches_its_own_buckets_by_name_in_its_own_region(host, allowed):
    assert local_egress.aws_destinations(MACHINE, REQUEST)(host, 443) is allowed


def test_china_regions_have_their_own_suffix():
    destinations = local_egress.aws_destinations({"AWS_DEFAULT_REGION": "cn-north-1"})
    assert destinations("s3.cn-north-1.amazonaws.com.cn", 443)
    assert destinations("dynamodb.cn-north-1.amazonaws.com.cn", 443)
    assert not destinations("s3.cn-north-1.amazonaws.com", 443)


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


def test_the_proxy_refuses_a_server_of_anyones_under_amazonaws_com():
    proxy = local_egress.EgressProxy("127.0.0.1", local_egress.aws_destinations(MACHINE))
    try:
        sock, answer = _ask(proxy, b"CONNECT ec2-203-0-113-5.eu-west-1.compute.amazonaws.com:443 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403") and sock.recv(1) == b""
        sock.close()
        assert proxy.refusals == ["ec2-203-0-113-5.eu-west-1.compute.amazonaws.com:443"]
    finally:
        proxy.close()
