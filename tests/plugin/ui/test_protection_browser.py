"""Protection rules and checks in the Branchwater view, in a real headless Chromium served by
`make stack`'s Airflow API server (as `test_browser.py`): from the repository page's rules to
a commit's checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.plugin.ui.conftest import ViewLake
from tests.plugin.ui.test_browser import Site, open_page, screenshot, site, table, view_lake

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

pytestmark = [
    pytest.mark.slow,
    pytest.mark.airflow,
    pytest.mark.browser,
    pytest.mark.postgres,
    pytest.mark.s3,
]

__all__ = ["site", "view_lake"]


def test_the_rules_and_a_commits_checks_show_in_a_browser(
    view_lake: ViewLake, site: Site, browser: WebDriver
) -> None:
    from selenium.webdriver.common.by import By

    repo = view_lake.conn.create_repository("guarded-")
    main = repo.branch("main")
    main.upload("orders.csv", b"id\n1\n")
    loaded = main.commit("Load guarded orders")
    repo.protect("main", no_direct_writes=True, required_checks=["quality"], no_delete=True)
    repo.record_check(loaded.id, "quality", True, {"rows": 1}, by="gx")

    open_page(browser, site, f"/branchwater/repositories/{repo.name}")
    rules = table(browser, "protections")
    assert "main refused: merges only quality refused allowed" in " ".join(rules.split())
    browser.find_element(By.CSS_SELECTOR, f"#branches a[href*='/commits/{loaded.id}']").click()
    checks = " ".join(table(browser, "checks").split())
    assert "quality passed" in checks and "gx rows: 1" in checks
    screenshot(browser, "checks")
