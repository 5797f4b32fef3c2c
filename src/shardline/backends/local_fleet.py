"""The local emulator's account: instance quotas it enforces, and AWS's ordinary refusals it injects.

SageMaker refuses a CreateProcessingJob whose instances would take the account past its quota for their type
(``ResourceLimitExceeded``), throttles (``ThrottlingException``), and sometimes ends a job for want of
capacity (``CapacityError``). The local backend does the same, as botocore ``ClientError``s of the same shape,
so the orchestration, the watch task and the benchmark meet them as they would on AWS.

Set by ``<local root>/fleet.json``, or the environment variable ``SHARDLINE_LOCAL_FLEET`` (the same JSON; it
wins)::

    {"quotas": {"ml.c5.2xlarge": 4},                  # instances of a type in use at once, at most
     "refuse": {"ThrottlingException": 0.2},          # share of submit calls refused, per error code
     "refuse_first": {"ThrottlingException": 2},      # or a schedule: each job's first 2 submit calls refused
     "capacity_errors": {"ml.c5.2xlarge": 0.5},       # share of jobs of a type ended for capacity
     "startup_seconds": 60,                           # each job's instances start this long before it runs
     "seed": "any text"}                               # which calls and jobs those shares pick

The shares pick calls by a hash of the seed, the job's name and the call's number, so a run is repeatable.
``refuse_first`` takes the codes in name order: ``{"A": 1, "B": 2}`` refuses call 1 with A, calls 2 and 3 with B.
``startup_seconds`` stands for SageMaker's provisioning, minutes on AWS: the job is InProgress and its instances
count against the quota for that long before its container starts (a benchmark of admission needs jobs as long,
against the scheduling around them, as they are on AWS).
The instances in use are kept in ``<local root>/fleet/record.jsonl``, one line per job start (+n) and end (-n),
written under a lock by the submit and by the job's supervisor: that file is the emulator's own record, from
which a test checks that the quota was never exceeded. With no settings, the emulator writes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import botocore.exceptions

from shardline.errors import PermanentError

FLEET_ENV = "SHARDLINE_LOCAL_FLEET"
FLEET_FILE = "fleet.json"
FLEET_DIR = "fleet"  # under the local root: the record, its lock, the submit calls counted
RECORD_FILE = "record.jsonl"
_LOCK_FILE = ".lock"
CAPACITY_REASON = (
    "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML instance type."
)


class FleetConfigError(PermanentError, ValueError):
    """The emulator's fleet settings are not what this module reads."""


@dataclasses.dataclass(frozen=True)
class EmulatedFleet:
    quotas: Mapping[str, int] = dataclasses.field(default_factory=dict)
    refuse: Mapping[str, float] = dataclasses.field(default_factory=dict)
    refuse_first: Mapping[str, int] = dataclasses.field(default_factory=dict)
    capacity_errors: Mapping[str, float] = dataclasses.field(default_factory=dict)
    startup_seconds: float = 0.0
    seed: str = ""

    @classmethod
    def load(cls, root: Path, environ: Mapping[str, str] | None = None) -> EmulatedFleet:
        environ = os.environ if environ is None else environ
        where, text = FLEET_ENV, environ.get(FLEET_ENV)
        if not text and (Path(root) / FLEET_FILE).is_file():
            where, text = str(Path(root) / FLEET_FILE), (Path(root) / FLEET_FILE).read_text()
        if not text:
            return cls()
        try:
            data = json.loads(text)
            unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise FleetConfigError(f"unknown setting(s) {sorted(unknown)}")
            fleet = cls(
                quotas={str(k): int(v) for k, v in (data.get("quotas") or {}).items()},
                refuse={str(k): float(v) for k, v in (data.get("refuse") or {}).items()},
                refuse_first={str(k): int(v) for k, v in (data.get("refuse_first") or {}).items()},
                capacity_errors={str(k): float(v) for k, v in (data.get("capacity_errors") or {}).items()},
                startup_seconds=float(data.get("startup_seconds") or 0),
                seed=str(data.get("seed", "")),
            )
        except (ValueError, TypeError, AttributeError) as err:
            raise FleetConfigError(
                f"{where}: not the local emulator's fleet settings ({err}); expected JSON like "
                '{"quotas": {"ml.c5.2xlarge": 4}, "refuse": {"ThrottlingException": 0.2}, '
                '"capacity_errors": {"ml.c5.2xlarge": 0.5}}'
            ) from err
        return fleet

    @property
    def active(self) -> bool:
        """Whether any setting is made: without one, the backend neither counts nor refuses anything."""
        return bool(self.quotas or self.refuse or self.refuse_first or self.capacity_errors or self.startup_seconds)

    def _picked(self, share: float, *parts: object) -> bool:
        digest = hashlib.sha256("\0".join(map(str, (self.seed, *parts))).encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < share

    def refusal(self, job_name: str, call: int) -> str | None:
        """The error code the ``call``-th submit of ``job_name`` is refused with, if it is."""
        scheduled = 0
        for code, calls in sorted(self.refuse_first.items()):
            scheduled += calls
            if call <= scheduled:
                return code
        return next((code for code, share in sorted(self.refuse.items()) if self._picked(share, job_name, call)), None)

    def capacity_error(self, job_name: str, instance_type: str) -> bool:
        """Whether the job ends for want of capacity before any instance starts."""
        return self._picked(self.capacity_errors.get(instance_type, 0.0), job_name, "capacity")


def client_error(code: str, message: str) -> botocore.exceptions.ClientError:
    """The error boto3 raises for an AWS error response: what a SageMaker call's caller sees."""
    response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400}}
    return botocore.exceptions.ClientError(response, "CreateProcessingJob")


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    (root / FLEET_DIR).mkdir(parents=True, exist_ok=True)
    with open(root / FLEET_DIR / _LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _append(root: Path, entry: dict) -> None:
    with open(root / FLEET_DIR / RECORD_FILE, "a") as record:
        record.write(json.dumps(entry) + "\n")
        record.flush()
        os.fsync(record.fileno())


def read_record(root: Path) -> list[dict]:
    """The emulator's record of instances taken (+n) and given back (-n), in order."""
    path = Path(root) / FLEET_DIR / RECORD_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def in_use(record: list[dict]) -> dict[str, dict[str, int]]:
    """Per instance type, the jobs holding instances now and how many each holds."""
    held: dict[str, dict[str, int]] = {}
    for entry in record:
        jobs = held.setdefault(entry["type"], {})
        if entry["delta"] > 0:
            jobs[entry["job"]] = entry["delta"]
        else:
            jobs.pop(entry["job"], None)
    return held


def peak_in_use(record: list[dict]) -> dict[str, int]:
    """Per instance type, the most instances in use at any moment of the record."""
    now: dict[str, int] = {}
    peak: dict[str, int] = {}
    for entry in record:
        now[entry["type"]] = now.get(entry["type"], 0) + entry["delta"]
        peak[entry["type"]] = max(peak.get(entry["type"], 0), now[entry["type"]])
    return peak


def take(
    root: Path, fleet: EmulatedFleet, job_name: str, instance_type: str, count: int, ended: Callable[[str], bool]
) -> None:
    """Admit a job's instances within the quota, or raise ``ResourceLimitExceeded`` as SageMaker does.

    ``ended(job)``: whether a job holding instances has ended; one that ended without giving them back (its
    supervisor was killed) gives them back here, so a dead job never holds the quota.
    """
    root = Path(root)
    with _locked(root):
        holders = in_use(read_record(root)).get(instance_type, {})
        for job in [j for j in holders if j != job_name and ended(j)]:
            _append(root, {"t": time.time(), "job": job, "type": instance_type, "delta": -holders.pop(job)})
        if job_name in holders:
            return  # a retried submit of a job already admitted
        quota = fleet.quotas.get(instance_type)
        used = sum(holders.values())
        if quota is not None and used + count > quota:
            raise client_error(
                "ResourceLimitExceeded",
                f"The account-level service limit '{instance_type} for processing job usage' is {quota} Instances, "
                f"with current utilization of {used} Instances and a request delta of {count} Instances. Please "
                "use AWS Service Quotas to request an increase for this quota.",
            )
        _append(root, {"t": time.time(), "job": job_name, "type": instance_type, "delta": count})


def give_back(root: Path, job_name: str) -> None:
    """A job ended: its instances are free (once; a job that holds none gives back nothing)."""
    root = Path(root)
    if not (root / FLEET_DIR / RECORD_FILE).exists():
        return  # the emulator has counted nothing (no fleet settings)
    with _locked(root):
        for instance_type, jobs in in_use(read_record(root)).items():
            if job_name in jobs:
                _append(root, {"t": time.time(), "job": job_name, "type": instance_type, "delta": -jobs[job_name]})


def submit_call(root: Path, job_name: str) -> int:
    """Count one more submit call of ``job_name`` (1 for its first): which calls are refused depends on it."""
    calls = Path(root) / FLEET_DIR / "calls" / job_name
    calls.parent.mkdir(parents=True, exist_ok=True)
    with _locked(Path(root)):
        number = int(calls.read_text() or 0) + 1 if calls.exists() else 1
        calls.write_text(str(number))
    return number
