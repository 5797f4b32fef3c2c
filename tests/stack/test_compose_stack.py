"""The compose stack, up for real: every service healthy, a DAG run green through Airflow's REST API, the
on-call page in a browser, a corrupt file resubmitted from inside the stack, and nothing left after ``down -v``.

The compose file is the user's, unchanged (``docker-compose.yaml``), with a ``.env`` that
``infra/compose/make_env.py`` writes, as the docs say. The images it names are those
``tests/stack/engine.py`` built or found.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.local.embedded_aws import free_port
from tests.airflow.ui.conftest import browser, screenshot  # noqa: F401 - fixtures: headless Chromium, screenshots
from tests.airflow.ui.test_page import _click, _css, _log_in, _open_from_airflow_nav, _text, _wait
from tests.stack.engine import REPO, STATE

PROJECT = "shardline-stack"
PIPELINE = "tabular_scoring_hourly"
UP_TIMEOUT = 600


@dataclass
class Stack:
    """What the browser helpers of the UI tests need: where Airflow is and who logs in."""

    url: str
    username: str
    password: str
    env: dict[str, str]

    @property
    def aws(self) -> str:
        """The embedded AWS endpoint as the host reaches it (compose publishes it on ``AWS_PORT``)."""
        return f"http://127.0.0.1:{self.env['AWS_PORT']}"

    def compose(
        self, *args: str, timeout: float = 900, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess:
        command = [
            str(Path(sys.executable).with_name("docker-compose")),
            "--project-directory",
            str(REPO),
            "-f",
            str(REPO / "docker-compose.yaml"),
            "--env-file",
            str(STATE / "compose.env"),
            "-p",
            PROJECT,
            *args,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, input=stdin)
        if check and result.returncode != 0:
            logs = subprocess.run(
                [*command[: -len(args)], "logs", "--tail", "60"], capture_output=True, text=True, check=False
            ).stdout
            raise AssertionError(
                f"docker compose {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
                f"\n{result.stdout}\n--- logs ---\n{logs[-6000:]}"
            )
        return result

    def exec(
        self, *command: str, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess:
        extra = [arg for name, value in (env or {}).items() for arg in ("-e", f"{name}={value}")]
        return self.compose("exec", "-T", *extra, "airflow-scheduler", *command, stdin=stdin)

    def api(self) -> httpx.Client:
        token = httpx.post(
            f"{self.url}/auth/token", json={"username": self.username, "password": self.password}, timeout=30
        )
        assert token.status_code in (200, 201), token.text
        return httpx.Client(
            base_url=f"{self.url}/api/v2",
            timeout=60,
            headers={"Authorization": f"Bearer {token.json()['access_token']}"},
        )


def _env_file() -> dict[str, str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_env", REPO / "infra" / "compose" / "make_env.py")
    make_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_env)
    STATE.mkdir(parents=True, exist_ok=True)
    path = STATE / "compose.env"
    assert make_env.main(["--output", str(path), "--force"]) == 0
    # Free ports on this machine, not 8080 and 5000: a developer's own Airflow often holds 8080 already, and its
    # login would answer the test's (AIRFLOW_PORT and AWS_PORT move what compose publishes).
    with path.open("a") as env:
        env.write(f"AIRFLOW_PORT={free_port()}\nAWS_PORT={free_port()}\n")
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#")


def _leftovers() -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={PROJECT}"
    found = {}
    for kind, command in (
        ("containers", ["docker", "ps", "-aq"]),
        ("volumes", ["docker", "volume", "ls", "-q"]),
        ("networks", ["docker", "network", "ls", "-q"]),
    ):
        found[kind] = subprocess.run(
            [*command, "--filter", label], capture_output=True, text=True, check=True
        ).stdout.split()
    return found


@pytest.fixture(scope="module")
def stack(figures):
    env = _env_file()
    ui = f"http://127.0.0.1:{env['AIRFLOW_PORT']}"
    up = Stack(ui, env["AIRFLOW_ADMIN_USERNAME"], env["AIRFLOW_ADMIN_PASSWORD"], env)
    up.compose("down", "-v", "--remove-orphans", check=False)  # what an interrupted run left
    started = time.monotonic()
    up.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", str(UP_TIMEOUT), timeout=UP_TIMEOUT + 60)
    figures(compose_up_s=round(time.monotonic() - started, 1))
    try:
        yield up
    finally:
        if os.environ.get("SHARDLINE_STACK_KEEP") != "1":
            up.compose("down", "-v", "--remove-orphans", check=False)


def _partition(logical_date: dt.datetime) -> tuple[str, str]:
    """(bucket, key prefix) of the hour the run at ``logical_date`` scores: the hour before it."""
    start = logical_date - dt.timedelta(hours=1)
    return "shardline-demo", f"events/dt={start:%Y-%m-%d}/hour={start:%H}/"


def _trigger(api: httpx.Client, run_id: str, logical_date: dt.datetime) -> None:
    """A manual run of the hour that ends at ``logical_date``, as the docs trigger one: named by its start (logical
    date and data interval as its scheduled run's), so it takes no other interval's logical date."""
    start = logical_date - dt.timedelta(hours=1)
    body = {
        "dag_run_id": run_id,
        "logical_date": start.isoformat(),
        "data_interval_start": start.isoformat(),
        "data_interval_end": logical_date.isoformat(),
    }
    made = api.post(f"/dags/{PIPELINE}/dagRuns", json=body)
    assert made.status_code in (200, 201), made.text


def _wait_for_run(api: httpx.Client, run_id: str, timeout: float = 900) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = api.get(f"/dags/{PIPELINE}/dagRuns/{run_id}").json()["state"]
        if state in ("success", "failed"):
            return state
        assert time.monotonic() < deadline, f"run {run_id} still {state} after {timeout:.0f}s"
        time.sleep(2)


def test_every_service_is_healthy_and_the_ui_answers(stack):
    listed = stack.compose("ps", "--format", "{{.Service}} {{.State}} {{.Health}}").stdout.split("\n")
    services = dict(line.split(" ", 1) for line in listed if line.strip())
    long_running = {
        "postgres",
        "aws",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "job-runner",
    }
    assert long_running <= set(services), services
    assert all(services[name] == "running healthy" for name in long_running), services
    assert httpx.get(f"{stack.url}/api/v2/monitor/health", timeout=30).json()["metadatabase"]["status"] == "healthy"
    assert httpx.get(f"{stack.url}/", timeout=30, follow_redirects=True).status_code == 200


def test_the_hourly_dag_runs_green_through_the_rest_api(stack, figures):
    hour = dt.datetime(2026, 11, 22, 11, tzinfo=dt.UTC)
    seeded = stack.exec(
        "python",
        "/opt/shardline/compose/seed_demo.py",
        "--logical-date",
        hour.isoformat(),
        "--files",
        "4",
        "--rows",
        "20000",
    )
    assert "uploaded 4 parquet files" in seeded.stdout, seeded.stdout + seeded.stderr
    with stack.api() as api:
        assert api.patch(f"/dags/{PIPELINE}", json={"is_paused": False}).status_code == 200
        started = time.monotonic()
        _trigger(api, "stack-green", hour)
        assert _wait_for_run(api, "stack-green") == "success"
        figures(dag_run_green_s=round(time.monotonic() - started, 1))
    s3 = boto3.client(
        "s3",
        endpoint_url=stack.aws,
        region_name="us-east-1",
        aws_access_key_id="shardline-local",
        aws_secret_access_key="shardline-local",
    )
    keys = [
        o["Key"]
        for o in s3.list_objects_v2(Bucket="shardline-demo", Prefix="scores/dt=2026-11-22/hour=10/")["Contents"]
    ]
    assert "scores/dt=2026-11-22/hour=10/_SUCCESS" in keys
    outputs = [k for k in keys if k.endswith(".parquet")]
    rows = sum(
        pq.read_table(io.BytesIO(s3.get_object(Bucket="shardline-demo", Key=k)["Body"].read())).num_rows
        for k in outputs
    )
    assert len(outputs) == 4 and rows == 20_000  # --rows is the partition's total

    # The hour is committed to the shipped output.table, in the catalog the stack keeps in its Postgres: the
    # on-call CLI inside the stack lists the snapshot, and a scan of the table counts the hour's rows.
    shown = stack.exec("python", "-m", "shardline.oncall.cli", "table", "history", PIPELINE, "--json")
    [snapshot] = [s for s in json.loads(shown.stdout)["snapshots"] if s["run_id"] == "stack-green"]
    partition = json.loads(snapshot["partition"])
    assert (snapshot["rows_added"], partition) == (20_000, {"dt": "2026-11-22", "hour": "10"}), snapshot
    probe = (
        "import os, pathlib, sqlalchemy\n"
        "from shardline.orchestration import tables\n"
        "from shardline.spec import load_spec\n"
        "spec = load_spec(pathlib.Path('/opt/airflow/dags/pipelines/tabular_scoring_hourly.yaml'))\n"
        "print(tables.scanned_rows(spec, 'score', {'dt': '2026-11-22', 'hour': '10'}))\n"
        "with sqlalchemy.create_engine(os.environ['SHARDLINE_LOCAL_CATALOG_URI']).connect() as db:\n"
        "    print(db.execute(sqlalchemy.text('select table_namespace, table_name from iceberg_tables')).all())\n"
    )
    said = stack.exec("python", "-c", probe)
    scanned, catalog = ["", "", *said.stdout.strip().splitlines()][-2:]
    assert scanned == "20000" and "('scoring', 'hourly_scores')" in catalog, said.stdout + said.stderr[-3000:]
    figures(table_snapshot=snapshot["snapshot_id"])


def _client(stack, service: str):
    return boto3.client(
        service,
        endpoint_url=stack.aws,
        region_name="us-east-1",
        aws_access_key_id="shardline-local",
        aws_secret_access_key="shardline-local",
    )


def _what_the_endpoint_holds(stack) -> tuple[dict, dict]:
    """The green run's outputs (key -> ETag, size) and its RUN item, as the aws service answers now."""
    s3, dynamodb = _client(stack, "s3"), _client(stack, "dynamodb")
    listed = s3.list_objects_v2(Bucket="shardline-demo", Prefix="scores/dt=2026-11-22/hour=10/")["Contents"]
    outputs = {o["Key"]: (o["ETag"], o["Size"]) for o in listed}
    run = dynamodb.get_item(
        TableName="shardline-jobs",
        Key={"pk": {"S": f"RUN#{PIPELINE}#stack-green"}, "sk": {"S": "RUN"}},
        ConsistentRead=True,
    ).get("Item", {})
    return outputs, run


def test_the_aws_service_killed_and_started_again_keeps_the_green_runs_ledger_and_outputs(stack):
    """The embedded endpoint's state lives on its volume: a kill -9 of the aws service and a start find the ledger
    and the outputs of the run before unchanged (they used to be gone, and the next run's end counted nothing)."""
    before = _what_the_endpoint_holds(stack)
    assert before[0] and before[1].get("ost", {}).get("S") == "SUCCEEDED", before
    stack.compose("kill", "-s", "SIGKILL", "aws")
    stack.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", str(UP_TIMEOUT), "aws", timeout=UP_TIMEOUT + 60)
    after = _what_the_endpoint_holds(stack)
    assert after == before


@pytest.mark.usefixtures("browser")
def test_a_corrupt_file_fails_its_run_and_a_resubmit_inside_the_stack_turns_it_green(
    stack,
    browser,  # noqa: F811
    screenshot,  # noqa: F811
):
    hour = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)
    seeded = stack.exec(
        "python",
        "/opt/shardline/compose/seed_demo.py",
        "--logical-date",
        hour.isoformat(),
        "--files",
        "3",
        "--rows",
        "5000",
    )
    assert seeded.returncode == 0, seeded.stderr
    s3 = boto3.client(
        "s3",
        endpoint_url=stack.aws,
        region_name="us-east-1",
        aws_access_key_id="shardline-local",
        aws_secret_access_key="shardline-local",
    )
    bucket, prefix = _partition(hour)
    s3.put_object(Bucket=bucket, Key=f"{prefix}late-arrival.parquet", Body=b"PAR1 cut short by a crashed writer")
    with stack.api() as api:
        api.patch(f"/dags/{PIPELINE}", json={"is_paused": False})
        _trigger(api, "stack-corrupt", hour)
        assert _wait_for_run(api, "stack-corrupt") == "failed"

        # The on-call page, in Chromium, shows the failed file.
        driver = browser
        _log_in(driver, stack)
        _open_from_airflow_nav(driver, stack)
        _click(driver, f"tr[data-pipeline={PIPELINE}] a.pipeline-link")
        row = "tr.run-row[data-run-id='stack-corrupt']"
        _wait(driver, lambda d: d.find_elements(*_css(row)), message="the run is not listed")
        _click(driver, f"{row} a.run-link")
        step = "section.step[data-step=score]"
        bad = _wait(
            driver,
            lambda d: d.find_elements(*_css(f"{step} tr.file-row[data-status=FAILED]")),
            message="the failed file is not shown",
        )[0]
        assert bad.get_attribute("data-key").endswith("/late-arrival.parquet")
        assert _text(driver, f"{step} tr.file-row[data-status=FAILED] .err-class") == "CorruptInputError"
        screenshot("compose-stack-failed-run")

        # The writer re-delivers the file; on call resubmits from inside the stack, as the page's hint says.
        good = io.BytesIO()
        pq.write_table(synthetic.make_table(5000, first_id=900_000), good)
        s3.put_object(Bucket=bucket, Key=f"{prefix}late-arrival.parquet", Body=good.getvalue())
        login = {"SHARDLINE_AIRFLOW_USERNAME": stack.username, "SHARDLINE_AIRFLOW_PASSWORD": stack.password}
        done = stack.exec(
            "shardline", "resubmit", f"{PIPELINE}/stack-corrupt", "--step", "score", "--all-failed", env=login
        )
        assert "cleared" in done.stdout, done.stdout + done.stderr
        assert api.get(f"/dags/{PIPELINE}/dagRuns/stack-corrupt").json()["state"] != "failed"  # cleared: running
        assert _wait_for_run(api, "stack-corrupt") == "success"


def test_a_hostile_model_in_a_compose_job_finds_nothing_of_airflows_and_is_refused_by_its_grant(stack, figures):
    """A pinned inference.py, submitted from the scheduler as its tasks submit jobs, tries what a hostile model
    would: every /proc/*/environ and cmdline it can read, links from its output folder to Airflow's files, and
    calls outside its job's grant, and the endpoint itself. It runs in the job-runner, under a uid that is not
    Airflow's, on a network whose one way out is the grant service."""
    probe = (Path(__file__).with_name("compose_probe.py")).read_text()
    done = stack.exec("python", "-", "shardline-jobs", stdin=probe)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout[done.stdout.index("FINDINGS ") + len("FINDINGS ") :])
    job = found.pop("job")
    assert job["status"] == "Completed", job["reason"]
    # Another container (the runner claimed it) and another uid than Airflow's 50000.
    assert job["claimed_by"] and job["claimed_by"] != job["scheduler_host"], job
    assert found["uid"] == 50001, found["uid"]
    # The probe reads what it can (its runner's environment: how to reach AWS) ...
    readable = [text for text in found["environ"].values() if not text.startswith("unreadable")]
    assert any("AWS_ENDPOINT_URL" in text for text in readable), found["environ"]
    # ... and no secret of the stack's .env, no Airflow variable, no Airflow process is among it.
    secrets = {
        name: stack.env[name]
        for name in (
            "AIRFLOW_FERNET_KEY",
            "AIRFLOW_JWT_SECRET",
            "AIRFLOW_API_SECRET_KEY",
            "POSTGRES_PASSWORD",
            "AIRFLOW_ADMIN_PASSWORD",
        )
    }
    seen = json.dumps(found)
    assert [name for name, value in secrets.items() if value in seen] == []
    assert "AIRFLOW__" not in seen
    commands = " ".join(found["cmdlines"].values())
    assert not [word for word in ("scheduler", "api-server", "triggerer", "dag-processor") if word in commands]
    # Its links out of the output folder were made, and nothing read through them left the box.
    assert set(found["links"].values()) <= {"made", "FileExistsError"}, found["links"]
    uploaded = {key: bytes.fromhex(body) for key, body in job["uploaded"].items()}
    assert not [k for k in uploaded if "leak-" in k or k.endswith("_SUCCESS")], list(uploaded)
    assert not [k for k, body in uploaded.items() for v in secrets.values() if v.encode() in body]
    assert [k for k in uploaded if k.endswith(".parquet")] == ["out/part-0.parquet"]  # its own work landed
    # What the job role may not do, refused as AWS refuses it, and named in the job's log.
    assert found["attacks"] == {
        "read another pipeline's outputs": "AccessDenied",
        "write its _SUCCESS": "AccessDenied",
        "forge another pipeline's ledger item": "AccessDeniedException",
        "reset the emulator": "403",
        "reach the endpoint itself": "URLError",  # the jobs' network has no route to it, nor its name
    }, found["attacks"]
    assert "through the grant service" in job["supervisor_log"], job["supervisor_log"]
    refused = [line for line in stack.compose("logs", "grant").stdout.splitlines() if f"job {job['name']}: " in line]
    assert len(refused) >= 3, refused  # the grant service names the job in each refusal
    figures(compose_job_secrets_found=0, compose_job_uid=found["uid"])


def test_down_leaves_nothing_behind(stack):
    stack.compose("down", "-v", "--remove-orphans")
    assert _leftovers() == {"containers": [], "volumes": [], "networks": []}
