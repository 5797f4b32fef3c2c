"""A pipeline's deadline: by when each run's partition must be scored, and who else hears when it is not."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field, WithJsonSchema

from shardline.spec.base import _Strict

DURATION_PATTERN = r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$"
MAX_DEADLINE_SECONDS = 7 * 86400
# A function of an importable module: ``package.module.function``.
IMPORT_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"


def duration_seconds(value: object) -> object:
    """``20m``, ``1h30m``, ``90s`` (or a number of seconds) as seconds; anything else is left for the field's own
    check to refuse."""
    if isinstance(value, str):
        match = re.match(DURATION_PATTERN, value.strip())
        if not match or not any(match.groups()):
            raise ValueError(f"{value!r} is no duration: write it as 20m, 1h30m, 90s, or a number of seconds")
        hours, minutes, seconds = (int(group or 0) for group in match.groups())
        return hours * 3600 + minutes * 60 + seconds
    return value


Duration = Annotated[
    int,
    BeforeValidator(duration_seconds),
    Field(ge=1, le=MAX_DEADLINE_SECONDS),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": DURATION_PATTERN, "minLength": 2},
                {"type": "integer", "minimum": 1, "maximum": MAX_DEADLINE_SECONDS},
            ]
        }
    ),
]


class DeadlineSpec(_Strict):
    """By when each run's partition must be scored. A run that has not succeeded by then (still running, or
    failed) is reported once: an error in the deadline callback's log naming the pipeline, the partition, the run's
    state and the on-call command; the run's message in `shardline runs` and the page; and ``notify``, if set. It
    becomes an Airflow Deadline Alert."""

    after: Duration
    """how long after the partition is due its run must have succeeded: `20m`, `1h30m`, `90s`, or seconds (at most
    7 days). Due: a scheduled run's data interval's end; a manual run's, the later of that and the moment it was
    triggered; a backfill has none"""
    notify: Annotated[str, Field(pattern=IMPORT_PATH_PATTERN)] | None = None
    """also call this function, `package.module.function` (a module of the DAG folder, or an installed one), with
    one argument, the `shardline.airflow.deadlines.DeadlineMissed` (its `message`, `pipeline`, `partition`,
    `run_id`, `state`, `command`); a page, a chat message"""
