"""A run that missed its deadline (spec ``deadline:``), recorded where on call looks: the run's RUN item."""

from __future__ import annotations

import logging

from shardline.ledger.step_writes import ensure_run, record_deadline_missed
from shardline.orchestration import services
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)


def record_missed(spec: PipelineSpec, run_id: str, mark: str, partition: str | None = None) -> None:
    """Mark the run as past its deadline (``mark``: when, and its state then): `shardline runs`, `status` and the
    page show it. A run late before its first plan task ran (queued behind a pool, say) has no RUN item yet: it is
    made now (RUNNING, with its ``partition``), so the miss is seen everywhere, not only in this log."""
    model = services.ledger_model(spec)
    if record_deadline_missed(model, spec.pipeline, run_id, mark):
        return
    ensure_run(model, spec.pipeline, run_id, partition)
    if not record_deadline_missed(model, spec.pipeline, run_id, mark):
        log.warning("run %s/%s: its deadline miss could not be recorded in the ledger", spec.pipeline, run_id)
