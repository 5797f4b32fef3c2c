"""A real Airflow 3 for tests: ``airflow standalone`` (API server, scheduler, DAG processor,
triggerer) on a free loopback port, with its own AIRFLOW_HOME and DAGs folder, pointed at
the session's moto_server. Started by the tests, stopped (the whole process group) after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from shardline.local.embedded_aws import free_port
from shardline.local.tether import tethered
from shardline.oncall.airflow_client import AirflowClient

STARTUP_TIMEOUT = 240
REPO_ROOT = Path(__file__).resolve().parents[2]  # tests.support.sqlite_args is imported from there


@dataclasses.dataclass
class AirflowStack:
    url: str
    home: Path
    dags: Path
    env: dict[str, str]
    username: str
    password: str
    log: Path

    def client(self) -> AirflowClient:
        return AirflowClient(self.url, username=self.username, password=self.password)

    def use_aws(self, monkeypatch) -> None:
        """Point this process's AWS clients (pynamodb's too) at the same endpoint as Airflow's."""
        for name, value in self.env.items():
            if name.startswith("AWS_"):
                monkeypatch.setenv(name, value)

    def s3(self):
        """An S3 client on the same endpoint as Airflow's."""
        return self.aws_client("s3")

    def aws_client(self, service: str):
        """A client of ``service`` on the same endpoint as Airflow's."""
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def token_for(self, username: str, role: str, expires_in: int | None = None) -> str:
        """A JWT for a simple-auth-manager user with ``role`` (e.g. "viewer"), signed by this Airflow's own
        code and secret: a user who may read but, as a viewer, not clear tasks. ``expires_in`` < 0: one that
        has already expired."""
        expiry = "" if expires_in is None else f", expiration_time_in_seconds={expires_in}"
        code = (
            "from airflow.api_fastapi.app import create_auth_manager\n"
            "from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser\n"
            f"print(create_auth_manager().generate_jwt(SimpleAuthManagerUser(username={username!r}, "
            f"role={role!r}){expiry}))\n"
        )
        env = {
            "PATH": str(Path(sys.executable).parent),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    def cli_env(self) -> dict[str, str]:
        """Environment for a `shardline` subprocess talking to this Airflow and the same AWS endpoint."""
        return {
            **self.env,
            "SHARDLINE_AIRFLOW_URL": self.url,
            "SHARDLINE_AIRFLOW_USERNAME": self.username,
            "SHARDLINE_AIRFLOW_PASSWORD": self.password,
            "SHARDLINE_DAGS_FOLDER": str(self.dags),
        }

    def wait_for_run(self, dag_id: str, run_id: str, states=("success", "failed"), timeout: float = 240) -> dict:
        client = self.client()
        deadline = time.monotonic() + timeout
        run = {}
        while time.monotonic() < deadline:
            run = client.dag_run(dag_id, run_id)
            if run["state"] in states:
                return run
            time.sleep(2)
        tis = client.task_instances(dag_id, run_id)
        raise AssertionError(
            f"run {run_id} still {run.get('state')} after {timeout}s: "
            f"{[(t['task_id'], t['state']) for t in tis]}\n{self.tail()}"
        )

    def assert_succeeds(self, dag_id: str, run_id: str, timeout: float = 240) -> dict:
        """Wait for the run to end, and fail the test unless it succeeded, with the logs of the tasks that failed."""
        run = self.wait_for_run(dag_id, run_id, timeout=timeout)
        assert run["state"] == "success", f"{self.failed_logs(dag_id, run_id)}\n--- standalone ---\n{self.tail()}"
        return run

    def failed_logs(self, dag_id: str, run_id: str, chars: int = 6000) -> str:
        """The logs of the run's failed tasks (latest try each), for an assertion's message: what the task said is
        what explains a run that failed where it should have succeeded."""
        client = self.client()
        parts = []
        for ti in client.task_instances(dag_id, run_id):
            if ti["state"] not in ("failed", "upstream_failed") or ti["try_number"] < 1:
                continue
            log = client._call(
                "GET",
                f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}",
                params={"full_content": "true"},
            )
            parts.append(f"--- {ti['task_id']} try {ti['try_number']} ---\n{str(log)[-chars:]}")
        return "\n".join(parts) or "(no failed task has a log)"

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Wait until the DAG processor has parsed a DAG file a test just wrote (its DAG is in the API)."""
        client = self.client()
        deadline = time.monotonic() + timeout
        while True:
            try:
                client._call("GET", f"/dags/{dag_id}")
                return
            except Exception:
                assert time.monotonic() < deadline, f"the DAG {dag_id} never appeared:\n{self.tail()}"
                time.sleep(2)

    def deadlines(self, dag_id: str, run_id: str = "~") -> dict[str, dict]:
        """The Airflow deadlines of the DAG's runs (``run_id``: one run's), by run id, as Airflow's UI reads them.
        Airflow drops the deadline of a run that succeeded in time."""
        client = self.client()
        answer = client._http.request(
            "GET",
            f"{client.base_url}/ui/dags/{dag_id}/dagRuns/{run_id}/deadlines",
            params={"limit": 1000},
            headers=client._auth_header(),
        )
        answer.raise_for_status()
        return {d["dag_run_id"]: d for d in answer.json()["deadlines"]}

    def lineage(self, dag_id: str, run_id: str, task_id: str) -> list[dict]:
        """The OpenLineage events of a task of a run (the file transport's, oldest first)."""
        events = []
        for path in sorted((self.home / "lineage").glob("ol-*.json")):
            event = json.loads(path.read_text())
            airflow = event.get("run", {}).get("facets", {}).get("airflow", {})
            if (
                event.get("job", {}).get("name") == f"{dag_id}.{task_id}"
                and airflow.get("dagRun", {}).get("run_id") == run_id
            ):
                events.append(event)
        return events

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def _healthy(url: str) -> bool:
    try:
        answer = httpx.get(f"{url}/api/v2/monitor/health", timeout=2)
        body = answer.json()
    except (httpx.HTTPError, ValueError):
        return False
    return all(
        body.get(part, {}).get("status") == "healthy"
        for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
    )


@contextlib.contextmanager
def airflow_standalone(home: Path, dags: Path, aws_env: dict[str, str], extra_env: dict[str, str] | None = None):
    port = free_port()
    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        **aws_env,
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        # A new DAG file is found within 5 s and parsed at once, a changed one goes to the front of the queue, and a
        # DAG callback's file too: an unchanged file has nothing new to say. Each parse costs about 0.3 CPU-s (it
        # imports the DAG factory); every minute, for the 4 to 6 files here, that was CPU the rest of the suite needs
        # on 2 cores (it runs three standalones), so unchanged files wait longer than a unit runs.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "900",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        # SQLite waits for its write lock instead of failing a busy process (tests/support/sqlite_args.py).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "tests.support.sqlite_args.SQLITE_CONNECT_ARGS",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "SHARDLINE_LOCAL_ROOT": str(home / "shardline-local"),
        # The test specs are unpinned (conftest), so tests can swap models; their instances run as processes.
        "SHARDLINE_LOCAL_RUNTIME": "process",
        "SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS": "1",
        # OpenLineage (shardline[lineage]) with its file transport: one file per event under home/lineage/. Only the
        # watch tasks emit task events (the plan and report tasks' carry no datasets of Shardline's), each built in a
        # thread of the task's process rather than a fork of it: the suite's Airflow runs a few hundred tasks.
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(home / "lineage" / "ol")}),
        "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
        # The task waits this long for its event to be written, then drops it (10 s by default): a busy machine
        # must not lose the events the tests read.
        "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "120",
        "AIRFLOW__OPENLINEAGE__DISABLED_FOR_OPERATORS": ";".join(
            (
                "shardline.airflow.operators.plan.PlanStepOperator",
                "shardline.airflow.operators.report.ReportOperator",
                "airflow.providers.standard.operators.empty.EmptyOperator",
            )
        ),
    }
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_S3"):
        env.pop(name, None)  # a developer's own endpoints must not leak into the test's (a caller may set them)
    env.update(extra_env or {})  # last: a caller may also change Airflow's settings above
    for name in [n for n in env if n.startswith("SHARDLINE_AIRFLOW_")]:
        env.pop(name)  # a developer's own Airflow settings must not leak into the test's
    (home / "lineage").mkdir(parents=True, exist_ok=True)
    log = home / "standalone.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            # Tethered: a test session killed mid-way (a timeout's SIGTERM, SIGKILL) leaves no standalone behind.
            tethered([str(venv_bin / "airflow"), "standalone"]),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=home,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not _healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(f"airflow standalone exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"airflow standalone not healthy after {STARTUP_TIMEOUT}s:\n{log.read_text()[-4000:]}"
                )
            time.sleep(2)
        passwords = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())
        username, password = next(iter(passwords.items()))
        yield AirflowStack(
            url,
            home,
            dags,
            {k: v for k, v in env.items() if k.startswith(("AWS_", "SHARDLINE_"))},
            username,
            password,
            log,
        )
    finally:
        _stop(proc)
        stop_local_jobs(home / "shardline-local")


def stop_local_jobs(root: Path) -> None:
    """Stop every local job still running under ``root``: a job's processes are not Airflow's children, so
    stopping Airflow leaves them running (a job held on a gate would spin after the test)."""
    from shardline.backends.local import LocalBackend

    backend = LocalBackend(root)
    for job_dir in sorted((root / "jobs").glob("sl-*")):
        with contextlib.suppress(Exception):
            if not backend.describe(job_dir.name).status.is_terminal:
                backend.stop(job_dir.name)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # Children that left the group (gunicorn/uvicorn workers) are killed by their session id.
    import psutil

    for child in psutil.process_iter(["pid"]):
        # A child may exit between the listing and the look-up: os.getsid then raises
        # ProcessLookupError, which is no psutil.Error.
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(child.pid) == proc.pid:
                child.kill()
