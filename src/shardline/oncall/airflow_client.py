"""A small client for Airflow 3's REST API (``/api/v2``): what the CLI needs, nothing more.

Where the CLI finds Airflow, first match wins, so the same command works against a laptop's
``airflow standalone`` and a production deployment:

1. the ``--airflow-url`` and ``--airflow-token-file`` flags (a file: a token on a command line is readable by
   every user of the machine);
2. the environment: ``SHARDLINE_AIRFLOW_URL`` with ``SHARDLINE_AIRFLOW_TOKEN`` (a bearer token), or
   with ``SHARDLINE_AIRFLOW_USERNAME`` and ``SHARDLINE_AIRFLOW_PASSWORD`` (exchanged for a token
   at ``POST /auth/token``, as Airflow's simple auth manager and others offer);
3. the file ``shardline login`` writes: ``$XDG_CONFIG_HOME/shardline/airflow.json`` (by default
   ``~/.config/shardline/airflow.json``), mode 0600, holding the URL and a token.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from shardline.errors import ShardlineError

ENV_URL = "SHARDLINE_AIRFLOW_URL"
ENV_TOKEN = "SHARDLINE_AIRFLOW_TOKEN"
ENV_USERNAME = "SHARDLINE_AIRFLOW_USERNAME"
ENV_PASSWORD = "SHARDLINE_AIRFLOW_PASSWORD"
ENV_CONFIG = "SHARDLINE_AIRFLOW_CONFIG"  # another path for the login file (tests, several Airflows)

HOW_TO_CONFIGURE = (
    f"run `shardline login URL` once (it asks for a user and password and keeps a token), or set "
    f"{ENV_URL} and {ENV_TOKEN} (or {ENV_USERNAME} and {ENV_PASSWORD})"
)


def login_refused(base_url: str, username: str, status: int, text: str) -> str:
    """Why ``POST /auth/token`` gave no token, and what to check."""
    return (
        f"logging in to Airflow at {base_url} as {username} failed ({status}: {text.strip() or 'no detail'}); "
        f"check the user name and password ({ENV_USERNAME} and {ENV_PASSWORD}, or what `shardline login` "
        "asked for)"
    )


# What Airflow 3's API server answers for each kind of bad token (airflow.api_fastapi.core_api.security).
NOT_AUTHENTICATED, TOKEN_EXPIRED, INVALID_TOKEN = "Not authenticated", "Token Expired", "Invalid JWT token"


def api_refused(
    base_url: str, source: str, method: str, path: str, status: int, detail: object, *, sent_token: bool = True
) -> str:
    """An error answer of the REST API in words, with what to do about it.

    A token that is missing, malformed, expired, or valid but without the permission are four different fixes,
    so each has its own words: Airflow answers 401 for the first and third, 403 for the second and fourth, and
    tells them apart by its detail.
    """
    if status == 401 and (not sent_token or str(detail) == NOT_AUTHENTICATED):
        return (
            f"Airflow at {base_url} needs a token, and none was sent (settings from {source}; 401: {detail}): "
            f"{HOW_TO_CONFIGURE}"
        )
    if status == 401 and str(detail) == TOKEN_EXPIRED:
        return (
            f"the token from {source} has expired (Airflow at {base_url} answered 401: {detail}): get a new "
            f"one: {HOW_TO_CONFIGURE}"
        )
    if status == 401:
        return f"Airflow at {base_url} refused the token from {source} (401: {detail}): {HOW_TO_CONFIGURE}"
    if status == 403 and str(detail) == INVALID_TOKEN:
        return (
            f"Airflow at {base_url} cannot read the token from {source} (403: {detail}): it is cut short, "
            "mistyped, or issued by another Airflow (another [api_auth] jwt_secret). Copy it again, or "
            f"{HOW_TO_CONFIGURE}"
        )
    said = f"Airflow at {base_url}: {method} /api/v2{path} answered {status}: {detail}"
    if status == 403:
        return (
            f"{said}; the token from {source} is valid, but its user lacks that permission in Airflow: ask an "
            "Airflow admin for it, or `shardline login` as a user who has it"
        )
    if status >= 500:
        return server_failed(base_url, f"{method} /api/v2{path}", status, detail, tries=1, waited=0.0)
    return said


def server_failed(base_url: str, request: str, status: int, detail: object, *, tries: int, waited: float) -> str:
    """Airflow's API server failed a request (5xx) every time it was asked: in one line, what failed and what to
    check. ``tries``: how often it was asked, over ``waited`` seconds of waits between the tries."""
    said = " ".join(str(detail).split())[:200] or "no detail"  # one line: an HTML error page is cut short
    times = f"{tries} times over {waited:.0f} s" if tries > 1 else "once"
    return (
        f"Airflow's API server at {base_url} failed {request} {times} ({status}: {said}): check its log for the "
        f"error, and that it and its metadata database are up ({base_url}/api/v2/monitor/health)"
    )


class AirflowApiError(ShardlineError):
    """The API answered with an error; the message carries its status and detail."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def config_path(env: dict[str, str] | None = None) -> Path:
    """Where ``shardline login`` keeps the URL and token."""
    env = os.environ if env is None else env
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG])
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "shardline" / "airflow.json"


@dataclasses.dataclass(frozen=True)
class AirflowSettings:
    """How to reach Airflow, and where that came from (said in every error about it)."""

    url: str
    token: str | None = None
    username: str | None = None
    password: str | None = None
    source: str = "flags"

    def client(self) -> AirflowClient:
        return AirflowClient(
            self.url, token=self.token, username=self.username, password=self.password, source=self.source
        )


def find_settings(
    url: str | None = None, token: str | None = None, env: dict[str, str] | None = None
) -> AirflowSettings | None:
    """Flags, then the environment, then the login file; ``None`` when none says where Airflow is."""
    env = os.environ if env is None else env
    if url:
        return AirflowSettings(url.strip(), token=token or env.get(ENV_TOKEN) or None, source="--airflow-url")
    if env.get(ENV_URL, "").strip():
        return AirflowSettings(
            env[ENV_URL].strip(),
            token=token or env.get(ENV_TOKEN) or None,
            username=env.get(ENV_USERNAME) or None,
            password=env.get(ENV_PASSWORD) or None,
            source=ENV_URL,
        )
    path = config_path(env)
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
        return AirflowSettings(str(saved["url"]), token=token or str(saved["token"]), source=str(path))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AirflowApiError(f"cannot read the login file {path} ({err!r}); run `shardline login URL` again") from err


def save_login(url: str, token: str, env: dict[str, str] | None = None) -> Path:
    """Write the login file, readable by its owner only (it holds a bearer token)."""
    path = config_path(env)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), stat.S_IRUSR | stat.S_IWUSR)  # also when the file already existed
        json.dump({"url": url.rstrip("/"), "token": token}, out)
    return path


# The waits (seconds) before each new try of a request Airflow's API server failed (5xx): an API server restarting,
# or its database briefly locked or failing over, answers 500 or 503 for a few seconds. Its request is one database
# transaction, rolled back when it fails, so asking again does not do a thing twice; a trigger that did land behind
# a gateway's 502 or 504 is refused when asked again (its logical date is taken), and says so.
RETRY_WAITS = (1.0, 2.0, 4.0)


class AirflowClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
        source: str = "the caller",
        retry_waits: Sequence[float] = RETRY_WAITS,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.base_url = base_url.rstrip("/")
        self.source = source  # where the URL and token came from, for messages
        self._token = token
        self._credentials = (username, password) if username and password else None
        self._http = httpx.Client(timeout=timeout)
        self._retry_waits = tuple(retry_waits)
        self._sleep = sleep  # the seam a test replaces: no test waits for real

    def _send(self, method: str, url: str, **kwargs) -> tuple[httpx.Response, int, float]:
        """The answer to a request, asked again after each of the retry waits while the server fails it (5xx); with
        how often it was asked and how long was waited."""
        tries, waited = 1, 0.0
        for wait in self._retry_waits:
            answer = self._http.request(method, url, **kwargs)
            if answer.status_code < 500:
                return answer, tries, waited
            self._sleep(wait)
            tries, waited = tries + 1, waited + wait
        return self._http.request(method, url, **kwargs), tries, waited

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AirflowClient | None:
        """A client configured from the environment or the login file, or ``None`` when neither says."""
        settings = find_settings(env=env)
        return settings.client() if settings else None

    def login(self, username: str, password: str) -> str:
        """Exchange a user and password for a bearer token (``POST /auth/token``) and use it from now on."""
        self._token, self._credentials = None, (username, password)
        self._auth_header()
        assert self._token is not None
        return self._token

    def _auth_header(self) -> dict[str, str]:
        if self._token is None and self._credentials is not None:
            username, password = self._credentials
            try:
                answer, tries, waited = self._send(
                    "POST", f"{self.base_url}/auth/token", json={"username": username, "password": password}
                )
                if answer.status_code >= 500:
                    raise AirflowApiError(
                        server_failed(
                            self.base_url,
                            "POST /auth/token",
                            answer.status_code,
                            answer.text,
                            tries=tries,
                            waited=waited,
                        ),
                        answer.status_code,
                    )
                if answer.status_code >= 400:
                    raise AirflowApiError(
                        login_refused(self.base_url, username, answer.status_code, answer.text[:300]),
                        answer.status_code,
                    )
                self._token = answer.json()["access_token"]
            except (httpx.HTTPError, ValueError, KeyError) as err:
                raise AirflowApiError(
                    f"cannot log in to Airflow at {self.base_url} (from {self.source}): {err!r}; "
                    "check that Airflow's API server answers at that URL (--airflow-url or "
                    f"{ENV_URL} picks another)"
                ) from err
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            answer, tries, waited = self._send(
                method, f"{self.base_url}/api/v2{path}", headers=self._auth_header(), **kwargs
            )
        except httpx.HTTPError as err:
            raise AirflowApiError(
                f"cannot reach Airflow at {self.base_url} (from {self.source}): {err!r}; check "
                "that its API server is up at that URL (--airflow-url or "
                f"{ENV_URL} picks another)"
            ) from err
        if answer.status_code >= 400:
            try:
                detail = answer.json().get("detail", answer.text)
            except (ValueError, AttributeError):
                detail = answer.text
            if answer.status_code >= 500:
                request = f"{method} /api/v2{path}"
                failed = server_failed(self.base_url, request, answer.status_code, detail, tries=tries, waited=waited)
                raise AirflowApiError(failed, answer.status_code)
            raise AirflowApiError(
                api_refused(
                    self.base_url, self.source, method, path, answer.status_code, detail, sent_token=bool(self._token)
                ),
                answer.status_code,
            )
        try:
            return answer.json() if answer.content else None
        except ValueError as err:
            raise AirflowApiError(
                f"Airflow at {self.base_url}: {method} /api/v2{path} answered something that is "
                f"not JSON ({answer.text[:200]!r}); check that {self.base_url} (from "
                f"{self.source}) is Airflow's API server"
            ) from err

    @staticmethod
    def _q(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    def dags_page(self) -> dict:
        """The first DAG in the list: what any user who may read DAGs can do (checks a token)."""
        return self._call("GET", "/dags", params={"limit": 1})

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self._call("GET", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}")

    def trigger(
        self,
        dag_id: str,
        conf: dict,
        *,
        run_id: str | None = None,
        logical_date: str | None = None,
        data_interval: tuple[str, str] | None = None,
        note: str | None = None,
    ) -> dict:
        """A new DAG run. ``data_interval`` (start, end) gives it that partition whatever the logical date infers."""
        body: dict[str, Any] = {"conf": conf, "logical_date": logical_date}
        if run_id:
            body["dag_run_id"] = run_id
        if data_interval:
            body["data_interval_start"], body["data_interval_end"] = data_interval
        if note:
            body["note"] = note
        return self._call("POST", f"/dags/{self._q(dag_id)}/dagRuns", json=body)

    def dag(self, dag_id: str) -> dict:
        """The DAG as the scheduler holds it: ``is_paused``, ``next_dagrun_logical_date``, ``next_dagrun_run_after``."""
        return self._call("GET", f"/dags/{self._q(dag_id)}")

    def runs_at(self, dag_id: str, logical_date: str) -> list[dict]:
        """The DAG's runs with this logical date (Airflow keeps one at most)."""
        params = {"logical_date_gte": logical_date, "logical_date_lte": logical_date}
        return self._call("GET", f"/dags/{self._q(dag_id)}/dagRuns", params=params).get("dag_runs", [])

    def delete_run(self, dag_id: str, run_id: str) -> None:
        self._call("DELETE", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}")

    def clear_tasks(
        self, dag_id: str, run_id: str, task_ids: list[str], *, include_downstream: bool = True, dry_run: bool = False
    ) -> list:
        """Clear these tasks (and what follows them) in one run, so the scheduler runs them again.

        With ``dry_run`` nothing changes, but Airflow checks the same permission (PUT on the DAG's
        task instances), so it tells beforehand whether the real clear would be allowed.
        """
        answer = self._call(
            "POST",
            f"/dags/{self._q(dag_id)}/clearTaskInstances",
            json={
                "dry_run": dry_run,
                "dag_run_id": run_id,
                "task_ids": task_ids,
                "only_failed": False,
                "include_downstream": include_downstream,
                "reset_dag_runs": True,
            },
        )
        return answer.get("task_instances", []) if answer else []

    def set_run_state(self, dag_id: str, run_id: str, state: str, note: str | None = None) -> dict:
        body: dict[str, Any] = {"state": state}
        if note:
            body["note"] = note[:1000]
        return self._call("PATCH", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}", json=body)

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str, note: str | None = None) -> dict:
        """Set a task instance's state (``failed``, ``success`` or ``skipped``): a deferred one's trigger is dropped."""
        body: dict[str, Any] = {"new_state": state}
        if note:
            body["note"] = note[:1000]
        path = f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances/{self._q(task_id)}"
        return self._call("PATCH", path, json=body)

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self._call("GET", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances/{self._q(task_id)}")

    def pool(self, name: str) -> dict | None:
        """An Airflow pool (its slots, occupied slots, include_deferred...), or None when there is none."""
        try:
            return self._call("GET", f"/pools/{self._q(name)}")
        except AirflowApiError as err:
            if err.status == 404:
                return None
            raise

    def put_pool(self, name: str, slots: int, description: str, *, create: bool) -> dict:
        """Create the pool, or set its slots and description; deferred tasks always count against it."""
        body = {"slots": slots, "description": description, "include_deferred": True}
        if create:
            return self._call("POST", "/pools", json={"name": name, **body})
        # The API checks a patch as a whole pool: its name (as "pool") goes with it.
        return self._call("PATCH", f"/pools/{self._q(name)}", json={"pool": name, **body})

    def pool_task_instances(self, pool: str, states: list[str]) -> list[dict]:
        """The task instances of every DAG run that hold (or wait for) slots of ``pool``, in these states."""
        answer = self._call(
            "GET", "/dags/~/dagRuns/~/taskInstances", params={"pool": [pool], "state": states, "limit": 1000}
        )
        return answer.get("task_instances", [])

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        answer = self._call("GET", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances")
        return answer.get("task_instances", [])
