"""Headless Chromium (Debian's package, driven by selenium through Debian's chromedriver) for the UI tests,
and the folder their screenshots go to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("SHARDLINE_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("SHARDLINE_CHROMEDRIVER", "/usr/bin/chromedriver"))
INSTALL_HINT = (
    "install Debian's Chromium and its driver: `apt-get update && apt-get install -y chromium "
    "chromium-driver` (or point SHARDLINE_CHROMIUM / SHARDLINE_CHROMEDRIVER at them)"
)
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,1100",
    "--force-device-scale-factor=1",
    "--lang=en-US",
)
SCREENSHOTS: list[Path] = []


def artifacts_dir() -> Path:
    """``$SHARDLINE_ARTIFACTS``, else ``.shardline/artifacts`` in the repository (git-ignored)."""
    folder = Path(
        os.environ.get("SHARDLINE_ARTIFACTS") or Path(__file__).resolve().parents[3] / ".shardline" / "artifacts"
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def screenshot(browser, request):
    """``screenshot("name")`` saves the browser's viewport as ``ui-<name>.png`` in the artifacts folder."""

    def take(name: str) -> Path:
        path = artifacts_dir() / f"ui-{name}.png"
        in_frame = browser.execute_script("return window.self !== window.top")
        browser.switch_to.default_content()  # the whole window: Airflow's navigation around the page
        assert browser.save_screenshot(str(path)), f"could not save {path}"
        if in_frame:
            from selenium.webdriver.common.by import By

            browser.switch_to.frame(browser.find_element(By.CSS_SELECTOR, "iframe[title=Shardline]"))
        SCREENSHOTS.append(path)
        request.node.user_properties.append(("screenshot", str(path)))
        return path

    return take


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: {INSTALL_HINT}", pytrace=False)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(
            "selenium is not installed: run `make venv` (pip install -c constraints.txt -e '.[dev]')", pytrace=False
        )
    work = tmp_path_factory.mktemp("chromium")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={work / 'profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Both paths are given, so selenium-manager has nothing to find; SE_OFFLINE makes sure it never downloads.
    patch = pytest.MonkeyPatch()
    patch.setenv("SE_OFFLINE", "true")
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(work / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(90)
    try:
        yield driver
    finally:
        driver.quit()
        patch.undo()


def pytest_terminal_summary(terminalreporter):
    if SCREENSHOTS:
        terminalreporter.write_sep("-", "Shardline UI screenshots")
        for path in SCREENSHOTS:
            terminalreporter.write_line(str(path))
