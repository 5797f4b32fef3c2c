"""HTTP calls the tests make to a real Airflow API server: httpx's, with a timeout a busy machine keeps within.

httpx waits 5 s by default; an API server on a machine running other tests can take longer to answer, and a test
must not fail for that (no test may depend on timing)."""

from __future__ import annotations

import httpx

TIMEOUT_SECONDS = 120.0


def get(url: str, **kwargs) -> httpx.Response:
    kwargs.setdefault("timeout", TIMEOUT_SECONDS)
    return httpx.get(url, **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    kwargs.setdefault("timeout", TIMEOUT_SECONDS)
    return httpx.post(url, **kwargs)
