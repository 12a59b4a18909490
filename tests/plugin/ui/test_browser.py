"""The Branchwater view in a real headless Chromium, served by `make stack`'s Airflow API
server (the session's `stack` fixture) with the plugin loaded from its entry point, on the
stack's own lake (PostgreSQL KV, SeaweedFS namespace): every page renders the lake's data,
the links lead from page to page, a visitor signs in on Airflow's login page first,
Airflow's own UI embeds the view from its navigation, and a commit task's default extra link
opens the commit's page. Screenshots are kept (see tests/fixtures/browser.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from branchwater.demo.airflow_home import connection_env
from branchwater.engine import Lake
from branchwater.plugin.hooks import DEFAULT_CONN_ID, BranchwaterHook
from branchwater.stack import StackHandle
from tests.fixtures.browser import screenshot_dir
from tests.plugin.conftest import LakeConnection
from tests.plugin.ui.conftest import BRANCH, ViewLake, fill_lake

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

pytestmark = [
    pytest.mark.slow,
    pytest.mark.airflow,
    pytest.mark.browser,
    pytest.mark.postgres,
    pytest.mark.s3,
]

WAIT = 60.0
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def view_lake(stack: StackHandle) -> Iterator[ViewLake]:
    """The lake `make stack` serves (PostgreSQL KV, SeaweedFS namespace), filled once for the
    module's tests (they only read it)."""
    s3 = stack.s3.options
    with Lake.connect(stack.kv_url, s3_options=s3) as lake:
        namespace = stack.config.default_namespace
        conn = LakeConnection(DEFAULT_CONN_ID, stack.kv_url, namespace, lake, s3_options=s3)
        yield fill_lake(conn)


@dataclass(frozen=True)
class Site:
    """An Airflow API server that serves the view, and the login of a user of its UI."""

    url: str
    user: str
    password: str


@pytest.fixture(scope="module")
def site(stack: StackHandle) -> Site:
    """`make stack`'s API server, which serves the view of its `branchwater_default` lake,
    and its admin login (Airflow's simple auth manager)."""
    return Site(stack.airflow_url, *stack.admin)


def open_page(driver: WebDriver, site: Site, path: str) -> None:
    """Open a page as a person would: Airflow's login page first, then back to the page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    target = f"{site.url}{path}"
    driver.get(target)
    if "/auth/login" in driver.current_url:
        wait = WebDriverWait(driver, WAIT)
        wait.until(ec.visibility_of_element_located((By.NAME, "username"))).send_keys(site.user)
        driver.find_element(By.NAME, "password").send_keys(site.password)
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda d: "/auth/login" not in d.current_url)


def table(driver: WebDriver, table_id: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    locator = (By.ID, table_id)
    element: WebElement = WebDriverWait(driver, WAIT).until(
        ec.visibility_of_element_located(locator)
    )
    return element.text


def follow(driver: WebDriver, text: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.LINK_TEXT, text).click()


def screenshot(driver: WebDriver, name: str) -> None:
    path = screenshot_dir() / f"branchwater-view-{name}.png"
    assert driver.save_screenshot(str(path))
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000, f"{path}: not a full screenshot"


def test_the_view_renders_the_lake_in_a_browser(
    view_lake: ViewLake, site: Site, browser: WebDriver
) -> None:
    repo, feature = view_lake.repo, view_lake.feature
    open_page(browser, site, "/branchwater/")
    assert browser.current_url == f"{site.url}/branchwater/"
    assert repo.storage_namespace in table(browser, "repositories")
    screenshot(browser, "repositories")

    follow(browser, repo.name)
    branches = table(browser, "branches")
    assert f"{BRANCH} {feature.id[:12]} Draft orders" in branches
    assert f"main (default) {view_lake.second.id[:12]} Load the second" in branches
    screenshot(browser, "repository")

    follow(browser, BRANCH)
    assert "Draft orders" in table(browser, "log")
    follow(browser, feature.id[:12])
    assert feature.id in table(browser, "commit")
    assert "added orders/draft.csv" in table(browser, "diff")
    screenshot(browser, "commit")

    follow(browser, repo.name)
    follow(browser, "GC runs")
    assert "clean (dry run) marked passed" in table(browser, "gc-runs")
    screenshot(browser, "gc-runs")
    follow(browser, view_lake.gc_run_id)
    assert view_lake.gc_run_id in browser.title
    screenshot(browser, "gc-report")


def test_airflows_ui_embeds_the_view_from_its_navigation(
    view_lake: ViewLake, site: Site, browser: WebDriver
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, site, "/plugin/branchwater")
    frame = (By.CSS_SELECTOR, "iframe")
    WebDriverWait(browser, WAIT).until(ec.frame_to_be_available_and_switch_to_it(frame))
    assert view_lake.repo.name in table(browser, "repositories")
    browser.switch_to.default_content()
    iframe = browser.find_element(*frame)
    assert iframe.get_attribute("src") == f"{site.url}/branchwater/"
    screenshot(browser, "in-airflow-ui")


def test_a_commit_tasks_default_extra_link_opens_the_commit(
    view_lake: ViewLake, site: Site, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", site.url)
    connection = {"conn_type": "branchwater", "password": view_lake.conn.kv_url}
    monkeypatch.setenv(connection_env("bw_no_template"), json.dumps(connection))
    feature = view_lake.feature
    url = BranchwaterHook("bw_no_template").commit_url(view_lake.repo.name, BRANCH, feature.id)
    assert url.startswith(f"{site.url}/branchwater/")
    open_page(browser, site, url.removeprefix(site.url))
    details = table(browser, "commit")
    assert feature.id in details
    assert f"Branch {BRANCH}" in details
