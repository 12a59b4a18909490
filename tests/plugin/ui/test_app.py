"""The Branchwater view's pages through FastAPI's test client, on a real lake (SQLite and
local files) behind the `branchwater_default` connection: what each page shows, that its
links lead on, and the 404 and 503 pages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from branchwater.engine import Lake, open_object_store
from branchwater.engine.gc.runs import files
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.plugin.hooks import BranchwaterHook
from branchwater.plugin.ui import app as view
from branchwater.plugin.ui.lake import LakeAccess
from branchwater.plugin.ui.paths import URL_PREFIX
from tests.plugin.conftest import LakeConnection, set_connection
from tests.plugin.ui.conftest import BRANCH, Page, ViewLake, get


def test_the_repositories_page_lists_every_repository(
    view_lake: ViewLake, client: TestClient
) -> None:
    other = view_lake.conn.create_repository("other-")
    page = get(client, "/")
    table = page.tables["repositories"]
    for repo in (view_lake.repo, other):
        assert repo.name in table
        assert repo.storage_namespace in table
    assert page.links[view_lake.repo.name] == f"/repositories/{view_lake.repo.name}"


def test_no_page_runs_scripts(view_lake: ViewLake, client: TestClient) -> None:
    for path in ("/", f"/repositories/{view_lake.repo.name}", "/no/such/page"):
        policy = client.get(path).headers["content-security-policy"]
        assert "default-src 'none'" in policy
        assert "script-src" not in policy


def test_an_empty_lake_says_how_to_make_a_repository(
    lake_conn: LakeConnection, client: TestClient
) -> None:
    assert "has no repositories yet" in get(client, "/").text


def test_a_repository_shows_its_branches_heads_compaction_figures_and_tags(
    view_lake: ViewLake, client: TestClient
) -> None:
    repo = view_lake.repo
    page = get(client, f"/repositories/{repo.name}")
    branches = page.tables["branches"]
    assert f"{BRANCH} {view_lake.feature.id[:12]} Draft orders" in branches
    assert f"main (default) {view_lake.second.id[:12]} Load the second" in branches
    status = repo.branch(BRANCH).compaction_status()
    assert status.compacted and status.staged_tombstones == 1
    figures = f"{status.staged_entries} {status.staged_tombstones} {status.sealed_tokens} yes"
    assert f"Draft orders {figures}" in branches
    assert "s ago" in branches
    assert f"v1 {view_lake.first.id[:12]}" in page.tables["tags"]


def test_links_carry_branch_names_with_slashes_to_the_log(
    view_lake: ViewLake, client: TestClient
) -> None:
    repo = view_lake.repo
    page = get(client, f"/repositories/{repo.name}")
    assert page.links[BRANCH] == f"/repositories/{repo.name}/log/feature%2Forders"
    log = get(client, page.links[BRANCH])
    assert f"Commits of {BRANCH}" in log.text
    messages = ["Draft orders", "Load the second", "Load November"]
    assert [m for m in messages if m in log.tables["log"]] == messages
    commit_link = log.links[view_lake.feature.id[:12]]
    assert urlsplit(commit_link).query == "branch=feature%2Forders"
    commit = get(client, commit_link)
    assert f"Branch {BRANCH}" in commit.tables["commit"]


def test_the_log_pages_through_history(
    view_lake: ViewLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(view, "LOG_PAGE", 2)
    repo = view_lake.repo
    first_page = get(client, f"/repositories/{repo.name}/log/main")
    assert "Load the second" in first_page.tables["log"]
    assert "Load November" in first_page.tables["log"]
    assert "Repository created" not in first_page.tables["log"]
    second_page = get(client, first_page.links["Older commits"])
    assert "Repository created" in second_page.tables["log"]
    assert "Load November" not in second_page.tables["log"]
    assert "Older commits" not in second_page.links


def test_the_repository_page_pages_through_branches_and_tags(
    view_lake: ViewLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(view, "REF_PAGE", 2)
    repo = view_lake.repo
    repo.create_branch("dev", source="main")
    for name in ("a-1", "a-2"):
        repo.tag(name, "main")
    first = get(client, f"/repositories/{repo.name}")
    assert "dev" in first.tables["branches"] and "feature/orders" in first.tables["branches"]
    assert "main" not in first.tables["branches"]
    assert [t for t in ("a-1", "a-2", "v1") if t in first.tables["tags"]] == ["a-1", "a-2"]
    branches = get(client, first.links["More branches"])
    assert "main (default)" in branches.tables["branches"]
    assert "dev" not in branches.tables["branches"]
    assert "More branches" not in branches.links
    assert "a-1" in branches.tables["tags"]
    tags = get(client, branches.links["More tags"])
    assert "v1" in tags.tables["tags"] and "a-1" not in tags.tables["tags"]
    assert "main (default)" in tags.tables["branches"]
    assert "More tags" not in tags.links


def test_a_branch_deleted_while_its_page_is_drawn_is_left_out(
    view_lake: ViewLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = view_lake.repo
    listed = repo.branches()
    repo.delete_branch(BRANCH)
    monkeypatch.setattr(type(repo), "branches", lambda self, **_: listed)
    page = get(client, f"/repositories/{repo.name}")
    assert BRANCH not in page.tables["branches"]
    assert "main (default)" in page.tables["branches"]


def test_a_commit_shows_its_metadata_and_its_diff_from_its_first_parent(
    view_lake: ViewLake, client: TestClient
) -> None:
    repo, second = view_lake.repo, view_lake.second
    page = get(client, f"/repositories/{repo.name}/commits/{second.id}")
    assert second.id in page.tables["commit"]
    assert (
        page.links[view_lake.first.id[:12]]
        == f"/repositories/{repo.name}/commits/{view_lake.first.id}"
    )
    diff = page.tables["diff"]
    assert "added orders/2026-11-02.csv" in diff
    assert "changed orders/2026-11-01.csv" in diff
    assert "removed orders/old.csv" in diff
    first = get(client, f"/repositories/{repo.name}/commits/{view_lake.first.id[:12]}")
    assert "airflow.dag_id daily_orders" in first.tables["metadata"]
    assert "added orders/old.csv" in first.tables["diff"]


def test_the_first_commit_has_nothing_to_compare_with(
    view_lake: ViewLake, client: TestClient
) -> None:
    repo = view_lake.repo
    root = list(repo.log("main"))[-1]
    assert not root.parents
    page = get(client, f"/repositories/{repo.name}/commits/{root.id}")
    assert "first commit" in page.text
    assert "diff" not in page.tables


def test_a_long_diff_is_cut_and_says_so(
    view_lake: ViewLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(view, "DIFF_LIMIT", 2)
    repo = view_lake.repo
    page = get(client, f"/repositories/{repo.name}/commits/{view_lake.second.id}")
    assert page.tables["diff"].count("orders/") == 2
    assert "Only the first 2 changes are shown" in page.text


def test_gc_runs_are_listed_with_their_figures_and_reports(
    view_lake: ViewLake, client: TestClient
) -> None:
    repo, run_id = view_lake.repo, view_lake.gc_run_id
    page = get(client, f"/repositories/{repo.name}/gc")
    table = page.tables["gc-runs"]
    assert f"{run_id}" in table
    assert "clean (dry run) marked passed 3 · 3.0 KiB 0 · 0 B" in table
    assert "minimum age overridden" in table
    report = client.get(page.links[run_id])
    assert report.status_code == 200
    saved = open_object_store(repo.storage_namespace).get(
        f"{files.RUNS_PREFIX}{run_id}/report.html"
    )
    assert report.content == saved
    assert "sandbox" in report.headers["content-security-policy"]
    assert f"<title>GC run {run_id}" in report.text
    summary = client.get(page.links["summary.json"])
    assert summary.status_code == 200
    assert summary.json()["counts"]["candidates"] == {"objects": 3, "bytes": 3072}


def test_a_pruned_run_is_listed_as_such(view_lake: ViewLake, client: TestClient) -> None:
    repo, run_id = view_lake.repo, view_lake.gc_run_id
    ns = Namespace.of(repo.storage_namespace, view_lake.conn.s3_options)
    summary = files.read_summary(ns, run_id)
    summary.pruned_at = "2026-12-06T12:00:00+00:00"
    files.write_summary(ns, summary)

    table = get(client, f"/repositories/{repo.name}/gc").tables["gc-runs"]

    assert "clean (dry run) marked (data pruned) passed" in table


def test_a_damaged_summary_is_named_not_a_failed_page(
    view_lake: ViewLake, client: TestClient
) -> None:
    repo = view_lake.repo
    damaged = "000000000000-abcdef"
    store = open_object_store(repo.storage_namespace)
    store.put(f"{files.RUNS_PREFIX}{damaged}/{files.SUMMARY}", b"{not json")
    table = get(client, f"/repositories/{repo.name}/gc").tables["gc-runs"]
    assert f"{damaged} unreadable" in table
    assert "has a damaged summary" in table
    assert view_lake.gc_run_id in table
    page = get(client, f"/repositories/{repo.name}/gc/{damaged}/summary.json", status=500)
    assert f"GC run '{damaged}' has a damaged summary" in page.text


@pytest.mark.parametrize(
    "counts",
    [
        {"candidates": {"objects": "many"}},
        {"deleted": {"bytes": None}},
        {"candidates": "all"},
        [3, 3_072],
    ],
)
def test_a_summary_whose_figures_are_not_figures_is_named_not_a_failed_page(
    view_lake: ViewLake, client: TestClient, counts: Any
) -> None:
    repo = view_lake.repo
    damaged = "000000000000-abcdef"
    store = open_object_store(repo.storage_namespace)
    summary = {"run_id": damaged, "status": "marked", "counts": counts}
    store.put(f"{files.RUNS_PREFIX}{damaged}/{files.SUMMARY}", json.dumps(summary).encode())
    table = get(client, f"/repositories/{repo.name}/gc").tables["gc-runs"]
    assert f"{damaged} unreadable" in table
    assert f"GC run '{damaged}' has a damaged summary" in table
    assert view_lake.gc_run_id in table


def test_the_gc_page_lists_runs_folders_and_reads_their_files_by_key(
    view_lake: ViewLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run writes thousands of candidates and state files: the page lists the runs' folders
    only, then reads each summary and looks up each report by key."""
    repo, run_id = view_lake.repo, view_lake.gc_run_id
    store = open_object_store(repo.storage_namespace)
    unfinished, without_report = "000000000000-000001", "000000000000-000002"
    store.put(f"{files.set_prefix(unfinished, files.CANDIDATES)}/{files.part_name(0)}", b"x")
    summary = {"run_id": without_report, "status": "marked", "mode": "clean"}
    store.put(files.run_prefix(without_report) + files.SUMMARY, json.dumps(summary).encode())
    listed: list[str] = []
    list_objects = type(store).list_objects

    def listing(self: Any, prefix: str = "") -> Any:
        listed.append(prefix)
        return list_objects(self, prefix)

    monkeypatch.setattr(type(store), "list_objects", listing)
    page = get(client, f"/repositories/{repo.name}/gc")
    table = page.tables["gc-runs"]
    assert not [prefix for prefix in listed if prefix.startswith(files.RUNS_PREFIX)]
    assert unfinished not in table
    assert f"{without_report} clean marked —" in table
    assert without_report not in page.links
    assert page.links[run_id] == f"/repositories/{repo.name}/gc/{run_id}/report.html"


def test_a_namespace_without_gc_runs_says_how_to_make_one(
    lake_conn: LakeConnection, client: TestClient
) -> None:
    repo = lake_conn.create_repository()
    page = get(client, f"/repositories/{repo.name}/gc")
    assert f"branchwater gc run {repo.name} --dry-run" in page.text


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/repositories/no-such-repo", "no-such-repo"),
        ("/repositories/Not_A_Name", "Not_A_Name"),
        ("/repositories/{repo}/log/no-such-branch", "no-such-branch"),
        ("/repositories/{repo}/commits/0123456789ab", "0123456789ab"),
        ("/repositories/{repo}/commits/zzz", "zzz"),
        ("/repositories/{repo}/log/main?after=0123456789ab", "0123456789ab"),
        ("/repositories/no-such-repo/gc", "no-such-repo"),
        ("/repositories/{repo}/gc/000000000000-000000/report.html", "000000000000-000000"),
        ("/repositories/{repo}/gc/not-a-run/report.html", "not a GC run id"),
        ("/repositories/{repo}/gc/not-a-run/summary.json", "not a GC run id"),
        ("/no/such/page", "Not Found"),
    ],
)
def test_unknown_names_are_a_404_page_with_a_readable_message(
    view_lake: ViewLake, client: TestClient, path: str, message: str
) -> None:
    page = get(client, path.format(repo=view_lake.repo.name), status=404)
    assert page.text.startswith("Not found")
    assert message in page.text
    assert page.links["All repositories"] == "/"


def test_an_unexpected_error_is_a_500_page_that_runs_no_scripts_either(
    view_lake: ViewLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starlette serves the unexpected-error page from outside the app's middleware."""

    def failing(*args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(view.history, "list_runs", failing)
    access = LakeAccess()
    with TestClient(view.create_app(access), raise_server_exceptions=False) as client:
        response = client.get(f"/repositories/{view_lake.repo.name}/gc")
    access.close()
    assert response.status_code == 500
    assert "RuntimeError: the API server's log has the details" in Page(response.text).text
    assert "Traceback" not in response.text
    assert response.headers["content-security-policy"] == view.CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'self'" in response.headers["content-security-policy"]


def test_an_unusable_connection_is_a_503_page_and_the_next_request_retries(
    lake_conn: LakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_connection(monkeypatch, "bw_view", "branchwater")
    access = LakeAccess("bw_view")
    with TestClient(view.create_app(access)) as client:
        page = get(client, "/", status=503)
        assert "The lake cannot be reached" in page.text
        assert "has no KV URL" in page.text
        set_connection(monkeypatch, "bw_view", "branchwater", password=lake_conn.kv_url)
        repo = lake_conn.create_repository()
        assert repo.name in get(client, "/").tables["repositories"]
    access.close()


def test_the_lake_is_opened_by_the_first_page_not_by_the_app(
    lake_conn: LakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__BRANCHWATER__UI_CONN_ID", "bw_later")
    access = LakeAccess()
    view.create_app(access)  # no connection named bw_later exists yet: nothing is read
    set_connection(monkeypatch, "bw_later", "branchwater", password=lake_conn.kv_url)
    repo = lake_conn.create_repository()
    assert [r.name for r in access.lake().repositories()] == [repo.name]
    access.close()


def test_extra_links_open_the_commits_page_by_default(
    view_lake: ViewLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a template of its own, a connection's commit links point at this view,
    under the API server's base URL."""
    base_url = "https://airflow.example.com/prefix"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", base_url)
    set_connection(monkeypatch, "bw_default_link", "branchwater", password=view_lake.conn.kv_url)
    repo, feature = view_lake.repo, view_lake.feature
    url = BranchwaterHook("bw_default_link").commit_url(repo.name, BRANCH, feature.id)
    assert url.startswith(f"{base_url}{URL_PREFIX}/")
    path = urlsplit(url)
    local = path.path.removeprefix(urlsplit(base_url).path + URL_PREFIX) + "?" + path.query
    page = get(client, local)
    assert feature.id in page.tables["commit"]
    assert f"Branch {BRANCH}" in page.tables["commit"]


def test_the_plugin_serves_the_app_and_links_it_from_the_ui() -> None:
    from importlib.metadata import entry_points

    from airflow.plugins_manager import is_valid_plugin

    (entry,) = [e for e in entry_points(group="airflow.plugins") if e.name == "branchwater"]
    plugin = entry.load()
    assert is_valid_plugin(plugin)
    (served,) = plugin.fastapi_apps
    assert served["url_prefix"] == URL_PREFIX
    assert served["app"].state.lake_access._hook is None
    (nav,) = plugin.external_views
    assert nav["href"] == "branchwater/"
    assert nav["destination"] == "nav"


def test_a_repository_page_uses_the_lake_of_the_connection(
    view_lake: ViewLake, client: TestClient
) -> None:
    """The page is the lake's own data: a commit made meanwhile shows on the next request."""
    repo = view_lake.repo
    with Lake.connect(view_lake.conn.kv_url) as lake:
        main = lake.repository(repo.name).branch("main")
        main.upload("later.csv", b"later")
        later = main.commit("Made meanwhile")
    page = get(client, f"/repositories/{repo.name}")
    assert f"main (default) {later.id[:12]} Made meanwhile" in page.tables["branches"]


@pytest.fixture
def auth_manager(airflow_home: Path) -> Any:
    """Airflow's auth manager as the API server sets it up (the simple one by default); it
    checks tokens against the metadata DB's revoked ones."""
    from airflow.api_fastapi.app import init_auth_manager

    return init_auth_manager()


@pytest.mark.slow
@pytest.mark.airflow
def test_served_by_airflow_the_view_asks_airflow_who_the_user_is(
    view_lake: ViewLake, auth_manager: Any
) -> None:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    access = LakeAccess()
    app = view.create_app(access, airflow_login=True)
    with TestClient(app, follow_redirects=False) as client:
        for cookies in ({}, {"_token": "not-a-token"}):
            client.cookies.clear()
            client.cookies.update(cookies)
            response = client.get(f"/repositories/{view_lake.repo.name}")
            assert response.status_code == 303
            assert response.headers["location"].endswith(
                f"login?next=http%3A%2F%2Ftestserver%2Frepositories%2F{view_lake.repo.name}"
            )
        viewer = auth_manager.generate_jwt(SimpleAuthManagerUser(username="v", role="viewer"))
        client.cookies.set("_token", viewer)
        page = get(client, "/")
        assert view_lake.repo.name in page.tables["repositories"]
        nobody = auth_manager.generate_jwt(SimpleAuthManagerUser(username="n", role=None))
        response = client.get("/", headers={"Authorization": f"Bearer {nobody}"})
        assert response.status_code == 403
        assert "may not see plugins' views" in Page(response.text).text
    access.close()
