"""What the pipelines under a DAGs folder need to exist: their ledger tables, S3 buckets and demo models.

Derived from the specs, never listed by hand. Used by `shardline local up` (the embedded
endpoint) and by the compose stack's init service (its `aws` service, the same endpoint). Idempotent:
what exists is kept.

A model is seeded only by its pinned digest: where a spec pins a model version to the sha256 of one of
the demo models shipped in ``seed_models/`` (the shipped specs do), that file is uploaded to the URI the
spec names for it, if nothing is there yet. An unpinned model, or one pinned to anything else, is
never written: the stack cannot choose the code a pipeline runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

SEED_MODELS = Path(__file__).resolve().parent / "seed_models"
VERSION_TEMPLATE = re.compile(r"\{\{\s*params\.model_version\s*\}\}")

S3_URI = re.compile(r"^s3://([^/]*)")
# S3's bucket naming rules, simplified: 3-63 lowercase letters, digits, dots and hyphens.
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclasses.dataclass(frozen=True)
class Plan:
    tables: tuple[str, ...]
    buckets: tuple[str, ...]
    problems: tuple[str, ...] = ()  # specs or names that were skipped, and why
    models: tuple[tuple[str, Path], ...] = ()  # (model URI, the shipped demo model pinned there)


def seed_index(folder: Path = SEED_MODELS) -> dict[str, Path]:
    """The shipped demo models by their sha256."""
    return {hashlib.sha256(path.read_bytes()).hexdigest(): path for path in sorted(folder.glob("*.tar.gz"))}


def pinned_models(spec) -> list[tuple[str, str]]:
    """(model URI, pinned sha256) for every pinned model of a spec whose URI is known before a run: one
    per version listed under model.versions, or the model.sha256 of a fixed URI."""
    found = []
    for step in spec.steps:
        model = step.model
        pins = (
            {VERSION_TEMPLATE.sub(v, model.uri): d for v, d in model.versions.items()}
            if model.versions
            else ({model.uri: model.sha256} if model.sha256 else {})
        )
        found += [(uri, digest) for uri, digest in pins.items() if "{" not in uri]
    return found


def s3_buckets(value: object) -> set[str]:
    """Every bucket named by an ``s3://`` URI anywhere in ``value`` (a spec as plain data).

    A bucket that is itself templated (``s3://{{ var.value.bucket }}/...``) cannot be known
    before a run and is left out; templated prefixes after a static bucket are fine.
    """
    found: set[str] = set()
    if isinstance(value, str):
        match = S3_URI.match(value.strip())
        if match and match.group(1) and "{" not in match.group(1):
            found.add(match.group(1))
    elif isinstance(value, dict):
        for item in value.values():
            found |= s3_buckets(item)
    elif isinstance(value, list | tuple):
        for item in value:
            found |= s3_buckets(item)
    return found


def make_plan(pipelines_dir: Path, extra_buckets: Iterable[str] = ()) -> Plan:
    """The tables and buckets the specs in ``pipelines_dir`` need. A spec that does not load is skipped
    (Airflow shows it as an import error); it must not keep the rest of the stack from starting."""
    from shardline.spec import PipelineSpec, SpecError, load_spec

    tables: set[str] = set()
    buckets: set[str] = set(extra_buckets)
    models: set[tuple[str, Path]] = set()
    seeds = seed_index()
    problems: list[str] = []
    specs = sorted([*pipelines_dir.glob("*.yaml"), *pipelines_dir.glob("*.yml")])
    for path in specs:
        try:
            spec = load_spec(path)
        except SpecError as err:
            problems.append(f"skipped {path.name}: {err}")
            continue
        tables.add(spec.ledger_table)
        buckets |= s3_buckets(spec.model_dump(mode="json"))
        models |= {(uri, seeds[digest]) for uri, digest in pinned_models(spec) if digest in seeds}
    if not tables:  # no valid spec yet: the table a new spec gets by default
        tables.add(PipelineSpec.model_fields["ledger_table"].default)
    for name in sorted(buckets):
        if not BUCKET_NAME.match(name):
            problems.append(f"skipped bucket {name!r}: not a valid S3 bucket name")
            buckets.discard(name)
    return Plan(
        tables=tuple(sorted(tables)),
        buckets=tuple(sorted(buckets)),
        problems=tuple(problems),
        models=tuple(sorted(models)),
    )


def ensure_bucket(s3, name: str, region: str) -> str:
    from botocore.exceptions import ClientError

    try:
        s3.head_bucket(Bucket=name)
        return "exists"
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in {"404", "NoSuchBucket", "NotFound"}:
            raise
    kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    s3.create_bucket(Bucket=name, **kwargs)
    return "created"


def ensure_table(name: str) -> str:
    """Create the ledger table with the project's own function (its schema is the one in code)."""
    from shardline.ledger.table import bind_ledger, create_ledger_table

    existed = bind_ledger(name).exists()
    create_ledger_table(name)  # safe on an existing table: TTL is only enabled when it is not yet
    return "exists" if existed else "created"


def apply(plan: Plan) -> list[str]:
    """Create what the plan names; one line per table and bucket saying what happened."""
    import boto3

    from shardline.ledger.table import region_from_env

    s3 = boto3.client("s3")
    region = region_from_env()
    done = [f"ledger table {table}: {ensure_table(table)}" for table in plan.tables]
    done += [f"bucket s3://{bucket}: {ensure_bucket(s3, bucket, region)}" for bucket in plan.buckets]
    return done + [f"model {uri}: {ensure_model(s3, uri, path)}" for uri, path in plan.models]


def ensure_model(s3, uri: str, path: Path) -> str:
    """Upload a shipped demo model where a spec pins it, unless something is there already (kept as it is:
    a job then checks its digest against the pin)."""
    from botocore.exceptions import ClientError

    bucket, _, key = uri.removeprefix("s3://").partition("/")
    try:
        size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in {"404", "NoSuchKey", "NotFound"}:
            raise
        s3.upload_file(str(path), bucket, key)
        return f"uploaded the demo model {path.name}"
    seed = path.read_bytes()
    # Read back only an object of the seed's size (an unrelated model there may be large).
    if (
        size == len(seed)
        and hashlib.sha256(s3.get_object(Bucket=bucket, Key=key)["Body"].read()).digest()
        == hashlib.sha256(seed).digest()
    ):
        return "exists"
    # Never overwritten (it may be someone's own model), but said: the job would refuse it as not pinned.
    return (
        f"exists, but is not the model the spec pins ({path.name}), so its jobs will refuse it: delete it to "
        "have the demo model uploaded, or pin the sha256 of your own in the spec"
    )
