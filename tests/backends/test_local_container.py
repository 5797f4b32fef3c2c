"""The container runtime's pure parts and its endpoint forwarder, without a Docker engine.

That the image really runs these commands, and scores as the host does, is ``make test-stack``'s
(tests/stack/test_worker_image.py).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from shardline import contract
from shardline.backends import local_container
from shardline.backends.local_supervisor import local_path

REQUEST = {
    "ProcessingJobName": "sl-p-score-abc-a1",
    "ProcessingResources": {"ClusterConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1}},
    "AppSpecification": {"ImageUri": "shardline-worker:local", "ContainerArguments": ["--exit-zero-on-file-failures"]},
    "Environment": {"SHARDLINE_LEDGER_TABLE": "t", "AWS_REGION": "eu-west-1"},
    "ProcessingInputs": [
        {"InputName": "data", "S3Input": {"S3Uri": "s3://b/m.json", "LocalPath": contract.DATA_DIR}},
        {"InputName": "model", "S3Input": {"S3Uri": "s3://b/model.tar.gz", "LocalPath": contract.MODEL_DIR}},
    ],
}


def test_an_instance_runs_the_requests_image_arguments_environment_and_paths(tmp_path):
    instance = tmp_path / "algo-1"
    mounts = local_container.instance_mounts(REQUEST, instance, local_path)
    command = local_container.container_command(
        REQUEST, instance, "algo-1", environment={"AWS_REGION": "us-east-1"}, network="jobs-net", mounts=mounts
    )

    # The image's own entrypoint, given exactly the request's ContainerArguments (no host path, no python -m).
    image_at = command.index("shardline-worker:local")
    assert command[image_at + 1 :] == REQUEST["AppSpecification"]["ContainerArguments"]
    assert "--entrypoint" not in command and "--user" not in command  # the image's entrypoint and user
    assert command[command.index("--network") + 1] == "jobs-net"
    assert {"--cap-drop", "ALL"} <= set(command)
    # Inputs read-only at their LocalPaths, the worker's output folder writable (its outputs wait there for their
    # upload; the request declares no output, since each instance uploads its own), the resource config read-only.
    binds = {
        m.split("target=")[1].split(",")[0]: m
        for m in (command[i + 1] for i, arg in enumerate(command) if arg == "--mount")
    }
    assert set(binds) == {
        contract.DATA_DIR,
        contract.MODEL_DIR,
        contract.OUTPUT_DIR,
        contract.RESOURCE_CONFIG,
        contract.CONTAINER_TMP,
    }
    # Bounded as an instance: a read-only image (its /tmp this instance's own folder), a cap on processes.
    assert "--read-only" in command and int(command[command.index("--pids-limit") + 1]) >= 4096
    assert f"source={instance / 'tmp'}" in binds[contract.CONTAINER_TMP]
    assert "--cpus" in command and "--memory" in command
    read_only = (contract.DATA_DIR, contract.MODEL_DIR, contract.RESOURCE_CONFIG)
    assert all(binds[path].endswith(",readonly") for path in read_only)
    assert not binds[contract.OUTPUT_DIR].endswith(",readonly")
    assert f"source={instance / 'processing' / 'output'}" in binds[contract.OUTPUT_DIR]
    # The request's Environment wins over the supervisor's AWS settings; nothing else of this machine's.
    env = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--env")
    assert env == {"AWS_REGION": "eu-west-1", "SHARDLINE_LEDGER_TABLE": "t", "HOME": contract.CONTAINER_TMP}


def test_credentials_reach_the_container_by_name_never_on_its_command_line(tmp_path):
    """A command line is readable by every user of the machine (``ps``, /proc/PID/cmdline): a credential is passed
    by name, its value in the docker CLI's own environment."""
    secrets = {"AWS_ACCESS_KEY_ID": "AKIAPROBE", "AWS_SECRET_ACCESS_KEY": "probe-secret", "AWS_SESSION_TOKEN": "tok"}
    environment = {"AWS_REGION": "us-east-1", **secrets}
    command = local_container.container_command(
        REQUEST, tmp_path, "algo-1", environment=environment, network="jobs-net", mounts=[]
    )
    assert not [arg for arg in command if any(value in arg for value in secrets.values())], command
    passed = [command[i + 1] for i, arg in enumerate(command) if arg == "--env"]
    assert set(secrets) <= set(passed)  # by name: docker takes each value from its own environment
    cli = local_container.cli_environment(REQUEST, environment, {"PATH": "/usr/bin", "DOCKER_HOST": "unix:///x"})
    assert cli == {"PATH": "/usr/bin", "DOCKER_HOST": "unix:///x", **secrets}


def test_a_ca_bundle_of_this_machine_is_mounted_where_the_container_reads_it(tmp_path):
    """AWS_CA_BUNDLE names a file here: the container gets that file, read-only, and the path it has there;
    a bundle that is not a readable file here is left out rather than pointing at nothing."""
    bundle = tmp_path / "corp-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    env, mounts = local_container.with_ca_bundle({"AWS_REGION": "us-east-1", "AWS_CA_BUNDLE": str(bundle)})
    assert env == {"AWS_REGION": "us-east-1", "AWS_CA_BUNDLE": local_container.CONTAINER_CA_BUNDLE}
    assert mounts == [(bundle.resolve(), local_container.CONTAINER_CA_BUNDLE, True)]
    command = local_container.container_command(
        REQUEST, tmp_path, "algo-1", environment=env, network="jobs-net", mounts=mounts
    )
    assert f"type=bind,source={bundle.resolve()},target={local_container.CONTAINER_CA_BUNDLE},readonly" in command
    assert f"AWS_CA_BUNDLE={local_container.CONTAINER_CA_BUNDLE}" in command and str(bundle) not in " ".join(
        a for a in command if a.startswith("AWS_CA_BUNDLE")
    )
    assert local_container.with_ca_bundle({"AWS_CA_BUNDLE": str(tmp_path / "absent.pem")}) == ({}, [])
    assert local_container.with_ca_bundle({"AWS_REGION": "us-east-1"}) == ({"AWS_REGION": "us-east-1"}, [])


def test_a_request_that_asks_for_network_isolation_gets_no_network(tmp_path):
    isolated = {**REQUEST, "NetworkConfig": {"EnableNetworkIsolation": True}}
    command = local_container.container_command(
        isolated, tmp_path, "algo-1", environment={}, network="jobs-net", mounts=[]
    )
    assert command[command.index("--network") + 1] == "none"


@pytest.mark.parametrize(
    ("asked", "docker", "image", "runtime"),
    [
        ("process", True, True, "process"),
        ("auto", False, False, "process"),
        ("auto", True, False, "process"),  # no image: processes, and a warning
        ("auto", True, True, "docker"),
        ("docker", True, True, "docker"),
    ],
)
def test_the_runtime_is_docker_whenever_it_can_be_unless_told(asked, docker, image, runtime):
    assert local_container.runtime_for(asked, "img:tag", engine_answers=docker, has_image=image) == runtime


@pytest.mark.parametrize(
    ("asked", "docker", "image", "says"),
    [
        ("docker", False, False, "no Docker engine answers"),
        ("docker", True, False, "has no image img:tag"),
        ("podman", True, True, "expected one of"),
    ],
)
def test_asking_for_docker_where_it_cannot_run_names_why(asked, docker, image, says):
    with pytest.raises(local_container.ContainerRuntimeError, match=says):
        local_container.runtime_for(asked, "img:tag", engine_answers=docker, has_image=image)
    if asked == "podman":
        with pytest.raises(local_container.ContainerRuntimeError, match=says):
            local_container.choose_runtime("img:tag", {"SHARDLINE_LOCAL_RUNTIME": asked})


def test_a_sample_runs_in_the_image_with_its_folders_mapped_and_no_network(tmp_path):
    root = tmp_path / "preview"
    root.mkdir()
    command = [
        "/venv/bin/python",
        "-m",
        "shardline.worker",
        "--input-dir",
        str(root / "data"),
        "--host",
        "preview",
        "--preview-json",
        str(root / "preview.json"),
        "--model-sha256",
        "ab" * 32,
    ]
    boxed = local_container.worker_in_image(command, "shardline-worker:local", {root: "/opt/ml/preview"})
    image_at = boxed.index("shardline-worker:local")
    assert boxed[image_at + 1 :] == [
        "--input-dir",
        "/opt/ml/preview/data",
        "--host",
        "preview",
        "--preview-json",
        "/opt/ml/preview/preview.json",
        "--model-sha256",
        "ab" * 32,
    ]
    assert boxed[boxed.index("--network") + 1] == "none"
    assert f"type=bind,source={root},target=/opt/ml/preview" in boxed


def test_the_forwarder_carries_a_loopback_endpoint_and_only_it(tmp_path):
    """The jobs' one way out: each loopback endpoint gets a forwarder; an endpoint elsewhere is left as given."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo_once():
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"echo:" + conn.recv(100))

    threading.Thread(target=echo_once, daemon=True).start()
    environ = {
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
        "AWS_ENDPOINT_URL_DYNAMODB": f"http://localhost:{port}",
        "AWS_ENDPOINT_URL_STS": "https://sts.eu-west-1.amazonaws.com",
        "AWS_REGION": "eu-west-1",
    }
    with local_container.endpoint_routes(environ, "127.0.0.2") as routes:
        assert set(routes) == {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_STS"}
        assert routes["AWS_ENDPOINT_URL_STS"] == environ["AWS_ENDPOINT_URL_STS"]
        host, _, forwarded = routes["AWS_ENDPOINT_URL_S3"].removeprefix("http://").partition(":")
        assert host == "127.0.0.2" and int(forwarded) != port
        with socket.create_connection((host, int(forwarded)), timeout=10) as client:
            client.sendall(b"ping")
            assert client.recv(100) == b"echo:ping"
    server.close()
    with pytest.raises(OSError):  # closed with the job
        socket.create_connection((host, int(forwarded)), timeout=2)


def test_process_workers_get_credentials_as_values_and_a_home_of_their_own(tmp_path, monkeypatch):
    from shardline.backends.local_supervisor import worker_environment

    credentials = tmp_path / "credentials"
    credentials.write_text("[default]\naws_access_key_id = AKIAFROMFILE\naws_secret_access_key = from-file\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("HOME", str(tmp_path / "airflow-home"))
    env = worker_environment({"Environment": {"X": "1"}}, tmp_path / "algo-1")
    assert env["AWS_ACCESS_KEY_ID"] == "AKIAFROMFILE" and env["X"] == "1"
    assert "AWS_SHARED_CREDENTIALS_FILE" not in env
    assert Path(env["HOME"]) == tmp_path / "algo-1" / "home" and Path(env["HOME"]).is_dir()


@pytest.mark.parametrize(
    ("environ", "network"),
    [
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:5000"}, local_container.JOB_NETWORK),
        (
            {"AWS_ENDPOINT_URL_DYNAMODB": "http://localhost:8000", "AWS_ENDPOINT_URL": "https://elsewhere"},
            local_container.JOB_NETWORK,
        ),
        ({"AWS_ENDPOINT_URL_DYNAMODB": "https://dynamodb.eu-west-1.amazonaws.com"}, None),
        ({}, None),  # AWS itself: Docker's default network
    ],
)
def test_the_internal_network_is_used_when_the_ledgers_endpoint_is_on_this_machine(environ, network):
    assert local_container.network_for(environ) == network


@pytest.mark.parametrize(
    ("inspected", "problem"),
    [
        ("true false 172.30.0.1", None),
        ("false false 172.30.0.1", "not internal"),
        ("true true 172.30.0.1", "can reach each other"),
        ("true <no value> 172.30.0.1", "can reach each other"),  # Docker's default: containers talk
        ("true false ", "no gateway"),
        ("true false 0.0.0.0", "no gateway"),
        ("", "not internal"),
    ],
)
def test_the_jobs_network_is_a_box_or_refused(inspected, problem):
    """Internal (no route out), no traffic between containers (no job reaches another's instances), and a
    gateway for the job's endpoint to listen on (an empty one would listen on every address of this machine)."""
    found = local_container.network_problem(inspected)
    assert (found is None) if problem is None else (problem in found), found


@pytest.mark.parametrize(
    ("instance_type", "vcpus", "gib"),
    [("ml.m5.xlarge", 4, 16), ("ml.c5.2xlarge", 8, 16), ("ml.r5.large", 2, 16), ("ml.g4dn.xlarge", 4, 16)],
)
def test_an_instance_is_sized_as_its_type_and_never_above_this_machine(instance_type, vcpus, gib):
    limits = local_container.size_limits(instance_type)
    cpus, memory = float(limits[limits.index("--cpus") + 1]), int(limits[limits.index("--memory") + 1])
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert cpus == min(vcpus, os.cpu_count())
    assert memory == min(gib << 30, machine)
    assert limits[limits.index("--memory-swap") + 1] == str(memory)  # no swap beyond it
    assert local_container.size_limits("not-a-type") == []


def _held_connection(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=30)


def _closed_at_once(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` without a word (what a connection past a cap gets)."""
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def test_the_forwarder_holds_at_most_its_cap_of_connections_and_frees_a_slot_when_one_ends():
    """A model that opens connections without end gets at most the cap's worth of forwarded connections (two
    threads each): the next is closed as it comes, and a slot is free again once a connection ends."""
    from shardline.waiting import wait_for

    upstream = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: [accepted.append(upstream.accept()[0]) for _ in range(3)], daemon=True).start()
    forwarder = local_container.Forwarder("127.0.0.1", upstream.getsockname()[:2], connections=2)
    try:
        first, second = _held_connection(forwarder.address), _held_connection(forwarder.address)
        assert wait_for(lambda: len(accepted), lambda n: n == 2, timeout=30) == 2  # both forwarded, and held
        third = _held_connection(forwarder.address)
        assert _closed_at_once(third)  # past the cap
        first.close()
        accepted[0].close()
        # The slot comes back once the first connection's two pipes end; then a new connection is forwarded.
        fourth = wait_for(
            lambda: _held_connection(forwarder.address),
            lambda sock: wait_for(lambda: len(accepted), lambda n: n == 3, timeout=2) == 3,
            timeout=30,
        )
        assert len(accepted) == 3
        for sock in (second, third, fourth, *accepted):
            sock.close()
    finally:
        forwarder.close()
        upstream.close()


def test_each_job_gets_a_network_name_of_its_own():
    names = {local_container.job_network_name(f"sl-daily-churn-score-{i:04d}-a1") for i in range(1000)}
    assert len(names) == 1000  # no two jobs share one
    assert local_container.job_network_name("sl-x") == local_container.job_network_name("sl-x")  # a retry finds it
    assert all(len(n) <= 64 and n.startswith("shardline-job-") for n in names)
    assert local_container.JOB_NETWORK not in names
