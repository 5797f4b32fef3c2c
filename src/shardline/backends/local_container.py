"""The local emulator's container runtime: each instance runs in the request's worker image, as on SageMaker.

SageMaker Processing starts the image's entrypoint with the request's ``ContainerArguments`` and
``Environment``, the inputs mounted at their ``LocalPath``s, as the image's own (non-root) user and with
no view of the machine that asked for the job. The process runtime cannot give model code that box:
it runs as Airflow's user, which can read Airflow's secrets in ``/proc/<pid>/environ`` and ``~/.aws``.
This runtime can, whenever a Docker engine answers and the image exists.

Network: a job's containers join an internal Docker network (no route out). When the AWS endpoint is
on this machine's loopback (the embedded moto_server), a forwarder on that network's gateway address
is the one way out, to that endpoint alone. A request with ``EnableNetworkIsolation`` gets no network.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from shardline import contract
from shardline.errors import ShardlineError

log = logging.getLogger(__name__)

ENV_RUNTIME = "SHARDLINE_LOCAL_RUNTIME"  # auto (default) | docker | process
RUNTIMES = ("auto", "docker", "process")
JOB_NETWORK = "shardline-local-jobs"  # internal: the jobs' containers reach nothing but the forwarded endpoint
JOB_LABEL = "shardline.job"  # on every container of a job, so stop() finds them from any process
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# The AWS settings a container gets from the supervisor: who it is and where AWS is. Nothing else of the
# submitter's environment crosses (no PATH, HOME or PYTHONPATH: the image has its own).
PASSED_AWS = frozenset({"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED", "AWS_CA_BUNDLE"})
BY_NAME = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"})  # never on a command line


class ContainerRuntimeError(ShardlineError):
    """The container runtime was asked for and cannot run: no engine, or no image."""


def docker_answers(timeout: float = 10.0) -> bool:
    """Whether a Docker CLI is on the PATH and its engine answers."""
    if not shutil.which("docker"):
        return False
    try:
        return (
            subprocess.run(
                ["docker", "version", "--format", "{{.Server.Version}}"],
                capture_output=True,
                timeout=timeout,
                check=False,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def image_present(image: str) -> bool:
    try:
        return (
            subprocess.run(
                ["docker", "image", "inspect", image], capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose_runtime(image: str, environ: Mapping[str, str] | None = None) -> str:
    """``docker`` or ``process`` for a job of ``image``: as ``SHARDLINE_LOCAL_RUNTIME`` says, or, when it says
    ``auto`` (the default), ``docker`` whenever an engine answers and has the image."""
    asked = (environ if environ is not None else os.environ).get(ENV_RUNTIME, "auto").strip().lower() or "auto"
    if asked == "process":
        return "process"
    engine = asked in RUNTIMES and docker_answers()
    return runtime_for(asked, image, engine_answers=engine, has_image=engine and image_present(image))


def runtime_for(asked: str, image: str, *, engine_answers: bool, has_image: bool) -> str:
    """The policy of :func:`choose_runtime`, given what it found."""
    if asked not in RUNTIMES:
        raise ContainerRuntimeError(f"{ENV_RUNTIME}={asked!r}: expected one of {', '.join(RUNTIMES)}")
    if asked == "process":
        return "process"
    if not engine_answers:
        if asked == "docker":
            raise ContainerRuntimeError(f"{ENV_RUNTIME}=docker, but no Docker engine answers (`docker version`)")
        return "process"
    if not has_image:
        if asked == "docker":
            raise ContainerRuntimeError(
                f"{ENV_RUNTIME}=docker, but the engine has no image {image}: build it with "
                f"`docker build -f inference_container/Dockerfile -t {image} .`"
            )
        log.warning("no image %s in the Docker engine: running the job's instances as processes", image)
        return "process"
    return "docker"


def network_for(environ: Mapping[str, str]) -> str | None:
    """The jobs' internal network when the endpoint the worker writes to (the ledger's DynamoDB) is on this
    machine's loopback, so a forwarder can be its one way out; None (Docker's default network) when the
    instances must reach AWS itself."""
    endpoint = environ.get("AWS_ENDPOINT_URL_DYNAMODB") or environ.get("AWS_ENDPOINT_URL")
    return JOB_NETWORK if endpoint and urlsplit(endpoint).hostname in LOOPBACK_HOSTS else None


ICC_OPTION = "com.docker.network.bridge.enable_icc"
_INSPECT = '{{.Internal}} {{index .Options "' + ICC_OPTION + '"}} {{(index .IPAM.Config 0).Gateway}}'


def network_problem(inspected: str) -> str | None:
    """What makes a network, as ``docker network inspect`` printed ``_INSPECT``, no box for the jobs: a route out
    (not ``--internal``), traffic between containers (another job's), or no gateway (the proxy would listen on
    every address of this machine). None when it is one."""
    internal, icc, gateway = ([*inspected.split(), "", "", ""])[:3]
    if internal != "true":
        return "it is not internal (its containers have a route out)"
    if icc != "false":
        return "its containers can reach each other (another job's instances too): enable_icc is not false"
    if not gateway or gateway in ("<no", "0.0.0.0"):
        return "it has no gateway address for the jobs' endpoint to listen on"
    return None


def ensure_job_network(name: str = JOB_NETWORK, job: str | None = None) -> str:
    """The internal network ``name`` a job's containers join (created when absent, with no traffic between
    containers: each reaches only its job's endpoint at the gateway); returns its gateway address. A network of
    that name that is no such box is made again, or refused while containers use it."""
    inspect = ["docker", "network", "inspect", name, "--format", _INSPECT]
    found = subprocess.run(inspect, capture_output=True, text=True, check=False)
    problem = network_problem(found.stdout) if found.returncode == 0 else "absent"
    if problem and problem != "absent":
        removed = subprocess.run(["docker", "network", "rm", name], capture_output=True, text=True, check=False)
        if removed.returncode != 0:
            raise ContainerRuntimeError(
                f"the jobs' network {name} is no box: {problem}, and it cannot be made again while in use "
                f"({removed.stderr.strip()}). Stop what uses it, then `docker network rm {name}`"
            )
    if problem:
        labels = ["--label", f"{JOB_LABEL}={job}"] if job else []
        created = subprocess.run(
            ["docker", "network", "create", "--internal", "-o", f"{ICC_OPTION}=false", *labels, name],
            capture_output=True,
            text=True,
            check=False,
        )
        if created.returncode != 0 and "already exists" not in created.stderr:  # another job made it meanwhile
            raise ContainerRuntimeError(f"cannot create the jobs' network {name}: {created.stderr.strip()}")
        found = subprocess.run(inspect, capture_output=True, text=True, check=True)
    problem = network_problem(found.stdout)
    if problem:
        raise ContainerRuntimeError(f"the jobs' network {name} is no box: {problem}")
    return found.stdout.split()[2]


def job_network_name(job: str) -> str:
    """The network of one job's own: named for it (Docker's names are short; a digest keeps them apart)."""
    return f"shardline-job-{hashlib.sha256(job.encode()).hexdigest()[:16]}"


@contextlib.contextmanager
def job_network(job: str) -> Iterator[tuple[str, str]]:
    """(name, gateway) of an internal network of ``job``'s own, removed when the job ends: no other job's container
    is ever on it. Where Docker has no address range left for one more network (its default pools hold about
    thirty), the job joins the shared jobs' network instead, where traffic between containers is off too."""
    name = job_network_name(job)
    try:
        gateway = ensure_job_network(name, job)
    except ContainerRuntimeError as err:
        if "address pool" not in str(err) and "address space" not in str(err):
            raise
        log.warning("no address range left for a network of job %s's own (%s): it joins %s", job, err, JOB_NETWORK)
        yield JOB_NETWORK, ensure_job_network()
        return
    try:
        yield name, gateway
    finally:
        remove_job_network(job)


def remove_job_network(job: str) -> None:
    """Remove the network of ``job``'s own, if it is there (its containers are gone first)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            ["docker", "network", "rm", job_network_name(job)], capture_output=True, timeout=120, check=False
        )


class CappedTcpServer:
    """A TCP server on ``listen_host``:(a free port) that handles each connection on a thread of its own, at most
    ``connections`` at once: one past that is closed as it comes (the client sees its connection end, and retries
    as it would), so a model that opens connections without end costs this machine no more than that. A subclass
    says what a connection gets (``handle``); the connection is closed and its slot freed after."""

    def __init__(self, listen_host: str, connections: int = 256):
        self._slots = threading.BoundedSemaphore(connections)
        self._server = socket.create_server((listen_host, 0))
        self.address = self._server.getsockname()[:2]
        self._thread = threading.Thread(target=self._serve, name=type(self).__name__, daemon=True)
        self._thread.start()

    def handle(self, client: socket.socket) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                client.close()  # at the cap
                continue
            threading.Thread(target=self._handled, args=(client,), daemon=True).start()

    def _handled(self, client: socket.socket) -> None:
        try:
            self.handle(client)
        except OSError:
            pass  # the client or the far end went away: nothing to answer
        finally:
            client.close()
            self._slots.release()

    def close(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone would leave it accepting.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(timeout=5)


class Forwarder(CappedTcpServer):
    """A TCP forwarder from ``listen_host``:(a free port) to ``target``: the containers' one way to the endpoint,
    at most ``connections`` at once (two threads each)."""

    def __init__(self, listen_host: str, target: tuple[str, int], connections: int = 256):
        self.target = target
        super().__init__(listen_host, connections)

    def handle(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target, timeout=10)
        upstream.settimeout(None)
        splice(client, upstream)


def splice(client: socket.socket, upstream: socket.socket) -> None:
    """Carry bytes both ways until both directions end; then close ``upstream`` (the caller closes ``client``)."""
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    upstream.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def endpoint_routes(environ: Mapping[str, str], gateway: str) -> Iterator[dict[str, str]]:
    """The containers' ``AWS_ENDPOINT_URL*``: each loopback endpoint forwarded from ``gateway``, others as given."""
    forwarders: dict[tuple[str, int], Forwarder] = {}
    routed: dict[str, str] = {}
    try:
        for name, url in environ.items():
            if not (name == "AWS_ENDPOINT_URL" or name.startswith("AWS_ENDPOINT_URL_")):
                continue
            parts = urlsplit(url)
            if parts.hostname not in LOOPBACK_HOSTS:
                routed[name] = url
                continue
            port = parts.port or (443 if parts.scheme == "https" else 80)
            target = (parts.hostname, port)
            if target not in forwarders:
                forwarders[target] = Forwarder(gateway, target)
            host, forwarded_port = forwarders[target].address
            routed[name] = urlunsplit(parts._replace(netloc=f"{host}:{forwarded_port}"))
        yield routed
    finally:
        for forwarder in forwarders.values():
            forwarder.close()


def aws_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Region and credentials for the containers, as the job's role would give them: the credentials boto3
    resolves here (environment, profile or instance role), passed as values, never the files they came from."""
    env = {k: v for k, v in environ.items() if k in PASSED_AWS}
    import boto3

    credentials = boto3.Session().get_credentials()
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = frozen.access_key, frozen.secret_key
        if frozen.token:
            env["AWS_SESSION_TOKEN"] = frozen.token
    return env


# Every container a worker runs in: the worker's process pool shares batches through /dev/shm (Docker's default
# 64 MB is too small), and the worker never gains a privilege or keeps a capability.
WORKER_CONTAINER = ("--shm-size", "1g", "--security-opt", "no-new-privileges", "--cap-drop", "ALL")


def container_name(job: str, host: str) -> str:
    return f"{job}-{host}"[:120]


def container_command(
    request: dict,
    instance_dir: Path,
    host: str,
    *,
    environment: Mapping[str, str],
    network: str,
    mounts: list[tuple[Path, str, bool]],
) -> list[str]:
    """``docker run`` for one instance: the request's image, entrypoint, ContainerArguments and Environment,
    each of ``mounts`` (host path, container path, read-only) bound, under the image's own user."""
    job = request["ProcessingJobName"]
    isolated = bool(request.get("NetworkConfig", {}).get("EnableNetworkIsolation"))
    command = [
        "docker",
        "run",
        "--rm",
        "--name",
        container_name(job, host),
        "--label",
        f"{JOB_LABEL}={job}",
        "--network",
        "none" if isolated else network,
        *WORKER_CONTAINER,
        # Bounded as an instance is: its image read-only (what it writes goes to its own folders, /tmp among
        # them, on this instance's directory), and a cap on processes and threads (a fork bomb stops there).
        "--read-only",
        "--pids-limit",
        str(pids_limit()),
        *size_limits(request["ProcessingResources"]["ClusterConfig"]["InstanceType"]),
    ]
    for source, target, read_only in mounts:
        command += ["--mount", f"type=bind,source={source},target={target}" + (",readonly" if read_only else "")]
    for name, value in _container_environment(request, environment).items():
        # A credential goes by name (the docker CLI's environment holds it: ``cli_environment``), so that no
        # secret is ever on a command line, which every user of this machine can read (``ps``).
        command += ["--env", name if name in BY_NAME else f"{name}={value}"]
    return [
        *command,
        request["AppSpecification"]["ImageUri"],
        *request["AppSpecification"].get("ContainerArguments", []),
    ]


def _container_environment(request: dict, environment: Mapping[str, str]) -> dict[str, str]:
    # HOME on the instance's writable /tmp: the image's own home is read-only, and libraries keep caches there.
    return {"HOME": contract.CONTAINER_TMP, **environment, **request.get("Environment", {})}


def size_limits(instance_type: str) -> list[str]:
    """``--cpus`` and ``--memory`` of the instance type (no more than this machine has): a job sized for an
    ml.m5.xlarge gets its 4 vCPUs and 16 GiB, as on SageMaker, and one that needs more fails here as it would
    there, instead of taking the machine."""
    vcpus, memory = contract.instance_vcpus(instance_type), contract.instance_memory_gib(instance_type)
    if vcpus is None or memory is None:
        return []
    cpus = min(vcpus, os.cpu_count() or vcpus)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    limit = min(int(memory * (1 << 30)), total) if total else int(memory * (1 << 30))
    return ["--cpus", str(cpus), "--memory", str(limit), "--memory-swap", str(limit)]


def pids_limit() -> int:
    """The cap on an instance's processes and threads: room for a pool process and its threads per core, and
    for the library threads each starts (OpenMP, BLAS), far below what a fork bomb reaches."""
    return 4096 + 256 * (os.cpu_count() or 1)


def cli_environment(request: dict, environment: Mapping[str, str], base: Mapping[str, str]) -> dict[str, str]:
    """The docker CLI's own environment for ``container_command``: ``base`` (how to reach the engine) and the
    values of the variables the command passes by name."""
    merged = _container_environment(request, environment)
    return {**base, **{name: merged[name] for name in BY_NAME if name in merged}}


def instance_mounts(request: dict, instance_dir: Path, local_path) -> list[tuple[Path, str, bool]]:
    """Each input at its LocalPath (read-only), the worker's output folder (written by the image's user; its
    outputs wait there for their upload, and nothing on this side ever reads it) and the resource config,
    mapped from this instance's directory."""
    mounts = [(instance_dir / "config" / "resourceconfig.json", contract.RESOURCE_CONFIG, True)]
    for item in request.get("ProcessingInputs", []):
        path = item["S3Input"]["LocalPath"]
        mounts.append((local_path(instance_dir, path), path, True))
    source = local_path(instance_dir, contract.OUTPUT_DIR)
    source.mkdir(parents=True, exist_ok=True)
    source.chmod(0o777)  # the image's user is not the supervisor's: SageMaker, too, hands it a writable volume
    mounts.append((source, contract.OUTPUT_DIR, False))
    # The image is read-only: /tmp (the worker's scratch, HOME for library caches) is this instance's own folder.
    tmp = instance_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    tmp.chmod(0o777)
    mounts.append((tmp, contract.CONTAINER_TMP, False))
    return mounts


CONTAINER_CA_BUNDLE = "/etc/ssl/shardline/aws-ca-bundle.pem"  # where a container finds the bundle AWS_CA_BUNDLE names


def with_ca_bundle(environment: Mapping[str, str]) -> tuple[dict[str, str], list[tuple[Path, str, bool]]]:
    """AWS_CA_BUNDLE names a file of this machine (a proxy's or a company's CA): in a container that path means
    nothing, so the file is mounted read-only at ``CONTAINER_CA_BUNDLE`` and the variable names that. A bundle
    that is not a readable file here is left out, with a WARNING: the instances then trust their image's CAs.
    Returns (``environment`` so amended, the mounts to add)."""
    env = dict(environment)
    named = env.pop("AWS_CA_BUNDLE", "")
    if not named:
        return env, []
    path = Path(named)
    if not path.is_file() or not os.access(path, os.R_OK):
        log.warning("AWS_CA_BUNDLE %s is not a readable file here: the instances trust their image's CAs", named)
        return env, []
    return {**env, "AWS_CA_BUNDLE": CONTAINER_CA_BUNDLE}, [(path.resolve(), CONTAINER_CA_BUNDLE, True)]


def remove_container(name: str) -> None:
    """Force-remove one container, if it is there (``--rm`` has removed it when it exited by itself)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120, check=False)


def remove_job_containers(job: str) -> None:
    """Force-remove whatever containers of ``job`` are left (a stop, or a supervisor that died)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listed = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={JOB_LABEL}={job}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        ids = listed.stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=120, check=False)


def worker_in_image(command: list[str], image: str, folders: Mapping[Path, str]) -> list[str]:
    """A ``python -m shardline.worker ...`` command line of this machine's, as a container of ``image`` that sees
    only ``folders`` (host folder -> container path, read-write for the image's user) and no network.

    For ``shardline preview``, ``shardline tune`` and the ``dry_run`` Param: model code on a sample, which
    needs no AWS (the caller fetched the model and the sample), so it gets nothing at all of this machine."""

    def inside(arg: str) -> str:
        for host, target in folders.items():
            if arg == str(host) or arg.startswith(f"{host}/"):
                return target + arg[len(str(host)) :]
        return arg

    mapped = [inside(arg) for arg in command[command.index("shardline.worker") + 1 :]]
    run = ["docker", "run", "--rm", "--network", "none", *WORKER_CONTAINER, "--env", "PYTHONUNBUFFERED=1"]
    if os.geteuid() != 0:
        # As the caller's uid, so that the caller can read and delete what the worker wrote (its own temp
        # folders). The box is the container: its own PID namespace and filesystem, no network, no capabilities.
        run += ["--user", f"{os.geteuid()}:{os.getegid()}"]
    for host, inside in folders.items():
        if os.geteuid() == 0:
            # Written by the image's own user, read back and removed here. The callers put it in a 0700 folder of
            # their own, so no other user of this machine reaches it.
            Path(host).chmod(0o777)
        run += ["--mount", f"type=bind,source={host},target={inside}"]
    return [*run, image, *mapped]


ENV_ALLOW_UNPINNED = "SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS"


def refuse_unpinned_process(image: str, pinned: bool, what: str) -> None:
    """An unpinned model's code runs only in the worker image: as a process it would run as this machine's
    (Airflow's) user, with whatever that user can read. ``SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS=1`` lets a
    developer run one on a machine of their own."""
    if pinned or os.environ.get(ENV_ALLOW_UNPINNED) == "1":
        return
    raise ContainerRuntimeError(
        f"the model is not pinned (model.allow_unpinned), and without Docker its code would run in {what} as "
        f"this machine's user. Pin it with model.sha256 or model.versions, or build the worker image ({image}) "
        f"where a Docker engine runs; on a machine of your own, {ENV_ALLOW_UNPINNED}=1 allows it"
    )


def sandbox_for(image: str, pinned: bool, what: str) -> bool:
    """Whether model code for ``what`` (preview, tune) runs in ``image`` (True) or as a process here (False);
    refuses an unpinned model as a process, as the local backend does."""
    if choose_runtime(image) == "docker":
        return True
    refuse_unpinned_process(image, pinned, what)
    return False
