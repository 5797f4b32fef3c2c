"""A run that missed its deadline (spec ``deadline:``), recorded where on call looks: the run's RUN item."""

from __future__ import annotations

import logging

from shardline.ledger.step_writes import record_deadline_missed
from shardline.orchestration import services
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)


def record_missed(spec: PipelineSpec, run_id: str, mark: str) -> None:
    """Mark the run as past its deadline (``mark``: when, and its state then): `shardline runs`, `status` and the
    page show it."""
    if not record_deadline_missed(services.ledger_model(spec), spec.pipeline, run_id, mark):
        log.warning(
            "run %s/%s has no record in the ledger yet: its deadline miss is in this log only", spec.pipeline, run_id
        )
