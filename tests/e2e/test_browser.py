"""The UIs in a real browser: Debian's chromium, headless, driven by Selenium through Debian's chromedriver
(Selenium Manager is never asked to download anything). On the shared `demo_stack`: Airflow's UI, reached
through its login page, lists the DAGs with no import error and shows the demo's retrain run as
successful; MLflow's UI shows the registered model `fraud-detector` with its `champion` alias. Screenshots
are saved under the artifacts folder (see conftest.py) whether the checks pass or not."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.conftest import machine_lock, wait_for
from tests.e2e.conftest import DAG_IDS

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PACKAGES = ("chromium", "chromium-driver")
# A fresh profile each time (added below); nothing may reach the network: no background traffic, and every
# host name but the loopback address fails to resolve.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--window-size=1600,1000",
)  # fmt: skip
PAGE_TIMEOUT = 60


@pytest.fixture(scope="session")
def chromium_paths() -> tuple[Path, Path]:
    """Debian's chromium and chromedriver, installed with apt-get when missing (as root, or with sudo)."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return CHROMIUM, CHROMEDRIVER
    if shutil.which("apt-get") is None:
        pytest.skip(
            f"{CHROMIUM} is missing and this system has no apt-get to install {' and '.join(PACKAGES)}"
        )
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        prefix = ["sudo", "-n"]
    else:
        pytest.skip(f"{CHROMIUM} is missing and installing {' and '.join(PACKAGES)} needs root (or sudo)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    with machine_lock("apt"):  # another test worker may be installing podman
        done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode:  # stale package lists: refresh them once
            subprocess.run(
                [*prefix, "apt-get", "update"], capture_output=True, text=True, env=env, timeout=600
            )
            done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, (
        f"`{' '.join(install)}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), f"apt-get installed {PACKAGES} but not {CHROMIUM}"
    return CHROMIUM, CHROMEDRIVER


@pytest.fixture
def browser(chromium_paths, artifacts_dir, request):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium_paths
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    # An explicit driver path: Selenium Manager (which would download a browser and driver) is not used.
    driver = webdriver.Chrome(service=Service(executable_path=str(driver_path)), options=options)
    driver.set_page_load_timeout(PAGE_TIMEOUT)
    try:
        yield driver
    finally:
        driver.save_screenshot(str(artifacts_dir / f"{request.node.name}-last.png"))
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait_for(driver, condition: Callable[[], bool], what: str, timeout: float = PAGE_TIMEOUT) -> None:
    """Poll the page (a single-page app renders after load) until `condition` holds; if it never does, say
    what the page shows."""
    try:
        wait_for(condition, timeout, what)
    except TimeoutError as late:
        body = driver.find_element("tag name", "body").text[:2000]
        raise AssertionError(f"{late}, at {driver.current_url}; the page says:\n{body}") from None


def _dismiss_dialogs(driver) -> None:
    """Close announcement pop-ups (MLflow shows one over the registry) so the screenshots show the page:
    Escape, again while a dialog is still shown, until none is."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def none_shown() -> bool:
        try:
            shown = [d for d in driver.find_elements(By.CSS_SELECTOR, "[role=dialog]") if d.is_displayed()]
        except StaleElementReferenceException:  # one closed while it was looked at
            return False
        if shown:
            ActionChains(driver).send_keys(Keys.ESCAPE).perform()
        return not shown

    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    _wait_for(driver, none_shown, "no dialog over the page", timeout=10)


def _text(driver) -> str:
    return driver.find_element("tag name", "body").text


def _log_in_to_airflow(driver, demo_stack) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{demo_stack.airflow_url}/")
    _wait_for(driver, lambda: "/auth/login" in driver.current_url, "redirect to Airflow's login page")
    _wait_for(driver, lambda: driver.find_elements(By.NAME, "username"), "the login form")
    driver.find_element(By.NAME, "username").send_keys(demo_stack.username)
    driver.find_element(By.NAME, "password").send_keys(demo_stack.password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _wait_for(driver, lambda: "/auth/login" not in driver.current_url, "leaving the login page after sign-in")


def test_airflow_ui_lists_the_dags_without_import_errors_and_shows_a_successful_run(
    browser, demo_stack, artifacts_dir
):
    _log_in_to_airflow(browser, demo_stack)

    _wait_for(browser, lambda: "Health" in _text(browser) and "Scheduler" in _text(browser), "the home page")
    home = _text(browser)
    browser.save_screenshot(str(artifacts_dir / "airflow-home.png"))
    assert "Import Error" not in home, home  # the home page shows a "Dag Import Errors" button when any

    browser.get(f"{demo_stack.airflow_url}/dags")
    _wait_for(browser, lambda: f"{len(DAG_IDS)} Dags" in _text(browser), "the list of DAGs")
    listed = _text(browser)
    browser.save_screenshot(str(artifacts_dir / "airflow-dags.png"))
    assert all(dag_id in listed for dag_id in DAG_IDS), listed

    # The retrain run the last day's features started: the run and its nine tasks, all successful but
    # ask_approval (skipped: approval is off in the demo).
    run_id = demo_stack.summary["phases"]["one_more_day"]["retrain_fraud_model"][0]
    browser.get(f"{demo_stack.airflow_url}/dags/retrain_fraud_model/runs/{quote(run_id, safe='')}")
    _wait_for(browser, lambda: "9 Task Instances" in _text(browser), "the task instances of the retrain run")
    browser.save_screenshot(str(artifacts_dir / "airflow-retrain-run.png"))
    page = _text(browser)
    assert run_id in page and "Asset Triggered" in page, page
    assert page.count("Success") >= 9 and "Failed" not in page and "Skipped" in page, page
    for task_id in (
        "as_of_date", "training_set", "skip_identical", "train", "evaluate", "register", "promote", "export",
        "ask_approval",
    ):  # fmt: skip
        assert task_id in page, page


def test_mlflow_ui_shows_the_registered_model_with_its_champion_alias(browser, demo_stack, artifacts_dir):
    import httpx

    # The champion now (a later test may have promoted another version), from MLflow's REST API.
    answer = httpx.get(
        f"{demo_stack.mlflow_url}/api/2.0/mlflow/registered-models/alias",
        params={"name": "fraud-detector", "alias": "champion"},
    )
    assert answer.status_code == 200, f"no champion alias on fraud-detector: {answer.text}"
    champion = answer.json()["model_version"]["version"]
    browser.get(f"{demo_stack.mlflow_url}/#/models")
    _wait_for(browser, lambda: "fraud-detector" in _text(browser), "fraud-detector in the model registry")
    _dismiss_dialogs(browser)
    browser.save_screenshot(str(artifacts_dir / "mlflow-models.png"))
    # the list's "Aliased versions" column: "@ champion : Version N"
    assert re.search(rf"@ champion\s*:\s*Version {champion}\b", _text(browser)), _text(browser)

    browser.get(f"{demo_stack.mlflow_url}/#/models/fraud-detector")
    _wait_for(browser, lambda: "@ champion" in _text(browser), "the champion alias on fraud-detector's page")
    _dismiss_dialogs(browser)
    browser.save_screenshot(str(artifacts_dir / "mlflow-fraud-detector.png"))
