"""What a watch task tells OpenLineage (shardline.airflow.lineage), serialized as the provider sends it.

tests/scenarios/test_oncall_airflow.py has a real Airflow emit these events with the file transport.
"""

from __future__ import annotations

import json
from pathlib import Path

from openlineage.client.serde import Serde

from shardline.airflow.lineage import s3_dataset_name, step_lineage
from shardline.decision.summary import StepSummary
from shardline.planning.attempt import Attempt
from shardline.spec import load_spec

DAGS = Path(__file__).resolve().parents[2] / "dags" / "pipelines"
SUMMARY = StepSummary(
    step="score", files=5, succeeded=4, failed=1, rows_in=20_000, rows_out=19_990, rows_rejected=10, attempts=2
)


def _attempt(step: str = "score", pipeline: str = "tabular_scoring_hourly", **values) -> Attempt:
    return Attempt(
        pipeline=pipeline,
        run_id="scheduled__2026-11-22T11:00:00+00:00",
        step=step,
        number=2,
        input_prefix="s3://shardline-demo/events/dt=2026-11-22/hour=10/",
        output_prefix="s3://shardline-demo/scores/dt=2026-11-22/hour=10/",
        model_uri="s3://shardline-demo/models/xgboost/v1/model.tar.gz",
        model_version="v1",
        **values,
    )


def _json(lineage) -> dict:
    """The lineage as JSON, the way the provider serializes each part of an event."""
    return {
        "inputs": [json.loads(Serde.to_json(d)) for d in lineage.inputs],
        "outputs": [json.loads(Serde.to_json(d)) for d in lineage.outputs],
        "run_facets": {k: json.loads(Serde.to_json(v)) for k, v in lineage.run_facets.items()},
    }


def test_a_step_names_its_s3_prefixes_as_datasets_with_the_ledgers_rows_and_its_model():
    spec = load_spec(DAGS / "tabular_scoring_hourly.yaml")
    said = _json(step_lineage(spec, _attempt(), SUMMARY, "PARTIAL"))
    [source], [target] = said["inputs"], said["outputs"]
    assert (source["namespace"], source["name"]) == ("s3://shardline-demo", "events/dt=2026-11-22/hour=10")
    assert (target["namespace"], target["name"]) == ("s3://shardline-demo", "scores/dt=2026-11-22/hour=10")
    read, written = source["inputFacets"]["inputStatistics"], target["outputFacets"]["outputStatistics"]
    assert (read["rowCount"], read["fileCount"]) == (20_000, 5)
    assert (written["rowCount"], written["fileCount"]) == (19_990, 4)
    facet = said["run_facets"]["shardline"]
    assert {k: v for k, v in facet.items() if not k.startswith("_")} == {
        "pipeline": "tabular_scoring_hourly",
        "step": "score",
        "status": "PARTIAL",
        "attempts": 2,
        "modelUri": "s3://shardline-demo/models/xgboost/v1/model.tar.gz",
        "modelVersion": "v1",
        # The digest the spec pins for that version: which artifact scored these rows.
        "modelSha256": spec.steps[0].model.versions["v1"],
        "filesSucceeded": 4,
        "filesFailed": 1,
        "rowsRejected": 10,
    }
    assert facet["_schemaURL"].endswith("docs/lineage.md#the-shardline-run-facet")


def test_a_step_whose_rows_cannot_be_read_still_names_its_datasets_and_one_with_no_attempt_says_nothing():
    spec = load_spec(DAGS / "tabular_scoring_hourly.yaml")
    said = _json(step_lineage(spec, _attempt(), None, "FAILED"))
    assert said["inputs"][0]["name"] == "events/dt=2026-11-22/hour=10" and not said["inputs"][0]["inputFacets"]
    assert said["run_facets"]["shardline"]["status"] == "FAILED"
    assert said["run_facets"]["shardline"]["attempts"] == 2  # the attempt's number, when no summary says it
    nothing = step_lineage(spec, None, SUMMARY, "FAILED")
    assert (nothing.inputs, nothing.outputs, nothing.run_facets) == ([], [], {})


def test_a_prefix_names_one_dataset_with_or_without_its_trailing_slash():
    # A second step's input is its first step's output prefix: one name joins the two in the graph (the churn demo,
    # tests/scenarios/test_pipeline_e2e.py, shows it end to end).
    assert s3_dataset_name("s3://b/scores/dt=1/") == s3_dataset_name("s3://b/scores/dt=1") == ("s3://b", "scores/dt=1")
    assert s3_dataset_name("s3://b/") == ("s3://b", "")


def test_the_output_checks_go_out_as_data_quality_metrics_and_assertions():
    """The profile the workers kept and the checks it passed or failed: OpenLineage's own data quality facets, on the
    input (the features the checks read) and the output (every output column, and each check as an assertion)."""
    spec = load_spec(DAGS / "tabular_scoring_hourly.yaml")
    quality = {
        "inputs": {"f0": {"count": 20_000, "nullCount": 12, "sum": 3.5, "min": -4.0, "max": 4.1, "quantiles": {}}},
        "outputs": {
            "prediction": {"count": 19_990, "nullCount": 0, "min": 0.01, "max": 0.99, "quantiles": {"0.5": 0.4}}
        },
        "assertions": [
            {
                "assertion": "checks.columns.prediction.min_distinct",
                "success": False,
                "severity": "error",
                "expected": "at least 2",
                "actual": "1",
            }
        ],
        "approval": None,
    }
    said = _json(step_lineage(spec, _attempt(), SUMMARY, "FAILED", quality))
    [source], [target] = said["inputs"], said["outputs"]
    metrics = source["inputFacets"]["dataQualityMetrics"]
    assert metrics["rowCount"] == 20_000 and metrics["columnMetrics"]["f0"]["nullCount"] == 12
    assert target["facets"]["dataQualityMetrics"]["columnMetrics"]["prediction"]["quantiles"] == {"0.5": 0.4}
    [assertion] = target["facets"]["dataQualityAssertions"]["assertions"]
    assert (assertion["assertion"], assertion["success"], assertion["actual"]) == (
        "checks.columns.prediction.min_distinct",
        False,
        "1",
    )
    assert target["outputFacets"]["outputStatistics"]["rowCount"] == 19_990  # beside them, as before


def test_a_step_with_an_output_table_names_the_table_and_its_commit_once_committed():
    import dataclasses

    import yaml

    from shardline.spec import parse_spec

    data = yaml.safe_load((DAGS / "tabular_scoring_hourly.yaml").read_text())
    data["steps"][0]["output"]["table"] = {"namespace": "scoring", "name": "hourly_scores"}
    spec = parse_spec(data, "tabular_scoring_hourly.yaml")
    commit = {
        "table": "scoring.hourly_scores",
        "partition": {"dt": "2026-11-22", "hour": "10"},
        "snapshot_id": 2272531170105508025,
        "files_added": 4,
        "files_removed": 2,
        "rows_added": 19_990,
        "already": False,
    }
    said = _json(step_lineage(spec, _attempt(), dataclasses.replace(SUMMARY, table=commit), "SUCCEEDED"))
    prefix, table = said["outputs"]
    # The prefix holds the table's data files: it names the table; the table is an output of its own, with the rows.
    assert prefix["facets"]["symlinks"]["identifiers"] == [
        {"namespace": "iceberg://local", "name": "scoring.hourly_scores", "type": "TABLE"}
    ]
    assert (table["namespace"], table["name"]) == ("iceberg://local", "scoring.hourly_scores")
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 19_990
    assert said["run_facets"]["shardline"]["table"] == {
        "table": "scoring.hourly_scores",
        "partition": {"dt": "2026-11-22", "hour": "10"},
        "snapshotId": 2272531170105508025,
        "filesAdded": 4,
        "filesRemoved": 2,
        "rowsAdded": 19_990,
    }

    # A step that failed before its commit names the table it was to write, and no table output or commit.
    failed = _json(step_lineage(spec, _attempt(), SUMMARY, "FAILED"))
    [only] = failed["outputs"]
    assert only["facets"]["symlinks"]["identifiers"][0]["name"] == "scoring.hourly_scores"
    assert "table" not in failed["run_facets"]["shardline"]
