"""A run's reports, for on-call: where each step's run report is (derived from its STEP item's plan), its
bytes, and the page fetched to a local file (`shardline report`; the page's report route streams it).
"""

from __future__ import annotations

import json
from pathlib import Path

from shardline.oncall.errors import BadRequest, Conflict, NotFound
from shardline.oncall.messages import no_reports_text, out_needs_step_text, report_missing_text, report_not_planned_text
from shardline.oncall.reads import OnCallReads, known_step
from shardline.oncall.values import RunRef, SavedReport, StepReportRef
from shardline.orchestration import services
from shardline.planning.attempt import Attempt
from shardline.report.model import RunReport
from shardline.s3uri import parse_s3_uri

# Where `shardline report` puts the pages it fetches, under the current directory.
LOCAL_REPORTS = (".shardline", "reports")


def path_part(text: str) -> str:
    """``text`` as one folder name: a separator or any unusual character becomes ``_``, and never ``.``/``..``."""
    part = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_.:+=@-") else "_" for ch in text)
    return part if part.strip(".") else "_" + part


def local_report_path(root: Path, pipeline: str, run_id: str, step: str) -> Path:
    """``<root>/.shardline/reports/<pipeline>/<run>/<step>/report.html`` (``root``: the current directory)."""
    return root.joinpath(*LOCAL_REPORTS, path_part(pipeline), path_part(run_id), path_part(step), "report.html")


class RunReports(OnCallReads):
    """Each step's run report: where it is, its bytes, the page saved to a local file."""

    def report_refs(self, ref: RunRef, step: str | None = None) -> list[StepReportRef]:
        """Where the run's step reports are, for each step planned (or ``step`` alone), in the spec's order.

        Each S3 key is derived from the STEP item's recorded plan (its output and metadata prefixes), never
        taken from the caller. Raises NotFound for an unknown pipeline, step or run, or a step never planned.
        """
        if step:
            known_step(self.spec(ref.pipeline), step)
        spec, records = self._run_records(ref)
        items = {item.step: item for item in records.steps}
        found = []
        for name in [step] if step else [s.name for s in spec.steps]:
            item = items.get(name)
            if item is None or not item.plan_json:
                if step:
                    raise NotFound(report_not_planned_text(ref, name))
                continue
            try:
                attempt = Attempt.from_plan(
                    item.plan_json, item.attempt or 1, 0, pipeline=ref.pipeline, run_id=ref.run_id, step=name
                )
            except ValueError as err:
                raise Conflict(f"{err}, so where its run report is cannot be told") from err
            found.append(StepReportRef(name, item.status, attempt.report_uri("html"), attempt.report_uri("json")))
        return found

    def open_report(self, ref: RunRef, report: StepReportRef, suffix: str = "html"):
        """The S3 object body (a stream) of a step's ``report.html`` or ``report.json``; the caller closes it.
        Raises NotFound, saying when reports are written, when it is not there."""
        spec = self.spec(ref.pipeline)
        s3 = services.s3_client(spec)
        uri = report.html_uri if suffix == "html" else report.json_uri
        bucket, key = parse_s3_uri(uri)
        try:
            return s3.get_object(Bucket=bucket, Key=key)["Body"]
        except s3.exceptions.NoSuchKey as err:
            raise NotFound(report_missing_text(ref, report.step, report.status, uri)) from err

    def _read_report(self, ref: RunRef, report: StepReportRef, suffix: str) -> bytes:
        body = self.open_report(ref, report, suffix)
        try:
            return body.read()
        finally:
            body.close()

    def save_reports(
        self, ref: RunRef, step: str | None = None, *, root: Path, out: Path | None = None, with_json: bool = False
    ) -> list[SavedReport]:
        """Fetch the run report of ``step`` (or of every step of the run that has one) to local files.

        Each goes to ``<root>/.shardline/reports/<pipeline>/<run>/<step>/report.html``, or to ``out`` (one
        step only). ``with_json`` also reads report.json, the same data, into each result.
        """
        refs = self.report_refs(ref, step)
        pages, missing = [], []
        for report in refs:
            try:
                pages.append((report, self._read_report(ref, report, "json")))
            except NotFound as err:
                if step:
                    raise
                missing.append(str(err))
        if not pages:
            planned = {r.step for r in refs}
            missing += [
                report_not_planned_text(ref, s.name) for s in self.spec(ref.pipeline).steps if s.name not in planned
            ]
            raise NotFound(no_reports_text(ref, missing))
        if out is not None and len(pages) > 1:
            raise BadRequest(out_needs_step_text(ref, [r.step for r, _ in pages]))
        saved = []
        for report, raw in pages:
            # The page is rendered here from report.json, never the stored report.html opened as it is: the HTML
            # in the bucket is bytes anyone with write access there chose, and the browser opens a local file
            # with no server's CSP in front of it. render_html escapes every value, and its page runs no script.
            try:
                data = json.loads(raw)
            except ValueError as err:
                raise Conflict(
                    f"{report.json_uri} is not a run report ({type(err).__name__}: {err}), so no page "
                    "was rendered from it"
                ) from err
            page = self._page(ref, report, raw)
            path = out if out is not None else local_report_path(root, ref.pipeline, ref.run_id, report.step)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(page)
            saved.append(
                SavedReport(report.step, report.status, report.html_uri, str(path), data if with_json else None)
            )
        return saved

    def _page(self, ref: RunRef, report: StepReportRef, raw: bytes) -> bytes:
        """The report's page, rendered from its report.json (every value escaped, a policy that allows no script).
        Without the run report's library (numpy: the ``airflow`` extra) it is the stored page, led
        by the same policy, which no later markup in the page can loosen."""
        try:
            from shardline.report.render import render_html
        except ImportError:
            return no_script_page(self._read_report(ref, report, "html"))
        try:
            return render_html(RunReport.from_json(raw)).encode()
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise Conflict(
                f"{report.json_uri} is not a run report ({type(err).__name__}: {err}), so no page was rendered from it"
            ) from err


# The policy a report page runs under when it is opened from a file: its inline styles and data: images only.
NO_SCRIPT_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def no_script_page(stored: bytes) -> bytes:
    """A stored page, led by a Content-Security-Policy that allows no script. The meta element comes first, so
    the browser puts it in the head before any of the page's own markup, and a policy, once set, can only be
    tightened by what follows."""
    return f'<meta http-equiv="Content-Security-Policy" content="{NO_SCRIPT_POLICY}">\n'.encode() + stored
