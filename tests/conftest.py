"""Shared fixtures: reference models trained once per session, and a real moto_server.

The AWS side is moto's standalone server, reached over HTTP through AWS_ENDPOINT_URL,
exactly as the worker reaches DynamoDB in production. No in-process AWS mocks.
"""

from __future__ import annotations

import functools
import os
import re
import uuid
import warnings
from pathlib import Path

import pytest

from examples import synthetic

# The stack tests build and start images (tests/stack): `make test-stack` runs them, `make test` does not.
collect_ignore = [] if os.environ.get("SHARDLINE_STACK_TESTS") == "1" else ["stack"]
# The local backend's instances run as processes in this suite, whatever engine the machine has; the stack
# tests choose the container runtime themselves.
os.environ["SHARDLINE_LOCAL_RUNTIME"] = "process"
# Many tests swap models under unpinned specs; the refusal itself is tested with this unset.
os.environ["SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS"] = "1"
# Three pytest-xdist workers share 2 cores, so an OpenMP thread that spin-waits for work (libgomp's default)
# burns CPU another test's process needs: training a reference model took 2 to 4 times the CPU. Threads that
# sleep when idle change no result; every process the suite starts inherits this.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# -- models, trained once per session ----------------------------------------------------------------------


SERVER_FIXTURES = {"moto_endpoint", "airflow_stack"}


def _needs_airflow(item) -> bool:
    return "airflow_stack" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items):
    """A test that reaches a server the suite starts is an integration test: `make test-fast` leaves them out.
    The tests of the real Airflow run first, together (by unit, then in their files' order), so a worker's
    `airflow standalone` is stopped as soon as they are done (:func:`pytest_runtest_teardown`), with or without
    xdist."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    airflow = sorted((i for i in items if _needs_airflow(i)), key=lambda i: _airflow_unit(i.nodeid.split("::")[0]))
    items[:] = airflow + [i for i in items if not _needs_airflow(i)]


# The shared `airflow standalone` while it runs: how to stop it. An idle one burns about a quarter of a core
# (its scheduler, DAG processor and triggerer heartbeats), which the rest of the suite needs on 2 cores.
_SHARED_AIRFLOW: dict[str, object] = {}


def _stop_shared_airflow() -> None:
    stop = _SHARED_AIRFLOW.pop("stop", None)
    if stop is not None:
        _SHARED_AIRFLOW["stopped"] = True
        stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of the real Airflow (its module fixtures finalized first), stop the standalone."""
    yield
    if _needs_airflow(item) and (nextitem is None or not _needs_airflow(nextitem)):
        _stop_shared_airflow()


def pytest_runtest_setup(item):
    if _needs_airflow(item) and _SHARED_AIRFLOW.get("stopped"):
        pytest.fail("the shared airflow standalone was stopped: its tests run as one unit, first (see conftest.py)")


@functools.cache
def _uses_airflow_stack(path: str) -> bool:
    file = Path(__file__).resolve().parents[1] / path
    return file.is_file() and re.search(r"def \w+\([^)]*\bairflow_stack\b", file.read_text()) is not None


# The real-Airflow test files in two units of about equal length: under xdist each unit runs on a worker of its
# own, with its own standalone, so one unit's waits (a scheduler's minute, a trigger's settle time) overlap the
# other's and the rest of the suite. A file not named here joins the first unit.
AIRFLOW_UNITS = {
    "tests/scenarios/test_scheduled_runs.py": "airflow-2",
    "tests/scenarios/test_admission.py": "airflow-2",
    "tests/scenarios/test_per_file_commit.py": "airflow-2",
    "tests/scenarios/test_multi_step.py": "airflow-2",
}


def _airflow_unit(path: str) -> str:
    return AIRFLOW_UNITS.get(path, "airflow-1")


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs pytest-xdist workers. Each unit of the real Airflow's test files goes to one worker as a
    whole, so a worker starts `airflow standalone` once, and the other workers take the rest, test by test,
    meanwhile. (The scheduler sees node ids only, so a module is the Airflow's when a function of it takes the
    fixture.)"""
    from xdist.scheduler import LoadScopeScheduling

    class AirflowStackTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _airflow_unit(path) if _uses_airflow_stack(path) else nodeid

    return AirflowStackTogether(config, log)


def _trained_once(tmp_path_factory, worker_id: str, kind: str) -> Path:
    """The synthetic ``kind`` model, trained by the first pytest-xdist worker that asks and read by the others
    (a lock file orders them): three workers on 2 cores would otherwise train each model three times."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / "trained-models"
    root.mkdir(parents=True, exist_ok=True)
    done = root / f"{kind}.done"
    with open(root / f"{kind}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script/save
                # Few epochs for torch: the tests check plumbing, not accuracy.
                path = synthetic.TRAINERS[kind](root / kind, **({"epochs": 3} if kind == "torch" else {}))
            done.write_text(str(path))
    return Path(done.read_text())


@pytest.fixture(scope="session")
def sklearn_model(tmp_path_factory, worker_id) -> Path:
    """A HistGradientBoostingClassifier saved with joblib: ``<dir>/model.joblib``. Read-only: shared by the
    session's workers."""
    return _trained_once(tmp_path_factory, worker_id, "sklearn")


@pytest.fixture(scope="session")
def xgboost_model(tmp_path_factory, worker_id) -> Path:
    """An XGBoost Booster saved as JSON: ``<dir>/model.json``. Read-only: shared by the session's workers."""
    return _trained_once(tmp_path_factory, worker_id, "xgboost")


@pytest.fixture(scope="session")
def torch_model(tmp_path_factory, worker_id) -> Path:
    """A TorchScript MLP: ``<dir>/model.pt``. Read-only: shared by the session's workers."""
    return _trained_once(tmp_path_factory, worker_id, "torch")


# -- moto_server --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory) -> str:
    """Start ``moto_server`` on a free loopback port (the project's own launcher); stop it at the end."""
    from shardline.local.embedded_aws import EmbeddedAwsError, embedded_aws

    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    try:
        with embedded_aws(log_path) as env:
            yield env["AWS_ENDPOINT_URL"]
    except EmbeddedAwsError as err:
        pytest.fail(f"{err}\n{log_path.read_text() if log_path.exists() else ''}")


AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture
def aws_env(monkeypatch, moto_endpoint, tmp_path_factory) -> dict[str, str]:
    """Point this process (and, through the returned dict, subprocesses) at moto_server."""
    # Keep any real AWS configuration of the machine out of the way: files that do not exist, the same for every test
    # of the session, so that the AWS_* variables stay the same from test to test and the ledger's connections keep
    # sharing one botocore session (shardline.ledger.table._shared_session) instead of building one a test.
    nothing = tmp_path_factory.getbasetemp() / "no-aws"
    env = {
        **AWS_TEST_ENV,
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_CONFIG_FILE": str(nothing / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(nothing / "credentials"),
        # As set for this process above, for the CLI and other subprocesses the tests start with this dict.
        "SHARDLINE_LOCAL_RUNTIME": os.environ["SHARDLINE_LOCAL_RUNTIME"],
        "SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS": os.environ["SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS"],
    }
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_DYNAMODB"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def ledger_table(aws_env) -> str:
    """A fresh ledger table on moto_server, created with the project's own create_ledger_table."""
    from shardline.ledger.table import create_ledger_table

    name = f"shardline-test-{uuid.uuid4().hex[:12]}"
    create_ledger_table(name, "us-east-1", aws_env["AWS_ENDPOINT_URL"])
    return name


# -- a real Airflow (standalone: API server, scheduler, DAG processor, triggerer) ---------------------------


PRIORITY_TYPE = "ml.m5.large"  # only the two pipelines below run on it: its pool is theirs
PRIORITY_PIPELINES = {"priority_high": "high", "priority_low": "low"}


def add_priority_pipelines(dags: Path) -> None:
    """Two copies of the hourly pipeline, one high priority and one low, on an instance type of their own with a
    quota of 1 in ``fleet.yaml``: tests/scenarios/test_admission.py opens their pool and watches who goes first."""
    import yaml

    base = yaml.safe_load((dags / "pipelines" / "tabular_scoring_hourly.yaml").read_text())
    (dags / "fleet.yaml").write_text(yaml.safe_dump({"quotas": {PRIORITY_TYPE: 1}}))
    for name, priority in PRIORITY_PIPELINES.items():
        spec = {**base, "pipeline": name, "priority": priority, "schedule": None, "poll_interval_seconds": 1}
        step = spec["steps"][0]
        # Named features: a test may swap in a script model (test_admission's gated one), which records none.
        step["input"] = {
            **step["input"],
            "prefix": f"s3://shardline-demo/priority/{name}/",
            "features": synthetic.feature_names(),
        }
        step["input"].pop("when_missing", None)
        # Its model is the test's own script, whose outputs are its first feature, not the hourly model's
        # probability: the hourly pipeline's checks are not this copy's.
        step.pop("checks", None)
        step["output"] = {**step["output"], "prefix": f"s3://shardline-demo/priority-out/{name}/{{{{ run_id }}}}/"}
        # No table: their runs are triggered without a logical date (no data interval to name a partition by), and
        # these tests are about admission.
        step["output"].pop("table", None)
        step["resources"] = {**step["resources"], "instance_type": PRIORITY_TYPE, "instance_count": 1}
        if name == "priority_low":
            step["retry"] = {"max_attempts": 1, "backoff_seconds": 1}  # a refusal counted as an attempt would fail it
        (dags / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        (dags / f"{name}.py").write_text(
            f'from shardline.airflow.dag_factory import dag_from_spec\n\ndag = dag_from_spec(__file__, "{name}.yaml")\n'
        )


BUDGETED_PIPELINE = "budgeted"
BUDGETED_RUN_USD = 8.0  # at $3,600 an instance-hour (a dollar a second): about eight seconds of its instance


def add_budgeted_pipeline(dags: Path) -> None:
    """A copy of the hourly pipeline with a run budget (``budget.run_usd``) its runs pass part way, priced at a dollar
    an instance-second, polled twice a second, over a model of the test's own (a slow script, unpinned):
    tests/scenarios/test_budget_airflow.py stops a run on it and resubmits it with a larger budget."""
    import yaml

    spec = yaml.safe_load((dags / "pipelines" / "tabular_scoring_hourly.yaml").read_text())
    spec.pop("deadline", None)
    spec.update(
        pipeline=BUDGETED_PIPELINE,
        schedule=None,
        poll_interval_seconds=0.5,
        cost={"local_price_per_hour": 3600.0},
        budget={"run_usd": BUDGETED_RUN_USD},
    )
    step = spec["steps"][0]
    step["model"] = {"uri": f"s3://shardline-demo/models/{BUDGETED_PIPELINE}/model.tar.gz", "allow_unpinned": True}
    step["input"] = {"prefix": f"s3://shardline-demo/{BUDGETED_PIPELINE}/in/", "features": synthetic.feature_names(4)}
    step["input"]["passthrough"] = ["id"]
    step.pop("checks", None)
    step["output"] = {"prefix": f"s3://shardline-demo/{BUDGETED_PIPELINE}/out/{{{{ run_id }}}}/"}
    step["resources"] = {**step["resources"], "instance_count": 1, "workers_per_instance": 1}
    step["retry"] = {"max_attempts": 1}
    (dags / "pipelines" / f"{BUDGETED_PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    dag_file = "from shardline.airflow.dag_factory import dag_from_spec\n\n"
    dag_file += f'dag = dag_from_spec(__file__, "{BUDGETED_PIPELINE}.yaml")\n'
    (dags / f"{BUDGETED_PIPELINE}.py").write_text(dag_file)


ARRIVALS_PIPELINE = "arrivals_hourly"
ARRIVALS_BUCKET = "shardline-arrivals"  # its own bucket: its S3 event notifications go to its queue alone
ARRIVALS_QUEUE = "shardline-arrivals"


def add_arrivals_pipeline(dags: Path) -> None:
    """A copy of the hourly pipeline started on arrival (``trigger: {on: ready_marker}``), over a bucket of its own:
    tests/scenarios/test_arrivals.py writes its markers. It keeps its @hourly schedule, which only names its
    partitions: the scheduler starts no run of it."""
    import yaml

    spec = yaml.safe_load((dags / "pipelines" / "tabular_scoring_hourly.yaml").read_text())
    spec.pop("deadline", None)
    spec.update(pipeline=ARRIVALS_PIPELINE, schedule="@hourly", trigger={"on": "ready_marker", "queue": ARRIVALS_QUEUE})
    step = spec["steps"][0]
    hour = "dt={{ data_interval_start | ds }}/hour={{ data_interval_start.strftime('%H') }}/"
    step["model"]["uri"] = f"s3://{ARRIVALS_BUCKET}/models/{{{{ params.model_version }}}}/model.tar.gz"
    step["input"] = {**step["input"], "prefix": f"s3://{ARRIVALS_BUCKET}/events/{hour}", "ready_marker": "_SUCCESS"}
    step["input"].pop("when_missing", None)
    step["output"]["prefix"] = f"s3://{ARRIVALS_BUCKET}/scores/{hour}"
    if step["output"].get("table"):
        step["output"]["table"] = {**step["output"]["table"], "name": ARRIVALS_PIPELINE}
    (dags / "pipelines" / f"{ARRIVALS_PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    dag_file = "from shardline.airflow.dag_factory import dag_from_spec\n\n"
    dag_file += f'dag = dag_from_spec(__file__, "{ARRIVALS_PIPELINE}.yaml")\n'
    (dags / f"{ARRIVALS_PIPELINE}.py").write_text(dag_file)


@pytest.fixture(scope="session")
def airflow_stack(tmp_path_factory, moto_endpoint, airflow_s3_proxy):
    """``airflow standalone`` on a free port over a copy of ``dags/``, talking to the session's moto_server.

    The copies of the specs run only when triggered (no schedule), so the scheduler does not
    start hourly runs of its own in the middle of a test; the hourly one waits for missing input.
    Their models are not pinned: the tests upload models of their own (a slow one, a failing one, a
    version that is not there) where the shipped specs pin the demo models.
    """
    import shutil

    import yaml

    from tests.support.airflow_stack import airflow_standalone

    root = tmp_path_factory.mktemp("airflow")
    dags = root / "dags"
    shutil.copytree(Path(__file__).resolve().parents[1] / "dags", dags)
    for path in (dags / "pipelines").glob("*.yaml"):
        spec = yaml.safe_load(path.read_text())
        spec["schedule"] = None
        for step in spec["steps"]:
            # One instance a job: these tests are about orchestration, and each instance is a worker, its forkserver
            # and a supervisor (about 2 CPU-s). Several instances are the backends', faults' and per-file tests'.
            step["resources"]["instance_count"] = 1
            step["model"].pop("versions", None)
            step["model"].pop("sha256", None)
            step["model"]["allow_unpinned"] = True
        if spec["pipeline"] == "tabular_scoring_hourly":
            # Triggered runs act as the scheduled ones would: a missing hour is waited for (the daily
            # pipeline keeps the default for a manual run: fail at once).
            spec["steps"][0]["input"]["when_missing"] = "wait"
            # A deadline no run of these tests comes near, not even a failed one in a long session: a run green in
            # time leaves none behind (test_oncall_airflow); one held past a short one is test_scheduled_runs'.
            spec["deadline"] = {"after": "12h"}
        if spec["pipeline"] == "daily_churn":
            # A file that fails in calibrate fails the step at once (no backoff to sit through): the
            # multi-step test resubmits it by hand. Its steps are polled as often as the hourly one's.
            spec["steps"][1]["retry"] = {"max_attempts": 1}
            spec["poll_interval_seconds"] = 1
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
    add_priority_pipelines(dags)
    add_arrivals_pipeline(dags)
    add_budgeted_pipeline(dags)
    aws = {**AWS_TEST_ENV, "AWS_ENDPOINT_URL": moto_endpoint}
    extra = {
        # A submit AWS refuses (tests/scenarios/test_admission.py has the emulator refuse some) waits 1 s, not 30.
        "SHARDLINE_SUBMIT_WAIT_FIRST_SECONDS": "1",
        # The orchestrator's S3 calls go through the session's proxy, which a test may hook.
        "AWS_ENDPOINT_URL_S3": airflow_s3_proxy.url,
    }
    standalone = airflow_standalone(root / "home", dags, aws, extra)
    try:
        stack = standalone.__enter__()
    except RuntimeError as err:
        pytest.fail(str(err))
    _SHARED_AIRFLOW["stop"] = lambda: standalone.__exit__(None, None, None)
    try:
        yield stack
    finally:
        _stop_shared_airflow()  # unless the last of its tests did already


@pytest.fixture(scope="session")
def airflow_s3_proxy(moto_endpoint):
    """The proxy in front of moto_server that the shared Airflow's S3 calls go through (``AWS_ENDPOINT_URL_S3``):
    it forwards every byte, and calls its ``before_forwarding`` hook, when a test sets one, with each request
    first (tests/scenarios/test_per_file_commit.py acts at the moment a step's end lists its outputs)."""
    from urllib.parse import urlsplit

    from tests.support.faults import TcpProxy

    upstream = urlsplit(moto_endpoint)
    with TcpProxy((upstream.hostname, upstream.port)) as proxy:
        yield proxy
