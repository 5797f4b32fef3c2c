"""Where a step's outputs are committed as a table: ``output.table`` in a spec, and the catalogs file,
``dags/catalogs.yaml``, that names the catalogs once for every pipeline.

::

    # dags/catalogs.yaml: pyiceberg's own properties, as in ~/.pyiceberg.yaml
    catalog:
      lake:
        type: glue
        glue.region: eu-west-1
        warehouse: s3://acme-lake/warehouse/

    # a step of a pipeline spec
    output:
      prefix: s3://acme-scores/hourly/dt={{ data_interval_start | ds }}/
      table: {catalog: lake, namespace: scoring, name: hourly_scores}

A value may name an environment variable, ``${NAME}``: it is read where the commit runs (Airflow's side), so
no secret is written in a file. The catalog ``local`` needs no entry: it is the stack's own, a SQL catalog in
a SQLite file beside the local backend's jobs with its warehouse on the embedded S3 (an entry named ``local``
replaces it: compose points it at its Postgres). Pure: no pyiceberg here (``orchestration.tables`` builds
the catalog).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from shardline.spec.base import SpecError, _Strict

CATALOGS_FILE = "catalogs.yaml"
LOCAL_CATALOG = "local"  # the stack's own: no entry needed (orchestration.tables.local_catalog_properties)
IDENTIFIER = r"^[a-z_][a-z0-9_]{0,127}$"  # Glue and Athena fold names to lower case: one spelling everywhere
_ENV_VALUE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Catalog types pyiceberg builds without a plugin: anything else is named in the error.
CATALOG_TYPES = ("sql", "glue", "rest", "hive", "dynamodb", "in-memory")


class TableSpec(_Strict):
    catalog: Annotated[str, Field(min_length=1, max_length=64)] = LOCAL_CATALOG
    """the catalog, by its name in dags/catalogs.yaml (`local`: the stack's own, needs no entry)"""
    namespace: Annotated[str, Field(pattern=IDENTIFIER)]
    """the table's namespace (a Glue database), created on the first commit"""
    name: Annotated[str, Field(pattern=IDENTIFIER)]
    """the table's name, created on the first commit from the first run's output schema"""
    partition: dict[Annotated[str, Field(pattern=IDENTIFIER)], str] | None = None
    """the partition columns, each a Jinja template rendered for the run (`{dt: "{{ data_interval_start | ds }}"}`);
    the worker adds each to every output row as text. Unset: `dt`, and `hour` too when the schedule's interval is
    shorter than a day"""
    mode: Literal["replace_partition", "append"] = "replace_partition"
    """replace_partition: a run's commit replaces the partition's earlier files, in one snapshot (reruns replace);
    append: it adds its files beside them"""

    @field_validator("partition")
    @classmethod
    def _some_columns(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and not value:
            raise ValueError("name at least one partition column, or leave partition unset for the schedule's")
        return value

    @property
    def qualified(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def catalog_table(self) -> tuple[str, str, str]:
        """Which table this is, wherever it is named: its catalog, namespace and name."""
        return self.catalog, self.namespace, self.name

    def partition_templates(self, *, hourly: bool) -> dict[str, str]:
        """The partition columns and their templates: the spec's own, else those of the schedule (``hourly``:
        it has intervals, shorter than a day)."""
        if self.partition is not None:
            return dict(self.partition)
        columns = {"dt": "{{ data_interval_start | ds }}"}
        if hourly:
            columns["hour"] = "{{ data_interval_start.strftime('%H') }}"
        return columns


class CatalogsFile(_Strict):
    catalog: dict[Annotated[str, Field(min_length=1, max_length=64)], dict[str, str]] = {}
    """each catalog's pyiceberg properties by name (type, uri, warehouse, s3.endpoint, glue.region, ...);
    `${NAME}` is read from the environment where the commit runs"""

    @field_validator("catalog")
    @classmethod
    def _typed(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for name, properties in value.items():
            kind = properties.get("type")
            if kind is None and "uri" not in properties:
                raise ValueError(f"catalog {name!r} has no type: give it one of {list(CATALOG_TYPES)}")
            if kind is not None and kind not in CATALOG_TYPES:
                raise ValueError(f"catalog {name!r} has type {kind!r}: use one of {list(CATALOG_TYPES)}")
        return value

    def names(self) -> list[str]:
        return sorted({LOCAL_CATALOG, *self.catalog})


def load_catalogs(dags_folder: Path) -> CatalogsFile:
    """``dags_folder/catalogs.yaml``, or no catalogs but the stack's own when there is none. A bad file is a
    :class:`SpecError` naming the file and the field."""
    path = Path(dags_folder) / CATALOGS_FILE
    if not path.is_file():
        return CatalogsFile()
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from err
    if data is None:
        return CatalogsFile()
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a catalogs file is a YAML mapping (catalog: {{NAME: {{type: ...}}}})")
    try:
        # pyiceberg's files hold numbers and booleans too; its properties are text.
        for properties in (data.get("catalog") or {}).values():
            if isinstance(properties, dict):
                for key, value in list(properties.items()):
                    if isinstance(value, bool | int | float):
                        properties[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return CatalogsFile.model_validate(data)
    except ValidationError as err:
        from shardline.spec import problem_lines

        raise SpecError(f"{path}: invalid catalogs file\n" + "\n".join(problem_lines(err))) from err


def check_catalogs(steps, catalogs: CatalogsFile, spec_path: Path) -> None:
    """Each step's ``output.table.catalog`` is one the catalogs file names (or ``local``): an import error naming
    the spec, the field and the file otherwise."""
    for step in steps:
        table = step.output.table
        if table is not None and table.catalog not in catalogs.names():
            raise SpecError(
                f"{spec_path}: steps.{step.name}.output.table.catalog is {table.catalog!r}, which "
                f"{spec_path.parent.parent / CATALOGS_FILE} does not name (catalogs: {catalogs.names()})"
            )


def expand_environment(properties: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """``properties`` with each ``${NAME}`` read from the environment; a name that is not set is an error naming
    it (never an empty value: a catalog built on one reaches the wrong place)."""
    environ = dict(os.environ) if environ is None else environ
    missing = sorted({m for value in properties.values() for m in _ENV_VALUE.findall(value) if m not in environ})
    if missing:
        raise SpecError(f"the catalog's properties name {', '.join(missing)}, not set in this environment")
    return {key: _ENV_VALUE.sub(lambda m: environ[m.group(1)], value) for key, value in properties.items()}
