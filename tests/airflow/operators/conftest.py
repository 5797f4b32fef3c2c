"""What the operators' tests share: one pipeline staged per test module on moto_server (its bucket, inputs, model and
ledger table real, its spec a file on disk as a DAG file's is), and Airflow's side of a task, written by hand as the
Amazon provider's operator tests write it: the context ``execute`` is handed, whose DAG run and task instance answer
only what the operators ask. The operators are called as Airflow's task runner calls them (``execute``, then the
method a deferral names, with the trigger's event); no Airflow runs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardline.spec import PipelineSpec, load_spec
from tests.conftest import AWS_TEST_ENV
from tests.support.pipelines import parquet_bytes, stage_step

PIPELINE = "operators_test"
FILES, ROWS = 2, 40  # two small files: a job of one instance ends in seconds
WHEN = dt.datetime(2025, 11, 22, 10, tzinfo=dt.UTC)  # the runs' logical date and data interval (long past)


# -- Airflow's side ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeDagRun:
    """A DAG run as a task's context holds it: what the operators read of it."""

    run_id: str
    conf: dict[str, Any] = dataclasses.field(default_factory=dict)
    run_type: str = "manual"
    clear_number: int = 0


class FakeTaskInstance:
    """A task instance as a task's context holds it: the XComs of the tasks before it, and whether Airflow still has a
    DAG run (``runs``: the run ids it has; None: it cannot say, and raises)."""

    def __init__(self, xcoms: dict[str, Any] | None = None, runs: set[str] | None = frozenset()):
        self.xcoms = dict(xcoms or {})
        self.runs = runs
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    def xcom_pull(self, task_ids: str | None = None, **_: Any) -> Any:
        return self.xcoms.get(task_ids)

    def get_dr_count(self, dag_id: str, run_ids: list[str] | None = None, **_: Any) -> int:
        self.asked.append((dag_id, tuple(run_ids or ())))
        if self.runs is None:
            raise RuntimeError("the API server could not be reached")
        return sum(r in self.runs for r in run_ids or ())


class FakeOutletEvent:
    """What ``context["outlet_events"][asset]`` gives a task: the Asset event's extra and partitions it sets."""

    def __init__(self) -> None:
        self.extra: dict[str, Any] = {}
        self.partitions: list[str] = []

    def add_partitions(self, *keys: str) -> None:
        self.partitions.extend(keys)


class FakeOutletEvents(dict):
    def __missing__(self, key):
        self[key] = FakeOutletEvent()
        return self[key]


def task_context(
    run_id: str,
    *,
    conf: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    xcoms: dict[str, Any] | None = None,
    runs: set[str] | None = frozenset(),
    run_type: str = "manual",
    clear_number: int = 0,
) -> dict[str, Any]:
    """The context Airflow hands a task of run ``run_id``: its Params as the trigger form's defaults, overridden by
    ``params``; its DAG run's ``conf`` as triggered."""
    return {
        "run_id": run_id,
        "params": {"input_prefix": "", "model_version": "latest", "instance_count": None, "dry_run": False}
        | (params or {}),
        "dag_run": FakeDagRun(run_id, dict(conf or {}), run_type, clear_number),
        "logical_date": WHEN,
        "data_interval_start": WHEN,
        "data_interval_end": WHEN,
        "ti": FakeTaskInstance(xcoms, runs),
        "outlet_events": FakeOutletEvents(),
    }


@pytest.fixture
def context() -> Callable[..., dict[str, Any]]:
    """``context(run_id, conf=..., params=..., xcoms=..., runs=...)``: a task's context (:func:`task_context`)."""
    return task_context


# -- the AWS side: real, on moto_server -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Staged:
    """A one-step pipeline (step ``score``) over ``FILES`` parquet files under ``in/`` and a packed XGBoost model."""

    spec: PipelineSpec
    bucket: str
    folder: Path
    spec_path: str
    local_root: Path

    def uri(self, folder: str) -> str:
        return f"s3://{self.bucket}/{folder}/"

    @property
    def model_uri(self) -> str:
        return f"s3://{self.bucket}/model/model.tar.gz"

    def variant(self, name: str, edit: Callable[[dict], None]) -> str:
        """A copy of the spec with ``edit`` applied to its data (``edit(data)``, in place), written beside it."""
        data = self.spec.model_dump(mode="json", exclude_defaults=True)
        edit(data)
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        load_spec(path)  # a variant the spec refuses is the test's mistake: said here, not as the operator's failure
        return str(path)

    def step_item(self, run_id: str, spec: PipelineSpec | None = None):
        """The step's STEP item as the ledger has it now, or None."""
        from shardline.ledger.keys import StepRef
        from shardline.ledger.records import StepRecord
        from shardline.ledger.step_reads import read_step
        from shardline.orchestration import services

        spec = spec or self.spec
        item = read_step(services.ledger_model(spec), StepRef(spec.pipeline, run_id, "score"), files=False).step
        return StepRecord.of(item) if item is not None else None

    def run_item(self, run_id: str):
        """The run's RUN item as the ledger has it now, or None."""
        from shardline.ledger.keys import RUN_SK, run_pk
        from shardline.ledger.records import RunRecord
        from shardline.orchestration import services

        control = services.ledger_model(self.spec).Control
        try:
            return RunRecord.of(control.get(run_pk(self.spec.pipeline, run_id), RUN_SK, consistent_read=True))
        except control.DoesNotExist:
            return None

    def jobs_of(self, run_id: str) -> list[str]:
        """The local backend's jobs of the run's step: the folders it keeps one per submitted job, by job name."""
        from shardline.planning.naming import job_name

        head = job_name(self.spec.pipeline, run_id, "score", 1).removesuffix("1")  # ...-a: any attempt's
        folder = self.local_root / "jobs"
        return sorted(p.name for p in folder.iterdir() if p.name.startswith(head)) if folder.is_dir() else []


@pytest.fixture(scope="module")
def module_aws(moto_endpoint, tmp_path_factory) -> Path:
    """This process pointed at moto_server for the whole module (as ``aws_env`` does for one test), and the local
    backend's root; the module's folder."""
    folder = tmp_path_factory.mktemp("operators")
    patch = pytest.MonkeyPatch()
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_DYNAMODB", "SHARDLINE_LOCAL_FLEET"):
        patch.delenv(name, raising=False)
    env = {
        **AWS_TEST_ENV,
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"),
        "SHARDLINE_LOCAL_ROOT": str(folder / "local"),
    }
    for name, value in env.items():
        patch.setenv(name, value)
    try:
        yield folder
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def staged(module_aws, moto_endpoint, xgboost_model) -> Staged:
    """The module's pipeline: its ledger table, bucket, inputs and model on moto_server, its spec on disk. Each test
    plans runs of its own (its own run id, and output prefix where it plans one: a prefix is one run's at a time)."""
    from shardline.ledger.table import create_ledger_table

    table = f"shardline-test-{uuid.uuid4().hex[:12]}"
    create_ledger_table(table, "us-east-1", moto_endpoint)
    inputs = {f"part-{i}.parquet": parquet_bytes(ROWS, i * ROWS) for i in range(FILES)}
    spec, bucket = stage_step(PIPELINE, table, xgboost_model.parent, module_aws, inputs)
    path = module_aws / f"{PIPELINE}.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
    return Staged(load_spec(path), bucket, module_aws, str(path), module_aws / "local")
