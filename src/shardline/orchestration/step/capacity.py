"""What AWS's ordinary refusals change in a step: the wait a planned job records on the STEP item, and the
attempt that follows a capacity failure (its instance type and count). The decisions are
:mod:`shardline.decision.fleet`'s; this module applies them to a spec and the ledger."""

from __future__ import annotations

import logging
import math

from shardline.decision import fleet
from shardline.ledger.step_writes import note_step
from shardline.orchestration import services
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)


def note_waiting(spec: PipelineSpec, attempt: Attempt, waiting: fleet.Waiting | None) -> bool:
    """Record on the step's STEP item why its attempt's job is not running yet (Airflow's admission, a refused
    submit), as data the CLI and the page render; None clears it once the job is submitted. False: the attempt no
    longer owns the step (it moved on)."""
    recorded = waiting.to_json() if waiting is not None and waiting.text() else None
    return note_step(services.ledger_model(spec), attempt.ref, attempt.number, recorded)


def after_capacity_failure(spec: PipelineSpec, attempt: Attempt) -> Attempt:
    """``attempt`` with its capacity failure counted, on the instance type (and count) the next job takes."""
    resources = spec.step(attempt.step).resources
    failed_on = attempt.runs_on(resources.instance_type)
    failures = {**attempt.capacity_failures, failed_on: attempt.capacity_failures.get(failed_on, 0) + 1}
    types = (resources.instance_type, *resources.fallback_instance_types)
    # The instances planned on the step's own type: kept from the first move on, so rounding never compounds.
    planned = attempt.planned_instances or math.ceil(
        attempt.requested_instances * fleet.vcpus(failed_on) / fleet.vcpus(types[0])
    )
    choice = fleet.capacity_choice(types, planned, failures)
    log.warning("step %s, attempt %d: %s", attempt.step, attempt.number, choice.reason)
    return attempt.model_copy(
        update={
            "instance_type": choice.instance_type,
            "requested_instances": choice.instance_count,
            "capacity_failures": failures,
            "planned_instances": planned,
        }
    )
