"""What can go wrong with an on-call request, as a small hierarchy: each kind knows how the page
answers it (``http_status``) and how the CLI exits (``exit_code``), so neither reads the message
to decide. Pure: no AWS client, no Airflow."""

from __future__ import annotations

from shardline.errors import ShardlineError


class OnCallError(ShardlineError):
    """Something the on-call engineer can fix; the message says what to do next.

    Its kind says how the page answers (``http_status``) and how the CLI exits (``exit_code``), so
    neither reads the message to decide.
    """

    http_status = 409
    exit_code = 1


class NotFound(OnCallError):
    """No such pipeline, run, step or file."""

    http_status = 404


class Conflict(OnCallError):
    """The request does not fit where the run is now (a watch task in charge, an attempt moved on, ended)."""

    http_status = 409


class BadRequest(OnCallError):
    """The request itself is malformed: a run name, a choice of files."""

    http_status = 400
    exit_code = 2


class Refused(OnCallError):
    """Airflow would not let this caller do it."""

    http_status = 403


class Unavailable(OnCallError):
    """Airflow cannot be asked (not configured, or not answering), so nothing was changed."""

    http_status = 503
