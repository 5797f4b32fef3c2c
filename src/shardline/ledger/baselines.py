"""A step's reference profile for its output checks (``checks.reference: baseline``), made once from a baseline file
by ``shardline checks baseline`` and read at each of the step's ends. One item per pipeline and step, written whole,
never expiring: a baseline stays until it is made again."""

from __future__ import annotations

import json

from shardline.errors import InvalidArgument
from shardline.ledger.keys import baseline_pk, step_sk
from shardline.ledger.table import LedgerItem

# DynamoDB holds 400 KB an item: a profile is a few KB a column (its sketch), so this is hundreds of columns.
MAX_BASELINE_BYTES = 300_000


def write_baseline(model: type[LedgerItem], pipeline: str, step: str, baseline: dict) -> None:
    """Record ``baseline`` (``profile``, ``source``, ``made_at``, ``made_by``) as the step's reference, replacing any
    earlier one. Raises InvalidArgument when it is too big for one item."""
    text = json.dumps(baseline, separators=(",", ":"))
    if len(text.encode()) > MAX_BASELINE_BYTES:
        raise InvalidArgument(
            f"the baseline of step {step} is {len(text.encode()):,} bytes of JSON, over the {MAX_BASELINE_BYTES:,} "
            "one ledger item holds: make it from a file with only the step's output columns and checked features"
        )
    c = model.Control
    c(baseline_pk(pipeline), step_sk(step), baseline=text).save()


def read_baseline(model: type[LedgerItem], pipeline: str, step: str) -> dict | None:
    """The step's reference as :func:`write_baseline` recorded it, or None when none was made."""
    c = model.Control
    try:
        item = c.get(baseline_pk(pipeline), step_sk(step), consistent_read=True)
    except c.DoesNotExist:
        return None
    return json.loads(item.baseline) if item.baseline else None
