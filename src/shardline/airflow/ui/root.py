"""The path Airflow is served under, which the page's links and the navigation entry start from.

Light on purpose (no FastAPI, no service layer): ``plugin`` reads it in every Airflow process that
loads plugins, and ``api`` reads it in the API server, so neither imports the other for it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from airflow.configuration import conf


def airflow_root_path() -> str:
    """The path Airflow is served under (``[api] base_url``), without a trailing slash."""
    return urlsplit(conf.get("api", "base_url", fallback="") or "/").path.rstrip("/")
