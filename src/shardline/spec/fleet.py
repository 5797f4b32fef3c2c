"""The fleet file, ``dags/fleet.yaml``: the account's SageMaker quotas, declared once for every pipeline.

::

    quotas:                 # instances of a type that may run at once, account-wide: the Service Quota
      ml.c5.2xlarge: 20     # "<type> for processing job usage"

Each quota is an Airflow pool (``sagemaker-<type>``, its slots the quota, deferred tasks counted), which
``shardline fleet sync`` creates and keeps in step with this file. A step on that type holds its instances'
worth of slots while it is submitted and watched, so Airflow admits steps within the quota, highest
``priority`` first. Without the file, or for a type it does not name, nothing is admitted by Airflow (AWS's
own refusals are still waited out). A bad file is an import error that names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import Field, ValidationError

from shardline.spec import INSTANCE_TYPE_PATTERN, PipelineSpec, SpecError, StepSpec, _Strict, problem_lines

FLEET_FILE = "fleet.yaml"


class FleetSpec(_Strict):
    quotas: dict[Annotated[str, Field(pattern=INSTANCE_TYPE_PATTERN)], Annotated[int, Field(ge=1, le=100_000)]] = {}
    """instances of each SageMaker instance type the account may run at once (its Service Quota for processing
    jobs): steps on that type are admitted within it, through an Airflow pool"""


def load_fleet(dags_folder: Path) -> FleetSpec:
    """``dags_folder/fleet.yaml``, or an empty fleet (no quotas) when there is none."""
    path = Path(dags_folder) / FLEET_FILE
    if not path.is_file():
        return FleetSpec()
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from err
    if data is None:
        return FleetSpec()
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a fleet file must be a YAML mapping (quotas: {{TYPE: N}}), got {type(data).__name__}")
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(f"{path}: invalid fleet file\n" + "\n".join(problem_lines(err))) from err


def quota_of(step: StepSpec, fleet: FleetSpec | None) -> int | None:
    """The account's quota of the step's instance type, or None when the fleet file names none."""
    return fleet.quotas.get(step.resources.instance_type) if fleet else None


def admitted_instances(step: StepSpec, fleet: FleetSpec | None) -> int | None:
    """The most instances a run of ``step`` may ask for: the spec's instance_count when anything counts them (its type's
    pool in ``fleet``, or resources.max_concurrent_instances), else None (as ``Admission.max_instances``)."""
    counted = quota_of(step, fleet) is not None or step.resources.max_concurrent_instances is not None
    return step.resources.instance_count if counted else None


def check_quotas(spec: PipelineSpec, fleet: FleetSpec | None, spec_path: Path) -> None:
    """A step that asks for more instances than its type's quota could never start: an import error naming the
    spec, the field and the fleet file."""
    for step in spec.steps:
        quota, resources = quota_of(step, fleet), step.resources
        if quota is not None and resources.instance_count > quota:
            raise SpecError(
                f"{spec_path}: steps.{step.name}.resources.instance_count is {resources.instance_count}, over the "
                f"quota of {quota} {resources.instance_type} instances in {FLEET_FILE}: no job of it could ever start"
            )
