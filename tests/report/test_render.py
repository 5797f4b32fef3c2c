"""The report page: self-contained, escaped, every chart drawn, fast; importing the room stays cheap."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from shardline.report.build import build_report
from shardline.report.charts import render_charts
from shardline.report.histogram import Histogram
from shardline.report.inputs import StepIdentity
from shardline.report.render import render_html
from tests.airflow.ui.conftest import browser  # noqa: F401  (the UI tests' headless Chromium, a module-scoped fixture)
from tests.report.example import example_histograms, example_records, example_report

SVG = b"<svg xmlns='http://www.w3.org/2000/svg'"


@pytest.fixture(scope="module")
def example():
    report = example_report()
    return report, render_html(report)


def images(page: str) -> dict[str, bytes]:
    return {
        name: base64.b64decode(data)
        for name, data in re.findall(
            r"<img class='chart' id='chart-(\w+)' alt='[^']*' src='data:image/svg\+xml;base64,([^']+)'>", page
        )
    }


def test_the_page_holds_every_section_and_chart_inline(example):
    report, page = example
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for section in ("throughput", "cost", "drift", "reconciliation"):
        assert f"<section id='{section}'>" in page
    charts = images(page)
    assert set(charts) == {"throughput", "instances", "cost", "drift"}
    assert all(svg.startswith(SVG) and len(svg) > 2_000 for svg in charts.values())
    # the figures the reader looks for
    assert f"PSI <b>{report.drift.psi:.3f}</b>" in page and "drift" in page
    assert "algo-3 (attempt 1)</b> finished" in page  # the straggler, called out
    assert "per 1M predictions" in page and "ml.m5.xlarge" in page


def test_the_page_needs_no_network_and_runs_no_script(example):
    _, page = example
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", page, re.IGNORECASE)
    assert not re.search(r"url\(", page)


def test_every_string_from_the_data_is_escaped(example):
    _, page = example
    # the example carries an input key with HTML in it and a failure reason with a script tag
    assert "&lt;b&gt;odd &amp; name&lt;/b&gt;" in page and "<b>odd" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    hostile = StepIdentity(pipeline="p<i>", run_id="r'\"><img src=x onerror=alert(1)>", step="s&t")
    page = render_html(build_report(hostile, [], []))
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page and "&#x27;" in page
    assert "p&lt;i&gt;" in page and "s&amp;t" in page


def test_a_step_with_nothing_recorded_renders_with_what_it_has():
    page = render_html(build_report(StepIdentity(pipeline="p", run_id="r", step="s"), [], []))
    assert images(page) == {} and "No drift statistic" in page and "n/a" in page


def test_a_16_instance_400_file_report_renders_with_every_chart():
    """A step of realistic size renders whole (how long it takes is `python -m tests.report.example`'s to
    print, not a test's to assert: no test here depends on timing)."""
    identity, files, instances = example_records(instances=16, files_per_instance=25, straggler="algo-11")
    current, reference = example_histograms(4_000_000)
    report = build_report(identity, files, instances, current, reference=reference, reference_run_id="before")
    page = render_html(report)
    assert len(images(page)) == 4 and report.stragglers == ["algo-11 (attempt 1)"]
    assert page.count("algo-11") >= 1 and report.reconciliation.files == 400


def test_importing_the_room_loads_no_matplotlib_and_its_package_no_numpy():
    code = (
        "import json, sys\nimport shardline.report\nfirst = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('numpy', 'matplotlib'))\n"
        "import shardline.report.inputs, shardline.report.model, shardline.report.build, shardline.report.render\n"
        "print(json.dumps([first, sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'pynamodb', "
        "'boto3', 'airflow'})]))"
    )
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(result.stdout) == [[], []]


def test_the_charts_alone_for_a_look(tmp_path):
    report = build_report(
        StepIdentity(pipeline="p", run_id="r", step="s"),
        [],
        [],
        Histogram().add(np.random.default_rng(0).normal(size=10_000)),
    )
    charts = render_charts(report)
    assert set(charts) == {"drift"}  # this run's histogram alone; no cost per 1M without predictions, no trend
    assert charts["drift"].startswith(SVG)


@pytest.mark.slow
def test_the_page_opens_in_headless_chromium_with_its_charts_drawn(example, browser, tmp_path):  # noqa: F811
    _, page = example
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    browser.get(path.as_uri())
    drawn = browser.execute_script(
        "return [...document.images].map(i => [i.id, i.complete, i.naturalWidth, i.naturalHeight])"
    )
    assert len(drawn) == 4 and all(done and width > 500 and height > 200 for _, done, width, height in drawn), drawn
    assert browser.title.startswith("Shardline report: scores")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_the_checks_section_shows_each_check_its_trend_and_who_approved_what_it_held_back():
    from shardline.report.model import CheckResult

    held = CheckResult(
        check="checks.columns.prediction.min_distinct",
        level="blocking",
        verdict="fail",
        value=1,
        shown="1",
        bound="at least 2",
        files=["<b>part-0.parquet</b>"],
        history=[1042.0, 1040.0, 1039.0],
    )
    passed = CheckResult(
        check="checks.rows_out.at_least", level="blocking", verdict="pass", value=9, shown="9", bound="at least 1"
    )
    report = example_report().model_copy(update={"checks": [held, passed]})
    page = render_html(report)
    assert "<h2>Output checks</h2>" in page and "1 blocking failed: held back" in page
    assert "checks.columns.prediction.min_distinct" in page and "&lt;b&gt;part-0.parquet&lt;/b&gt;" in page
    assert page.count("alt='trend'") == 1  # the check with earlier values has its line; the other has none yet
    approved = render_html(report.model_copy(update={"approval": {"by": "<i>oncall</i>", "at": "now", "reason": "ok"}}))
    assert "approved by <b>&lt;i&gt;oncall&lt;/i&gt;</b>" in approved and "1 blocking failed: approved" in approved
