"""What auto-tune shows (``shardline.worker.tools.tune_report``): the machine's line, the table with the best
marked, and the text it prints, from figures given here (no run, no plot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardline.worker.tools.tune_decisions import Point, Setting
from shardline.worker.tools.tune_report import JSON_NAME, machine_line, render, render_table

MACHINE = {"cores": 16, "cpu": "x86_64", "memory_gib": 64, "gpus": [], "simulated_gpus": False}


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({}, "16 cores (x86_64), 64 GiB, no GPU"),
        ({"memory_gib": None, "gpus": ["NVIDIA A10G", "NVIDIA A10G"]}, "16 cores (x86_64), NVIDIA A10G, NVIDIA A10G"),
        (
            {"gpus": ["cpu:0"], "simulated_gpus": True},
            "16 cores (x86_64), 64 GiB, cpu:0 (simulated: computing on the CPU)",
        ),
        (
            {"load_average_1m": 3.5},
            "16 cores (x86_64), 64 GiB, no GPU, load average 3.5 as it started (other work skews the figures)",
        ),
    ],
)
def test_the_machines_line_says_what_the_figures_were_measured_on(changes, line):
    assert machine_line({**MACHINE, **changes}) == line


def _points() -> list[Point]:
    return [
        Point("split", Setting(4, 1, 4096, 0), [1000.0, 1100.0]),
        Point("batch", Setting(4, 1, 8192, 0), [2000.0]),
        Point("batch", Setting(4, 1, 16384, 0), [1990.0, 2010.0]),
    ]


def test_the_table_has_a_row_per_setting_and_marks_the_best():
    points = _points()
    lines = render_table(points, points[1], gpu=False)
    assert lines[0].split() == [
        "phase",
        "workers",
        "x",
        "threads",
        "batch_rows",
        "rows/s",
        "(median)",
        "spread",
        "runs",
    ]
    assert lines[1].split() == ["split", "4x1", "4,096", "1,050", "9.5%", "2"]
    assert lines[2].endswith("  <- best") and lines[2].split()[:4] == ["batch", "4x1", "8,192", "2,000"]
    assert not lines[1].endswith("<- best") and not lines[3].endswith("<- best")
    assert "gpu_batch_rows" in render_table(points, points[1], gpu=True)[0]


def test_the_text_names_the_best_those_as_good_the_snippet_and_where_the_figures_are(tmp_path):
    points = _points()
    result = {
        "sample": {"files": ["a.parquet"], "rows": 20_000, "copies": 2, "rows_per_run": 40_000},
        "machine": MACHINE,
        "model": {"kind": "xgboost", "sha256": "0123456789abcdef" * 4},
        "repeat": 2,
        "batch_sweep": "stopped at 16,384: no better than 8,192",
        "tolerance": 0.03,
        "snippet": "steps:\n  - name: score\n    batch_rows: 8192",
        "notes": ["the spec has no field for threads"],
    }
    text = render(result, points, points[1], on_gpu=False, plot=None, out=tmp_path)
    assert text.startswith("auto-tune on 16 cores (x86_64), 64 GiB, no GPU\n")
    assert "sha256 0123456789ab...)" in text and "laid out 2 times (40,000 rows a run)" in text
    assert "best: 4x1 (workers x threads), batch_rows 8,192: 2,000 rows/s" in text
    assert (
        "as good as the best, as far as the runs tell (within 3%, or a run as fast as its slowest): 4x1 batch 16,384"
        in text
    )
    assert "\n  steps:\n    - name: score\n      batch_rows: 8192\n" in text  # the snippet, indented to paste
    assert "- the spec has no field for threads" in text
    assert f"figures: {tmp_path / JSON_NAME}" in text
    assert text.endswith("plot: none (matplotlib is not installed here: pip install matplotlib)\n")
    assert render(result, points, points[1], on_gpu=False, plot=Path("/x/tune.png"), out=tmp_path).endswith(
        "plot: /x/tune.png\n"
    )
