"""What an instance says at its end (``worker/job/summary.py``): its manifest, one per attempt, written whole."""

from __future__ import annotations

import json

import numpy as np

from shardline.report.histogram import Histogram
from shardline.report.profile import Profile
from shardline.worker.job.summary import _merged_histogram, describe_slots, human_bytes, manifest_path, write_manifest
from shardline.worker.pool.devices import WorkerSlot


def test_each_attempt_keeps_its_own_manifest_and_a_run_outside_a_pipeline_has_one(tmp_path):
    assert manifest_path(tmp_path, "algo-2", 3) == tmp_path / "attempt-0003" / "manifest-algo-2.json"
    assert manifest_path(tmp_path, "algo-2", 1) != manifest_path(tmp_path, "algo-2", 2)
    assert manifest_path(tmp_path, "algo-1", None) == tmp_path / "manifest-algo-1.json"


def test_a_manifest_is_written_whole_and_replaces_the_one_before(tmp_path):
    first = write_manifest(tmp_path / "_shardline", "algo-1", {"files": 1}, 2)
    again = write_manifest(tmp_path / "_shardline", "algo-1", {"files": 2}, 2)
    assert first == again and json.loads(again.read_text()) == {"files": 2}
    assert [p.name for p in again.parent.iterdir()] == ["manifest-algo-1.json"]  # no temp file left beside it


def test_the_instances_histogram_is_its_files_first_output_column_merged():
    def of(**columns) -> dict:
        profile = Profile()
        for name, values in columns.items():
            array = np.asarray(values, dtype=float)
            profile.column("outputs", name, "numbers").add_numbers(array, 0)
        return profile.to_dict()

    merged = _merged_histogram([of(score=[0.1, 0.2], other=[5.0]), None, of(score=[0.9], other=[6.0, 7.0])])
    assert merged["column"] == "score" and Histogram.from_dict(merged).count == 3
    assert _merged_histogram([None, None]) is None  # no file succeeded with a profile: none, never an empty one


def test_the_log_line_says_sizes_and_workers_plainly():
    assert [human_bytes(n) for n in (512, 2048, 5 * 2**30, 3 * 2**40)] == ["512.0 B", "2.0 KiB", "5.0 GiB", "3.0 TiB"]
    assert describe_slots([WorkerSlot(0, 4), WorkerSlot(1, 4)]) == "2 CPU worker(s) x 4 thread(s)"
    assert describe_slots([WorkerSlot(0, 2, gpu="0")]) == "1 GPU worker(s) x 2 thread(s)"
