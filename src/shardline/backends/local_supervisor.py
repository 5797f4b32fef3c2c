"""The supervisor of one local processing job: ``python -m shardline.backends.local_supervisor JOB_DIR``.

Started detached by :class:`shardline.backends.local.LocalBackend`. It plays the part of
SageMaker Processing for one request: deal out the inputs per instance, run one worker
per instance, enforce the runtime limit, record the final state. It uploads nothing: each instance
uploads its own outputs as its files finish (``worker/job/uploads.py``), with the job's credentials, as on
SageMaker, so nothing a container wrote is ever read back on this machine (a symlink it left points nowhere).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3

from shardline import contract
from shardline.backends import JobStatus, local_container, local_egress, local_fleet
from shardline.backends.local import (
    CREDENTIAL_SOURCES,
    REQUEST_FILE,
    STATE_FILE,
    job_environment,
    read_state,
    write_json_atomic,
)
from shardline.backends.local_credentials import assume_job_role
from shardline.errors import InputRefused
from shardline.grant import book as grant_book
from shardline.grant.proxy import emulated_endpoints
from shardline.planning.inputs import unsafe_key_reason
from shardline.s3uri import parse_s3_uri
from shardline.waiting import end_processes

log = logging.getLogger(__name__)

SM_ROOT = contract.CONTAINER_ROOT + "/"


class _Stop(Exception):
    pass


def _on_sigterm(signum, _frame):
    raise _Stop(signal.Signals(signum).name)


def local_path(instance_dir: Path, sm_path: str) -> Path:
    """Map a container path (/opt/ml/processing/...) into this instance's directory."""
    relative = sm_path[len(SM_ROOT) :] if sm_path.startswith(SM_ROOT) else sm_path.lstrip("/")
    if reason := unsafe_key_reason(relative.rstrip("/")):
        raise InputRefused(f"LocalPath {sm_path!r} does not name a directory under {SM_ROOT}: {reason}")
    return instance_dir / "processing" / relative


def list_prefix(s3, uri: str) -> list[tuple[str, str, str]]:
    """(bucket, key, path relative to the prefix's folder) for every object under an S3Prefix."""
    bucket, prefix = parse_s3_uri(uri)
    base = prefix if prefix.endswith("/") or not prefix else posixpath.dirname(prefix) + "/"
    base = "" if base == "/" else base
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            found.append((bucket, item["Key"], item["Key"][len(base) :]))
    return sorted(found, key=lambda t: t[1])


def manifest_entries(s3, uri: str) -> list[tuple[str, str, str]]:
    """(bucket, key, relative path) per entry; an entry that is no safe relative path is left out, with a warning."""
    bucket, key = parse_s3_uri(uri)
    entries = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        raise InputRefused(f'{uri} is not a manifest: expected [{{"prefix": ...}}, entries...]')
    prefix_bucket, prefix = parse_s3_uri(entries[0]["prefix"])
    found = []
    # Manifest order is kept: entries are dealt round robin in the order they are listed.
    for rel in entries[1:]:
        reason = unsafe_key_reason(rel) if isinstance(rel, str) else "not a string"
        if reason:
            log.warning("manifest %s: not downloading entry %r: %s", uri, rel, reason)
            continue
        found.append((prefix_bucket, prefix + rel, rel))
    return found


STAGING_THREADS = 16  # downloads of a job's inputs at once (boto3's client is thread-safe)


def deal(objects: list, instances: int, distribution: str) -> list[list]:
    if distribution == "ShardedByS3Key":
        return contract.deal(objects, instances)
    return [list(objects) for _ in range(instances)]  # FullyReplicated


def download(s3, bucket: str, key: str, relative: str, target: Path) -> None:
    """Download one object to ``target/relative``, unless that path leaves ``target``: then warn and skip it.

    SageMaker writes into a container, where a stray path does little harm; here it would land
    on the Airflow machine itself (site-packages/*.pth runs at the next Python start).
    """
    reason = unsafe_key_reason(relative)
    dest = target / relative
    if reason is None and not dest.resolve().is_relative_to(target.resolve()):
        reason = f"resolves to {dest.resolve()}, outside {target}"  # a symlink on the way
    if reason:
        log.warning("not downloading s3://%s/%s: %s", bucket, key, reason)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    s3.download_file(bucket, key, str(dest))


def stage_inputs(s3, request: dict, instance_dirs: list[Path]) -> dict[Path, list[str]]:
    """Download each instance's share of every input; returns the s3:// URIs each instance was dealt (by its
    folder), so an instance that dies can be named with the inputs it had."""
    dealt: dict[Path, list[str]] = {d: [] for d in instance_dirs}
    for spec in request.get("ProcessingInputs", []):
        s3_input = spec["S3Input"]
        if s3_input["S3DataType"] == "ManifestFile":
            objects = manifest_entries(s3, s3_input["S3Uri"])
        else:
            objects = list_prefix(s3, s3_input["S3Uri"])
        shares = deal(objects, len(instance_dirs), s3_input.get("S3DataDistributionType", "FullyReplicated"))
        downloads = []
        for instance_dir, share in zip(instance_dirs, shares, strict=True):
            target = local_path(instance_dir, s3_input["LocalPath"])
            target.mkdir(parents=True, exist_ok=True)
            for bucket, key, relative in share:
                downloads.append((bucket, key, relative, target))
                if s3_input.get("S3DataDistributionType") == "ShardedByS3Key":  # the files, not the model
                    dealt[instance_dir].append(f"s3://{bucket}/{key}")
        # In parallel, as SageMaker stages an instance's inputs: one at a time, a job's start waited on each GET.
        with ThreadPoolExecutor(max_workers=STAGING_THREADS) as pool:
            list(pool.map(lambda d: download(s3, *d), downloads))  # the first failure is raised
        log.info(
            "input %s: %d object(s) dealt %s over %d instance(s)",
            spec.get("InputName"),
            len(objects),
            s3_input.get("S3DataDistributionType"),
            len(instance_dirs),
        )
    return dealt


def worker_command(request: dict, instance_dir: Path, host: str) -> list[str]:
    inputs = {i["InputName"]: i["S3Input"]["LocalPath"] for i in request.get("ProcessingInputs", [])}
    command = [
        sys.executable,
        "-m",
        "shardline.worker",
        "--resource-config",
        str(instance_dir / "config" / "resourceconfig.json"),
        "--scratch-dir",
        str(instance_dir / "scratch"),
    ]
    if "data" in inputs:
        command += ["--input-dir", str(local_path(instance_dir, inputs["data"]))]
    if "model" in inputs:
        command += ["--model-dir", str(local_path(instance_dir, inputs["model"]))]
    # The worker's default output folder, on this instance's volume: its outputs wait there for their upload.
    command += ["--output-dir", str(local_path(instance_dir, contract.OUTPUT_DIR))]
    # The container sees /opt/ml/processing/...: so do its arguments (e.g. --manifest-dir).
    arguments = [
        str(local_path(instance_dir, a)) if a.startswith(SM_ROOT) else a
        for a in request.get("AppSpecification", {}).get("ContainerArguments", [])
    ]
    return command + arguments


PLACEHOLDER = "shardline-job"  # what a job behind its grant proxy signs with: the emulated endpoint takes any keys


def instance_credentials(request: dict, proxied: bool, sts=None) -> dict[str, str]:
    """The credentials a job's instances hold, never those of whoever submitted it. Behind its grant proxy
    (emulated endpoints) placeholders: the proxy is the check, and this machine's own keys (a developer's real
    ones, say) would be the model's to write into its outputs. Where a grant service finds the job by the key it
    signs with (compose), that key is the job's name. Against AWS itself, the request's role, assumed with a
    session policy that narrows it to the job (``shardline.grant.session``)."""
    if proxied:
        key = os.environ["AWS_ACCESS_KEY_ID"] if os.environ.get(grant_book.ENDPOINT_ENV) else PLACEHOLDER
        return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": PLACEHOLDER, "AWS_SESSION_TOKEN": PLACEHOLDER}

    credentials = assume_job_role(request, sts or boto3.client("sts"), os.environ)
    log.info("the instances hold %s, assumed for this job and narrowed to it", request["RoleArn"])
    return credentials.environment()


def worker_environment(request: dict, instance_dir: Path) -> dict[str, str]:
    """A process-runtime worker's environment: the allow-listed part of ours with the job's own, credentials as
    values (never the files they came from) and a HOME of its own, so the model's code finds no ``~/.aws``."""
    env = job_environment(os.environ, request.get("Environment", {}))
    for name in CREDENTIAL_SOURCES:  # a model with one would re-assume the submitter's role
        env.pop(name, None)
    home = instance_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {**env, **local_container.aws_environment(os.environ), "HOME": str(home)}


def grant_proxy(job_dir: Path, host: str, stack: contextlib.ExitStack) -> str | None:
    """The URL of the job's one way to AWS when the endpoints are emulated: a proxy on ``host`` that lets through
    what the job role's grant allows and refuses the rest as AWS would (``shardline.grant``), in a session of its own.
    None when the endpoints are AWS's own, where IAM enforces the job role itself.

    Not in the job's process group: a stop's SIGTERM to that group reaches the instances, which then write their
    last records (the STOPPED heartbeat that ends an instance's bill, the files they finished) through this proxy, so
    it must outlive them. The supervisor ends it after its instances, and it ends itself within a second of the
    supervisor's death (a SIGKILL of the group)."""
    if shared := os.environ.get(grant_book.ENDPOINT_ENV):
        log.info("the instances reach AWS through the grant service at %s, signed as this job", shared)
        return shared

    if emulated_endpoints(os.environ) is None:
        log.info("the endpoints are AWS's own: the job role's grant is IAM's to enforce")
        return None
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardline.grant.proxy", str(job_dir / REQUEST_FILE), host],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=job_environment(os.environ),
        text=True,
        start_new_session=True,
    )
    stack.callback(end_processes, [proc], grace=10)
    url = (proc.stdout.readline() if proc.stdout else "").strip()
    if url == "none":
        log.info("the endpoints are AWS's own: the job role's grant is IAM's to enforce")
        return None
    if not url.startswith("http://"):
        raise RuntimeError(f"the job's grant proxy did not start (exit code {proc.wait()}); see supervisor.log")
    log.info("the instances reach AWS through %s: only what the job role's grant allows goes on", url)
    return url


def _routed(proxy: str) -> dict[str, str]:
    """The instances' endpoint variables: the proxy for every service, and no per-service way around it."""
    return {"AWS_ENDPOINT_URL": proxy, "AWS_ENDPOINT_URL_S3": proxy, "AWS_ENDPOINT_URL_DYNAMODB": proxy}


def start_instances(
    request: dict, job_dir: Path, hosts: list[str], instance_dirs: list[Path], runtime: str, stack: contextlib.ExitStack
) -> dict[str, subprocess.Popen]:
    """One worker per instance: a process here, or a container of the request's image (``runtime``)."""
    if runtime == "docker":
        # An endpoint on this machine is the emulated one (its proxy checks the grant): AWS's own gets the job role.
        emulated = local_container.network_for(os.environ) is not None
        # The job's own internal network (removed at its end): no other job's container is on it.
        network, gateway = stack.enter_context(local_container.job_network(request["ProcessingJobName"]))
        log.info("the instances run on network %s (internal, no traffic between containers)", network)
        if emulated:  # the endpoint is this machine's: through the grant, and nothing else
            proxy = grant_proxy(job_dir, gateway, stack)
            routes = (
                _routed(proxy) if proxy else stack.enter_context(local_container.endpoint_routes(os.environ, gateway))
            )
        else:  # the instances write to AWS itself: still on their network, whose one way out is a tunnel to AWS
            # Only the request's region, and S3's virtual-hosted names of its own buckets.
            egress = local_egress.EgressProxy(gateway, local_egress.aws_destinations(os.environ, request))
            stack.callback(egress.close)
            routes = {k: v for k, v in os.environ.items() if k.startswith("AWS_ENDPOINT_URL")}
            routes |= {"HTTPS_PROXY": egress.url, "https_proxy": egress.url, "NO_PROXY": "", "no_proxy": ""}
            log.info("the endpoints are AWS's own: the instances reach them only, through %s", egress.url)
        credentials = instance_credentials(request, proxied=emulated)
        container_env, bundle_mounts = local_container.with_ca_bundle(
            {**local_container.aws_environment(os.environ), **routes, **credentials}
        )
    else:
        proxy = grant_proxy(job_dir, "127.0.0.1", stack)
        credentials = instance_credentials(request, proxied=proxy is not None)
    procs: dict[str, subprocess.Popen] = {}
    for host, instance_dir in zip(hosts, instance_dirs, strict=True):
        config = instance_dir / "config"
        config.mkdir(parents=True, exist_ok=True)
        (config / "resourceconfig.json").write_text(json.dumps({"current_host": host, "hosts": hosts}))
        if runtime == "docker":
            mounts = local_container.instance_mounts(request, instance_dir, local_path) + bundle_mounts
            command = local_container.container_command(
                request, instance_dir, host, environment=container_env, network=network, mounts=mounts
            )
            # The docker CLI's own (how to reach the engine), and the credentials the command passes by name.
            env = local_container.cli_environment(request, container_env, job_environment(os.environ))
        else:
            command, env = worker_command(request, instance_dir, host), worker_environment(request, instance_dir)
            env.update(credentials)
            if proxy:
                env.update(_routed(proxy))
        with open(instance_dir / "worker.log", "ab") as out:
            procs[host] = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        log.info("%s: worker pid %d (%s)", host, procs[host].pid, runtime)
    return procs


def discard_inputs(request: dict, instance_dirs: list[Path]) -> None:
    """Delete what was staged for the job's instances (its inputs and model) once they have all exited, as SageMaker
    discards an instance's volume when its job ends: a retry stages only its own files, and never needs the disk
    every earlier attempt took. The instances' logs and outputs' records stay."""
    for spec in request.get("ProcessingInputs", []):
        for instance_dir in instance_dirs:
            shutil.rmtree(local_path(instance_dir, spec["S3Input"]["LocalPath"]), ignore_errors=True)


def run(job_dir: Path) -> dict:
    request = json.loads((job_dir / REQUEST_FILE).read_text())
    count = request["ProcessingResources"]["ClusterConfig"]["InstanceCount"]
    max_runtime = request.get("StoppingCondition", {}).get("MaxRuntimeInSeconds", 86400)
    hosts = contract.host_names(count)
    instance_dirs = [job_dir / host for host in hosts]
    s3 = boto3.client("s3")
    started = time.monotonic()
    if (job_dir / "STOP").exists():
        raise _Stop("stop requested before the job started")
    dealt = stage_inputs(s3, request, instance_dirs)

    runtime = read_state(job_dir).get("runtime", "process")
    with contextlib.ExitStack() as stack:
        procs = start_instances(request, job_dir, hosts, instance_dirs, runtime, stack)
        ended: set[str] = set()
        lost: dict[str, dict] = {}
        try:
            while any(p.poll() is None for p in procs.values()):
                died = {h: p.poll() for h, p in procs.items() if h not in lost and is_lost(p.poll())}
                if died and not (job_dir / "STOP").exists():
                    # Said at once, while the others go on: the watch starts its unfinished files as a next attempt.
                    for host, code in died.items():
                        lost[host] = {
                            "reason": f"exited with code {code}",
                            "inputs": dealt[job_dir / host],
                            "seen_at": time.time(),
                        }
                        log.warning("%s died (exit code %s) while the job goes on", host, code)
                    write_json_atomic(job_dir / STATE_FILE, {**read_state(job_dir), "lost_instances": lost})
                if runtime == "docker":  # a client that died leaves its container running: an instance is gone whole
                    for host in [h for h, p in procs.items() if p.poll() is not None and h not in ended]:
                        ended.add(host)
                        local_container.remove_container(
                            local_container.container_name(request["ProcessingJobName"], host)
                        )
                if (job_dir / "STOP").exists():  # stop() was asked before it knew our pid
                    raise _Stop("stop requested")
                if time.monotonic() - started > max_runtime:
                    end_processes(procs.values(), grace=10)
                    break
                time.sleep(0.2)
        except _Stop:
            end_processes(procs.values(), grace=10)  # the workers got SIGTERM too; give them time to sweep temp files
            discard_inputs(request, instance_dirs)
            raise
        finally:
            if runtime == "docker":  # a container whose client was killed would run on
                local_container.remove_job_containers(request["ProcessingJobName"])
    codes = {host: p.wait() for host, p in procs.items()}
    discard_inputs(request, instance_dirs)
    end = job_end(codes, time.monotonic() - started, max_runtime)
    log.info("exit codes %s; %s", codes, end["status"])
    return end


def is_lost(code: int | None) -> bool:
    """Whether an instance that exited with ``code`` died without ending its work: killed by a signal, or crashed.
    A worker's own ends (every file done, some failed, a setup error, fenced by a newer attempt) are not."""
    return code is not None and code not in contract.WORKER_ENDS


def job_end(codes: dict[str, int], elapsed: float, max_runtime: float) -> dict:
    """The job's end from its workers' exit codes and the runtime at which they were all seen to have exited.

    A job is complete only once its end is seen. One seen past its limit is Stopped, as SageMaker
    would have stopped it, even if its workers exited a moment after the limit, between two polls.
    """
    if elapsed > max_runtime:
        return {
            "status": JobStatus.STOPPED.value,
            "failure_reason": f"MaxRuntimeInSeconds ({max_runtime}) exceeded",
            "exit_codes": codes,
        }
    failed = {h: c for h, c in codes.items() if c != 0}
    if failed:
        detail = ", ".join(f"{h} exited with code {c}" for h, c in sorted(failed.items()))
        return {"status": JobStatus.FAILED.value, "failure_reason": f"AlgorithmError: {detail}", "exit_codes": codes}
    return {"status": JobStatus.COMPLETED.value, "exit_codes": codes}


def _start_up(job_dir: Path, seconds: float) -> None:
    """The emulated instances' provisioning (local_fleet's ``startup_seconds``): the job is InProgress and holds
    its instances, and a stop ends it."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if (job_dir / "STOP").exists():
            raise _Stop("stopped while its instances started")
        time.sleep(min(0.5, left))


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [local-job] %(message)s")
    job_dir = Path(argv[0])
    signal.signal(signal.SIGTERM, _on_sigterm)
    write_json_atomic(job_dir / STATE_FILE, {**read_state(job_dir), "pid": os.getpid(), "host": socket.gethostname()})
    if os.environ.get(grant_book.ENDPOINT_ENV):
        # A grant service knows a job by the access key its requests carry: this job's name, here and in its workers.
        os.environ["AWS_ACCESS_KEY_ID"] = job_dir.name
    try:
        state = read_state(job_dir)
        if state.get("capacity_error"):  # the emulated account had no instances to give (local_fleet)
            ended = {"status": JobStatus.FAILED.value, "failure_reason": local_fleet.CAPACITY_REASON}
        else:
            _start_up(job_dir, float(state.get("startup_seconds") or 0))
            ended = run(job_dir)
    except _Stop as err:
        ended = {"status": JobStatus.STOPPED.value, "failure_reason": f"stopped ({err})"}
    except Exception as err:  # recorded as the job's failure reason, like SageMaker's
        log.exception("job failed")
        ended = {"status": JobStatus.FAILED.value, "failure_reason": f"ClientError: {type(err).__name__}: {err}"}
    state = read_state(job_dir)
    if (job_dir / "STOP").exists() and ended["status"] != JobStatus.COMPLETED.value:
        ended = {**ended, "status": JobStatus.STOPPED.value}
    write_json_atomic(job_dir / STATE_FILE, {**state, **ended, "ended_at": time.time()})
    local_fleet.give_back(job_dir.parent.parent, job_dir.name)  # its instances are free for the next job
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
