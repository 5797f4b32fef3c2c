"""A run's budget as on-call raised it (``shardline resubmit ... --budget-usd``): one attribute of its RUN item, which
the step's next watch holds the run to instead of the spec's ``budget.run_usd``."""

from __future__ import annotations

from pynamodb.exceptions import UpdateError

from shardline.errors import InvalidArgument, LedgerRecordMissing
from shardline.ledger.keys import RUN_SK, run_pk
from shardline.ledger.table import LedgerItem, condition_failed


def set_run_budget(model: type[LedgerItem], pipeline: str, run_id: str, budget_usd: float) -> None:
    """Record ``budget_usd`` as the run's budget. The RUN item must exist: a budget of no run is no budget."""
    if not budget_usd > 0:
        raise InvalidArgument(f"--budget-usd must be a number of USD above 0, got {budget_usd!r}")
    c = model.Control
    try:
        c(run_pk(pipeline, run_id), RUN_SK).update(actions=[c.budget_usd.set(budget_usd)], condition=c.pk.exists())
    except UpdateError as err:
        if condition_failed(err):
            raise LedgerRecordMissing(
                f"run {pipeline}/{run_id} has no RUN item in the ledger: no budget was set"
            ) from err
        raise
