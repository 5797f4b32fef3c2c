"""A step's output table (``output.table``): its catalog, built with pyiceberg on Airflow's side, and the one
commit per run that makes a partition's outputs the table's (docs/tables.md).

The worker writes each output as parquet with the partition columns, named by its run and attempt
(``naming.output_tag``): those files become the table's data files as they are, nothing is copied. At the step's
end, after every check and before ``_SUCCESS``, :func:`commit_partition` adds exactly the outputs manifest's files
and, in ``replace_partition`` mode, removes the partition's other files: one snapshot, swapped in by the catalog
at once, so a reader sees the old partition whole or the new one whole. The commit is idempotent by content: a
retried end whose files are the partition's already commits nothing; a conflicting writer (another partition
committed at the same moment) is met by reloading the table and committing again. The job's role never needs
the catalog: only Airflow's side commits.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardline.errors import TableCommitFailed, TableError
from shardline.orchestration.footers import parquet_footer
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec, SpecError
from shardline.spec.tables import LOCAL_CATALOG, TableSpec, expand_environment

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

# Who wrote a snapshot: ``shardline table history`` and a retried end read them back.
SNAPSHOT_KEYS = ("shardline.pipeline", "shardline.run-id", "shardline.step", "shardline.attempt")
COMMIT_TRIES = 8  # commits lost to another writer before the step's end gives up (each reloads and tries again)
READ_THREADS = 48  # parquet footers read at once: a commit of 1,000 files waits on S3, not on a core
ENV_LOCAL_CATALOG_URI = "SHARDLINE_LOCAL_CATALOG_URI"  # compose: its Postgres; else SQLite beside the local jobs
ENV_LOCAL_WAREHOUSE = "SHARDLINE_LOCAL_WAREHOUSE"
LOCAL_WAREHOUSE = "s3://shardline-warehouse/"


@dataclasses.dataclass(frozen=True)
class TableCommit:
    """What a step's end committed to its table: the snapshot now current, the files it added and removed, and
    the rows the partition holds (the snapshot's own count). ``already``: the partition held exactly these files
    before (a retried end), so nothing was committed."""

    table: str
    partition: dict[str, str]
    snapshot_id: int
    files_added: int
    files_removed: int
    rows_added: int
    already: bool = False

    def words(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in self.partition.items())
        if self.already:
            return f"table {self.table} partition {where} already held these outputs (snapshot {self.snapshot_id})"
        return (
            f"committed {self.rows_added:,} rows in {self.files_added} file(s) to table {self.table} partition "
            f"{where} in snapshot {self.snapshot_id}"
            + (f", replacing {self.files_removed}" if self.files_removed else "")
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- the catalog --------------------------------------------------------------------------------------------


def local_catalog_properties(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The stack's own catalog: SQL, in SQLite beside the local backend's jobs (or ``SHARDLINE_LOCAL_CATALOG_URI``:
    compose's Postgres), its warehouse on the embedded S3 that ``AWS_ENDPOINT_URL`` names."""
    from shardline.orchestration.services import local_root

    env = dict(os.environ) if environ is None else environ
    uri = env.get(ENV_LOCAL_CATALOG_URI) or f"sqlite:///{Path(local_root()) / 'iceberg' / 'catalog.db'}"
    properties = {"type": "sql", "uri": uri, "warehouse": env.get(ENV_LOCAL_WAREHOUSE) or LOCAL_WAREHOUSE}
    s3 = {
        "s3.endpoint": env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
        "s3.access-key-id": env.get("AWS_ACCESS_KEY_ID"),
        "s3.secret-access-key": env.get("AWS_SECRET_ACCESS_KEY"),
        "s3.session-token": env.get("AWS_SESSION_TOKEN"),
        "s3.region": env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1",
    }
    return {**properties, **{k: v for k, v in s3.items() if v}}


def catalog_properties(spec: PipelineSpec, name: str) -> dict[str, str]:
    """The pyiceberg properties of the catalog ``name``: its entry in ``dags/catalogs.yaml`` with ``${NAME}`` read
    from this environment, or the stack's own for ``local``."""
    entry = spec.catalogs.catalog.get(name)
    if entry is not None:
        return expand_environment(entry)
    if name == LOCAL_CATALOG:
        return local_catalog_properties()
    raise TableError(f"no catalog named {name!r}: add it to dags/catalogs.yaml (catalogs: {spec.catalogs.names()})")


def catalog_for(spec: PipelineSpec, name: str) -> Catalog:
    """The catalog ``name`` as this process's environment builds it, built once per set of properties."""
    properties = catalog_properties(spec, name)
    if name == LOCAL_CATALOG and name not in spec.catalogs.catalog and properties["uri"].startswith("sqlite:///"):
        Path(properties["uri"].removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return _catalog(name, tuple(sorted(properties.items())))


_building = threading.Lock()


@functools.lru_cache(maxsize=16)
def _catalog(name: str, properties: tuple[tuple[str, str], ...]) -> Catalog:
    from pyiceberg.catalog import load_catalog

    with _building:  # one build at a time in a process: a new SQL catalog's first build makes its tables
        try:
            return load_catalog(name, **dict(properties))
        except Exception:  # noqa: BLE001 - another process made a new SQL catalog's tables at once: now they are
            pass
        try:
            return load_catalog(name, **dict(properties))
        except Exception as err:
            raise TableCommitFailed(f"catalog {name!r} could not be built: {type(err).__name__}: {err}") from err


def _ensure_local_warehouse(spec: PipelineSpec, name: str) -> None:
    """On the embedded stack the warehouse's bucket is made on first use, as the pipelines' buckets are."""
    if name != LOCAL_CATALOG or name in spec.catalogs.catalog or spec.backend != "local":
        return
    from shardline.orchestration import services

    bucket, _ = parse_s3_uri(catalog_properties(spec, name)["warehouse"])
    s3 = services.s3_client(spec)
    try:
        s3.head_bucket(Bucket=bucket)
    except s3.exceptions.ClientError:
        s3.create_bucket(Bucket=bucket)


# -- schema ---------------------------------------------------------------------------------------------------


def iceberg_schema_of(arrow_schema) -> Any:
    """An Arrow schema as Iceberg's, ids unassigned (what a table made from it, or evolved by it, receives)."""
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow

    return visit_pyarrow(arrow_schema, _ConvertToIcebergWithoutIDs())


def schema_problems(table_schema, file_schema) -> tuple[list[str], list[str]]:
    """(columns the outputs add, why the outputs cannot be committed): a table column the outputs lack, or one
    whose type they change, is refused (readers of every earlier partition would read it otherwise)."""
    problems, added = [], []
    theirs = {field.name: field for field in file_schema.fields}
    for field in table_schema.fields:
        mine = theirs.get(field.name)
        if mine is None:
            problems.append(f"column {field.name!r} ({field.field_type}) is in the table but not in this run's outputs")
        elif str(mine.field_type) != str(field.field_type):
            problems.append(
                f"column {field.name!r} is {field.field_type} in the table, {mine.field_type} in this run's outputs"
            )
    ours = {field.name for field in table_schema.fields}
    added = [field.name for field in file_schema.fields if field.name not in ours]
    return added, problems


def _refused_schema(spec_table: TableSpec, problems: list[str]) -> TableError:
    return TableError(
        f"table {spec_table.qualified} refused this run's outputs: {'; '.join(problems)}. Nothing was committed. "
        "Ways forward: write the column as before (the model's output or input.passthrough), or commit to a new "
        f"table (output.table.name); an Iceberg table never changes a column's type or drops one under its readers"
    )


# -- the commit ------------------------------------------------------------------------------------------------


def snapshot_properties(attempt: Attempt) -> dict[str, str]:
    values = (attempt.pipeline, attempt.run_id, attempt.step, str(attempt.number))
    return {**dict(zip(SNAPSHOT_KEYS, values, strict=True)), "shardline.partition": json.dumps(attempt.table_partition)}


def commit_partition(spec: PipelineSpec, attempt: Attempt, outputs: list[dict]) -> TableCommit | None:
    """Commit the step's outputs (the outputs manifest's ``outputs``) as the run's partition of its table, once.
    None for a step without a table. Raises :class:`TableError` for what no retry mends (a schema the table
    refuses, a file that is not parquet) and :class:`TableCommitFailed` for what one may."""
    spec_table = spec.step(attempt.step).output.table
    if spec_table is None:
        return None
    if attempt.table_partition is None:  # planned before output.table was set: its outputs carry no partition
        raise TableError(
            f"step {attempt.step} has output.table {spec_table.qualified}, but attempt {attempt.number} was planned "
            "without it (the spec changed under the run): nothing was committed. Score the partition again: "
            + f"`{naming.rerun_command(attempt.pipeline, attempt.run_id)}`"
        )
    paths = [o["output"] for o in outputs if int(o.get("rows_out") or 0) > 0]  # an empty file has no partition
    not_parquet = [p for p in paths if not p.endswith(".parquet")]
    if not_parquet:
        raise TableError(
            f"table {spec_table.qualified}: {len(not_parquet)} output(s) are not parquet (e.g. {not_parquet[0]}): "
            "a table step writes parquet; they were written before output.table was set. Rerun the partition: "
            + f"`{naming.rerun_command(attempt.pipeline, attempt.run_id)}`"
        )
    from pyiceberg.exceptions import CommitFailedException

    try:
        _ensure_local_warehouse(spec, spec_table.catalog)
        catalog = catalog_for(spec, spec_table.catalog)
    except SpecError as err:  # a ${NAME} in dags/catalogs.yaml not set where the commit runs: a setting to change
        raise TableError(
            f"catalog {spec_table.catalog!r} of table {spec_table.qualified}: {err}; nothing was committed. Set it "
            "for Airflow's workers, then: " + f"`{naming.rerun_command(attempt.pipeline, attempt.run_id)}`"
        ) from err
    except TableCommitFailed as err:  # the catalog cannot be reached: say how to commit once it can
        raise TableCommitFailed(
            f"{err}; nothing was committed to table {spec_table.qualified} and _SUCCESS was not written. When the "
            "catalog answers again: " + f"`{naming.rerun_command(attempt.pipeline, attempt.run_id)}`"
        ) from err
    started = time.monotonic()
    last: Exception | None = None
    for attempt_number in range(COMMIT_TRIES):
        try:
            table = _table_for(catalog, spec_table, attempt, paths)
            done = _commit_once(table, spec_table, attempt, paths)
            log.info("step %s: %s (%.2fs)", attempt.step, done.words(), time.monotonic() - started)
            return done
        except CommitFailedException as err:  # another writer's commit landed first: reload and try again
            last = err
            log.warning(
                "step %s: table %s moved on under its commit (%s); trying again",
                attempt.step,
                spec_table.qualified,
                err,
            )
            time.sleep(min(0.05 * 2**attempt_number, 2.0))
        except (TableError, TableCommitFailed):
            raise
        except Exception as err:
            raise _failed(spec_table, attempt, err) from err
    raise _failed(spec_table, attempt, last)


def _failed(spec_table: TableSpec, attempt: Attempt, err: Exception | None) -> TableCommitFailed:
    return TableCommitFailed(
        f"the commit to table {spec_table.qualified} did not land ({type(err).__name__}: {err}); nothing was "
        "committed and _SUCCESS was not written. When the catalog answers again: "
        + f"`{naming.rerun_command(attempt.pipeline, attempt.run_id)}`"
    )


def _table_for(catalog: Catalog, spec_table: TableSpec, attempt: Attempt, paths: list[str]) -> Table:
    """The table, made from the first output's schema and the partition columns on the first commit."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    try:
        return catalog.load_table(spec_table.qualified)
    except NoSuchTableError:
        pass
    if not paths:
        raise TableError(f"table {spec_table.qualified} does not exist, and this run has no rows to make it from")
    schema = _assigned(iceberg_schema_of(_arrow_schema(catalog, paths[0])))
    try:
        catalog.create_namespace_if_not_exists(spec_table.namespace)
    except Exception:  # a SQL catalog checks, then inserts: another partition's first commit made it in between
        if not catalog.namespace_exists(spec_table.namespace):
            raise
    try:
        return catalog.create_table(
            spec_table.qualified, schema=schema, partition_spec=_partition_spec(schema, list(attempt.table_partition))
        )
    except TableAlreadyExistsError:  # another partition's end made it a moment ago
        return catalog.load_table(spec_table.qualified)


def _assigned(schema):
    from pyiceberg.schema import assign_fresh_schema_ids

    return assign_fresh_schema_ids(schema)


def _partition_spec(schema, columns: list[str]):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    fields = [
        PartitionField(
            source_id=schema.find_field(name).field_id, field_id=1000 + i, transform=IdentityTransform(), name=name
        )
        for i, name in enumerate(columns)
    ]
    return PartitionSpec(*fields)


def _arrow_schema(catalog_or_table, path: str):
    import pyarrow.parquet as pq

    io = catalog_or_table.io if hasattr(catalog_or_table, "io") else catalog_or_table._load_file_io(location=path)
    with io.new_input(path).open() as stream:
        return pq.read_metadata(stream).schema.to_arrow_schema()


def partition_filter(partition: dict[str, str]):
    """The row filter of one partition: each partition column equal to its value."""
    from pyiceberg.expressions import AlwaysTrue, And, EqualTo

    where = AlwaysTrue()
    for name, value in partition.items():
        where = And(where, EqualTo(name, value))
    return where


def _commit_once(table: Table, spec_table: TableSpec, attempt: Attempt, paths: list[str]) -> TableCommit:
    columns = list(attempt.table_partition)
    specced = [field.name for field in table.spec().fields]
    if specced != columns:
        raise TableError(
            f"table {spec_table.qualified} is partitioned by {specced}, this step by {columns} "
            "(output.table.partition): commit to a new table, or partition the step as the table is"
        )
    if paths:
        file_schema = iceberg_schema_of(_arrow_schema(table, paths[0]))
        added, problems = schema_problems(table.schema(), file_schema)
        if problems:
            raise _refused_schema(spec_table, problems)
        if added:  # nullable columns, before the data: readers of earlier partitions read them as null
            with table.update_schema() as update:
                update.union_by_name(file_schema)
            log.info("table %s: added column(s) %s", spec_table.qualified, added)
    where = partition_filter(attempt.table_partition)
    held = {task.file.file_path: task.file for task in table.scan(row_filter=where).plan_files()}
    to_add = [p for p in paths if p not in held]
    wanted = set(paths)
    to_remove = [f for p, f in held.items() if p not in wanted] if spec_table.mode == "replace_partition" else []
    current = table.current_snapshot()
    if not to_add and not to_remove:
        return TableCommit(
            spec_table.qualified,
            dict(attempt.table_partition),
            current.snapshot_id if current else 0,
            0,
            0,
            0,
            already=True,
        )
    data_files = _data_files(table, to_add, attempt)
    tx = table.transaction()
    if tx.table_metadata.name_mapping() is None:  # the files carry no field ids: readers map them by name
        from pyiceberg.table import TableProperties

        tx.set_properties(
            **{TableProperties.DEFAULT_NAME_MAPPING: tx.table_metadata.schema().name_mapping.model_dump_json()}
        )
    update = tx.update_snapshot(snapshot_properties=snapshot_properties(attempt))
    with update.overwrite() if to_remove else update.fast_append() as producer:
        for data_file in to_remove:
            producer.delete_data_file(data_file)
        for data_file in data_files:
            producer.append_data_file(data_file)
    committed = tx.commit_transaction()
    snapshot = committed.current_snapshot()
    return TableCommit(
        spec_table.qualified,
        dict(attempt.table_partition),
        snapshot.snapshot_id,
        len(to_add),
        len(to_remove),
        sum(f.record_count for f in data_files),
    )


def _data_files(table: Table, paths: list[str], attempt: Attempt) -> list:
    """Each file as the table's data file, from its parquet footer (schema, rows, column bounds), and checked to hold
    the run's partition: a file whose partition columns say otherwise, or whose schema the table cannot read, is
    refused, never committed. One ranged GET a file, :data:`READ_THREADS` at once: a commit of 1,000 files waits on
    S3, not on a core (pyiceberg's own reader asks three times a file)."""
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    metadata = table.metadata
    schema = metadata.schema()
    stats_columns = compute_statistics_plan(schema, metadata.properties)
    mapping = parquet_path_to_id_mapping(schema)
    s3 = _s3_for(table)

    def read(path: str):
        parquet, size = _footer(s3, path)
        try:
            _check_pyarrow_schema_compatible(
                schema, parquet.schema.to_arrow_schema(), format_version=metadata.format_version
            )
        except ValueError as err:
            raise TableError(f"table {'.'.join(table.name())}: {path} cannot be committed: {err}") from err
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=parquet, stats_columns=stats_columns, parquet_column_mapping=mapping
        )
        return DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=statistics.partition(metadata.spec(), schema),
            file_size_in_bytes=size,
            sort_order_id=None,
            spec_id=metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        )

    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        files = list(pool.map(read, paths))
    expected = tuple(attempt.table_partition.values())
    for data_file in files:
        found = tuple(data_file.partition[i] for i in range(len(expected)))
        if found != expected:
            raise TableError(
                f"{data_file.file_path} holds partition {found}, not this run's {expected}: it was not written by "
                "this run's worker (each row carries the run's partition columns). Nothing was committed"
            )
    return files


def _s3_for(table: Table):
    """A boto3 S3 client for the table's warehouse: the endpoint, region and keys its FileIO was given (the
    ``s3.*`` properties), else boto3's own chain."""
    import boto3

    from shardline.orchestration.services import client_config

    p = table.io.properties
    return boto3.client(
        "s3",
        endpoint_url=p.get("s3.endpoint") or None,
        region_name=p.get("s3.region") or p.get("client.region") or None,
        aws_access_key_id=p.get("s3.access-key-id") or p.get("client.access-key-id") or None,
        aws_secret_access_key=p.get("s3.secret-access-key") or p.get("client.secret-access-key") or None,
        aws_session_token=p.get("s3.session-token") or p.get("client.session-token") or None,
        config=client_config(),
    )


def _footer(s3, path: str):
    """A parquet file's footer metadata and the file's size (:func:`footers.parquet_footer`)."""
    bucket, key = parse_s3_uri(path)
    found = parquet_footer(s3, bucket, key)
    if found is None:
        raise TableError(f"{path} is not a parquet file (no footer): it cannot be committed")
    return found


# -- reading a table back --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SnapshotRow:
    """One snapshot of a table, as ``shardline table history`` lists it."""

    snapshot_id: int
    committed_at: str
    operation: str
    pipeline: str | None
    run_id: str | None
    step: str | None
    attempt: str | None
    partition: str | None
    rows_added: int
    rows_removed: int
    total_rows: int


def load_table(spec: PipelineSpec, step: str) -> Table:
    spec_table = spec.step(step).output.table
    if spec_table is None:
        raise TableError(f"step {step} of {spec.pipeline} has no output.table")
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog_for(spec, spec_table.catalog).load_table(spec_table.qualified)
    except NoSuchTableError as err:
        raise TableError(
            f"table {spec_table.qualified} does not exist yet: no run of step {step} has committed"
        ) from err


def history(spec: PipelineSpec, step: str) -> list[SnapshotRow]:
    """The table's snapshots, newest first, each with the run that committed it (none: another writer's)."""
    import datetime as dt

    table = load_table(spec, step)
    rows = []
    # Newest first by the commit's own order: two commits in one second keep theirs (the shown time is to the second).
    ordered = sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0), reverse=True)
    for snapshot in ordered:
        summary = snapshot.summary
        extra = dict(summary.additional_properties) if summary else {}
        rows.append(
            SnapshotRow(
                snapshot_id=snapshot.snapshot_id,
                committed_at=dt.datetime.fromtimestamp(snapshot.timestamp_ms / 1000, dt.UTC).isoformat(
                    timespec="seconds"
                ),
                operation=str(summary.operation.value) if summary else "",
                pipeline=extra.get("shardline.pipeline"),
                run_id=extra.get("shardline.run-id"),
                step=extra.get("shardline.step"),
                attempt=extra.get("shardline.attempt"),
                partition=extra.get("shardline.partition"),
                rows_added=int(extra.get("added-records") or 0),
                rows_removed=int(extra.get("deleted-records") or 0),
                total_rows=int(extra.get("total-records") or 0),
            )
        )
    return rows


def scanned_rows(spec: PipelineSpec, step: str, partition: dict[str, str]) -> int:
    """The rows the table's current snapshot holds in ``partition``, counted by scanning its data back (one column
    read), not from any record of what was written."""
    table = load_table(spec, step)
    first = next(iter(partition))
    reader = table.scan(row_filter=partition_filter(partition), selected_fields=(first,)).to_arrow_batch_reader()
    return sum(batch.num_rows for batch in reader)
