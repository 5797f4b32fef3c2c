"""Airflow's REST API answering 5xx (an API server restarting, its database locked): the client asks again after
each of its waits, and a failure that persists is one line saying what failed and what to check. Against a real
HTTP server on loopback; the waits are recorded, never slept."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading

import pytest

from shardline.oncall.airflow_client import RETRY_WAITS, AirflowApiError, AirflowClient
from shardline.oncall.errors import Unavailable
from shardline.oncall.service import OnCall
from shardline.spec import parse_spec

START = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
TRIGGER = "/api/v2/dags/hourly/dagRuns"


class ScriptedApi:
    """An HTTP server whose answers to ``POST /api/v2/dags/hourly/dagRuns`` are ``statuses`` in turn (the last one
    from then on); ``GET /api/v2/dags/hourly`` says the DAG is paused. It records every request."""

    def __init__(self, statuses: list[int]):
        self.statuses, self.requests = list(statuses), []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                api.requests.append(("GET", self.path))
                self._answer(200, {"is_paused": True})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                api.requests.append(("POST", self.path))
                status = api.statuses.pop(0) if len(api.statuses) > 1 else api.statuses[0]
                body = {"dag_run_id": "manual__r1"} if status < 400 else {"detail": "Internal Server Error"}
                self._answer(status, body)

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def posts(self) -> int:
        return sum(1 for method, path in self.requests if method == "POST" and path == TRIGGER)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(request):
    server = ScriptedApi(request.param)
    yield server
    server.close()


def client(api: ScriptedApi, waits: list[float]) -> AirflowClient:
    return AirflowClient(api.url, token="t", source="the test", sleep=waits.append)


@pytest.mark.parametrize("api", [[500, 200]], indirect=True)
def test_a_5xx_answer_is_asked_again_after_a_wait_and_the_next_answer_stands(api):
    waits: list[float] = []
    run = client(api, waits).trigger("hourly", {}, logical_date=START.isoformat())
    assert run == {"dag_run_id": "manual__r1"}
    assert (api.posts(), waits) == (2, [RETRY_WAITS[0]])


@pytest.mark.parametrize("api", [[404]], indirect=True)
def test_a_4xx_answer_is_not_asked_again(api):
    waits: list[float] = []
    with pytest.raises(AirflowApiError) as caught:
        client(api, waits).trigger("hourly", {}, logical_date=START.isoformat())
    assert (caught.value.status, api.posts(), waits) == (404, 1, [])


@pytest.mark.parametrize("api", [[500]], indirect=True)
def test_a_5xx_that_persists_says_in_one_line_what_failed_and_what_to_check(api):
    waits: list[float] = []
    spec = parse_spec(
        {
            "pipeline": "hourly",
            "schedule": "@hourly",
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": "s3://m/model.tar.gz", "sha256": "0" * 64},
                    "input": {"prefix": "s3://in/{{ ds }}/"},
                    "output": {"prefix": "s3://out/{{ ds }}/"},
                }
            ],
        },
        "hourly.yaml",
    )
    oncall = OnCall({"hourly": spec}, airflow=client(api, waits), now=lambda: START + dt.timedelta(hours=2))
    with pytest.raises(Unavailable) as caught:
        oncall.trigger("hourly", START, {})
    said = str(caught.value)
    assert (api.posts(), waits) == (len(RETRY_WAITS) + 1, list(RETRY_WAITS))
    assert "\n" not in said
    assert said.startswith("Airflow did not confirm the trigger of hourly for 2026-11-22 12:00-2026-11-22 13:00 UTC")
    assert (
        f"Airflow's API server at {api.url} failed POST {TRIGGER} 4 times over 7 s (500: Internal Server Error): "
        f"check its log for the error, and that it and its metadata database are up ({api.url}/api/v2/monitor/health); "
        "then run the same command again"
    ) in said
    assert said.endswith("(should the run have been made after all, it is refused, naming it)")
