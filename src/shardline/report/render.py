"""The run report as one self-contained HTML page: charts embedded as SVG images (:mod:`.charts`), no script,
no network. Every string that comes from the data (keys, hosts, error messages, run ids) is escaped: input keys and
failure reasons are anyone's text.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import statistics
from typing import Any

from shardline.report.charts import duration_text as _duration
from shardline.report.charts import number_text as _num
from shardline.report.charts import render_charts
from shardline.report.model import InstanceSummary, RunReport

MAX_FILE_ROWS = 500  # the page lists at most this many files (problems first); the JSON has them all


# What the report page may load: its inline styles and data: images (the charts), nothing else, no script.
PAGE_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def render_html(report: RunReport, *, max_file_rows: int = MAX_FILE_ROWS) -> str:
    """The report page: one HTML document with its charts inside."""
    charts = {name: _data_uri(svg) for name, svg in render_charts(report).items()}
    e = _e
    title = f"{report.pipeline} / {report.run_id} / {report.step}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # The page is opened from a file (`shardline report --open`) or served: in both, no script runs.
        f'<meta http-equiv="Content-Security-Policy" content="{PAGE_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Shardline report: {e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<header><h1>Run report <span class='muted'>{e(title)}</span></h1>",
        f"<p class='muted'>attempt {e(report.attempt)} · backend {e(report.backend)} · "
        f"started {e(_when(report.started_at))} · ended {e(_when(report.ended_at))}"
        f"{' · generated ' + e(_when(report.generated_at)) if report.generated_at else ''}</p></header>",
        _summary(report),
    ]
    if report.notes:
        parts.append("<ul class='notes'>" + "".join(f"<li>{e(n)}</li>" for n in report.notes) + "</ul>")
    if report.checks:
        parts += ["<section id='checks'><h2>Output checks</h2>", _checks(report), "</section>"]
    parts += [
        "<section id='throughput'><h2>Throughput over time per instance</h2>",
        _chart(charts, "throughput", "rows per second per instance over the run"),
        _flags(report),
        _chart(charts, "instances", "files and bytes per instance"),
        _instance_table(report.instances),
        "</section>",
        "<section id='cost'><h2>Cost</h2>",
        _cost(report),
        _chart(charts, "cost", "cost per instance and trend"),
        "</section>",
        "<section id='drift'><h2>Predictions against the previous successful run</h2>",
        _drift(report),
        _chart(charts, "drift", "prediction histograms, this run and the reference"),
        "</section>",
        "<section id='reconciliation'><h2>Reconciliation</h2>",
        _reconciliation(report, max_file_rows),
        "</section>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


# -- HTML parts -------------------------------------------------------------------------------------------


def _summary(report: RunReport) -> str:
    r, c, d = report.reconciliation, report.cost, report.drift
    cards = [
        ("duration", _duration(report.seconds) if report.seconds is not None else "n/a", ""),
        ("files", f"{r.succeeded:,} of {r.files:,} succeeded", "alert" if r.failed else ""),
        ("predictions", f"{c.predictions:,}", "" if r.balanced else "alert"),
        ("cost", _usd(c.total) if c.total is not None else "n/a", "alert" if c.error else ""),
        ("per 1M predictions", _usd(c.cost_per_million) if c.cost_per_million is not None else "n/a", ""),
        *([("control plane", _control_card(c), "")] if c.control_plane is not None else []),
        (
            "drift (PSI)",
            f"{d.psi:.3f} {d.verdict}" if d.psi is not None else "n/a",
            {"drift": "alert", "moderate": "warn"}.get(d.verdict, ""),
        ),
        _checks_card(report),
        *([_table_card(report.table)] if report.table else []),
        ("stragglers", ", ".join(report.stragglers) or "none", "alert" if report.stragglers else ""),
        ("idle", ", ".join(report.idle) or "none", "warn" if report.idle else ""),
    ]
    return (
        "<div class='cards'>"
        + "".join(
            f"<div class='card {cls}'><div class='label'>{_e(label)}</div><div class='value'>{_e(value)}</div></div>"
            for label, value, cls in cards
        )
        + "</div>"
    )


def _table_card(commit: dict) -> tuple[str, str, str]:
    """The output table's commit: which table and partition, and the snapshot that holds this run's rows."""
    where = "/".join(f"{k}={v}" for k, v in (commit.get("partition") or {}).items())
    return "table", f"{commit.get('table')} {where}: snapshot {commit.get('snapshot_id')}", ""


def _checks_card(report: RunReport) -> tuple[str, str, str]:
    blocking = [c for c in report.checks if c.verdict == "fail" and c.level == "blocking"]
    warned = [c for c in report.checks if c.verdict == "fail" and c.level == "warn"]
    if not report.checks:
        return "checks", "none set", ""
    if blocking:
        said = "approved" if report.approval else "held back"
        return "checks", f"{len(blocking)} blocking failed: {said}", "warn" if report.approval else "alert"
    passed = sum(c.verdict == "pass" for c in report.checks)
    return (
        "checks",
        f"{passed} of {len(report.checks)} passed" + (f", {len(warned)} warn" if warned else ""),
        ("warn" if warned else ""),
    )


def _checks(report: RunReport) -> str:
    """Each check: verdict, level, value against bound, and its value over the earlier partitions (oldest first, this
    run last, as a line)."""
    approval = report.approval
    head = ""
    if approval:
        head = (
            f"<p class='warn'>Outputs held back by these checks were approved by <b>{_e(approval.get('by'))}</b> at "
            f"{_e(approval.get('at'))}: {_e(approval.get('reason'))}</p>"
        )
    rows = []
    for check in report.checks:
        cls = {"fail": "alert" if check.level == "blocking" else "warn", "n/a": "muted"}.get(check.verdict, "")
        trend = _sparkline([*reversed(check.history), check.value]) if check.history else ""
        files = f"<br><span class='muted'>most in {_e(', '.join(check.files))}</span>" if check.files else ""
        rows.append(
            f"<tr class='{cls}'><td>{_e(check.verdict)}</td><td>{_e(check.level)}</td><td>{_e(check.check)}</td>"
            f"<td class='num'>{_e(check.shown)}</td><td>{_e(check.bound)}{files}</td><td>{trend}</td></tr>"
        )
    return (
        head
        + "<table><thead><tr><th>verdict</th><th>level</th><th>check</th><th>value</th><th>bound</th>"
        + "<th>earlier partitions, then this one</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _sparkline(values: list[float | None], width: int = 120, height: int = 24) -> str:
    """A small line of ``values`` (the last one, this run's, marked), as an embedded SVG image."""
    points = [(i, v) for i, v in enumerate(values) if v is not None]
    if len(points) < 2:
        return ""
    low, high = min(v for _, v in points), max(v for _, v in points)
    span = (high - low) or 1.0
    step = (width - 8) / max(1, len(values) - 1)
    xy = [(4 + i * step, height - 4 - (v - low) / span * (height - 8)) for i, v in points]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    last_x, last_y = xy[-1]
    svg = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}'>"
        f"<polyline fill='none' stroke='#888' stroke-width='1.5' points='{line}'/>"
        f"<circle cx='{last_x:.1f}' cy='{last_y:.1f}' r='3' fill='#1f6feb'/></svg>"
    )
    return f"<img alt='trend' src='{_data_uri(svg.encode())}'>"


def _flags(report: RunReport) -> str:
    lines = []
    by_name = {s.instance: s for s in report.instances}
    for name in report.stragglers:
        summary = by_name[name]
        peers = [s for s in report.instances if s.attempt == summary.attempt]
        since = min(s.started_after_seconds for s in peers if s.started_after_seconds is not None)
        finishes = sorted(s.finished_after_seconds - since for s in peers if s.finished_after_seconds is not None)
        took, median = summary.finished_after_seconds - since, statistics.median(finishes)
        lines.append(
            f"<li class='alert'><b>{_e(name)}</b> finished {_e(_duration(took))} after its attempt began, "
            f"the median instance {_e(_duration(median))}: the step waited on it.</li>"
        )
    for name in report.idle:
        summary = by_name[name]
        why = (
            "had no files"
            if summary.files == 0
            else f"had a file in flight {summary.busy_fraction:.0%} of its {_duration(summary.seconds)}"
        )
        lines.append(f"<li class='warn'><b>{_e(name)}</b> {_e(why)}.</li>")
    return "<ul class='flags'>" + "".join(lines) + "</ul>" if lines else ""


def _instance_table(summaries: list[InstanceSummary]) -> str:
    head = ("instance", "type", "files", "failed", "rows out", "read", "written", "ran", "busy", "rows/s", "cost")
    rows = []
    for s in summaries:
        cls = "alert" if s.straggler else "warn" if s.idle else ""
        cells = (
            s.instance,
            s.instance_type,
            f"{s.files:,}",
            f"{s.files_failed:,}",
            f"{s.rows_out:,}",
            _bytes(s.bytes_in),
            _bytes(s.bytes_out),
            _duration(s.seconds),
            f"{s.busy_fraction:.0%}" if s.busy_fraction is not None else "n/a",
            f"{s.rows_per_second:,.0f}" if s.rows_per_second is not None else "n/a",
            _usd(s.cost) if s.cost is not None else "n/a",
        )
        rows.append(f"<tr class='{cls}'>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return _table(head, rows)


def _cost(report: RunReport) -> str:
    c = report.cost
    parts = []
    if c.error:
        parts.append(f"<p class='alert'>{_e(c.error)}</p>")
    head = ("instance type", "instances", "instance-seconds", "USD per hour", "USD")
    rows = [
        f"<tr><td>{_e(line.instance_type)}</td><td>{line.instances}</td><td>{line.seconds:,.1f}</td>"
        f"<td>{_e(_usd(line.price_per_hour))}</td><td>{_e(_usd(line.cost))}</td></tr>"
        for line in c.by_type
    ]
    parts.append(_table(head, rows))
    per_million = _usd(c.cost_per_million) if c.cost_per_million is not None else "n/a (no predictions)"
    parts.append(
        f"<p>{_e(_usd(c.total) if c.total is not None else 'n/a')} for "
        f"{c.instance_seconds:,.0f} instance-seconds and {c.predictions:,} predictions: "
        f"<b>{_e(per_million)} per 1M predictions</b>. "
        f"<span class='muted'>Prices: {_e(c.prices_source)}. Counted from each instance's start (its worker's; from "
        f"its first file in a report of an older worker) to its last heartbeat.</span></p>"
    )
    if c.control_plane is not None:
        counted = ", ".join(f"{kind} {n:,}" for kind, n in c.requests.items()) or "none counted"
        per = _usd(c.control_plane_per_million) if c.control_plane_per_million is not None else "n/a"
        parts.append(
            f"<p>Control plane: {_e(_usd(c.control_plane))} ({_e(per)} per 1M predictions) for the instances' "
            f"requests ({_e(counted)}) and {c.downloads:,} GETs of their inputs and model. "
            f"<span class='muted'>Prices: {_e(c.request_prices_source)}. Not in it: the orchestrator's own "
            "requests (plan, polls, the step's end).</span></p>"
        )
    return "\n".join(parts)


def _control_card(c) -> str:
    """The control plane's cost, and its share of compute's."""
    if c.total:
        return f"{_usd(c.control_plane)} ({c.control_plane / c.total:.0%} of compute)"
    return _usd(c.control_plane)


def _drift(report: RunReport) -> str:
    d = report.drift
    if d.psi is None:
        return f"<p class='muted'>No drift statistic: {_e(d.note or 'nothing to compare')}.</p>"
    cls = {"drift": "alert", "moderate": "warn"}.get(d.verdict, "ok")
    meaning = {
        "stable": "no real change",
        "moderate": "a moderate shift",
        "drift": f"at or above this pipeline's limit of {d.max_psi:g}",
    }[d.verdict]
    text = (
        f"<p class='{cls}'>PSI <b>{d.psi:.3f}</b> against run <b>{_e(d.reference_run_id or '?')}</b>: "
        f"{_e(d.verdict)} ({_e(meaning)}). <span class='muted'>PSI below 0.1 is usually read as no change, "
        f"0.1 to 0.25 as moderate, above 0.25 as large; an empty bin counts as 0.0001.</span></p>"
    )
    quantiles = [k for k in d.current_quantiles if k in d.reference_quantiles]
    if quantiles:
        head = ("", *quantiles)
        rows = [
            f"<tr><td>{_e(name)}</td>" + "".join(f"<td>{_e(_num(values.get(q)))}</td>" for q in quantiles) + "</tr>"
            for name, values in (("reference", d.reference_quantiles), ("this run", d.current_quantiles))
        ]
        text += _table(head, rows)
    return text


def _reconciliation(report: RunReport, max_rows: int) -> str:
    r = report.reconciliation
    balance = (
        ("every succeeded file wrote one row out per row in" if not r.rows_rejected else "rows in = out + rejected")
        if r.balanced
        else f"{len(r.mismatched)} succeeded file(s) wrote a different number of rows than they read"
    )
    rejected = f"{r.rows_rejected:,} rows rejected, " if r.rows_rejected else ""
    parts = [
        f"<p class='{'ok' if r.balanced and not r.failed else 'alert'}'>{r.files:,} files: {r.succeeded:,} "
        f"succeeded, {r.failed:,} failed, {r.unfinished:,} unfinished; {r.rows_in:,} rows in, "
        f"{r.rows_out:,} rows out, {rejected}({_e(balance)}). {r.retried:,} file(s) needed more than one attempt "
        f"(up to {r.max_attempt}).</p>"
    ]
    problem = [
        row.status != "SUCCEEDED" or not row.balanced or row.attempt > 1 or row.rows_rejected > 0 for row in r.rows
    ]
    problems = [row for row, bad in zip(r.rows, problem, strict=True) if bad]
    others = [row for row, bad in zip(r.rows, problem, strict=True) if not bad] if len(problems) < max_rows else []
    shown = (problems + others)[:max_rows]
    head = ("file", "instance", "attempt", "status", "rows in", "rows out", "reason")
    rows = []
    for row in shown:
        cls = "alert" if row.status == "FAILED" or not row.balanced else "warn" if row.status != "SUCCEEDED" else ""
        cells = (
            row.key,
            row.host or "",
            row.attempt,
            row.status,
            f"{row.rows_in:,}",
            f"{row.rows_out:,}",
            row.error
            or ("" if row.balanced else "rows out differ from rows in")
            or (f"{row.rows_rejected:,} row(s) rejected" if row.rows_rejected else ""),
        )
        rows.append(f"<tr class='{cls}'>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    parts.append(_table(head, rows, cls="files"))
    if len(shown) < len(r.rows):
        parts.append(
            f"<p class='muted'>{len(r.rows) - len(shown):,} more file(s) succeeded with rows balanced; "
            f"report.json lists every file.</p>"
        )
    if r.model_warnings:
        parts.append(
            f"<p class='warn'>The model code said {r.model_warnings:,} warning line(s) (warnings, WARNING logs, "
            "stderr): each is a WARNING in the job's log, once per distinct line per file.</p>"
        )
    if r.rejects:
        parts.append(f"<h3>Rejected rows (tolerance.rows): the first {len(r.rejects):,} of {r.rows_rejected:,}</h3>")
        cells = [f"<tr><td>{_e(x.key)}</td><td>{_e(x.where)}</td><td>{_e(x.reason)}</td></tr>" for x in r.rejects]
        parts.append(_table(("file", "where", "why"), cells, cls="files"))
    return "\n".join(parts)


def _table(head: tuple[str, ...], rows: list[str], cls: str = "") -> str:
    return (
        f"<table class='{cls}'><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _chart(charts: dict[str, str], name: str, alt: str) -> str:
    if name not in charts:
        return ""
    return f"<img class='chart' id='chart-{name}' alt='{_e(alt)}' src='{charts[name]}'>"


# -- formatting -------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _data_uri(svg: bytes) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


def _when(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "n/a"


def _usd(value: float) -> str:
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if abs(value) >= 100 else f"${value:.4g}"


def _bytes(value: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;color:#1d2733;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea;padding-bottom:4px}
.muted{color:#6b7785;font-weight:normal}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:8px;margin:16px 0}
.card{border:1px solid #dde3ea;border-radius:6px;padding:8px 10px;background:#f8fafc}
.card .label{font-size:12px;color:#6b7785}.card .value{font-size:16px;font-weight:600;overflow-wrap:anywhere}
.card.alert{border-color:#d1495b;background:#fdf0f2}.card.warn{border-color:#e0a100;background:#fff8e6}
p.alert,li.alert{color:#a3182c}p.warn,li.warn{color:#8a6200}p.ok{color:#1f6b43}
img.chart{width:100%;max-width:1100px;display:block;margin:8px 0}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border-bottom:1px solid #e6ebf0;padding:3px 8px;text-align:left;vertical-align:top}
td{font-variant-numeric:tabular-nums}tr.alert td{background:#fdf0f2}tr.warn td{background:#fff8e6}
table.files td:first-child,table.files td:last-child{overflow-wrap:anywhere;max-width:420px}
ul.notes{color:#8a6200}
"""
