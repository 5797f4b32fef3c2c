"""A Docker engine and the images the stack tests need, on a machine that may never have had Docker.

``make test-stack`` runs this first (``python -m tests.stack.engine up``): it installs Debian's
``docker.io`` and ``debootstrap`` when they are missing, starts ``dockerd`` when no engine answers,
and builds the images. ``down`` stops the engine again if ``up`` started it.

No registry can be reached here, so every image a Dockerfile names ``FROM`` and that the engine lacks
is built locally under its official tag, from a Debian bookworm root bootstrapped once
(``shardline-stack-base:bookworm``) and the stand-in Dockerfiles in ``tests/stack/standins/``. The
project's own Dockerfiles and compose file are built unchanged; on a machine with a registry, the
official images are pulled and used instead, and no stand-in is built.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parent / "standins"
STATE = REPO / "build" / "stack"
BASE_IMAGE = "shardline-stack-base:bookworm"
WORKER_IMAGE = "shardline-worker:local"
AIRFLOW_IMAGE = "shardline-airflow:local"
# Official tag -> the stand-in Dockerfile that builds it here when it can be neither found nor pulled.
STANDIN_FOR = {
    "python:3.11-slim-bookworm": "python.Dockerfile",
    "apache/airflow:3.3.2-python3.11": "airflow.Dockerfile",
    "postgres:16": "postgres.Dockerfile",
}
TORCH_INDEX_PORT = 18600
DEBIAN_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates", "libgomp1", "curl")


def say(message: str) -> None:
    print(f"[stack] {message}", flush=True)


def run(*command: str, quiet: bool = False, **kwargs) -> subprocess.CompletedProcess:
    if not quiet:
        say("$ " + " ".join(command))
    return subprocess.run(command, check=True, **kwargs)


def answers(*command: str, timeout: float = 30) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# -- the engine ---------------------------------------------------------------------------------------------


def install_debian_packages(*packages: str) -> None:
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(*sudo, "apt-get", "update", "-qq", env=env, stdout=subprocess.DEVNULL)
    run(*sudo, "apt-get", "install", "-y", "-qq", *packages, env=env, stdout=subprocess.DEVNULL)


def ensure_engine() -> int | None:
    """A Docker engine that answers; returns the pid of the dockerd started here (None if one was running)."""
    if answers("docker", "version"):
        return None
    missing = [pkg for cmd, pkg in (("dockerd", "docker.io"), ("debootstrap", "debootstrap")) if not shutil.which(cmd)]
    if missing:
        install_debian_packages(*missing)
    STATE.mkdir(parents=True, exist_ok=True)
    log = open(STATE / "dockerd.log", "ab")  # noqa: SIM115 - dockerd outlives this function
    proc = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while not answers("docker", "version", timeout=5):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"dockerd did not start; see {STATE / 'dockerd.log'}")
        time.sleep(0.5)
    (STATE / "dockerd.pid").write_text(str(proc.pid))
    say(f"dockerd started (pid {proc.pid})")
    return proc.pid


def stop_engine() -> None:
    """Stop the dockerd that ``up`` started, if it did."""
    pid_file = STATE / "dockerd.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 15)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.2)
    pid_file.unlink()
    say(f"dockerd (pid {pid}) stopped")


# -- images -------------------------------------------------------------------------------------------------


def image_exists(tag: str) -> bool:
    return answers("docker", "image", "inspect", tag)


def image_size_mb(tag: str) -> int:
    out = subprocess.run(
        ["docker", "image", "inspect", tag, "--format", "{{.Size}}"], capture_output=True, text=True, check=True
    ).stdout
    return round(int(out) / 1e6)


def ca_bundle() -> Path:
    """The CA bundle pip trusts here: a registry behind a TLS-inspecting proxy is verified with it."""
    configured = os.environ.get("PIP_CERT")
    if not configured:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
        ).stdout
        for line in out.splitlines():
            if line.split("=", 1)[0].endswith(".cert"):
                configured = line.split("=", 1)[1].strip().strip("'\"")
    return Path(configured or "/etc/ssl/certs/ca-certificates.crt")


def ensure_base_image() -> None:
    """Debian bookworm with Python 3.11, bootstrapped from Debian's own registry and imported once."""
    if image_exists(BASE_IMAGE):
        return
    if not shutil.which("debootstrap"):
        install_debian_packages("debootstrap")
    with tempfile.TemporaryDirectory(prefix="shardline-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        run(
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            "bookworm",
            str(root),
            stdout=subprocess.DEVNULL,
        )
        shutil.copyfile(ca_bundle(), root / "etc/ssl/certs/ca-certificates.crt")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        run("docker", "import", "-", BASE_IMAGE, stdin=tar.stdout, stdout=subprocess.DEVNULL)
        tar.wait()


def ensure_official(tag: str) -> str:
    """``tag`` from the engine, a registry, or (neither reachable) its stand-in; returns which."""
    if image_exists(tag):
        return "present"
    if answers("docker", "pull", "--quiet", tag, timeout=120):
        return "pulled"
    ensure_base_image()
    if tag == "apache/airflow:3.3.2-python3.11":
        ensure_official("python:3.11-slim-bookworm")
    with tempfile.TemporaryDirectory(prefix="shardline-standin-") as tmp:
        context = Path(tmp)
        for path in STANDINS.iterdir():
            shutil.copy2(path, context / path.name)
        shutil.copyfile(REPO / "constraints.txt", context / "constraints.txt")
        run(
            "docker",
            "build",
            "--quiet",
            "-t",
            tag,
            "-f",
            str(context / STANDIN_FOR[tag]),
            str(context),
            stdout=subprocess.DEVNULL,
        )
    return "stand-in"


@contextlib.contextmanager
def torch_index():
    """A one-package index on loopback serving the CPU torch wheel this machine holds (pip's find-links), so the
    worker image takes it instead of downloading it; None where there is no such wheel."""
    folders = os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split()
    wheels = [path for folder in folders for path in Path(folder).glob("torch-*+cpu-*.whl")]
    if not wheels:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="shardline-torch-index-") as tmp:
        (Path(tmp) / "torch").mkdir()
        for wheel in wheels:
            (Path(tmp) / "torch" / wheel.name).symlink_to(wheel)
        handler = partial(QuietHandler, directory=tmp)
        try:  # one port every time: the URL is a build argument, and a new one would miss the build cache
            server = ThreadingHTTPServer(("127.0.0.1", TORCH_INDEX_PORT), handler)
        except OSError:
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def build(tag: str, dockerfile: str, **build_args: str) -> float:
    """``docker build`` of one of the project's Dockerfiles, unchanged, from the repo root; returns seconds."""
    started = time.monotonic()
    args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
    # --network host: pip reaches the registries, and the loopback torch index, as it does on this machine.
    run(
        "docker",
        "build",
        "--network",
        "host",
        *args,
        "-t",
        tag,
        "-f",
        str(REPO / dockerfile),
        str(REPO),
        stdout=subprocess.DEVNULL,
    )
    return time.monotonic() - started


def up() -> dict:
    started = time.monotonic()
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / "figures.json").unlink(missing_ok=True)  # the tests write this run's figures
    figures: dict = {"dockerd_started_here": ensure_engine() is not None}
    figures["base_images"] = {tag: ensure_official(tag) for tag in STANDIN_FOR}
    with torch_index() as index:
        extra = {"TORCH_INDEX_URL": index} if index else {}
        figures["worker_build_s"] = round(build(WORKER_IMAGE, "inference_container/Dockerfile", **extra), 1)
    figures["airflow_build_s"] = round(build(AIRFLOW_IMAGE, "infra/compose/airflow.Dockerfile"), 1)
    figures["worker_image_mb"] = image_size_mb(WORKER_IMAGE)
    figures["images_s"] = round(time.monotonic() - started, 1)
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / "engine.json").write_text(json.dumps(figures, indent=2))
    say(f"images ready in {figures['images_s']} s: {json.dumps(figures)}")
    return figures


def down() -> None:
    """Remove what the tests made in the engine (the jobs' network), then stop the engine if ``up`` started it."""
    from shardline.backends.local_container import JOB_LABEL, JOB_NETWORK

    if answers("docker", "version"):
        answers("docker", "network", "rm", JOB_NETWORK)
        # A job's own network is removed with its job; one an interrupted run left goes here.
        listed = subprocess.run(
            ["docker", "network", "ls", "-q", "--filter", f"label={JOB_LABEL}"],
            capture_output=True,
            text=True,
            check=False,
        )
        for network in listed.stdout.split():
            answers("docker", "network", "rm", network)
    stop_engine()


def summary(seconds: int) -> str:
    """The one line ``make test-stack`` ends with, from the figures the engine and the tests recorded."""
    engine = json.loads((STATE / "engine.json").read_text())
    measured = json.loads((STATE / "figures.json").read_text())
    equal = sum(v for k, v in measured.items() if k.startswith("equal_predictions_"))
    kinds = sum(1 for k in measured if k.startswith("equal_predictions_"))
    return (
        f"stack ok: worker image {engine['worker_image_mb']} MB, {equal:,} predictions equal ({kinds} model "
        f"kinds); compose up in {measured['compose_up_s']:.0f} s, DAG run green in "
        f"{measured['dag_run_green_s']:.0f} s; images ready in {engine['images_s']:.0f} s, {seconds} s in all"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stack.engine")
    parser.add_argument("action", choices=["up", "down", "summary"])
    parser.add_argument("--seconds", type=int, default=0, help="summary: the whole run's wall time")
    args = parser.parse_args(argv)
    if args.action == "up":
        up()
    elif args.action == "down":
        down()
    else:
        print(summary(args.seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
