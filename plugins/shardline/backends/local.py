"""A local emulator of SageMaker Processing, driven by the same request dict.

Each job gets a directory under the backend's root. ``submit`` writes the request there
and starts a detached supervisor process (``python -m shardline.backends.local_job``) in
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
import signal
import subprocess
import sys
import time
from pathlib import Path

from shardline.backends import JobNotFound, JobState
from shardline.decide import JobStatus

STATE_FILE = "state.json"
REQUEST_FILE = "request.json"


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def read_state(job_dir: Path) -> dict:
    return json.loads((job_dir / STATE_FILE).read_text())


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
        try:
            job_dir.mkdir()  # atomic: the first submit of a name wins, a second adopts
        except FileExistsError:
            return name
        (job_dir / REQUEST_FILE).write_text(json.dumps(request, indent=2))
        write_json_atomic(job_dir / STATE_FILE, {
            "name": name, "status": JobStatus.IN_PROGRESS.value, "created_at": time.time(), "pid": None,
        })
        log = open(job_dir / "supervisor.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "shardline.backends.local_job", str(job_dir)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() kills the whole tree
            )
        finally:
            log.close()
        state = read_state(job_dir)
        state["pid"] = proc.pid
        if state["status"] == JobStatus.IN_PROGRESS.value:
            write_json_atomic(job_dir / STATE_FILE, {**state, "pid": proc.pid})
        return name

    def describe(self, name: str) -> JobState:
        job_dir = self.job_dir(name)
        if not (job_dir / STATE_FILE).exists():
            raise JobNotFound(f"no local job named {name} under {self.root}")
        state = read_state(job_dir)
        status = JobStatus(state["status"])
        reason = state.get("failure_reason")
        pid = state.get("pid")
        if status is JobStatus.IN_PROGRESS and pid and not _alive(pid):
            # The supervisor died without recording an end (killed with -9, machine reboot).
            status, reason = JobStatus.FAILED, "the local job supervisor died before the job ended"
        return JobState(name=name, status=status, failure_reason=reason, created_at=state.get("created_at"),
                        ended_at=state.get("ended_at"))

    def stop(self, name: str, grace_seconds: float = 10.0) -> None:
        state = self.describe(name)
        if state.status.is_terminal:
            return
        job_dir = self.job_dir(name)
        pid = read_state(job_dir).get("pid")
        (job_dir / "STOP").touch()  # the supervisor records Stopped when it sees this
        if not pid:
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if read_state(job_dir)["status"] == JobStatus.IN_PROGRESS.value:  # the supervisor had no time to say
            write_json_atomic(job_dir / STATE_FILE, {**read_state(job_dir), "status": JobStatus.STOPPED.value,
                                                     "failure_reason": "stopped", "ended_at": time.time()})
