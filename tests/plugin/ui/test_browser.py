"""The Branchwater view in a real headless Chromium, served by `make stack`'s Airflow API
server (the session's `stack` fixture) with the plugin loaded from its entry point, on the
stack's own lake (PostgreSQL KV, SeaweedFS namespace): every page renders the lake's data,
the links lead from page to page, a visitor signs in on Airflow's login page first,
Airflow's own UI embeds the view from its navigation, and a commit task's default extra link
opens the commit's page. Screenshots are kept (see tests/fixtures/browser.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

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
T = TypeVar("T")
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


def open_page(
    driver: WebDriver, site: Site, path: str, shown: tuple[str, str] | None = None
) -> None:
    """Open a page as a person would: Airflow's login page first, then back to the page.

    Airflow's own UI is a single-page app that sends a visitor to its login page only once
    its script has run: for such a page, `shown` (a locator of what it renders) says when
    the page is there, so the login page is not missed by looking too early."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    target = f"{site.url}{path}"
    driver.get(target)
    if shown is not None:
        on_login = ec.url_contains("/auth/login")
        wait_for(driver, ec.any_of(on_login, ec.presence_of_element_located(shown)), path)
    if "/auth/login" in driver.current_url:
        username = wait_for(driver, ec.visibility_of_element_located((By.NAME, "username")), path)
        username.send_keys(site.user)
        driver.find_element(By.NAME, "password").send_keys(site.password)
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(driver, lambda d: "/auth/login" not in d.current_url, path)


def wait_for(driver: WebDriver, condition: Callable[[WebDriver], T], what: str) -> T:
    """`condition`'s value once truthy; on timeout, a screenshot and the page's source are
    kept beside the screenshots, and the failure names them and the page's address."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT).until(condition)
    except TimeoutException:
        stem = screenshot_dir() / f"timeout-{re.sub(r'[^a-z0-9]+', '-', what.lower()).strip('-')}"
        driver.save_screenshot(f"{stem}.png")
        Path(f"{stem}.html").write_text(driver.page_source)
        pytest.fail(f"waited {WAIT:.0f} s on {driver.current_url} for {what}: see {stem}.png/.html")


def table(driver: WebDriver, table_id: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    located = ec.visibility_of_element_located((By.ID, table_id))
    element: WebElement = wait_for(driver, located, f"table {table_id}")
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

    frame = (By.CSS_SELECTOR, "iframe")
    open_page(browser, site, "/plugin/branchwater", shown=frame)
    wait_for(browser, ec.frame_to_be_available_and_switch_to_it(frame), "the view's iframe")
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


def test_the_object_browser_lists_a_ref_and_previews_its_objects_in_a_browser(
    view_lake: ViewLake, site: Site, browser: WebDriver
) -> None:
    """From the repository page to a folder, a Parquet object's preview, a CSV whose cell
    holds markup (shown as text, not run), and a hostile path's 404 page."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from selenium.webdriver.common.by import By

    repo = view_lake.conn.create_repository("browse-")
    main = repo.branch("main")
    data = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2], "amount": [1.5, 2.5]}), data)
    main.upload("tables/orders/day=1/part-0.parquet", data.getvalue())
    main.upload("raw/notes.csv", b"id,note\n1,<b>bold</b>\n")
    loaded = main.commit("Load for the browser")

    open_page(browser, site, f"/branchwater/repositories/{repo.name}")
    browser.find_element(By.CSS_SELECTOR, "#branches a[href$='/objects/main']").click()
    listing = table(browser, "objects")
    assert listing.split()[:6] == ["Name", "Size", "Checksum", "Modified", "raw/", "folder"]
    assert f"{loaded.id[:12]} Load for the browser" in table(browser, "ref")
    follow(browser, "tables/")
    follow(browser, "orders/")
    follow(browser, "day=1/")
    follow(browser, "part-0.parquet")
    assert table(browser, "schema").split() == ["Column", "Type", "id", "int64", "amount", "double"]
    assert table(browser, "rows").split() == ["id", "amount", "1", "1.5", "2", "2.5"]
    assert f"{loaded.id[:12]} Load for the browser" in table(browser, "object")
    screenshot(browser, "object-preview")

    follow(browser, repo.name)
    open_page(
        browser, site, f"/branchwater/repositories/{repo.name}/object/main?path=raw%2Fnotes.csv"
    )
    assert table(browser, "rows").split("\n")[1] == "1 <b>bold</b>"
    assert browser.find_elements(By.CSS_SELECTOR, "#rows b") == []
    open_page(browser, site, f"/branchwater/repositories/{repo.name}/object/main?path=%3Cscript%3E")
    message = browser.find_element(By.ID, "error-message").text
    assert "<script>" in message and "Not found" in browser.title
