"""The on-call page's FastAPI app, mounted by Airflow's API server at ``/shardline``.

JSON endpoints over ``shardline.oncall.service`` (the service layer the ``shardline`` CLI uses), and
one self-contained HTML page that calls them. Authentication and authorization are Airflow's
own: every endpoint resolves the user with ``airflow.api_fastapi.core_api.security.get_user``
(the ``_token`` cookie the Airflow UI holds, or an ``Authorization: Bearer`` token) and asks the
configured auth manager through ``requires_access_dag``: reading needs GET on the pipeline's
DAG (its runs), resubmitting needs PUT on its task instances, as clearing tasks in Airflow
does. The resubmission then clears the step's watch task through Airflow's REST API *with the
caller's own token*, so Airflow checks that permission again, and records the action in
Airflow's audit log.

The DAGs folder is Airflow's (``[core] dags_folder``), so the page shows the pipelines this
Airflow runs, and AWS is reached with the API server's own settings.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import logging
import os
import secrets
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from airflow.api_fastapi.logging.decorators import action_logging
from airflow.configuration import conf
from botocore.exceptions import BotoCoreError, ClientError
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from pynamodb.exceptions import PynamoDBException

from shardline.airflow.ui.root import airflow_root_path
from shardline.ledger.states import HELD_BACK, STEP_TERMINAL, StepStatus
from shardline.oncall.airflow_client import ENV_URL, AirflowClient
from shardline.oncall.errors import BadRequest, OnCallError
from shardline.oncall.reads import load_specs
from shardline.oncall.service import OnCall
from shardline.oncall.values import FileChoice, RunRef

PAGE = Path(__file__).with_name("static") / "oncall.html"
ICON = Path(__file__).with_name("static") / "icon.svg"

log = logging.getLogger(__name__)

# Airflow shows the page in an iframe of its own UI, which the same API server serves: 'self' is Airflow's
# origin, and no other site may frame the page (clickjacking the resubmit button). The JSON answers and the
# icon get the same frame rule and may load nothing.
FRAME_ANCESTORS = "frame-ancestors 'self'"
API_CSP = f"default-src 'none'; {FRAME_ANCESTORS}"
# The page: only its own inline script and style (they carry the per-answer nonce), fetches to this origin.
# No 'unsafe-inline': text from the ledger that ever reached the DOM as markup could not run or restyle it.
PAGE_CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
    f"img-src 'self'; base-uri 'none'; form-action 'none'; {FRAME_ANCESTORS}"
)

# A run report: a page Shardline rendered (every string from the ledger escaped), with its charts as data: PNGs and
# one <style> element, and no script. Its policy lets it show just that: no script at all, no request anywhere
# (a CSS url() included), and `sandbox` makes it a unique origin without scripts, forms or popups even if text in
# it ever reached the page as markup. Inline style is allowed because the page is stored, not templated here:
# it has no nonce to carry, and with nothing else loadable, style alone can neither run nor send anything.
REPORT_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    f"sandbox; {FRAME_ANCESTORS}"
)
REPORT_CHUNK_BYTES = 64 * 1024

_bearer = HTTPBearer(auto_error=False)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


# --- authorization -------------------------------------------------------------------------------


def dag_access(method: str, entity: DagAccessEntity | None = None):
    """A dependency: the caller, once the auth manager allows ``method`` on the pipeline's DAG.

    The pipeline is the ``dag_id`` path parameter or the ``pipeline`` query parameter; with
    neither, the check is Airflow's "any DAG" one (what its own DAG list asks).
    """

    def check(request: Request, user: GetUserDep) -> BaseUser:
        dag_id = request.path_params.get("dag_id") or request.query_params.get("pipeline") or None
        requires_access_dag(method, entity, param_dag_id=dag_id)(request, user)  # raises 403
        return user

    return check


can_read_runs = dag_access("GET", DagAccessEntity.RUN)
can_clear_tasks = dag_access("PUT", DagAccessEntity.TASK_INSTANCE)  # what clearing a task instance asks
ReaderDep = Annotated[BaseUser, Depends(can_read_runs)]
ResubmitterDep = Annotated[BaseUser, Depends(can_clear_tasks)]


def _caller_token(request: Request, bearer: HTTPAuthorizationCredentials | None) -> str | None:
    """The token the caller authenticated with: the same precedence as Airflow's ``get_user``."""
    if bearer and bearer.scheme.lower() == "bearer":
        return bearer.credentials
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN)


def _airflow_url(_request: Request) -> str:
    """Where this API server answers: SHARDLINE_AIRFLOW_URL, else ``[api] base_url``, else its own loopback port.

    Never the request's Host header: the caller's token is sent there.
    """
    configured = os.environ.get(ENV_URL, "").strip() or conf.get("api", "base_url", fallback="") or ""
    if configured:
        return configured.rstrip("/")
    return f"http://127.0.0.1:{conf.get('api', 'port', fallback='8080')}"


# --- the service layer ---------------------------------------------------------------------------


def _dags_folder() -> Path:
    return Path(conf.get("core", "dags_folder"))


def _oncall(airflow: AirflowClient | None = None) -> OnCall:
    return OnCall.from_folder(_dags_folder(), airflow=airflow)


def _known(oncall: OnCall, pipeline: str) -> None:
    if pipeline not in oncall.specs:
        # Not the folder's path: the server's file system is none of the reader's business.
        raise HTTPException(status.HTTP_404_NOT_FOUND, unknown_pipeline_detail(pipeline))


def json_body(request: Request) -> None:
    """A dependency: a state-changing request declares its body as JSON, exactly.

    ``application/json``, with at most a ``charset=utf-8`` parameter. A page on another site can send
    ``text/plain`` (or a form encoding) with the user's cookies and no CORS preflight; it cannot send
    ``application/json`` without one, which Airflow's API server grants only to the origins in
    ``[api] access_control_allow_origins``. Exact, not a substring (``text/plain; application/json`` contains
    one): what gets past does not depend on which bodies the framework's parser happens to accept.
    """
    declared = request.headers.getlist("content-type")
    media, _, parameters = (declared[0] if len(declared) == 1 else "").partition(";")
    parameters = parameters.replace(" ", "").lower()
    if media.strip().lower() != "application/json" or parameters not in ("", "charset=utf-8", 'charset="utf-8"'):
        got = ", ".join(declared)[:100] or "none"
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            f"send the body as JSON with the header Content-Type: application/json (got {got!r})",
        )


def unknown_pipeline_detail(pipeline: str) -> str:
    return (
        f"no pipeline {pipeline!r} among the specs in Airflow's DAGs folder; check the pipeline's name in the "
        "address, or pick it from the list of pipelines"
    )


# AWS error codes that say what went wrong without saying where (the codes are AWS's documented names; the
# messages that come with them carry ARNs, account ids and resource names, and stay in the server's log).
_AWS_SUMMARIES = {
    "could not find a table, bucket or job the pipeline spec names (check its names)": {
        "ResourceNotFoundException",
        "NoSuchBucket",
        "NoSuchKey",
        "TableNotFoundException",
    },
    "refused the API server's AWS credentials (whoever runs this Airflow must fix them)": {
        "AccessDenied",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
    },
    "is throttling the API server; try again shortly": {
        "ThrottlingException",
        "Throttling",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "SlowDown",
    },
}


def _aws_summary(err: Exception) -> str:
    if isinstance(err, ClientError):
        code = err.response.get("Error", {}).get("Code")
    else:
        code = getattr(err, "cause_response_code", None)  # PynamoDB's wrapper of a ClientError
    for summary, codes in _AWS_SUMMARIES.items():
        if code in codes:
            return summary
    return "could not be reached or refused the request; try again shortly"


def aws_error_detail(summary: str, ref: str) -> str:
    """What the page says when AWS failed: the kind of failure, and the reference to the server's log."""
    return (
        f"AWS (the ledger table or the job backend) {summary}. The API server's log has the details under ref "
        f"{ref}: give it to whoever runs this Airflow"
    )


def _file_part(text: str) -> str:
    """A name for a download's file name: letters, digits, ``-`` and ``_`` only (never a quote or a separator)."""
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_") else "_" for ch in text)[:80]


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


CHOOSE_FILES_DETAIL = 'send exactly one of {"all_failed": true} or a non-empty {"files": [...]}'


class ResubmitBody(BaseModel):
    """What to resubmit: every file of the step that has not succeeded, or the named ones."""

    all_failed: bool = False
    files: list[str] = Field(default_factory=list, max_length=10_000)
    dry_run: bool = False


class ApproveBody(BaseModel):
    """Why the held-back outputs are right as they are: recorded with who and when."""

    reason: str = Field(min_length=10, max_length=2000)


def create_app() -> FastAPI:
    """The app Airflow mounts: the routes below, behind the error answers and the security headers."""
    app = FastAPI(
        title="Shardline on-call",
        description="Pipelines, runs, steps, instances and files from Shardline's ledger; resubmit failed files.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_exception_handler(OnCallError, _oncall_error)
    for aws_error in (ClientError, BotoCoreError, PynamoDBException):
        app.add_exception_handler(aws_error, _aws_error)
    app.middleware("http")(_security_headers)
    app.include_router(page_routes)
    app.include_router(read_routes)
    app.include_router(action_routes)
    return app


# --- what every answer gets ----------------------------------------------------------------------


async def _oncall_error(_request: Request, err: OnCallError) -> JSONResponse:
    # The error's kind says the answer (not found, conflict, bad request, refused, unavailable).
    return JSONResponse({"detail": str(err)}, status_code=err.http_status)


async def _aws_error(request: Request, err: Exception) -> JSONResponse:
    # AWS's message names ARNs, account ids and roles: it goes to the server's log, where whoever runs
    # this Airflow finds it by the reference; the reader gets what kind of failure it was.
    ref = secrets.token_hex(6)
    log.error(
        "Shardline on-call %s %r: AWS failed (ref %s): %s", request.method, request.url.path, ref, err, exc_info=err
    )
    return JSONResponse({"detail": aws_error_detail(_aws_summary(err), ref)}, status_code=status.HTTP_502_BAD_GATEWAY)


async def _security_headers(request: Request, call_next) -> Response:
    response = await call_next(request)
    # Every answer, errors too: a browser must never read a JSON answer as HTML or script.
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Content-Security-Policy", API_CSP)
    response.headers.setdefault("X-Frame-Options", "SAMEORIGIN")  # frame-ancestors, for older browsers
    return response


# --- the page (no data in it: it fetches the endpoints below) -----------------------------------

page_routes = APIRouter()


@page_routes.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page(request: Request, bearer: BearerDep) -> Response:
    try:
        await get_user(request, None, bearer)
    except HTTPException:
        # Not logged in (or the token expired): Airflow's login page, then back here.
        return RedirectResponse(
            get_auth_manager().get_url_login(next_url=str(request.url)), status_code=status.HTTP_307_TEMPORARY_REDIRECT
        )
    base = request.scope.get("root_path", "").rstrip("/") + "/"
    nonce = secrets.token_urlsafe(18)  # new for each answer, so a page cannot guess it
    body = PAGE.read_text(encoding="utf-8")
    body = body.replace("__SHARDLINE_BASE__", html.escape(base, quote=True))
    body = body.replace("__AIRFLOW_ROOT__", html.escape(airflow_root_path() + "/", quote=True))
    body = body.replace("__CSP_NONCE__", nonce)
    return HTMLResponse(
        body,
        headers={
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": PAGE_CSP.format(nonce=nonce),
        },
    )


@page_routes.get("/icon.svg", include_in_schema=False)
def icon() -> Response:
    return Response(ICON.read_bytes(), media_type="image/svg+xml", headers={"Cache-Control": "max-age=3600"})


# --- reads ---------------------------------------------------------------------------------------

read_routes = APIRouter()


@read_routes.get("/pipelines")
def pipelines(user: Annotated[BaseUser, Depends(dag_access("GET"))]) -> list[dict]:
    """The pipelines in Airflow's DAGs folder that the caller may read."""
    specs = load_specs(_dags_folder())
    readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    return [
        {
            "pipeline": s.pipeline,
            "description": s.description,
            "owner": s.owner,
            "schedule": s.schedule,
            "backend": s.backend,
            "ledger_table": s.ledger_table,
            "steps": [step.name for step in s.steps],
        }
        for name, s in sorted(specs.items())
        if name in readable
    ]


@read_routes.get("/fleet")
def fleet(request: Request, user: Annotated[BaseUser, Depends(dag_access("GET"))], bearer: BearerDep) -> list[dict]:
    """Per instance type with a quota (``dags/fleet.yaml``): its instances in use, the steps running and waiting
    on its pool (read from Airflow as the caller), and today's jobs of the pipelines the caller may read (from the
    ledger), as `shardline fleet`."""
    from shardline.oncall.fleet import fleet_report, view_json

    client = AirflowClient(_airflow_url(request), token=_caller_token(request, bearer))
    readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    views = fleet_report(_dags_folder(), client, _oncall(), dt.datetime.now(dt.UTC), pipelines=readable)
    return [view_json(v) for v in views]


@read_routes.get("/runs")
def runs(
    _user: ReaderDep, pipeline: Annotated[str, Query(min_length=1)], limit: Annotated[int, Query(ge=1, le=200)] = 25
) -> list[dict]:
    """The pipeline's recent runs, newest first, from its ledger table."""
    oncall = _oncall()
    _known(oncall, pipeline)
    return [_plain(row) for row in oncall.runs(pipeline, limit)]


@read_routes.get("/quote")
def pipeline_quote(
    _user: ReaderDep,
    pipeline: Annotated[str, Query(min_length=1)],
    partition: Annotated[str | None, Query(max_length=40)] = None,
) -> dict:
    """What the pipeline's next run will cost, before it is triggered: its partition (an interval's start; default
    the schedule's latest whole interval), quoted from the pipeline's history as `shardline quote --no-sample`
    quotes it (the page never runs a sample). An unscheduled pipeline is quoted over its spec's input prefix."""
    from shardline.orchestration import quote as quoting
    from shardline.spec import SpecError, data_interval

    oncall = _oncall()
    _known(oncall, pipeline)
    spec = oncall.spec(pipeline)
    scheduled = spec.schedule not in (None, "@once")
    try:
        start = dt.datetime.fromisoformat(partition) if partition else None
    except ValueError:
        raise BadRequest(
            f"partition {partition!r} is no time: give an interval's start, e.g. 2026-11-22T10:00"
        ) from None
    if start is not None:  # a time without a zone is UTC, as everywhere in Shardline
        start = start.replace(tzinfo=dt.UTC) if start.tzinfo is None else start.astimezone(dt.UTC)
    if scheduled:
        start = start or data_interval(spec.schedule, dt.datetime.now(dt.UTC))[0]
    try:
        found = quoting.quote(spec, [start if scheduled else None])
    except (quoting.QuoteError, SpecError) as err:
        raise BadRequest(str(err)) from err
    return {**quoting.quote_data(found), "lines": quoting.quote_lines(found)}


@read_routes.get("/runs/{dag_id}/{run_id}")
def run(_user: ReaderDep, dag_id: str, run_id: str) -> dict:
    """One run: its steps, each with its instances and files."""
    oncall = _oncall()
    _known(oncall, dag_id)
    view = _plain(oncall.status(RunRef(dag_id, run_id), with_files=True))
    for step in view["steps"]:
        step["not_succeeded"] = step["files"] - step["succeeded"]
        step["ended"] = step["status"] in STEP_TERMINAL
    root = airflow_root_path()
    view["airflow_run_url"] = f"{root}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
    for step in view["steps"]:
        # A step its blocking checks held back: the checks that failed, for the page's Approve button.
        step["held_back"] = (
            [row.result.model_dump() for row in oncall.checks_view(RunRef(dag_id, run_id), step["name"]).blocked]
            if step["status"] == StepStatus.FAILED.value and (step.get("message") or "").startswith(HELD_BACK)
            else []
        )
    for step in view["steps"]:
        # Relative to the app's root; a report is written when its step ends.
        step["report_url"] = (
            (f"runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}/steps/{quote(step['name'], safe='')}/report")
            if step["ended"]
            else None
        )
    return view


@read_routes.get("/runs/{dag_id}/{run_id}/steps/{step}/report", response_class=HTMLResponse)
def step_report(_user: ReaderDep, dag_id: str, run_id: str, step: str) -> Response:
    """A step's run report (report.html), streamed from S3.

    The run and step name what to look up, never where: the key is derived from the step's plan
    as the ledger recorded it, so a request can only reach the report of a run of a pipeline
    whose runs the caller may read.
    """
    oncall = _oncall()
    _known(oncall, dag_id)
    ref = RunRef(dag_id, run_id)
    [found] = oncall.report_refs(ref, step)  # NotFound (404) for an unknown step or run, or one never planned
    body = oncall.open_report(ref, found)  # NotFound when its step has not written it

    def chunks():
        try:
            yield from body.iter_chunks(REPORT_CHUNK_BYTES)
        finally:
            body.close()

    return StreamingResponse(
        chunks(),
        media_type="text/html; charset=utf-8",
        headers={
            "Content-Security-Policy": REPORT_CSP,
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
            "Content-Disposition": f'inline; filename="report-{_file_part(dag_id)}-{_file_part(step)}.html"',
        },
    )


# --- the action ----------------------------------------------------------------------------------

action_routes = APIRouter()


@action_routes.post(
    "/runs/{dag_id}/{run_id}/steps/{step}/resubmit",
    # Authorized first, then the body's type checked, then written to Airflow's audit log (FastAPI
    # resolves can_clear_tasks once): a request refused by either is not in the audit log.
    dependencies=[Depends(can_clear_tasks), Depends(json_body), Depends(action_logging(event="shardline_resubmit"))],
)
def resubmit(
    request: Request, user: ResubmitterDep, bearer: BearerDep, dag_id: str, run_id: str, step: str, body: ResubmitBody
) -> dict:
    """Start a new attempt of ``step`` with the chosen files (a dry run only says which).

    When the DAG run had already finished, the step's watch task is cleared through
    Airflow's REST API as the caller, so the run follows the new attempt.
    """
    if body.all_failed == bool(body.files):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, CHOOSE_FILES_DETAIL)
    client = AirflowClient(_airflow_url(request), token=_caller_token(request, bearer))
    oncall = _oncall(airflow=client)
    _known(oncall, dag_id)
    choice = FileChoice(files=body.files, all_failed=body.all_failed)
    result = oncall.resubmit(RunRef(dag_id, run_id), step, choice, dry_run=body.dry_run)
    return {**_plain(result), "user": user.get_name()}


@action_routes.post(
    "/runs/{dag_id}/{run_id}/steps/{step}/approve",
    # As a resubmit: the caller must be allowed to clear the step's watch task, and the request is in the audit log.
    dependencies=[Depends(can_clear_tasks), Depends(json_body), Depends(action_logging(event="shardline_approve"))],
)
def approve(
    request: Request, user: ResubmitterDep, bearer: BearerDep, dag_id: str, run_id: str, step: str, body: ApproveBody
) -> dict:
    """Accept the outputs ``step``'s blocking checks held back: who (the caller), when and why are recorded, and the
    step's watch task is cleared through Airflow's REST API as the caller, so the step ends again with its _SUCCESS."""
    client = AirflowClient(_airflow_url(request), token=_caller_token(request, bearer))
    oncall = _oncall(airflow=client)
    _known(oncall, dag_id)
    result = oncall.approve(RunRef(dag_id, run_id), step, body.reason, by=user.get_name())
    return {**_plain(result), "user": user.get_name()}
