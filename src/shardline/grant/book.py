"""Many jobs' grants behind one endpoint: compose's ``grant`` service.

In the compose stack the jobs' container (``job-runner``) sits on an internal network with no route to the
``aws`` service; its one way out is the ``grant`` service, on both networks. Each job signs its requests with
its own name as its access key id, and the service checks each request against that job's grant. The grants
come from a folder only Airflow's processes write (the submitter files each job's request there), never from the
jobs' own volume, which their code could rewrite.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from shardline.grant.job import JobGrant, JobScope
from shardline.grant.proxy import GrantProxy, emulated_endpoints

log = logging.getLogger(__name__)

GRANTS_ENV = "SHARDLINE_LOCAL_GRANTS"  # the folder the submitter files grants in, and the service reads
ENDPOINT_ENV = "SHARDLINE_GRANT_ENDPOINT"  # set where jobs reach AWS through a grant service (the job runner)
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")  # SageMaker's ProcessingJobName
GRANT_FILE_LIMIT = 1 << 20  # a CreateProcessingJob request: kilobytes


def file_grant(folder: Path, request: Mapping) -> Path:
    """File ``request``'s grant under ``folder`` (written aside, then renamed: a reader sees it whole or not)."""
    name = request["ProcessingJobName"]
    if not _JOB_NAME.fullmatch(name):
        raise ValueError(f"job name {name!r} is no SageMaker job name")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    aside = folder / f".{name}.json.{os.getpid()}"
    aside.write_text(json.dumps(request))
    os.replace(aside, path)
    return path


class GrantBook:
    """The grants filed in ``folder``, each found by its job's name (the access key id its requests carry)."""

    def __init__(self, folder: Path, environ: Mapping[str, str], cached: int = 256):
        self.folder = Path(folder)
        self.environ = dict(environ)
        self._cache: OrderedDict[str, JobGrant] = OrderedDict()
        self._cached = cached
        self._lock = threading.Lock()

    def grant_for(self, key: str) -> JobGrant | None:
        """The grant of the job named ``key``; None when no such job's grant was filed (or it cannot be read)."""
        if not _JOB_NAME.fullmatch(key):
            return None
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        request = _read_filed(self.folder / f"{key}.json")
        if request is None or request.get("ProcessingJobName") != key:
            return None
        grant = JobGrant.of(JobScope.of_request(request, self.environ))
        with self._lock:
            self._cache[key] = grant
            while len(self._cache) > self._cached:
                self._cache.popitem(last=False)
        return grant


def _read_filed(path: Path) -> dict | None:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > GRANT_FILE_LIMIT:
            return None
        try:
            found = json.loads(file.read(GRANT_FILE_LIMIT))
        except ValueError:
            return None
    return found if isinstance(found, dict) else None


def main(argv: list[str]) -> int:
    """``python -m shardline.grant.book FOLDER [HOST [PORT]]``: serve every filed job's grant on one endpoint
    (default 0.0.0.0:5000) in front of the emulated endpoints of this environment, until terminated."""
    import signal

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [grant] %(message)s")
    folder = Path(argv[0])
    host = argv[1] if len(argv) > 1 else "0.0.0.0"
    port = int(argv[2]) if len(argv) > 2 else 5000
    upstreams = emulated_endpoints(os.environ)
    if upstreams is None:
        log.error("the endpoints of this environment are not emulated ones (plain HTTP): nothing to guard")
        return 2
    book = GrantBook(folder, os.environ)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with GrantProxy(None, upstreams, host=host, port=port, grant_for=book.grant_for) as proxy:
        log.info("the jobs' grants filed in %s, on %s", folder, proxy.url)
        stop.wait()
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
