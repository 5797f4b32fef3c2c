"""A local emulator of SageMaker Processing, driven by the same request dict.

Each job gets a directory under the backend's root. ``submit`` writes the request there
and starts a detached supervisor process (``python -m shardline.backends.local_supervisor``) in
its own process group; the supervisor downloads the inputs per instance, runs the
worker once per instance, enforces MaxRuntimeInSeconds, uploads the outputs and records
the job's state in ``state.json``. Because state lives on disk, ``describe`` and
``stop`` work from any process: the Airflow worker that submitted, the triggerer that
polls, or an on-call engineer's CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from shardline.backends import JobNotFound, JobState, JobStatus, LostInstance, local_container, local_fleet
from shardline.grant import book as grant_book
from shardline.waiting import wait_for

STATE_FILE = "state.json"
# What SageMaker says with each refusal the emulator injects (see local_fleet).
_REFUSALS = {
    "ResourceLimitExceeded": "The account-level service limit for processing job usage is reached (a refusal the "
    "local emulator's fleet settings inject)",
    "ThrottlingException": "Rate exceeded",
    "ServiceUnavailable": "Service Unavailable",
    "InternalFailure": "We encountered an internal error. Please try again.",
}
REQUEST_FILE = "request.json"

# What a local job's processes take from the environment of whoever submitted it. The
# submitter is an Airflow process holding Airflow's secrets (AIRFLOW__* has the database
# password, the Fernet key, the JWT secret); a SageMaker job sees none of that, only its
# request's Environment, so the emulator passes only how to reach AWS and how to run Python.
# In the process runtime a job's model code runs as the same user, so this is no sandbox: it stops
# the leak that needs no effort (a model that logs or ships its environment), not a determined one.
# The container runtime (local_container) is the box: the image's own user, nothing of this machine.
# Where the submitter's credentials come from besides their values: a profile, a web identity (EKS), a
# container-credentials endpoint. The supervisor resolves its own through them; a worker never gets one (there the
# model could re-assume Airflow's role): local_supervisor.worker_environment drops them.
CREDENTIAL_SOURCES = frozenset(
    {
        "AWS_PROFILE",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_ROLE_SESSION_NAME",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    }
)
PASSED_ENV = CREDENTIAL_SOURCES | frozenset(
    {
        # Who the job is, and how it reaches AWS: the worker reads S3 and writes the ledger.
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_CA_BUNDLE",
        "AWS_EC2_METADATA_DISABLED",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        # How to run: PYTHONPATH is how the compose image finds shardline.worker (it is not pip-installed there).
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "CUDA_VISIBLE_DEVICES",  # which GPUs this machine lends the job
        "SHARDLINE_GRANT_ENDPOINT",  # where jobs reach AWS through one grant service (compose's job runner)
    }
)
PASSED_PREFIXES = ("AWS_ENDPOINT_URL_", "LC_")


def job_environment(environ: Mapping[str, str], own: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a local job's process: the allow-listed part of ``environ``, then the job's own."""
    passed = {k: v for k, v in environ.items() if k in PASSED_ENV or k.startswith(PASSED_PREFIXES)}
    return {**passed, **(own or {})}


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


# -- a job left to a runner service of its own uid (local_runner: compose's job-runner) --------------------

RUNNER_ENV = "SHARDLINE_LOCAL_RUNNER"  # "service": submitters leave their jobs to this runner
RUNNER_SERVICE = "service"
CLAIM_FILE = "CLAIMED"  # created exclusively: by the runner that starts the job, or by whoever declares it unclaimed
CLAIM_SECONDS = 300.0  # a job no runner claimed in this long fails, naming the service to start
DIED_REASON = "the local job supervisor died before the job ended"


def handed_off(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process leaves the jobs it submits to a runner service rather than starting them itself."""
    value = (environ if environ is not None else os.environ).get(RUNNER_ENV, "").strip().lower()
    return value == RUNNER_SERVICE


def claim(job_dir: Path, by: str) -> bool:
    """Take the job for ``by``, exactly once whoever else tries: whether this call took it."""
    try:
        descriptor = os.open(job_dir / CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o664)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w") as file:
        file.write(by)
    return True


def unclaimed_reason(job_dir: Path, state: dict, now: float) -> str | None:
    """The failure to record for a job left to a runner that none claimed in time (None: not such a job).

    The claim file decides between a runner's late claim and this verdict, so the job is never both."""
    if state.get("runner") != RUNNER_SERVICE or state.get("pid") is not None:
        return None
    if now - float(state.get("created_at") or now) < CLAIM_SECONDS or (job_dir / CLAIM_FILE).exists():
        return None
    if not claim(job_dir, "unclaimed"):
        return None  # a runner took it a moment ago
    return (
        f"no job runner started this job within {CLAIM_SECONDS:.0f}s: the local backend leaves its jobs to a "
        f"runner service ({RUNNER_ENV}={RUNNER_SERVICE}); in the compose stack that is the job-runner "
        "service (`docker compose ps job-runner`, `docker compose logs job-runner`)"
    )


def start_supervisor(job_dir: Path) -> subprocess.Popen:
    """Start the job's supervisor, detached: its own session and process group, so stop() signals the whole
    tree at once. It records its pid in state.json itself, so no write here races with it. Its environment is
    the job's too (readable in /proc by the model's code): no Airflow secrets."""
    with open(job_dir / "supervisor.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "shardline.backends.local_supervisor", str(job_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=job_environment(os.environ),
        )


def read_state(job_dir: Path) -> dict:
    return json.loads((job_dir / STATE_FILE).read_text())


def lost_instances_of(state: dict) -> tuple[LostInstance, ...]:
    """The instances the supervisor saw die while the job went on (``local_supervisor.note_lost``)."""
    found = state.get("lost_instances") or {}
    return tuple(
        LostInstance(host, str(seen.get("reason", "")), tuple(str(u) for u in seen.get("inputs", [])))
        for host, seen in sorted(found.items())
        if isinstance(seen, dict)
    )


def _instance_type(job_dir: Path) -> str | None:
    """The instance type the job's request asked for (None when its request cannot be read)."""
    try:
        return json.loads((job_dir / REQUEST_FILE).read_text())["ProcessingResources"]["ClusterConfig"]["InstanceType"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _here(state: dict) -> bool:
    """Whether the job's supervisor runs on this host, so its pid means something here.

    In the compose stack the scheduler starts jobs and the triggerer describes them from
    another container: there, a pid of the scheduler's is not a dead process.
    """
    return state.get("host") in (None, socket.gethostname())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still "exists"; reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == 0


def _group_alive(pgid: int) -> bool:
    _alive(pgid)  # reap the leader if it is our child, so a zombie does not count
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# A submit renames its staging folder into place within a second or two; one this old belongs to a dead submit.
STAGING_MAX_AGE_SECONDS = 120.0


def _modified_since(path: Path, since: float) -> bool:
    """Whether ``path`` changed after ``since``; one renamed away meanwhile (its submit finished) did."""
    try:
        return path.stat().st_mtime > since
    except FileNotFoundError:
        return True


class LocalBackend:
    """Runs processing jobs on this machine, one worker process tree per instance."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def job_dir(self, name: str) -> Path:
        return self.root / "jobs" / name

    def submit(self, request: dict) -> str:
        name = request["ProcessingJobName"]
        job_dir = self.job_dir(name)
        job_dir.parent.mkdir(parents=True, exist_ok=True)
        if job_dir.exists():
            return name  # a retried task adopts the job its earlier try started
        # The emulated account: its injected refusals first, as SageMaker answers them.
        fleet = local_fleet.EmulatedFleet.load(self.root)
        resources = request["ProcessingResources"]["ClusterConfig"]
        if fleet.active:
            refused = fleet.refusal(name, local_fleet.submit_call(self.root, name))
            if refused:
                raise local_fleet.client_error(refused, _REFUSALS.get(refused, "Rate exceeded"))
        # Build the job directory aside and rename it into place: a job dir always has its state,
        # and of two racing submits exactly one wins the rename.
        # The instances run as containers of the request's image whenever Docker can (local_container).
        runtime = local_container.choose_runtime(request["AppSpecification"]["ImageUri"])
        if runtime == "process":
            pinned = "--model-sha256" in request["AppSpecification"].get("ContainerArguments", [])
            local_container.refuse_unpinned_process(request["AppSpecification"]["ImageUri"], pinned, f"job {name}")
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=job_dir.parent))
        left_to_runner = handed_off()
        if left_to_runner:  # the runner's uid shares the folder's group, never the submitter's uid
            staging.chmod(0o2770)
        (staging / REQUEST_FILE).write_text(json.dumps(request, indent=2))
        write_json_atomic(
            staging / STATE_FILE,
            {
                "name": name,
                "status": JobStatus.IN_PROGRESS.value,
                "created_at": time.time(),
                "pid": None,
                "runtime": runtime,
                # Decided here, where the fleet settings are; the supervisor ends such a job before it starts.
                "capacity_error": fleet.capacity_error(name, resources["InstanceType"]),
                "startup_seconds": fleet.startup_seconds,
                # Left to a runner service of its own uid (local_runner), or started here.
                "runner": RUNNER_SERVICE if left_to_runner else None,
            },
        )
        if fleet.active:
            # The quota, once the staging folder exists: while it does, another submit's admission sees this job
            # as being created (``_ended``), never as ended, so its instances are not given back under it.
            try:
                local_fleet.take(
                    self.root, fleet, name, resources["InstanceType"], int(resources["InstanceCount"]), self._ended
                )
            except Exception:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        if left_to_runner and os.environ.get(grant_book.GRANTS_ENV):
            # Where jobs reach AWS through a grant service, the job's grant is filed where its code cannot write.
            grant_book.file_grant(Path(os.environ[grant_book.GRANTS_ENV]), request)
        try:
            staging.rename(job_dir)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            return name  # a racing submit created it (and holds its instances, under the same name)
        if not left_to_runner:
            start_supervisor(job_dir)
        return name

    def _ended(self, name: str) -> bool:
        """Whether a job that holds instances in the emulator's record has ended (and so holds none)."""
        try:
            return self.describe(name).status.is_terminal
        except JobNotFound:
            # Being created (its staging folder is there: its submit has taken its instances and is about to
            # rename it into place), or never created (that submit failed): it holds instances only in the first.
            # A staging folder older than a submit takes is a submit that died before its rename.
            alive_since = time.time() - STAGING_MAX_AGE_SECONDS
            return not any(_modified_since(p, alive_since) for p in self.job_dir(name).parent.glob(f".{name}.*"))

    def describe(self, name: str) -> JobState:
        job_dir = self.job_dir(name)
        if not (job_dir / STATE_FILE).exists():
            raise JobNotFound(f"no local job named {name} under {self.root}")
        state = read_state(job_dir)
        status = JobStatus(state["status"])
        reason = state.get("failure_reason")
        pid = state.get("pid")
        if status is JobStatus.IN_PROGRESS and (job_dir / "STOP").exists():
            status = JobStatus.STOPPING  # as SageMaker reports a stop that is under way
        if status in (JobStatus.IN_PROGRESS, JobStatus.STOPPING) and pid and _here(state) and not _alive(pid):
            # The supervisor died without recording an end (killed with -9, machine reboot).
            status, reason = JobStatus.FAILED, DIED_REASON
        if not status.is_terminal and (unclaimed := unclaimed_reason(job_dir, state, time.time())):
            ended = {"status": JobStatus.FAILED.value, "failure_reason": unclaimed, "ended_at": time.time()}
            write_json_atomic(job_dir / STATE_FILE, {**state, **ended})
            local_fleet.give_back(self.root, name)
            status, reason = JobStatus.FAILED, unclaimed
        lost = () if status.is_terminal else lost_instances_of(state)
        return JobState(
            name=name,
            status=status,
            failure_reason=reason,
            created_at=state.get("created_at"),
            ended_at=state.get("ended_at"),
            instance_type=_instance_type(job_dir),
            lost_instances=lost,
        )

    def stop(self, name: str, grace_seconds: float = 10.0) -> None:
        state = self.describe(name)
        if state.status.is_terminal:
            return
        job_dir = self.job_dir(name)
        (job_dir / "STOP").touch()  # the supervisor records Stopped when it sees this
        deadline = time.monotonic() + grace_seconds
        # A job submitted a moment ago: its supervisor is starting and has not written its pid yet.
        pid = wait_for(lambda: read_state(job_dir).get("pid"), timeout=grace_seconds)
        if not pid or not _here(read_state(job_dir)):
            return  # on another host (another container) the supervisor sees STOP and ends the job itself
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        # Wait for the whole group, not only the supervisor: a stuck worker gets SIGKILL.
        wait_for(lambda: not _group_alive(pid), timeout=max(0.0, deadline - time.monotonic()))
        if _group_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        _alive(pid)  # reaps the supervisor if this process started it
        if read_state(job_dir).get("runtime") == "docker":  # containers outlive a killed client, and so does a network
            local_container.remove_job_containers(name)
            local_container.remove_job_network(name)
        if read_state(job_dir)["status"] == JobStatus.IN_PROGRESS.value:  # the supervisor had no time to say
            write_json_atomic(
                job_dir / STATE_FILE,
                {
                    **read_state(job_dir),
                    "status": JobStatus.STOPPED.value,
                    "failure_reason": "stopped",
                    "ended_at": time.time(),
                },
            )
            local_fleet.give_back(self.root, name)
