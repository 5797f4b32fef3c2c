"""When the ledger cannot vouch for a step: its STEP item gone, older than the attempt that was planned, or the table
itself gone. Absence is never success, and never a newer attempt that moved on: every reader and every fenced write's
refusal asks here before it reads one as the other."""

from __future__ import annotations

import shlex

from shardline.errors import LedgerRecordMissing
from shardline.ledger.keys import StepRef
from shardline.ledger.step_reads import read_step_item
from shardline.ledger.table import LedgerItem


def record_gap(step_item, ref: StepRef, attempt: int) -> str | None:
    """Why the ledger cannot vouch for ``attempt`` of the step, from its STEP item as read (None when it is gone):
    the item is missing, or names an older attempt than one that was planned (the table lost its state and was
    made again). None when the item is there at ``attempt`` or a newer one. Absence is never success, and never a
    newer attempt that moved on."""
    pipeline, run_id, step = ref
    rerun = shlex.join(["shardline", "rerun", f"{pipeline}/{run_id}"])
    if step_item is None:
        found = "has no record of"
    elif int(step_item.attempt or 0) < attempt:
        found = f"records only attempt {int(step_item.attempt or 0)} of"
    else:
        return None
    return (
        f"the ledger {found} step {step} of run {run_id}, which planned attempt {attempt}: was the AWS endpoint's "
        "state lost (the embedded endpoint restarted without its data, the table recreated)? Nothing the step did "
        f"can be counted or vouched for without it, so it is not taken for done. Plan the run again: {rerun}"
    )


TABLE_GONE = "ResourceNotFoundException"


def table_gone(err: BaseException) -> bool:
    """Whether a pynamodb error says the ledger table itself does not exist (the endpoint lost its state and was
    not provisioned again, or the table was deleted)."""
    return getattr(err, "cause_response_code", None) == TABLE_GONE or type(err).__name__ == "TableDoesNotExist"


def table_gone_text(model: type[LedgerItem], ref: StepRef) -> str:
    """What a step's end says when the ledger table is gone: nothing it did can be counted."""
    pipeline, run_id, step = ref
    rerun = shlex.join(["shardline", "rerun", f"{pipeline}/{run_id}"])
    return (
        f"the ledger table {model.Meta.table_name} does not exist, so step {step} of run {run_id} has no record: was "
        "the AWS endpoint's state lost (the embedded endpoint restarted without its data)? Provision it again "
        f"(`shardline local up` does), then plan the run again: {rerun}"
    )


def check_refusal(model: type[LedgerItem], ref: StepRef, attempt: int) -> None:
    """After a write fenced on ``attempt`` was refused: raise :class:`LedgerRecordMissing` when the reason is not a
    newer attempt or a cancel but a STEP item that is gone (or older than ``attempt``); return when it is there."""
    gap = record_gap(read_step_item(model, ref), ref, attempt)
    if gap:
        raise LedgerRecordMissing(gap)
