"""A job runner of its own for the local backend: where model code must not share Airflow's uid or processes.

In the compose stack the scheduler and the API server submit local jobs. Started there, a job's supervisor and
its workers would be processes of that container, under Airflow's uid, beside processes whose environment holds
the Fernet key, the JWT secret and the database password. With ``SHARDLINE_LOCAL_RUNNER=service`` the submitter
only writes the job's folder; this runner, in a container of its own under a uid of its own with none of
Airflow's environment (compose's ``job-runner`` service), claims each such job and starts its supervisor.

The folder on the shared volume stays the job's one record, as it is for any local job: the triggerer
describes the job from ``state.json``, a stop is the ``STOP`` file, and the supervisor records the job's end.
The runner adds two ends no supervisor can record: one that died (its child exited with the job unended)
and one no runner claimed within ``CLAIM_SECONDS`` (whoever describes it then records that, naming the service).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from shardline.backends import JobStatus, local_fleet
from shardline.backends.local import (
    CLAIM_FILE,
    CLAIM_SECONDS,
    DIED_REASON,
    RUNNER_ENV,
    RUNNER_SERVICE,
    STATE_FILE,
    claim,
    handed_off,
    read_state,
    start_supervisor,
    unclaimed_reason,
    write_json_atomic,
)

__all__ = [
    "CLAIM_FILE",
    "CLAIM_SECONDS",
    "DIED_REASON",
    "RUNNER_ENV",
    "RUNNER_SERVICE",
    "Runner",
    "claim",
    "handed_off",
    "healthy",
    "record_died",
    "unclaimed_reason",
]

log = logging.getLogger("shardline.local.runner")

HEARTBEAT_FILE = "runner-alive"  # touched each pass: compose's health check reads its age
HEARTBEAT_SECONDS = 60.0


class Runner:
    """Claims the jobs left under ``root`` and runs their supervisors as its children."""

    def __init__(self, root: Path, host: str | None = None):
        self.root = Path(root)
        self.host = host or socket.gethostname()
        self.children: dict[str, subprocess.Popen] = {}
        self._not_left: set[str] = set()  # jobs whose submitter started them itself: never read again on each pass

    def waiting(self) -> list[Path]:
        """Job folders left to a runner that none has claimed yet, oldest name first."""
        jobs = self.root / "jobs"
        found = []
        for job_dir in sorted(jobs.iterdir()) if jobs.is_dir() else []:
            if job_dir.name.startswith(".") or job_dir.name in self._not_left or (job_dir / CLAIM_FILE).exists():
                continue
            with contextlib.suppress(OSError, ValueError):
                if not (job_dir / STATE_FILE).exists():
                    continue
                if read_state(job_dir).get("runner") == RUNNER_SERVICE:
                    found.append(job_dir)
                else:
                    self._not_left.add(job_dir.name)
        return found

    def start_waiting(self) -> list[str]:
        """Claim and start every waiting job; the names started."""
        started = []
        for job_dir in self.waiting():
            if claim(job_dir, self.host):
                self.children[job_dir.name] = start_supervisor(job_dir)
                log.info("job %s: supervisor pid %d", job_dir.name, self.children[job_dir.name].pid)
                started.append(job_dir.name)
        return started

    def reap(self) -> list[str]:
        """Forget supervisors that exited, recording the end of any job whose supervisor did not; those names."""
        died = []
        for name, child in list(self.children.items()):
            if child.poll() is None:
                continue
            del self.children[name]
            if record_died(self.root / "jobs" / name):
                log.warning("job %s: its supervisor exited with code %s before the job ended", name, child.returncode)
                died.append(name)
        return died

    def adopt_orphans(self) -> list[str]:
        """On start: jobs this host claimed before a restart have no supervisor any more; record their end."""
        jobs = self.root / "jobs"
        orphans = []
        for job_dir in sorted(jobs.iterdir()) if jobs.is_dir() else []:
            with contextlib.suppress(OSError):
                if (job_dir / CLAIM_FILE).read_text() == self.host and record_died(job_dir):
                    orphans.append(job_dir.name)
        return orphans

    def heartbeat(self) -> None:
        (self.root / HEARTBEAT_FILE).touch()

    def pass_once(self) -> None:
        self.reap()
        self.start_waiting()
        self.heartbeat()


def record_died(job_dir: Path) -> bool:
    """Record that the job's supervisor is gone when its state still says it runs; whether it had to."""
    try:
        state = read_state(job_dir)
    except (OSError, ValueError):
        return False
    if JobStatus(state["status"]).is_terminal:
        return False
    write_json_atomic(
        job_dir / STATE_FILE,
        {**state, "status": JobStatus.FAILED.value, "failure_reason": DIED_REASON, "ended_at": time.time()},
    )
    local_fleet.give_back(job_dir.parent.parent, job_dir.name)
    return True


def healthy(root: Path, now: float | None = None) -> bool:
    """Whether a runner passed over ``root`` within ``HEARTBEAT_SECONDS`` (compose's health check)."""
    try:
        age = (now if now is not None else time.time()) - (Path(root) / HEARTBEAT_FILE).stat().st_mtime
    except OSError:
        return False
    return age < HEARTBEAT_SECONDS


def main(argv: list[str]) -> int:
    """``python -m shardline.backends.local_runner [--check] [ROOT]`` (ROOT: ``SHARDLINE_LOCAL_ROOT``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [job-runner] %(message)s")
    check = "--check" in argv
    given = [a for a in argv if a != "--check"]
    root = Path(given[0] if given else os.environ.get("SHARDLINE_LOCAL_ROOT", ".shardline-local"))
    if check:
        return 0 if healthy(root) else 1
    # Group-writable, as the submitter's files are: Airflow's processes read the job's state and logs, write STOP.
    os.umask(0o002)
    runner = Runner(root)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    for name in runner.adopt_orphans():
        log.warning("job %s: claimed here before a restart, its supervisor is gone: recorded as failed", name)
    log.info("running the local jobs left under %s, as uid %d", root, os.getuid())
    while not stopping:
        runner.pass_once()
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
