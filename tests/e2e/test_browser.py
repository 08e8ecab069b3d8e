"""The UIs in a real browser: Debian's chromium, headless, driven by Selenium through Debian's chromedriver
(Selenium Manager is never asked to download anything). On the shared `demo_stack`: Airflow's UI, reached
through its login page, lists the DAGs with no import error and shows the demo's retrain run as
successful; MLflow's UI shows the registered model `fraud-detector` with its `champion` alias; and a
retrain that asks for a sign-off is approved by a second person in Airflow's Required Actions (last on the
stack: it moves the champion). Screenshots are saved under the artifacts folder (see conftest.py) whether
the checks pass or not."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.conftest import machine_lock, wait_for
from tests.e2e.conftest import DAG_IDS, DEMO_DATES, at_most_every, mlops_json

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
RETRAIN, APPROVE = "retrain_fraud_model", "approve_fraud_model"
APPROVER = "risk-officer"  # scripts/up.sh's second user (role user): may answer approvals
APPROVAL_TIMEOUT = 900  # seconds: a retrain of the demo's feed, then the approval run


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
    """The page's text; empty while the body is being replaced (the waits look again)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return driver.find_element("tag name", "body").text
    except StaleElementReferenceException:
        return ""


def _in_any_frame(driver, text: str) -> bool:
    """Whether `text` shows on the page or in one of its frames (MLflow's UI shows HTML artifacts in one)."""
    from selenium.common.exceptions import WebDriverException

    if text in _text(driver):
        return True
    try:
        for frame in driver.find_elements("tag name", "iframe"):
            driver.switch_to.frame(frame)
            try:
                if text in _text(driver):
                    return True
            finally:
                driver.switch_to.default_content()
    except WebDriverException:
        driver.switch_to.default_content()
    return False


def _buttons(driver, label: str) -> list:
    """The displayed buttons labelled `label`; none while the page is re-rendering (a button found and then
    replaced before its text is read is stale: the wait that calls this looks again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return [
            b
            for b in driver.find_elements(By.TAG_NAME, "button")
            if b.text.strip() == label and b.is_displayed()
        ]
    except StaleElementReferenceException:
        return []


def _champion(demo_stack) -> str:
    """fraud-detector's champion version now, from MLflow's REST API."""
    import httpx

    answer = httpx.get(
        f"{demo_stack.mlflow_url}/api/2.0/mlflow/registered-models/alias",
        params={"name": "fraud-detector", "alias": "champion"},
    )
    assert answer.status_code == 200, f"no champion alias on fraud-detector: {answer.text}"
    return answer.json()["model_version"]["version"]


def _log_in_to_airflow(driver, demo_stack, user: str | None = None) -> None:
    from selenium.webdriver.common.by import By

    user = user or demo_stack.username
    driver.get(f"{demo_stack.airflow_url}/")
    _wait_for(driver, lambda: "/auth/login" in driver.current_url, "redirect to Airflow's login page")
    _wait_for(driver, lambda: driver.find_elements(By.NAME, "username"), "the login form")
    driver.find_element(By.NAME, "username").send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(demo_stack.passwords[user])
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

    # The retrain run the last day's features started: the run and its ten tasks, all successful but
    # ask_approval (skipped: approval is off in the demo) and compress where the gate did not promote.
    run_id = demo_stack.summary["phases"]["one_more_day"]["retrain_fraud_model"][0]
    browser.get(f"{demo_stack.airflow_url}/dags/retrain_fraud_model/runs/{quote(run_id, safe='')}")
    _wait_for(browser, lambda: "10 Task Instances" in _text(browser), "the task instances of the retrain run")
    browser.save_screenshot(str(artifacts_dir / "airflow-retrain-run.png"))
    page = _text(browser)
    assert run_id in page and "Asset Triggered" in page, page
    assert page.count("Success") >= 9 and "Failed" not in page and "Skipped" in page, page
    for task_id in (
        "as_of_date", "training_set", "skip_identical", "train", "evaluate", "register", "promote", "export",
        "compress", "ask_approval",
    ):  # fmt: skip
        assert task_id in page, page


def test_mlflow_ui_shows_the_registered_model_with_its_champion_alias(browser, demo_stack, artifacts_dir):
    champion = _champion(demo_stack)  # the champion now (a later test may have promoted another version)
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


@pytest.mark.moves_champion
def test_a_retrain_that_asks_for_a_sign_off_waits_for_a_person_who_approves_it_in_the_airflow_ui(
    browser, demo_stack, artifacts_dir
):
    """Human approval as a person meets it: the demo's first champion is put back by hand, a retrain as of
    the last day (which beat it in the demo) is started by `admin` with the `require_approval` param; its
    gate pass waits. admin, outside the approvers group, is refused by Airflow. In the browser, the stack's
    second user and its one approver, risk-officer, finds it under Required
    Actions, reads the gate's figures, writes a comment and approves; the approval DAG records who and why,
    and the candidate becomes the champion."""
    from airflow_client.client.models.update_hitl_detail_payload import UpdateHITLDetailPayload
    from selenium.webdriver.common.by import By

    from mlops.airflow_api import AirflowAPI, AirflowAPIError

    promoted = [r for r in demo_stack.summary["retrains"] if r["decision"] == "promoted"]
    assert len(promoted) >= 2 and promoted[-1]["as_of"] == DEMO_DATES[-1].isoformat(), promoted
    champion = _champion(demo_stack)
    first = promoted[0]["model_version"]
    why = "e2e: the first champion back, so the last day's model is a candidate again"
    moved = mlops_json(demo_stack, "promote", "--version", first, "--expect", champion, "--reason", why)
    assert moved["decision"] == "promoted" and _champion(demo_stack) == first, moved

    api = AirflowAPI(demo_stack.airflow_url, demo_stack.username, demo_stack.password)
    deadline = time.monotonic() + APPROVAL_TIMEOUT
    conf = {"as_of": DEMO_DATES[-1].isoformat(), "force": True, "require_approval": True}
    run_id = api.trigger(RETRAIN, conf)
    assert api.wait_for_run(RETRAIN, run_id, deadline).state == "success"
    decision = api.xcom(RETRAIN, run_id, "promote")
    assert decision["decision"] == "awaiting_approval", decision
    candidate = decision["model_version"]
    assert _champion(demo_stack) == first  # nothing moved before the sign-off
    [approval_run] = api.wait_for_created_runs(RETRAIN, run_id, "fraud_model_candidate", deadline)
    wait_for(
        at_most_every(
            1, lambda: api.task_instance(APPROVE, approval_run.run_id, "approval").state == "awaiting_input"
        ),
        APPROVAL_TIMEOUT,
        "the approval task to wait for a person",
    )
    # admin is not in the stack's approvers group (scripts/up.sh: risk-officer alone): Airflow refuses
    with pytest.raises(AirflowAPIError) as refused:
        api.call(
            api.task_instances_api.update_hitl_detail, APPROVE, approval_run.run_id, "approval", -1,
            UpdateHITLDetailPayload(chosen_options=["Approve"], params_input={"comment": "mine"}),
        )  # fmt: skip
    assert refused.value.status == 403, refused.value
    assert api.task_instance(APPROVE, approval_run.run_id, "approval").state == "awaiting_input"

    _log_in_to_airflow(browser, demo_stack, APPROVER)
    browser.get(f"{demo_stack.airflow_url}/required_actions")
    subject = f"Promote fraud-detector v{candidate}?"
    _wait_for(browser, lambda: subject in _text(browser), "the candidate among the required actions")
    browser.save_screenshot(str(artifacts_dir / "airflow-required-actions.png"))
    browser.find_element(By.LINK_TEXT, subject).click()
    _wait_for(
        browser,
        lambda: "The gate passed" in _text(browser) and _buttons(browser, "Approve"),
        "the approval form with the gate's figures",
    )
    page = _text(browser)
    assert f"fraud-detector v{candidate}" in page and f"v{first}" in page, page
    assert "auc_pr" in page and "Started by: admin" in page, page
    # the link to the candidate's MLflow version (its run, holdout metrics and evaluation plots)
    link = browser.find_element(By.PARTIAL_LINK_TEXT, f"/#/models/fraud-detector/versions/{candidate}")
    assert link.get_attribute("href").startswith(demo_stack.mlflow_url), link.get_attribute("href")
    mlflow_version = link.get_attribute("href")
    # and to its model card (training/model_card.py), which the gate step wrote: the approver reads it first
    card_link = browser.find_element(By.PARTIAL_LINK_TEXT, "/model_card/index.html")
    card = card_link.get_attribute("href")
    assert card.startswith(f"{demo_stack.mlflow_url}/#/experiments/"), card
    approval_form = browser.current_url
    browser.get(card)  # MLflow's UI shows the run's HTML artifact
    _wait_for(
        browser,
        lambda: _in_any_frame(browser, f"Model card: fraud-detector v{candidate}"),
        "the model card in MLflow's artifact view",
    )
    _dismiss_dialogs(browser)
    browser.save_screenshot(str(artifacts_dir / "mlflow-model-card.png"))
    for section in (
        "Holdout metrics",
        "Operating point",
        "Performance by segment",
        "Comparison with the champion",
    ):
        assert _in_any_frame(browser, section), section
    browser.get(approval_form)
    _wait_for(browser, lambda: bool(_buttons(browser, "Approve")), "the approval form again")
    comment = "e2e: figures checked, approved by the risk officer"
    browser.find_element(By.CSS_SELECTOR, "[name=comment], #element_comment").send_keys(comment)
    browser.save_screenshot(str(artifacts_dir / "airflow-approval-form.png"))
    _buttons(browser, "Approve")[0].click()

    assert api.wait_for_run(APPROVE, approval_run.run_id, deadline).state == "success"
    recorded = api.xcom(APPROVE, approval_run.run_id, "record_decision")
    assert recorded["decision"] == "promoted" and recorded["model_version"] == candidate, recorded
    # the approval made the smaller variants its version serves from (the retrain made fp32 alone for it)
    assert recorded["serving_file"] and "compress_error" not in recorded, recorded
    assert _champion(demo_stack) == candidate
    history = mlops_json(demo_stack, "history")["history"]
    row = [r for r in history if r["candidate_version"] == candidate and r["decided_by"]][-1]
    assert (row["decided_by"], row["comment"], row["triggered_by"]) == (APPROVER, comment, "admin"), row
    browser.get(
        f"{demo_stack.airflow_url}/dags/{APPROVE}/runs/{quote(approval_run.run_id, safe='')}/tasks/approval"
        "/required_actions"
    )
    _wait_for(browser, lambda: APPROVER in _text(browser), "the answer, with who gave it")
    browser.save_screenshot(str(artifacts_dir / "airflow-approval-answered.png"))
    browser.get(mlflow_version)  # where the approver's link leads: the version, now the champion
    _wait_for(browser, lambda: "@ champion" in _text(browser), f"MLflow's page of v{candidate}, the champion")
    _dismiss_dialogs(browser)
    browser.save_screenshot(str(artifacts_dir / "mlflow-approved-version.png"))
