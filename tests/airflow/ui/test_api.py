"""The on-call app's answers as a browser gets them, from Airflow's own API server with the plugin loaded.

Only the API server runs (no scheduler: nothing here needs a DAG run), over a migrated SQLite
database, so this module takes seconds. Its one pipeline names a ledger table that does not exist
on moto_server: reading it is a real AWS failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from shardline.ledger.keys import StepRef
from shardline.local.embedded_aws import free_port
from shardline.planning.naming import run_folder
from tests.conftest import AWS_TEST_ENV
from tests.support import http
from tests.support.airflow_stack import _stop

PIPELINE = "p"
STARTUP_TIMEOUT = 180


@dataclasses.dataclass
class Api:
    base: str  # the app's root: Airflow's URL + /shardline
    auth: dict[str, str]
    log: Path
    table: str
    dags: Path  # read on every request: a test may add a pipeline's spec

    def resubmit(self, content_type: str | None, body: bytes = b'{"all_failed": true, "dry_run": true}'):
        headers = {**self.auth, **({"Content-Type": content_type} if content_type else {})}
        return http.post(f"{self.base}/runs/{PIPELINE}/run-1/steps/score/resubmit", content=body, headers=headers)


def _answers(url: str) -> bool:
    try:
        return http.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def api(tmp_path_factory, moto_endpoint):
    root = tmp_path_factory.mktemp("oncall-api")
    dags, home = root / "dags", root / "home"
    (dags / "pipelines").mkdir(parents=True)
    table = f"shardline-missing-{uuid.uuid4().hex[:8]}"  # never created
    (dags / "pipelines" / f"{PIPELINE}.yaml").write_text(
        f"pipeline: {PIPELINE}\nledger_table: {table}\nsteps:\n  - name: score\n"
        f"    model: {{uri: s3://b/m.tar.gz, sha256: {'a' * 64}}}\n"
        "    input: {prefix: s3://b/in/}\n    output: {prefix: s3://b/out/}\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SHARDLINE_AIRFLOW_"))}
    env.update(
        {
            **AWS_TEST_ENV,
            "AWS_ENDPOINT_URL": moto_endpoint,
            "AWS_CONFIG_FILE": str(root / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-creds"),
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": url,
        }
    )
    home.mkdir()
    migrated = subprocess.run(
        [str(venv_bin / "airflow"), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=home,
    )
    assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
    log = home / "api-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(venv_bin / "airflow"), "api-server", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=home,
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not _answers(url):
            assert proc.poll() is None, f"the API server exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no API server after {STARTUP_TIMEOUT}s:\n{log.read_text()[-4000:]}"
            time.sleep(1)
        username, password = next(
            iter(json.loads((home / "simple_auth_manager_passwords.json.generated").read_text()).items())
        )
        answer = http.post(f"{url}/auth/token", json={"username": username, "password": password})
        answer.raise_for_status()
        yield Api(f"{url}/shardline", {"Authorization": f"Bearer {answer.json()['access_token']}"}, log, table, dags)
    finally:
        _stop(proc)


def policy(answer: httpx.Response) -> dict[str, str]:
    """The answer's Content-Security-Policy, as directive -> sources."""
    directives = (d.strip().split(None, 1) for d in answer.headers["content-security-policy"].split(";"))
    return {d[0]: (d[1] if len(d) > 1 else "") for d in directives if d}


def test_the_page_may_be_framed_by_airflow_only_and_runs_only_its_own_script(api):
    page = http.get(f"{api.base}/", headers=api.auth)
    assert page.status_code == 200, page.text
    csp = policy(page)
    # Airflow's UI frames the page from the API server's own origin: 'self', and nothing else.
    assert csp["frame-ancestors"] == "'self'"
    nonce = re.search(r'<script nonce="([A-Za-z0-9_-]{16,})">', page.text).group(1)
    assert f'<style nonce="{nonce}">' in page.text
    assert (csp["default-src"], csp["script-src"], csp["style-src"]) == (
        "'none'",
        f"'nonce-{nonce}'",
        f"'nonce-{nonce}'",
    )
    assert csp["connect-src"] == "'self'" and csp["base-uri"] == "'none'"
    assert "unsafe" not in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    again = http.get(f"{api.base}/", headers=api.auth)
    assert policy(again)["script-src"] != csp["script-src"]  # a nonce per answer, never a fixed one


def test_every_other_answer_may_be_framed_by_airflow_only_and_is_never_sniffed(api):
    answers = {
        "pipelines": http.get(f"{api.base}/pipelines", headers=api.auth),
        "icon": http.get(f"{api.base}/icon.svg"),
        "unknown pipeline": http.get(f"{api.base}/runs", params={"pipeline": "nope"}, headers=api.auth),
        "no token": http.get(f"{api.base}/pipelines"),
        "aws failure": http.get(f"{api.base}/runs", params={"pipeline": PIPELINE}, headers=api.auth),
    }
    assert [a.status_code for a in answers.values()] == [200, 200, 404, 401, 502]
    for what, answer in answers.items():
        assert answer.headers.get("x-content-type-options") == "nosniff", what
        assert policy(answer) == {"default-src": "'none'", "frame-ancestors": "'self'"}, what


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",  # what a cross-site form or a "simple" fetch sends without a CORS preflight
        "text/plain; application/json",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "application/json; charset=latin-1",
        "application/json; charset=utf-8; x=y",
        None,
    ],
)
def test_a_resubmission_is_refused_unless_its_body_is_declared_json_exactly(api, content_type):
    answer = api.resubmit(content_type)
    assert answer.status_code == 415, answer.text
    assert "Content-Type: application/json" in answer.json()["detail"]


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"]
)
def test_a_resubmission_declared_json_gets_past_the_check(api, content_type):
    # The pipeline's ledger table does not exist: past the check, the resubmission fails on AWS.
    assert api.resubmit(content_type).status_code == 502


def test_an_aws_failure_shows_the_reader_a_reference_not_aws_s_message(api):
    for answer in (
        http.get(f"{api.base}/runs", params={"pipeline": PIPELINE}, headers=api.auth),
        http.get(f"{api.base}/runs/{PIPELINE}/run-1", headers=api.auth),
        api.resubmit("application/json"),
    ):
        assert answer.status_code == 502, answer.text
        detail = answer.json()["detail"]
        ref = re.search(r"ref ([0-9a-f]{12})\b", detail).group(1)
        assert "could not find a table, bucket or job the pipeline spec names" in detail
        for leak in ("arn:", "botocore", "pynamodb", "Error", "Exception", "An error occurred", "Requested resource"):
            assert leak not in answer.text, (leak, answer.text)
        assert not re.search(r"\d{12}", answer.text.replace(ref, "")), answer.text  # an account id
        # Whoever runs the server finds AWS's own message in its log by the reference (written before the answer).
        logged = [line for line in api.log.read_text(errors="replace").splitlines() if f"ref {ref}" in line]
        assert logged and "ResourceNotFoundException" in "\n".join(logged), api.log.read_text()[-3000:]


# --- a step's run report ---------------------------------------------------------------------------------------

# A report as a step's end writes it, with what a page must never run: the answer's policy keeps it inert.
REPORT_HTML = (
    b"<!DOCTYPE html><html><head><meta charset='utf-8'><style>h1{color:#1f6fb2}</style></head><body>"
    b"<h1>Run report</h1><img alt='chart' src='data:image/png;base64,iVBORw0KGgo='>"
    b"<script>document.title='ran'</script></body></html>"
)


@pytest.fixture
def reported(api, aws_env, ledger_table):
    """Pipeline ``r`` in the API server's DAGs folder, with run-1 (its step ended, its report on S3, written as a
    step's end writes it) and run-2 (its step planned, not ended: no report yet)."""
    import boto3

    from shardline.ledger.states import StepStatus
    from shardline.ledger.step_writes import ensure_run, finish_step, start_attempt
    from shardline.ledger.table import bind_ledger

    bucket = f"r-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    (api.dags / "pipelines" / "r.yaml").write_text(
        f"pipeline: r\nledger_table: {ledger_table}\nsteps:\n  - name: score\n"
        f"    model: {{uri: s3://{bucket}/m.tar.gz, sha256: {'a' * 64}}}\n"
        f"    input: {{prefix: s3://{bucket}/in/}}\n    output: {{prefix: s3://{bucket}/out/}}\n"
    )
    model = bind_ledger(ledger_table)
    for run_id in ("run-1", "run-2"):
        ensure_run(model, "r", run_id)
        start_attempt(
            model,
            StepRef("r", run_id, "score"),
            1,
            [(f"s3://{bucket}/in/a.parquet", 1)],
            plan_json=json.dumps(
                {
                    "input_prefix": f"s3://{bucket}/in/",
                    "output_prefix": f"s3://{bucket}/out/{run_id}/",
                    "model_uri": f"s3://{bucket}/m.tar.gz",
                    "requested_instances": 1,
                }
            ),
        )
    finish_step(model, StepRef("r", "run-1", "score"), 1, StepStatus.SUCCEEDED)
    s3.put_object(
        Bucket=bucket,
        Key=f"out/run-1/_shardline/reports/{run_folder('run-1')}/score/report.html",
        Body=REPORT_HTML,
        ContentType="text/html; charset=utf-8",
    )
    # Another run's report where a crafted run id could point, were the key taken from the request.
    s3.put_object(
        Bucket=bucket, Key=f"out/run-2/_shardline/reports/{run_folder('run-1')}/score/report.html", Body=b"not this one"
    )
    yield bucket
    (api.dags / "pipelines" / "r.yaml").unlink()


def test_a_step_s_report_is_streamed_from_s3_under_a_policy_that_lets_nothing_run(api, reported):
    run = http.get(f"{api.base}/runs/r/run-1", headers=api.auth)
    assert run.status_code == 200, run.text
    [step] = run.json()["steps"]
    assert step["report_url"] == "runs/r/run-1/steps/score/report"  # relative to the app, as the page links it

    answer = http.get(f"{api.base}/{step['report_url']}", headers=api.auth)
    assert answer.status_code == 200, answer.text
    assert answer.content == REPORT_HTML
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert answer.headers["x-content-type-options"] == "nosniff" and answer.headers["cache-control"] == "no-store"
    csp = policy(answer)
    assert csp["default-src"] == "'none'" and "script-src" not in csp  # no script, whatever the page holds
    assert "sandbox" in csp and csp["frame-ancestors"] == "'self'"
    assert (csp["img-src"], csp["style-src"], csp["base-uri"], csp["form-action"]) == (
        "data:",
        "'unsafe-inline'",
        "'none'",
        "'none'",
    )
    assert http.get(f"{api.base}/{step['report_url']}").status_code == 401  # Airflow's auth, as every route


def test_a_report_that_is_not_there_is_a_404_that_says_when_reports_are_written(api, reported):
    running = http.get(f"{api.base}/runs/r/run-2", headers=api.auth).json()["steps"][0]
    assert running["report_url"] is None  # not ended: the page shows no link
    answer = http.get(f"{api.base}/runs/r/run-2/steps/score/report", headers=api.auth)
    assert answer.status_code == 404, answer.text
    assert "has not ended (PLANNED)" in answer.json()["detail"]
    assert "a step's run report is written when the step ends" in answer.json()["detail"]
    assert policy(answer) == {"default-src": "'none'", "frame-ancestors": "'self'"}


@pytest.mark.parametrize(
    "path",
    [
        "runs/r/nope/steps/score/report",  # no such run in the ledger
        "runs/r/RUN-1/steps/score/report",  # names the same folder once slugged, but is not a run
        "runs/r/..%2Frun-1/steps/score/report",
        "runs/r/run-1/steps/other/report",  # not a step of the spec
        "runs/nope/run-1/steps/score/report",
    ],
)
def test_a_report_is_found_only_through_the_ledger_never_by_a_path_from_the_request(api, reported, path):
    answer = http.get(f"{api.base}/{path}", headers=api.auth, params={"key": "out/run-2/_shardline/x"})
    assert answer.status_code == 404, answer.text
    assert b"not this one" not in answer.content and REPORT_HTML not in answer.content


# --- a quote before launch -------------------------------------------------------------------------------------


def test_the_page_quotes_a_pipelines_next_run_or_says_why_it_cannot(api, aws_env, ledger_table):
    """`GET /quote` quotes as `shardline quote --no-sample` does: a pipeline with no successful run is refused with
    the command that samples it, an hour with no input is quoted as nothing, and a partition that is no time or no
    interval's start is a 400 naming it."""
    import boto3

    bucket = f"q-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="in/part-0.csv", Body=b"id,f0\n1,0.5\n")
    hour = "dt={{ data_interval_start | ds }}/hour={{ data_interval_start.strftime('%H') }}/"
    specs = {
        "q": f"    input: {{prefix: s3://{bucket}/in/}}\n",
        "qh": f'    input: {{prefix: "s3://{bucket}/hourly/{hour}"}}\n',
    }
    for name, input_line in specs.items():
        schedule = "schedule: '@hourly'\n" if name == "qh" else ""
        (api.dags / "pipelines" / f"{name}.yaml").write_text(
            f"pipeline: {name}\n{schedule}ledger_table: {ledger_table}\nsteps:\n  - name: score\n"
            f"    model: {{uri: s3://{bucket}/m.tar.gz, sha256: {'a' * 64}}}\n"
            f"{input_line}    output: {{prefix: s3://{bucket}/out/}}\n"
        )
    try:
        refused = http.get(f"{api.base}/quote", params={"pipeline": "q"}, headers=api.auth)
        assert refused.status_code == 400, refused.text
        detail = refused.json()["detail"]
        assert "has no successful run on ml.m5.xlarge to quote from" in detail and "`shardline quote q`" in detail

        quoted = http.get(
            f"{api.base}/quote", params={"pipeline": "qh", "partition": "2026-11-22T10:00"}, headers=api.auth
        )
        assert quoted.status_code == 200, quoted.text
        body = quoted.json()
        assert body["lines"][0] == "quote of qh: 1 run(s)" and body["partitions"][0]["partition"].startswith(
            "2026-11-22T10"
        )
        assert any(f"no input under s3://{bucket}/hourly/dt=2026-11-22/hour=10/" in line for line in body["lines"])
        assert body["usd"]["expected"] == 0

        for partition in ("yesterday", "2026-11-22T10:30"):
            bad = http.get(f"{api.base}/quote", params={"pipeline": "qh", "partition": partition}, headers=api.auth)
            assert bad.status_code == 400 and partition in bad.json()["detail"], bad.text
        assert http.get(f"{api.base}/quote", params={"pipeline": "q"}).status_code == 401  # Airflow's auth
    finally:
        for name in specs:
            (api.dags / "pipelines" / f"{name}.yaml").unlink()
