"""How a step ends, from the watch's status and what its end found (``decision.step_end``). Pure."""

from __future__ import annotations

import pytest

from shardline.decision.step_end import EndChecks, end_status
from shardline.ledger.states import StepStatus

OK, PARTIAL, FAILED = StepStatus.SUCCEEDED, StepStatus.PARTIAL, StepStatus.FAILED


@pytest.mark.parametrize(
    ("status", "checks", "ends"),
    [
        (OK, EndChecks(), (OK, "all 4 files succeeded")),
        (PARTIAL, EndChecks(), (PARTIAL, "all 4 files succeeded")),
        (OK, EndChecks(lost="another run holds out/"), (FAILED, "another run holds out/")),
        (
            OK,
            EndChecks(unvouched="out/a.parquet is not the object the ledger recorded"),
            (FAILED, "out/a.parquet is not the object the ledger recorded"),
        ),
        (
            PARTIAL,
            EndChecks(over_limit="12 rows rejected, over tolerance.rows"),
            (FAILED, "12 rows rejected, over tolerance.rows"),
        ),
        (OK, EndChecks(checks="checks: blocked by drift.max_psi"), (FAILED, "checks: blocked by drift.max_psi")),
        # The first check that found something is the reason, in the module's order.
        (OK, EndChecks(lost="held", unvouched="unvouched", checks="checks"), (FAILED, "held")),
        (OK, EndChecks(over_limit="over", checks="checks"), (FAILED, "over")),
        # A step that failed already keeps its own reason: nothing of it is committed.
        (FAILED, EndChecks(checks="checks"), (FAILED, "all 4 files succeeded")),
    ],
)
def test_a_done_step_ends_as_the_watch_said_unless_a_check_of_its_outputs_fails_it(status, checks, ends):
    assert end_status(status, "all 4 files succeeded", checks) == ends
