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

from shardline.local.embedded_aws import free_port
from tests.airflow_stack import _stop
from tests.conftest import AWS_TEST_ENV

PIPELINE = "p"
STARTUP_TIMEOUT = 180


@dataclasses.dataclass
class Api:
    base: str  # the app's root: Airflow's URL + /shardline
    auth: dict[str, str]
    log: Path
    table: str

    def resubmit(self, content_type: str | None, body: bytes = b'{"all_failed": true, "dry_run": true}'):
        headers = {**self.auth, **({"Content-Type": content_type} if content_type else {})}
        return httpx.post(f"{self.base}/runs/{PIPELINE}/run-1/steps/score/resubmit", content=body, headers=headers)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200
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
        "    input: {prefix: s3://b/in/}\n    output: {prefix: s3://b/out/}\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SHARDLINE_AIRFLOW_"))}
    env.update({
        **AWS_TEST_ENV, "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_CONFIG_FILE": str(root / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-creds"),
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}", "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__BASE_URL": url,
    })
    home.mkdir()
    migrated = subprocess.run([str(venv_bin / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True,
                              timeout=300, check=False, cwd=home)
    assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
    log = home / "api-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(venv_bin / "airflow"), "api-server", "--port", str(port)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=home)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not _answers(url):
            assert proc.poll() is None, f"the API server exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no API server after {STARTUP_TIMEOUT}s:\n{log.read_text()[-4000:]}"
            time.sleep(1)
        username, password = next(iter(json.loads(
            (home / "simple_auth_manager_passwords.json.generated").read_text()).items()))
        answer = httpx.post(f"{url}/auth/token", json={"username": username, "password": password})
        answer.raise_for_status()
        yield Api(f"{url}/shardline", {"Authorization": f"Bearer {answer.json()['access_token']}"}, log, table)
    finally:
        _stop(proc)


def policy(answer: httpx.Response) -> dict[str, str]:
    """The answer's Content-Security-Policy, as directive -> sources."""
    directives = (d.strip().split(None, 1) for d in answer.headers["content-security-policy"].split(";"))
    return {d[0]: (d[1] if len(d) > 1 else "") for d in directives if d}


def test_the_page_may_be_framed_by_airflow_only_and_runs_only_its_own_script(api):
    page = httpx.get(f"{api.base}/", headers=api.auth)
    assert page.status_code == 200, page.text
    csp = policy(page)
    # Airflow's UI frames the page from the API server's own origin: 'self', and nothing else.
    assert csp["frame-ancestors"] == "'self'"
    nonce = re.search(r'<script nonce="([A-Za-z0-9_-]{16,})">', page.text).group(1)
    assert f'<style nonce="{nonce}">' in page.text
    assert (csp["default-src"], csp["script-src"], csp["style-src"]) == ("'none'", f"'nonce-{nonce}'",
                                                                        f"'nonce-{nonce}'")
    assert csp["connect-src"] == "'self'" and csp["base-uri"] == "'none'"
    assert "unsafe" not in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    again = httpx.get(f"{api.base}/", headers=api.auth)
    assert policy(again)["script-src"] != csp["script-src"]  # a nonce per answer, never a fixed one


def test_every_other_answer_may_be_framed_by_airflow_only_and_is_never_sniffed(api):
    answers = {
        "pipelines": httpx.get(f"{api.base}/pipelines", headers=api.auth),
        "icon": httpx.get(f"{api.base}/icon.svg"),
        "unknown pipeline": httpx.get(f"{api.base}/runs", params={"pipeline": "nope"}, headers=api.auth),
        "no token": httpx.get(f"{api.base}/pipelines"),
        "aws failure": httpx.get(f"{api.base}/runs", params={"pipeline": PIPELINE}, headers=api.auth),
    }
    assert [a.status_code for a in answers.values()] == [200, 200, 404, 401, 502]
    for what, answer in answers.items():
        assert answer.headers.get("x-content-type-options") == "nosniff", what
        assert policy(answer) == {"default-src": "'none'", "frame-ancestors": "'self'"}, what


@pytest.mark.parametrize("content_type", [
    "text/plain",  # what a cross-site form or a "simple" fetch sends without a CORS preflight
    "text/plain; application/json",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/jsonp",
    "application/json; charset=latin-1",
    "application/json; charset=utf-8; x=y",
    None,
])
def test_a_resubmission_is_refused_unless_its_body_is_declared_json_exactly(api, content_type):
    answer = api.resubmit(content_type)
    assert answer.status_code == 415, answer.text
    assert "Content-Type: application/json" in answer.json()["detail"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON;charset=UTF-8"])
def test_a_resubmission_declared_json_gets_past_the_check(api, content_type):
    # The pipeline's ledger table does not exist: past the check, the resubmission fails on AWS.
    assert api.resubmit(content_type).status_code == 502


def test_an_aws_failure_shows_the_reader_a_reference_not_aws_s_message(api):
    for answer in (httpx.get(f"{api.base}/runs", params={"pipeline": PIPELINE}, headers=api.auth),
                   httpx.get(f"{api.base}/runs/{PIPELINE}/run-1", headers=api.auth),
                   api.resubmit("application/json")):
        assert answer.status_code == 502, answer.text
        detail = answer.json()["detail"]
        ref = re.search(r"ref ([0-9a-f]{12})\b", detail).group(1)
        assert "could not find a table, bucket or job the pipeline spec names" in detail
        for leak in ("arn:", "botocore", "pynamodb", "Error", "Exception", "An error occurred", "Requested resource"):
            assert leak not in answer.text, (leak, answer.text)
        assert not re.search(r"\d{12}", answer.text.replace(ref, "")), answer.text  # an account id
        # The operator finds AWS's own message in the server's log by the reference (written before the answer).
        logged = [line for line in api.log.read_text(errors="replace").splitlines() if f"ref {ref}" in line]
        assert logged and "ResourceNotFoundException" in "\n".join(logged), api.log.read_text()[-3000:]
