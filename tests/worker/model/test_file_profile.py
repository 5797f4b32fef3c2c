"""The worker keeps each file's profile while it writes (every output column's histogram or labels): what the step's
checks read, and the run report compares across runs."""

from __future__ import annotations

import numpy as np
import pytest

from examples import synthetic
from shardline.report.histogram import Histogram
from shardline.report.profile import Profile
from shardline.worker.pool.runner import FileResult
from tests.support.helpers import (
    SYNTHETIC_COLUMNS,
    describe,
    load_manifest,
    read_table,
    reports_by_input,
    run_worker,
    sklearn_predict,
)


@pytest.mark.slow
def test_each_file_and_the_instance_carry_the_histogram_of_what_was_written(tmp_path, sklearn_model):
    data, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(data, files=3, rows=6000)
    result = run_worker(data, out, sklearn_model.parent, *SYNTHETIC_COLUMNS, "--batch-rows", "700")
    assert result.returncode == 0, describe(result)
    manifest = load_manifest(out)

    predict = sklearn_predict(sklearn_model)
    everything = []
    for rel, report in reports_by_input(manifest).items():
        written = read_table(out / report["output"]).column("prediction").to_numpy()
        everything.append(written)
        profile = Profile.from_dict(report["profile"])
        assert list(profile.outputs) == ["prediction"] and not profile.inputs
        kept = profile.outputs["prediction"].histogram.to_dict()
        assert profile.outputs["prediction"].rows == len(written) and profile.outputs["prediction"].nulls == 0
        # Class labels are kept exactly: the histogram is the output's own value counts, batch after batch.
        values, counts = np.unique(written, return_counts=True)
        assert kept["exact"] == [[int(v), int(n)] for v, n in zip(values, counts, strict=True)], rel
        assert len(written) == len(predict(read_table(data / rel)))

    whole = manifest["prediction_histogram"]
    assert Histogram.from_dict(whole) == Histogram().add(np.concatenate(everything))


@pytest.mark.slow
def test_a_float_prediction_keeps_its_quantiles_within_the_sketch_accuracy(tmp_path, xgboost_model):
    data, out = tmp_path / "in", tmp_path / "out"
    synthetic.make_dataset(data, files=2, rows=5000)
    result = run_worker(data, out, xgboost_model.parent, *SYNTHETIC_COLUMNS, "--batch-rows", "1000")
    assert result.returncode == 0, describe(result)
    manifest = load_manifest(out)
    written = np.concatenate(
        [read_table(out / r["output"]).column("prediction").to_numpy() for r in manifest["file_reports"]]
    )
    kept = Histogram.from_dict(manifest["prediction_histogram"])
    assert kept.count == len(written)
    for q in (0.1, 0.5, 0.9):
        exact = float(np.quantile(written, q, method="inverted_cdf"))
        assert abs(kept.quantile(q) - exact) <= 0.011 * abs(exact) + 1e-9, q


def test_a_split_files_parts_merge_into_one_profile():
    report = FileResult("big.parquet")
    first, second = np.arange(0.0, 1.0, 0.01), np.arange(5.0, 6.0, 0.01)

    def part(values, labels) -> dict:
        profile = Profile()
        profile.files = 1
        profile.column("outputs", "prediction", "numbers").add_numbers(values, 0)
        profile.column("outputs", "label", "labels").add_labels(labels, 0, sum(labels.values()))
        return profile.to_dict()

    report.add_profile(part(first, {"a": 60, "b": 40}))
    report.add_profile(part(second, {"b": 50, "c": 50}))
    report.add_profile(None)  # an empty part adds nothing
    profile = Profile.from_dict(report.profile)
    assert profile.files == 1  # the parts of one file
    assert profile.outputs["label"].labels == {"a": 60, "b": 90, "c": 50}
    merged, whole = profile.outputs["prediction"].histogram, Histogram().add(np.concatenate([first, second]))
    assert merged.count == whole.count == 200
    for got, want in zip(merged.buckets(), whole.buckets(), strict=True):  # the same buckets, the same counts
        np.testing.assert_array_equal(got, want)
