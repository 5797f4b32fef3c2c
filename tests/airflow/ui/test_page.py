"""The on-call page, in headless Chromium, against a real Airflow API server with the plugin loaded.

A run fails on a corrupt input; the page, opened from Airflow's navigation after logging in on
Airflow's own login page, shows the run, the step, its instances and the file with its error class;
the input is fixed; "Resubmit failed" asks for confirmation and reports the new attempt; the same
DAG run then turns green, all under the page's own Content-Security-Policy. Airflow's trigger form links to the
page's quote of the next run. Airflow's auth applies:
no token, a bad token, or a viewer's token on the resubmit endpoint are refused.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pytest

from tests.conftest import PRIORITY_TYPE
from tests.support import http

PIPELINE = "tabular_scoring_hourly"
BUCKET = "shardline-demo"
HOUR = dt.datetime(2026, 11, 22, 5, tzinfo=dt.UTC)  # test_oncall_airflow uses hours 3 and 4
PAGE = Path(__file__).resolve().parents[3] / "src" / "shardline" / "airflow" / "ui" / "static" / "oncall.html"
WAIT = 60


# --- helpers -------------------------------------------------------------------------------------


def _token(stack) -> str:
    answer = http.post(f"{stack.url}/auth/token", json={"username": stack.username, "password": stack.password})
    answer.raise_for_status()
    return answer.json()["access_token"]


def _viewer_token(stack) -> str:
    """A JWT for a user with the simple auth manager's Viewer role, signed by this Airflow's own code and secret."""
    return stack.token_for("viewer", "viewer")


def _s3(stack):
    """An S3 client of the stack's embedded endpoint."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=stack.env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="module")
def ui(airflow_stack):
    """The stack, once its API server is known to have loaded the plugin."""
    plugins = airflow_stack.client()._call("GET", "/plugins", params={"limit": 100})["plugins"]
    names = [p["name"] for p in plugins]
    if "shardline_ui" not in names:
        pytest.fail(
            f"Airflow did not load the shardline_ui plugin (plugins: {names}): the `airflow.plugins` entry "
            "point of pyproject.toml registers it; reinstall the package (`make venv`)",
            pytrace=False,
        )
    return airflow_stack


@pytest.fixture(scope="module")
def failed_run(ui, tmp_path_factory, xgboost_model):
    """A run of HOUR that failed on a corrupt input, and a way to fix that input."""

    from examples import synthetic
    from shardline.ledger.table import create_ledger_table
    from shardline.spec import load_spec

    work = tmp_path_factory.mktemp("ui")
    env = ui.env
    s3 = _s3(ui)
    spec = load_spec(ui.dags / "pipelines" / f"{PIPELINE}.yaml")
    s3.create_bucket(Bucket=BUCKET)
    patch = pytest.MonkeyPatch()
    for name, value in env.items():
        if name.startswith("AWS_"):
            patch.setenv(name, value)
    create_ledger_table(spec.ledger_table, "us-east-1", env["AWS_ENDPOINT_URL"])
    patch.undo()
    synthetic.pack(xgboost_model.parent, work / "model.tar.gz")
    s3.upload_file(str(work / "model.tar.gz"), BUCKET, "models/xgboost/v1/model.tar.gz")
    files = synthetic.make_dataset(work / "data", files=4, rows=20_000)
    prefix = f"events/dt={HOUR:%Y-%m-%d}/hour={HOUR:%H}/"
    for path in files:
        s3.upload_file(str(path), BUCKET, prefix + path.name)
    s3.put_object(Bucket=BUCKET, Key=prefix + "late-arrival.parquet", Body=b"PAR1 truncated upload")

    run_id = f"manual__{HOUR:%Y%m%dT%H}-{uuid.uuid4().hex[:6]}"
    ui.client().trigger(PIPELINE, {}, run_id=run_id, logical_date=HOUR.isoformat())
    run = ui.wait_for_run(PIPELINE, run_id)
    assert run["state"] == "failed", ui.tail()

    def fix_input() -> None:
        s3.upload_file(str(files[0]), BUCKET, prefix + "late-arrival.parquet")

    return {"run_id": run_id, "fix_input": fix_input}


# --- auth, without a browser ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_api_refuses_requests_without_a_valid_token(ui):
    base = f"{ui.url}/shardline"
    assert http.get(f"{base}/pipelines").status_code == 401
    assert http.get(f"{base}/runs", params={"pipeline": PIPELINE}).status_code == 401
    bad = {"Authorization": "Bearer not-a-jwt"}
    assert http.get(f"{base}/pipelines", headers=bad).status_code == 403
    assert http.get(f"{base}/pipelines", cookies={"_token": "not-a-jwt"}).status_code == 403
    posted = http.post(f"{base}/runs/{PIPELINE}/any-run/steps/score/resubmit", json={"all_failed": True})
    assert posted.status_code == 401
    # The page itself sends an anonymous visitor to Airflow's login page, and back.
    page = http.get(f"{base}/", follow_redirects=False)
    assert page.status_code == 307 and "/auth/login" in page.headers["location"], page.headers
    assert "next=" in page.headers["location"]


@pytest.mark.slow
def test_a_viewer_may_read_but_not_resubmit(ui, failed_run):
    base = f"{ui.url}/shardline"
    viewer = {"Authorization": f"Bearer {_viewer_token(ui)}"}
    listed = http.get(f"{base}/pipelines", headers=viewer)
    assert listed.status_code == 200 and PIPELINE in [p["pipeline"] for p in listed.json()], listed.text
    run = http.get(f"{base}/runs/{PIPELINE}/{failed_run['run_id']}", headers=viewer)
    assert run.status_code == 200, run.text
    refused = http.post(
        f"{base}/runs/{PIPELINE}/{failed_run['run_id']}/steps/score/resubmit",
        headers=viewer,
        json={"all_failed": True, "dry_run": True},
    )
    assert refused.status_code == 403, refused.text


def test_the_page_never_puts_server_data_into_innerhtml():
    text = PAGE.read_text()
    assert "innerHTML" not in text and "insertAdjacentHTML" not in text and "document.write" not in text


# --- the page, in Chromium -----------------------------------------------------------------------


def _wait(driver, condition, timeout: float = WAIT, message: str = ""):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # The page redraws itself (after an action, and every few seconds while a step runs): look again.
    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, poll_frequency=0.5, ignored_exceptions=ignored).until(condition, message)


def _css(selector: str):
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR, selector


def _click(driver, selector: str, message: str = "") -> None:
    """Click what the selector finds, once it can be clicked; the page redraws itself, so try again if it did."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support import expected_conditions as ec

    def clicked(d) -> bool:
        element = ec.element_to_be_clickable(_css(selector))(d)
        if not element:
            return False
        try:
            element.click()
        except StaleElementReferenceException:
            return False  # redrawn between finding and clicking: find it again
        return True

    _wait(driver, clicked, message=message or f"could not click {selector}")


def _text(driver, selector: str) -> str:
    return driver.find_element(*_css(selector)).text


def _log_in(driver, stack) -> None:
    """Airflow's own login page (simple auth manager), as a person would."""
    from selenium.webdriver.support import expected_conditions as ec

    driver.get(f"{stack.url}/auth/login?next={stack.url}/")
    _wait(driver, ec.presence_of_element_located(_css("input[name=username]")), message="no login form")
    driver.find_element(*_css("input[name=username]")).send_keys(stack.username)
    driver.find_element(*_css("input[name=password]")).send_keys(stack.password)
    driver.find_element(*_css("button[type=submit]")).click()
    _wait(
        driver,
        lambda d: d.get_cookie("_token") is not None and "/auth/login" not in d.current_url,
        message="login did not set Airflow's _token cookie",
    )


def _open_from_airflow_nav(driver, stack) -> None:
    """Follow the "Shardline" entry of Airflow's navigation; then work inside the page's iframe."""
    from selenium.webdriver.support import expected_conditions as ec

    link = _wait(
        driver,
        ec.element_to_be_clickable(_css("a[href$='plugin/shardline']")),
        message="no Shardline entry in Airflow's navigation",
    )
    link.click()
    frame = _wait(
        driver,
        ec.presence_of_element_located(_css("iframe[title=Shardline]")),
        message="the Shardline view did not open in Airflow",
    )
    driver.switch_to.frame(frame)


def _dump(driver) -> str:
    driver.switch_to.default_content()
    logs = []
    try:
        logs = [f"{e['level']}: {e['message']}" for e in driver.get_log("browser")]
    except Exception as err:  # the log is a diagnostic only
        logs = [f"(no browser log: {err})"]
    return f"url={driver.current_url}\nconsole:\n" + "\n".join(logs[-30:])


@pytest.mark.slow
def test_a_failed_run_is_found_and_resubmitted_from_the_page(ui, failed_run, browser, screenshot):
    from selenium.webdriver.support import expected_conditions as ec

    run_id = failed_run["run_id"]
    driver = browser
    try:
        _log_in(driver, ui)
        _open_from_airflow_nav(driver, ui)

        # Pipelines -> runs -> the failed run.
        _click(driver, f"tr[data-pipeline={PIPELINE}] a.pipeline-link")
        row = f"tr.run-row[data-run-id='{run_id}']"
        _wait(driver, ec.presence_of_element_located(_css(row)), message="the run is not listed")
        assert _text(driver, f"{row} .badge") == "FAILED"
        # Beside its runs, the pipeline's next run (the schedule's latest whole hour) is quoted: that hour has no
        # input here, which the quote says rather than pricing it.
        _click(driver, "#quote-button")
        _wait(driver, ec.visibility_of_element_located(_css("#quote")), message="no quote shown")
        shown = _text(driver, "#quote")
        assert shown.startswith(f"quote of {PIPELINE}: 1 run(s)") and "no input under" in shown, shown
        _click(driver, f"{row} a.run-link")

        step = "section.step[data-step=score]"
        _wait(driver, ec.presence_of_element_located(_css(step)), message="the run's steps did not show")
        assert driver.find_element(*_css("#run-header")).get_attribute("data-status") == "FAILED"
        assert driver.find_element(*_css(step)).get_attribute("data-status") == "FAILED"
        assert _text(driver, f"{step} .attempt") == "attempt 1"
        assert driver.find_elements(*_css(f"{step} .instance")), "no instance in the grid"
        bad = driver.find_element(*_css(f"{step} tr.file-row[data-status=FAILED]"))
        assert bad.get_attribute("data-key").endswith("/late-arrival.parquet")
        assert bad.find_element(*_css(".err-class")).text == "CorruptInputError"
        assert len(driver.find_elements(*_css(f"{step} tr.file-row[data-status=SUCCEEDED]"))) == 4
        button = driver.find_element(*_css(f"{step} button.resubmit"))
        assert button.is_enabled() and button.text == "Resubmit failed (1)"
        screenshot("failed-run")
        # The page works under its own Content-Security-Policy: a bar's width is set (a style attribute would
        # have been refused), and Chromium reported no violation.
        bar = driver.find_element(*_css(f"{step} .summary .bar > div:not(.failed)"))
        assert driver.execute_script("return arguments[0].style.width", bar) == "80%"  # 4 of 5 files
        refused = [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
        assert not refused, refused

        # Asking, then cancelling, changes nothing.
        _click(driver, f"{step} button.resubmit")
        dialog = _wait(driver, ec.visibility_of_element_located(_css("#confirm-dialog")), message="no confirmation")
        assert "Resubmit 1 file(s) of step score" in dialog.text and "attempt 2" in dialog.text, dialog.text
        assert "late-arrival.parquet" in _text(driver, "#confirm-files")
        _click(driver, "#confirm-cancel")
        _wait(driver, ec.text_to_be_present_in_element(_css("#notice"), "cancelled"))
        assert ui.client().dag_run(PIPELINE, run_id)["state"] == "failed"

        # Fix the input, then resubmit for real.
        failed_run["fix_input"]()
        _click(driver, f"{step} button.resubmit")
        _wait(driver, ec.visibility_of_element_located(_css("#confirm-dialog")))
        screenshot("confirm-resubmit")
        _click(driver, "#confirm-ok")
        _wait(
            driver,
            lambda d: d.find_element(*_css("#notice")).get_attribute("data-kind") in ("ok", "error"),
            message="no answer to the resubmission",
        )
        notice = _text(driver, "#notice")
        assert driver.find_element(*_css("#notice")).get_attribute("data-kind") == "ok", notice
        assert "Submitted attempt 2" in notice and "cleared" in notice, notice

        run = ui.wait_for_run(PIPELINE, run_id, states=("success", "failed"))
        assert run["state"] == "success", ui.tail()

        # The page follows the new attempt on its own (it refreshes while a step has not ended).
        _wait(
            driver,
            lambda d: d.find_element(*_css(step)).get_attribute("data-status") == "SUCCEEDED",
            timeout=120,
            message="the page did not show the step succeeding",
        )
        _wait(
            driver,
            lambda d: d.find_element(*_css("#run-header")).get_attribute("data-status") == "SUCCEEDED",
            timeout=60,
            message="the page did not show the run succeeding",
        )
        assert _text(driver, f"{step} .attempt") == "attempt 2"
        assert len(driver.find_elements(*_css(f"{step} tr.file-row[data-status=SUCCEEDED]"))) == 5
        assert not driver.find_element(*_css(f"{step} button.resubmit")).is_enabled()
        path = screenshot("resubmitted-run")
        assert path.stat().st_size > 10_000

        # The step's run report (its end wrote it), from the page's link, in the same frame, charts drawn under
        # the report's own policy; Back returns to the page.
        _click(driver, f"{step} a.report-link")
        _wait(
            driver,
            lambda d: d.find_element(*_css("h1")).text.startswith("Run report"),
            message="the run report did not open",
        )
        charts = driver.find_elements(*_css("img.chart"))
        assert charts and all(driver.execute_script("return arguments[0].naturalWidth", c) > 100 for c in charts)
        refused = [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
        assert not refused, refused
        screenshot("run-report")
        driver.back()
        driver.switch_to.default_content()
        driver.switch_to.frame(driver.find_element(*_css("iframe[title=Shardline]")))
        _wait(driver, ec.presence_of_element_located(_css(step)), message="Back did not return to the page")

        # The fleet panel: each instance type of dags/fleet.yaml with its quota (tests/conftest.py declares one).
        _click(driver, "#fleet-link")
        fleet_type = f"section.fleet-type[data-type='{PRIORITY_TYPE}']"
        _wait(driver, ec.presence_of_element_located(_css(fleet_type)), message="the fleet panel did not show")
        assert _text(driver, f"{fleet_type} [data-tile='in use'] .v").endswith(" of 1")
        assert _text(driver, f"{fleet_type} [data-tile='today: failed'] .v").isdigit()
        screenshot("fleet")
        driver.back()
        driver.switch_to.default_content()
        driver.switch_to.frame(driver.find_element(*_css("iframe[title=Shardline]")))
        _wait(driver, ec.presence_of_element_located(_css(step)), message="Back did not return to the run")

        # From the page back to Airflow's own view of the same DAG run.
        _click(driver, "#airflow-run-link")
        driver.switch_to.default_content()
        _wait(
            driver,
            lambda d: d.current_url.endswith(f"/dags/{PIPELINE}/runs/{run_id}"),
            message="the link did not open the DAG run in Airflow",
        )

        # Airflow's own trigger form links to the quote of the run it would start, which the page then shows at once.
        driver.get(f"{ui.url}/dags/{PIPELINE}")
        _click(driver, "[data-testid=trigger-dag-button]")
        link = _wait(
            driver,
            ec.element_to_be_clickable(_css(f"[data-testid=config-form] a[href$='/pipelines/{PIPELINE}/quote']")),
            message="no quote link in Airflow's trigger form",
        )
        assert link.text == "quote it", link.text
        # The form's defaults can be triggered as they are: nothing it requires is left empty.
        assert driver.find_element(*_css("[data-testid=trigger-dag-submit]")).is_enabled(), "Trigger disabled"
        screenshot("trigger-form-quote")
        windows = set(driver.window_handles)
        link.click()
        opened = set(driver.window_handles) - windows  # Airflow's Markdown may open links in a new tab
        if opened:
            driver.switch_to.window(opened.pop())
        _wait(driver, ec.visibility_of_element_located(_css("#quote")), message="the linked page quoted nothing")
        shown = _text(driver, "#quote")
        assert shown.startswith(f"quote of {PIPELINE}: 1 run(s)") and "no input under" in shown, shown
    except Exception:
        print(_dump(driver))
        raise

    # Airflow's audit log names who resubmitted.
    logs = ui.client()._call("GET", "/eventLogs", params={"event": "shardline_resubmit", "dag_id": PIPELINE})
    entries = [e for e in logs["event_logs"] if e["run_id"] == run_id]
    assert entries and {e["owner"] for e in entries} == {ui.username}, logs
    assert any(json.loads(e["extra"] or "{}").get("files") for e in entries), entries


@pytest.fixture(scope="module")
def held_run(ui, failed_run, tmp_path_factory):
    """A run of another hour whose outputs the shipped distinct-values check held back (a broken model: every row
    scored the same). ``failed_run`` made the bucket, the table and the inputs' model first."""

    from examples import synthetic

    work = tmp_path_factory.mktemp("ui-held")
    s3 = _s3(ui)
    synthetic.pack(synthetic.train_xgboost(work / "broken", broken=True).parent, work / "broken.tar.gz")
    s3.upload_file(str(work / "broken.tar.gz"), BUCKET, "models/xgboost/broken/model.tar.gz")
    hour = HOUR + dt.timedelta(hours=10)  # 15:00: no other test of this Airflow scores it (the on-call ones take 3-14)
    prefix = f"events/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    for path in synthetic.make_dataset(work / "data", files=2, rows=5_000):
        s3.upload_file(str(path), BUCKET, prefix + path.name)
    run_id = f"manual__{hour:%Y%m%dT%H}-{uuid.uuid4().hex[:6]}"
    ui.client().trigger(PIPELINE, {"model_version": "broken"}, run_id=run_id, logical_date=hour.isoformat())
    assert ui.wait_for_run(PIPELINE, run_id)["state"] == "failed", ui.tail()
    return {"run_id": run_id, "s3": s3, "marker": f"scores/dt={hour:%Y-%m-%d}/hour={hour:%H}/_SUCCESS"}


@pytest.mark.slow
def test_held_back_outputs_are_approved_from_the_page_with_a_reason(ui, held_run, browser, screenshot):
    from selenium.webdriver.support import expected_conditions as ec

    run_id = held_run["run_id"]
    base = f"{ui.url}/shardline/runs/{PIPELINE}/{run_id}/steps/score/approve"
    viewer = {"Authorization": f"Bearer {_viewer_token(ui)}"}
    refused = http.post(base, headers=viewer, json={"reason": "a viewer may not approve anything"})
    assert refused.status_code == 403, refused.text  # approving takes the right to clear the watch task
    driver = browser
    try:
        _log_in(driver, ui)
        _open_from_airflow_nav(driver, ui)
        driver.execute_script("location.hash = arguments[0]", f"#/runs/{PIPELINE}/{run_id}")  # the run's own view
        held = "div.held-back[data-step=score]"
        _wait(driver, ec.presence_of_element_located(_css(held)), message="the held-back checks did not show")
        assert "checks.columns.prediction.min_distinct: 1 against at least 2" in _text(driver, held)
        screenshot("held-back-run")

        _click(driver, f"{held} button.approve")
        _wait(driver, ec.visibility_of_element_located(_css("#approve-dialog")), message="no approval dialog")
        assert not driver.find_element(*_css("#approve-ok")).is_enabled()  # no reason, no approval
        driver.find_element(*_css("#approve-reason")).send_keys("a test of the page's approval")
        _click(driver, "#approve-ok")
        _wait(
            driver,
            lambda d: d.find_element(*_css("#notice")).get_attribute("data-kind") in ("ok", "error"),
            message="no answer to the approval",
        )
        notice = _text(driver, "#notice")
        assert driver.find_element(*_css("#notice")).get_attribute("data-kind") == "ok", notice
        assert f"Approved by {ui.username}" in notice, notice
    except Exception:
        print(_dump(driver))
        raise
    assert ui.wait_for_run(PIPELINE, run_id, states=("success", "failed"))["state"] == "success", ui.tail()
    assert held_run["s3"].list_objects_v2(Bucket=BUCKET, Prefix=held_run["marker"])["KeyCount"] == 1
    logs = ui.client()._call("GET", "/eventLogs", params={"event": "shardline_approve", "dag_id": PIPELINE})
    assert [e["owner"] for e in logs["event_logs"] if e["run_id"] == run_id] == [ui.username], logs
