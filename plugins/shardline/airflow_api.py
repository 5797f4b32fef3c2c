"""A small client for Airflow 3's REST API (``/api/v2``): what the CLI needs, nothing more.

Configured from the environment, so the same command works against a laptop's
``airflow standalone`` and a production deployment:

- ``SHARDLINE_AIRFLOW_URL``: the API server, e.g. ``http://localhost:8080``;
- ``SHARDLINE_AIRFLOW_TOKEN``: a bearer token, or
- ``SHARDLINE_AIRFLOW_USERNAME`` and ``SHARDLINE_AIRFLOW_PASSWORD``: exchanged for a token
  at ``POST /auth/token`` (Airflow's simple auth manager, and others that offer it).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

import httpx

ENV_URL = "SHARDLINE_AIRFLOW_URL"
ENV_TOKEN = "SHARDLINE_AIRFLOW_TOKEN"
ENV_USERNAME = "SHARDLINE_AIRFLOW_USERNAME"
ENV_PASSWORD = "SHARDLINE_AIRFLOW_PASSWORD"

# DAG run states in which no task will run again unless something is cleared.
FINISHED_RUN_STATES = frozenset({"success", "failed"})
# Task instance states in which the task will not run again unless it is cleared.
FINISHED_TASK_STATES = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})


class AirflowApiError(RuntimeError):
    """The API answered with an error; the message carries its status and detail."""


class AirflowClient:
    def __init__(self, base_url: str, *, token: str | None = None, username: str | None = None,
                 password: str | None = None, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._credentials = (username, password) if username and password else None
        self._http = httpx.Client(timeout=timeout)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AirflowClient | None:
        """A client configured from the environment, or ``None`` when no URL is set."""
        env = os.environ if env is None else env
        url = env.get(ENV_URL, "").strip()
        if not url:
            return None
        return cls(url, token=env.get(ENV_TOKEN) or None, username=env.get(ENV_USERNAME) or None,
                   password=env.get(ENV_PASSWORD) or None)

    def _auth_header(self) -> dict[str, str]:
        if self._token is None and self._credentials is not None:
            username, password = self._credentials
            try:
                answer = self._http.post(f"{self.base_url}/auth/token",
                                         json={"username": username, "password": password})
                if answer.status_code >= 400:
                    raise AirflowApiError(f"logging in to {self.base_url} as {username} failed "
                                          f"({answer.status_code}): {answer.text[:300]}")
                self._token = answer.json()["access_token"]
            except (httpx.HTTPError, ValueError, KeyError) as err:
                raise AirflowApiError(f"cannot log in to Airflow at {self.base_url}: {err!r}; check "
                                      f"{ENV_URL} and the credentials") from err
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            answer = self._http.request(method, f"{self.base_url}/api/v2{path}", headers=self._auth_header(),
                                        **kwargs)
        except httpx.HTTPError as err:
            raise AirflowApiError(f"cannot reach Airflow at {self.base_url} ({err!r}); check {ENV_URL}") from err
        if answer.status_code >= 400:
            try:
                detail = answer.json().get("detail", answer.text)
            except ValueError:
                detail = answer.text
            raise AirflowApiError(f"{method} {path} answered {answer.status_code}: {detail}")
        try:
            return answer.json() if answer.content else None
        except ValueError as err:
            raise AirflowApiError(f"{method} {path} answered something that is not JSON: "
                                  f"{answer.text[:200]!r}") from err

    @staticmethod
    def _q(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self._call("GET", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}")

    def trigger(self, dag_id: str, conf: dict, *, run_id: str | None = None, logical_date: str | None = None) -> dict:
        body: dict[str, Any] = {"conf": conf, "logical_date": logical_date}
        if run_id:
            body["dag_run_id"] = run_id
        return self._call("POST", f"/dags/{self._q(dag_id)}/dagRuns", json=body)

    def clear_tasks(self, dag_id: str, run_id: str, task_ids: list[str], *, include_downstream: bool = True) -> list:
        """Clear these tasks (and what follows them) in one run, so the scheduler runs them again."""
        answer = self._call("POST", f"/dags/{self._q(dag_id)}/clearTaskInstances", json={
            "dry_run": False, "dag_run_id": run_id, "task_ids": task_ids, "only_failed": False,
            "include_downstream": include_downstream, "reset_dag_runs": True,
        })
        return answer.get("task_instances", []) if answer else []

    def set_run_state(self, dag_id: str, run_id: str, state: str, note: str | None = None) -> dict:
        body: dict[str, Any] = {"state": state}
        if note:
            body["note"] = note[:1000]
        return self._call("PATCH", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}", json=body)

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self._call("GET", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances/{self._q(task_id)}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        answer = self._call("GET", f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances")
        return answer.get("task_instances", [])
