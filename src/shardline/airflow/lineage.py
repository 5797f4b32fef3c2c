"""What a step's watch task tells OpenLineage: the step's S3 datasets, its rows in and out, its model and its end.

Airflow's OpenLineage provider (``shardline[lineage]``) calls the watch operator's
``get_openlineage_facets_on_complete`` and ``..._on_failure`` when the task ends; they import this module and build
the answer here. Only the provider calls them, so nothing imports this module where the provider is not installed.

Datasets are named as the Amazon provider names S3 ones: namespace ``s3://bucket``, name the key prefix (without
its trailing ``/``), so a step's input is the earlier step's output and the graph joins up. The row counts are the
ledger's (:func:`shardline.orchestration.step.end.summarize`): rows in and out of the files that succeeded.
"""

from __future__ import annotations

from typing import Any

import attr
from airflow.providers.common.compat.openlineage.facet import (
    Identifier,
    InputDataset,
    OutputDataset,
    OutputStatisticsOutputDatasetFacet,
    RunFacet,
    SymlinksDatasetFacet,
)
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.generated.data_quality_assertions_dataset import Assertion, DataQualityAssertionsDatasetFacet
from openlineage.client.generated.data_quality_metrics_dataset import ColumnMetrics as OutputColumnMetrics
from openlineage.client.generated.data_quality_metrics_dataset import DataQualityMetricsDatasetFacet
from openlineage.client.generated.data_quality_metrics_input_dataset import (
    ColumnMetrics,
    DataQualityMetricsInputDatasetFacet,
)
from openlineage.client.generated.input_statistics_input_dataset import InputStatisticsInputDatasetFacet

from shardline.decision.summary import StepSummary
from shardline.planning.attempt import Attempt
from shardline.spec import PipelineSpec

FACET_SCHEMA = "https://github.com/shardline/shardline/blob/main/docs/lineage.md#the-shardline-run-facet"
PRODUCER = "https://github.com/shardline/shardline"


@attr.define
class ShardlineRunFacet(RunFacet):
    """A Shardline step's end: its status, attempts, files, rejected rows, and the model it ran."""

    pipeline: str
    step: str
    status: str  # SUCCEEDED, PARTIAL (within its tolerance) or FAILED
    attempts: int
    modelUri: str  # camelCase: OpenLineage facets are
    modelVersion: str | None = None
    modelSha256: str | None = None
    filesSucceeded: int | None = None
    filesFailed: int | None = None
    rowsRejected: int | None = None
    approval: dict | None = None  # outputs its checks held back, accepted by on-call: by, at, reason, attempt
    table: dict | None = None  # its commit to `output.table`: table, partition, snapshotId, rows and files

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA


def s3_dataset_name(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of an S3 prefix: ``s3://b/scores/dt=1/`` is ``("s3://b", "scores/dt=1")``."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return f"s3://{bucket}", key.rstrip("/")


def step_facts(spec: PipelineSpec, attempt: Attempt, summary: StepSummary | None, status: str) -> dict[str, Any]:
    """The step's facts as the ``shardline`` run facet carries them."""
    try:  # the digest the worker checked the artifact against
        pinned = spec.step(attempt.step).model.pin_for(attempt.model_version)
    except ValueError:  # a version the spec no longer pins: the run's own record says which it was
        pinned = None
    return {
        "pipeline": attempt.pipeline,
        "step": attempt.step,
        "status": status,
        "attempts": summary.attempts if summary is not None else attempt.number,
        "modelUri": attempt.model_uri,
        "modelVersion": attempt.model_version,
        "modelSha256": pinned,
        "filesSucceeded": summary.succeeded if summary is not None else None,
        "filesFailed": summary.failed if summary is not None else None,
        "rowsRejected": summary.rows_rejected if summary is not None else None,
        "approval": summary.approval if summary is not None else None,
        "table": _table_facts(summary.table) if summary is not None and summary.table else None,
    }


def _table_facts(commit: dict[str, Any]) -> dict[str, Any]:
    """A table commit as the run facet carries it (camelCase, as OpenLineage's facets are)."""
    return {
        "table": commit["table"],
        "partition": commit["partition"],
        "snapshotId": commit["snapshot_id"],
        "filesAdded": commit["files_added"],
        "filesRemoved": commit["files_removed"],
        "rowsAdded": commit["rows_added"],
    }


def table_identifier(spec: PipelineSpec, step: str) -> Identifier | None:
    """The step's output table as a dataset: namespace ``iceberg://<catalog>`` (the catalog's name in
    dags/catalogs.yaml, or ``local``), name ``<namespace>.<table>``; None for a step without ``output.table``."""
    table = spec.step(step).output.table
    if table is None:
        return None
    return Identifier(namespace=f"iceberg://{table.catalog}", name=table.qualified, type="TABLE")


def step_lineage(
    spec: PipelineSpec, attempt: Attempt | None, summary: StepSummary | None, status: str, quality: dict | None = None
) -> OperatorLineage:
    """The lineage of a watch task that ended with the step ``status``; ``summary``: the step's report, None when it
    could not be read (the datasets are named, without their rows); ``quality``: what its output checks read and
    found (:func:`~shardline.orchestration.step.run_report.quality_facts`), None when unknown; no ``attempt`` (the
    task failed before it had one): nothing to say."""
    if attempt is None:
        return OperatorLineage()
    read: dict[str, Any] = {}
    written: dict[str, Any] = {}
    if summary is not None:
        read["inputStatistics"] = InputStatisticsInputDatasetFacet(rowCount=summary.rows_in, fileCount=summary.files)
        written["outputStatistics"] = OutputStatisticsOutputDatasetFacet(
            rowCount=summary.rows_out, fileCount=summary.succeeded
        )
    output_facets: dict[str, Any] = {}
    if quality is not None:
        if quality["inputs"]:
            read["dataQualityMetrics"] = DataQualityMetricsInputDatasetFacet(
                columnMetrics={name: ColumnMetrics(**m) for name, m in quality["inputs"].items()},
                rowCount=summary.rows_in if summary is not None else None,
            )
        if quality["outputs"]:
            output_facets["dataQualityMetrics"] = DataQualityMetricsDatasetFacet(
                columnMetrics={name: OutputColumnMetrics(**m) for name, m in quality["outputs"].items()},
                rowCount=summary.rows_out if summary is not None else None,
            )
        if quality["assertions"]:
            output_facets["dataQualityAssertions"] = DataQualityAssertionsDatasetFacet(
                assertions=[Assertion(**a) for a in quality["assertions"]]
            )
    source, target = s3_dataset_name(attempt.input_prefix), s3_dataset_name(attempt.output_prefix)
    outputs = [OutputDataset(*target, facets=output_facets, outputFacets=written)]
    table = table_identifier(spec, attempt.step)
    if table is not None:
        # The outputs are the table's data files: the prefix names the table (a symlink, as Spark's Iceberg lineage
        # does); once the end committed them, the table is an output of its own, so a catalog-side consumer joins up.
        output_facets["symlinks"] = SymlinksDatasetFacet(identifiers=[table])
    if table is not None and summary is not None and summary.table:  # the end committed the partition
        outputs.append(
            OutputDataset(
                table.namespace,
                table.name,
                facets={
                    "symlinks": SymlinksDatasetFacet(
                        identifiers=[Identifier(namespace=target[0], name=target[1], type="LOCATION")]
                    )
                },
                outputFacets=written,
            )
        )
    return OperatorLineage(
        inputs=[InputDataset(*source, inputFacets=read)],
        outputs=outputs,
        run_facets={"shardline": ShardlineRunFacet(**step_facts(spec, attempt, summary, status), producer=PRODUCER)},
    )
