"""The run report of one step: gather its records (ledger, the instances' manifests, the previous runs'
reports), build it with the pure ``report`` room, and write it beside the step's outputs.

``report.html`` (one self-contained page) and ``report.json`` (the same data) go to
``<metadata root>/reports/<run>/<step>/``; the JSON of earlier runs is what the next report reads
for its cost trend and its drift reference, so nothing else has to be stored.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging

from shardline.backends import JobNotFound
from shardline.contract import PROFILES_FOLDER
from shardline.ledger.keys import StepRef
from shardline.ledger.records import stale_parts
from shardline.ledger.states import FileStatus, StepStatus
from shardline.ledger.step_reads import StepRecords, list_runs, read_step_item
from shardline.orchestration import services
from shardline.orchestration.budget import prices_for
from shardline.orchestration.step import outputs, watch
from shardline.orchestration.step.approval import UNCOMPUTED, Approval, approval_of
from shardline.orchestration.step.baseline import baseline_of
from shardline.orchestration.step.files import read_step_files
from shardline.orchestration.step.upstream import UpstreamError, upstream_outputs
from shardline.planning import naming
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import put_metadata
from shardline.planning.naming import job_name
from shardline.report.build import build_report
from shardline.report.checks import Baseline, Partition, blocked_by, blocked_message, evaluate
from shardline.report.cost import request_prices
from shardline.report.histogram import Histogram, HistogramFormatError
from shardline.report.inputs import PreviousRun, records_from_ledger, reject_where
from shardline.report.model import CheckResult, RejectRow, RunReport
from shardline.report.profile import Profile
from shardline.report.render import render_html
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec, StepSpec

log = logging.getLogger(__name__)

MAX_PROFILE_BYTES = 4 << 20  # one file's profile: a few KB a column; past this it is not one the worker wrote
# How many of the pipeline's newest runs are looked through for the earlier successful ones (a Query of the run
# index, then one STEP item read per run until enough are found).
SCAN_RUNS = 200
# How many earlier runs of the pipeline the cost trend shows (and the drift reference is looked for in).
TREND_RUNS = 10


@dataclasses.dataclass(frozen=True)
class WrittenReport:
    report: RunReport
    html_uri: str
    json_uri: str


REJECTS_IN_REPORT = 200  # rejected rows the report lists, over all files; each file's rejects list has them all


def read_rejects(spec: PipelineSpec, uri: str, limit: int) -> list[dict]:
    """The first ``limit`` rows of a file's rejects list (one JSON object per rejected row)."""
    bucket, key = parse_s3_uri(uri)
    body = services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"]
    return [json.loads(line) for line in itertools.islice(body.iter_lines(), limit)]


def misplaced_rejects(attempt: Attempt, f) -> list[str]:
    """Why ``f``'s rejects list is not one its attempt's instances put (none: it is, or it has none). A job's own code
    can write its FILE items, so a rejects list is read only from its attempt's ``instances/`` folder."""
    if not f.rejects_key:
        return []
    folder = naming.worker_manifest_folder(
        attempt.output_prefix, attempt.run_id, attempt.step, f.attempt, attempt.metadata_prefix
    )
    if f.rejects_key.startswith(f"{folder}/rejects/"):
        return []
    return [f"{f.input_key}'s rejects list {f.rejects_key} is not where attempt {f.attempt}'s instances put theirs"]


def rejected_rows(spec: PipelineSpec, attempt: Attempt, files) -> dict[str, list[RejectRow]]:
    """The first rejected rows of the step's files that rejected some, read from their rejects lists (only where
    the step's instances put them: :func:`misplaced_rejects`)."""
    found: dict[str, list[RejectRow]] = {}
    left = REJECTS_IN_REPORT
    for f in sorted(files, key=lambda f: f.input_key):
        if not (f.rejects_key and f.rows_rejected and f.status == FileStatus.SUCCEEDED) or left <= 0:
            continue
        if misplaced := misplaced_rejects(attempt, f):
            log.warning("not read into the run report: %s", misplaced[0])
            continue
        try:
            rows = read_rejects(spec, f.rejects_key, left)
        except Exception as err:  # noqa: BLE001 - the counts stand; the report says the list was not read
            log.warning("the rejects list %s could not be read: %s: %s", f.rejects_key, type(err).__name__, err)
            continue
        found[f.input_key] = [
            RejectRow(key=f.input_key, where=reject_where(r), reason=r.get("reason", "")) for r in rows
        ]
        left -= len(rows)
    return found


def build_step_report(spec: PipelineSpec, attempt: Attempt, records: StepRecords | None = None) -> RunReport:
    """The step's report from what its run recorded, against the pipeline's earlier runs.

    ``records``: the step's files read already, with every attribute (``outputs.read_outputs``); else read here.
    """
    if records is None:
        records = read_step_files(spec, attempt.ref, file_attributes=None)
    step_spec = spec.step(attempt.step)
    files = records.settled  # a file's rejects parts count as the file's rows
    found = records_from_ledger(
        records.step,
        files,
        records.shards,
        instance_type=step_spec.resources.instance_type,
        backend=spec.backend,
        pipeline=attempt.pipeline,
        run_id=attempt.run_id,
        step=attempt.step,
        planned_sizes=records.planned_sizes,
        instance_types=attempt_instance_types(spec, attempt, {int(s.attempt or 1) for s in records.shards}),
    )
    profile = current_profile(spec, attempt, records.files)
    previous = previous_reports(spec, attempt.ref, max(TREND_RUNS, step_spec.checks.last))
    prices, price_note = prices_for(spec, attempt.step)
    # A held-back partition, approved or not, is never the reference: its outputs were accepted, not found right.
    references = [(run_id, r) for run_id, r in previous if not r.approval]
    reference = next(((run_id, r) for run_id, r in references if r.drift.current_histogram), None)
    report = build_report(
        found.identity,
        found.files,
        found.instances,
        profile.histogram,
        reference=Histogram.from_dict(reference[1].drift.current_histogram) if reference else None,
        reference_run_id=reference[0] if reference else None,
        previous_runs=[PreviousRun(run_id, r.cost.cost_per_million, r.ended_at) for run_id, r in reversed(previous)],
        prices=prices,
        max_psi=step_spec.drift.max_psi,
        rejects=rejected_rows(spec, attempt, files),
        request_prices=request_prices(spec.cost.request_prices),
    )
    if price_note:
        report.notes.append(price_note)
    if profile.missing:
        report.notes.append(f"the predictions' distribution is not whole: {profile.missing}")
    history = [Partition(run_id, r.reconciliation.rows_out, _profile_of(run_id, r)) for run_id, r in references]
    current = Partition(attempt.run_id, report.reconciliation.rows_out, profile.merged)
    baseline = None
    if step_spec.checks.reference == "baseline":
        baseline = Baseline(*baseline_of(spec, attempt.step))
    results = [
        *evaluate(step_spec.checks, current, history, profile.files, profile.missing, baseline),
        _drift_check(step_spec, report, profile.missing),
    ]
    results = _with_history(results, references[: step_spec.checks.last])
    approved = approval_of(records.step, attempt.number)
    report = report.model_copy(
        update={
            "checks": results,
            "profile": profile.merged.to_dict() if profile.merged else None,
            "approval": dataclasses.asdict(approved) if approved else None,
        }
    )
    if step_spec.input.from_step:
        try:
            tolerated = upstream_outputs(spec, attempt.step, attempt.run_id, attempt.input_prefix).tolerated_text(
                attempt.step
            )
        except UpstreamError as err:
            tolerated = f"the outputs manifest of step {step_spec.input.from_step} could not be read: {err}"
        if tolerated:
            report.notes.append(tolerated)
    return report


def quality_facts(spec: PipelineSpec, attempt: Attempt) -> dict | None:
    """What the step's lineage says of its data's quality, from its run report: each profiled input feature's and
    output column's metrics (OpenLineage's ``ColumnMetrics``, as dicts), each check as an assertion, and the
    approval of held-back outputs. None when the report cannot be read (the lineage goes out without them)."""
    bucket, key = parse_s3_uri(attempt.report_uri("json"))
    try:
        report = RunReport.from_json(services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"].read())
        profile = Profile.from_dict(report.profile) if report.profile else None
    except Exception:
        log.warning("lineage: the run report %s could not be read", attempt.report_uri("json"), exc_info=True)
        return None
    return {
        "inputs": {name: c.metrics() for name, c in profile.inputs.items()} if profile else {},
        "outputs": {name: c.metrics() for name, c in profile.outputs.items()} if profile else {},
        "assertions": [
            {
                "assertion": c.check,
                "success": c.verdict != "fail",
                "severity": "error" if c.level == "blocking" else "warn",
                "expected": c.bound,
                "actual": c.shown,
            }
            for c in report.checks
        ],
        "approval": report.approval,
    }


def _with_history(results: list[CheckResult], previous: list[tuple[str, RunReport]]) -> list[CheckResult]:
    """Each check with the values the same check had in the earlier partitions' reports (newest first), for the
    report's trend and `shardline checks`; a band keeps the values it was made from."""
    past = [{c.check: c.value for c in report.checks} for _, report in previous]
    return [
        result
        if result.history
        else result.model_copy(update={"history": [p[result.check] for p in past if p.get(result.check) is not None]})
        for result in results
    ]


def _profile_of(run_id: str, report: RunReport) -> Profile | None:
    """An earlier run's merged profile, as its report recorded it (None: a report from before profiles)."""
    if report.profile is None:
        return None
    try:
        return Profile.from_dict(report.profile)
    except HistogramFormatError as err:
        log.warning("the profile in run %s's report is unreadable and left out of the checks' bands: %s", run_id, err)
        return None


def _drift_check(step_spec: StepSpec, report: RunReport, missing: str | None) -> CheckResult:
    """The drift policy's PSI as a check: blocking with ``drift.action: fail``, else a warning. Not computable for
    want of this run's profile fails it; for want of an earlier run it is n/a."""
    drift = report.drift
    bound = f"below {drift.max_psi:g}" + (f" (against run {drift.reference_run_id})" if drift.reference_run_id else "")
    if missing:  # a PSI of part of the predictions says nothing of the rest
        verdict, shown, bound = "fail", "not computed", missing
    elif drift.psi is not None:
        verdict, shown = ("fail" if drift.verdict == "drift" else "pass"), f"{drift.psi:.3f}"
    else:
        verdict, shown = "n/a", drift.note or "nothing to compare"
    return CheckResult(
        check="drift.max_psi",
        level="blocking" if step_spec.drift.action == "fail" else "warn",
        verdict=verdict,
        value=drift.psi,
        shown=shown,
        bound=bound,
    )


def attempt_instance_types(spec: PipelineSpec, attempt: Attempt, numbers: set[int]) -> dict[int, str]:
    """The instance type each attempt's job really ran on, from the backend (a capacity move runs an attempt on a
    fallback type, so the spec's type would price it wrong); an attempt whose job cannot be described is left
    out, and priced at the spec's type."""

    backend = services.backend_for(spec)
    found: dict[int, str] = {}
    for number in sorted(numbers):
        try:
            state = backend.describe(job_name(attempt.pipeline, attempt.run_id, attempt.step, number))
        except JobNotFound:
            continue
        if state.instance_type:
            found[number] = state.instance_type
    return found


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """The step's outputs as its workers profiled them while they scored: every succeeded file's profile, read from
    the manifest of the instance and attempt that wrote it, and merged. ``missing``: why some are not in it (a
    manifest not found or unreadable), or None when every succeeded file's is."""

    merged: Profile | None
    files: dict[str, Profile]  # input (relative to the input prefix) -> its own profile
    missing: str | None = None

    @property
    def histogram(self) -> Histogram | None:
        """The first prediction column's: the one the drift check compares between runs."""
        if self.merged is None:
            return None
        return next(iter(self.merged.outputs.values())).histogram if self.merged.outputs else None


def current_profile(spec: PipelineSpec, attempt: Attempt, files) -> StepProfile:
    """:class:`StepProfile` of the step's succeeded ``files`` (its rejects parts included, stale ones not): each
    file's profile from the manifest of the instance and attempt that wrote it (one read per instance), or, where an
    instance left none (lost before it went up), from the profile it put beside it when the file's output went up."""
    s3 = services.s3_client(spec)
    stale = stale_parts(files)
    succeeded = [f for f in files if f.status == FileStatus.SUCCEEDED and f.input_key not in stale]
    prefix = attempt.output_prefix.rstrip("/") + "/"
    manifests = {
        where: outputs.worker_outputs(s3, attempt, *where)
        for where in sorted({(f.attempt, f.host or "") for f in succeeded})
    }
    found: dict[str, Profile] = {}
    problems: list[str] = []
    for f in succeeded:
        name = f.input_key.removeprefix(naming.rejects_parts_prefix_of(f.input_key) or attempt.input_prefix)
        written = manifests[(f.attempt, f.host or "")]
        entry = written.get((f.output_key or "").removeprefix(prefix)) if written else None
        stored = entry.get("profile") if entry else _profile_beside(s3, attempt, f.attempt, name)
        if stored is None:
            problems.append(f"{f.input_key}: no profile (neither its instance's manifest nor beside it)")
            continue
        try:
            found[name] = Profile.from_dict(stored)
        except HistogramFormatError as err:
            problems.append(f"{f.input_key}: its profile is unreadable: {err}")
    try:
        merged = Profile.merged(found.values()) if found else None
    except HistogramFormatError as err:
        merged, problems = None, [*problems, f"the files' profiles cannot be merged: {err}"]
    missing = None
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        missing = f"{len(problems)} of {len(succeeded)} file(s) cannot be counted: {'; '.join(problems[:3])}{more}"
    return StepProfile(merged, found, missing)


def _profile_beside(s3, attempt: Attempt, number: int, name: str) -> dict | None:
    """The profile an instance put beside its manifest for one file (contract.PROFILES_FOLDER), or None."""
    folder = naming.worker_manifest_folder(
        attempt.output_prefix, attempt.run_id, attempt.step, number, attempt.metadata_prefix
    )
    bucket, key = parse_s3_uri(f"{folder}/{PROFILES_FOLDER}/{name}.json")
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_PROFILE_BYTES + 1)
    except s3.exceptions.NoSuchKey:
        return None
    try:
        return json.loads(body) if len(body) <= MAX_PROFILE_BYTES else None
    except ValueError:
        return None


def previous_reports(spec: PipelineSpec, ref: StepRef, limit: int = TREND_RUNS) -> list[tuple[str, RunReport]]:
    """The reports of the pipeline's ``limit`` newest earlier runs whose step SUCCEEDED, newest first (those that
    have one), looked for among its :data:`SCAN_RUNS` newest runs: a row of failed runs does not leave the checks'
    bands without history."""
    model = services.ledger_model(spec)
    s3 = services.s3_client(spec)
    found: list[tuple[str, RunReport]] = []
    for run in list_runs(model, ref.pipeline, limit=SCAN_RUNS):
        if len(found) >= limit:
            break
        if run.run_id == ref.run_id:
            continue
        step = read_step_item(model, StepRef(ref.pipeline, run.run_id, ref.step))
        if step is None or step.status != StepStatus.SUCCEEDED or not step.plan_json:
            continue
        try:
            earlier = Attempt.from_plan(
                step.plan_json, step.attempt or 1, 0, pipeline=ref.pipeline, run_id=run.run_id, step=ref.step
            )
            bucket, key = parse_s3_uri(earlier.report_uri("json"))
            found.append((run.run_id, RunReport.from_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())))
        except s3.exceptions.NoSuchKey:
            continue  # a run from before reports, or one whose report was never written
        except ValueError as err:
            log.warning("the report of run %s is unreadable and left out of the trend: %s", run.run_id, err)
    return found[:limit]


def write_step_report(spec: PipelineSpec, attempt: Attempt, records: StepRecords | None = None) -> WrittenReport:
    """Build the step's report (from ``records`` when the step's files were read already, with every
    attribute) and write report.html and report.json beside its outputs."""
    report = build_step_report(spec, attempt, records)
    s3 = services.s3_client(spec)
    uris = {}
    for suffix, body, content_type in (
        ("json", report.to_json(indent=1), "application/json"),
        ("html", render_html(report), "text/html; charset=utf-8"),
    ):
        uri = attempt.report_uri(suffix)
        put_metadata(s3, uri, body.encode(), content_type)
        uris[suffix] = uri
    return WrittenReport(report, uris["html"], uris["json"])


def note_table(spec: PipelineSpec, attempt: Attempt, written: WrittenReport | Exception, committed: dict) -> None:
    """Write the step's report again with what its end committed to its output table (the report is written before
    the commit, whose checks read it). A report that cannot be written again is logged: the commit stands, and the
    step's record and ``_SUCCESS`` carry it."""
    if isinstance(written, Exception):
        return
    report = written.report.model_copy(update={"table": committed})
    try:
        s3 = services.s3_client(spec)
        put_metadata(s3, written.json_uri, report.to_json(indent=1).encode(), "application/json")
        put_metadata(s3, written.html_uri, render_html(report).encode(), "text/html; charset=utf-8")
    except Exception:
        log.exception("step %s: the run report could not be written again with its table commit", attempt.step)


def write_report(spec: PipelineSpec, attempt: Attempt, records: StepRecords | None = None) -> WrittenReport | Exception:
    """:func:`write_step_report`, with its failure logged and returned rather than raised: a report that cannot be
    written fails no step by itself (:func:`checks_failure` decides). ``records``: the step's files as its end read
    them already (``outputs.read_outputs``), so they are not read again; else the report reads them."""
    try:
        return write_step_report(spec, attempt, records)
    except Exception as err:
        log.exception("step %s: the run report could not be written", attempt.step)
        return err


def checks_failure(
    spec: PipelineSpec,
    attempt: Attempt,
    outputs: bool,
    written: WrittenReport | Exception,
    approved: Approval | None = None,
) -> str | None:
    """For a step that produced ``outputs``, the reason its output checks hold back its ``_SUCCESS`` (a blocking check
    failed), or None, from its run report as :func:`write_report` wrote it (or failed to). A warn check that fails
    is a warning in the log (and a line in the report).

    A report that cannot be written fails no step by itself, unless a blocking check needed it: then the checks
    could not run, and the step fails saying so (fail closed). ``approved``: on-call accepted this attempt's
    held-back outputs (`shardline approve`): a blocking check that fails again is logged, and holds nothing back.
    """
    step_spec = spec.step(attempt.step)
    blocking = step_spec.checks.blocking or step_spec.drift.action == "fail"
    if isinstance(written, Exception):
        if blocking and outputs:
            return f"checks: could not run: the run report failed: {watch.describe_error(written)}"
        return None
    log.info("step %s: run report %s", attempt.step, written.html_uri)
    if not outputs:
        return None
    for result in written.report.checks:
        if result.verdict == "fail" and result.level == "warn":
            log.warning("step %s: check failed (warn): %s", attempt.step, result.line())
    message = blocked_message(written.report.checks)
    if message is None:
        return None
    blocking = blocked_by(written.report.checks)
    computed = all(c.shown not in UNCOMPUTED for c in blocking)  # an approval accepts values, never their absence
    if approved is not None and computed and approved.covers([c.check for c in blocking]):
        log.warning("step %s: %s; %s", attempt.step, message, approved.words())
        return None
    if approved is not None:  # the approval was of other checks: what fails now and was not accepted holds it back
        uncovered = [c for c in blocking if c.check not in approved.checks or c.shown in UNCOMPUTED]
        message = f"{blocked_message(uncovered)} (the outputs were {approved.words()}, which accepted only "
        message += f"{', '.join(approved.checks) or 'none'})"
    return f"{message}; report: {written.html_uri}. " + naming.checks_ways_forward(
        attempt.pipeline, attempt.run_id, attempt.step
    )
