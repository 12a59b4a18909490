"""A lake with something on every page of the Branchwater view, behind `branchwater_default`.

Its GC run is saved by the GC job's own writers (summary and report), without running Spark:
the view reads what the job writes, and the job's tests cover how it decides. `client`
serves the view through FastAPI's test client; `get` reads a page as a `Page`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import Any

import pytest
from fastapi.testclient import TestClient

from branchwater.engine import Commit, Repository
from tests.plugin.conftest import LakeConnection

BRANCH = "feature/orders"
"""A branch name with a slash, which the view's links must carry through."""


@dataclass(frozen=True)
class ViewLake:
    conn: LakeConnection
    repo: Repository
    first: Commit
    second: Commit
    feature: Commit
    gc_run_id: str


@pytest.fixture
def view_lake(lake_conn: LakeConnection) -> ViewLake:
    return fill_lake(lake_conn)


def fill_lake(lake_conn: LakeConnection) -> ViewLake:
    """A repository with history on two branches, a tag, a compacted branch with staged
    changes, and a saved GC run."""
    repo = lake_conn.create_repository("sales-")
    main = repo.branch("main")
    main.upload("orders/2026-11-01.csv", b"id,amount\n1,10\n")
    main.upload("orders/old.csv", b"id\n0\n")
    first = main.commit("Load November", metadata={"airflow.dag_id": "daily_orders"})
    main.upload("orders/2026-11-02.csv", b"id,amount\n2,20\n")
    main.upload("orders/2026-11-01.csv", b"id,amount\n1,11\n")
    main.delete("orders/old.csv")
    second = main.commit("Load the second")
    feature = repo.create_branch(BRANCH, source="main")
    feature.upload("orders/draft.csv", b"draft")
    feature_commit = feature.commit("Draft orders")
    feature.delete("orders/2026-11-02.csv")
    feature.upload("orders/staged.csv", b"staged")
    feature.compact()
    feature.delete("orders/draft.csv")
    repo.tag("v1", first.id)
    run_id = save_gc_run(repo, lake_conn.s3_options)
    return ViewLake(lake_conn, repo, first, second, feature_commit, run_id)


def save_gc_run(repo: Repository, s3_options: dict[str, str]) -> str:
    """A finished dry run's summary and report, as the GC job saves them."""
    from branchwater.engine.gc.runs import files, report
    from branchwater.engine.gc.runs.storage import Namespace
    from tests.helpers.gc import run_summary

    run_id, _ = repo.prepare_uncommitted_for_gc()
    now = datetime.now(UTC).isoformat()
    summary = run_summary(
        run_id=run_id,
        repository=repo.name,
        repository_id="test",
        storage_namespace=repo.storage_namespace,
        started_at=now,
        prepare_started_at=now,
        cutoff=now,
        default_min_age_seconds=6 * 3600.0,
        counts={"candidates": files.Volume(3, 3_072), "listed": files.Volume(9, 9_000)},
        gate_success=True,
    )
    ns = Namespace.of(repo.storage_namespace, s3_options)
    files.write_summary(ns, summary)
    ns.store.put(files.run_prefix(run_id) + files.REPORT, report.render(summary, None).encode())
    return run_id


class Page(HTMLParser):
    """A page's text, its links by text, and the text of its tables by id."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.links: dict[str, str] = {}
        self.tables: dict[str, str] = {}
        self.chunks: list[str] = []
        self._href: str | None = None
        self._table: str | None = None
        self.feed(html)
        self.text = " ".join(" ".join(self.chunks).split())

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "a":
            self._href = values.get("href")
        elif tag == "table" and values.get("id"):
            self._table = values["id"]
            self.tables[self._table] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._href = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)
        if self._href is not None and data.strip():
            self.links.setdefault(data.strip(), self._href)
        if self._table is not None:
            self.tables[self._table] += f" {data.strip()}" if data.strip() else ""


@pytest.fixture
def client(lake_conn: LakeConnection) -> Iterator[TestClient]:
    from branchwater.plugin.ui import app as view
    from branchwater.plugin.ui.lake import LakeAccess

    access = LakeAccess()
    with TestClient(view.create_app(access)) as test_client:
        yield test_client
    access.close()


def get(client: TestClient, url: str, status: int = 200, **kwargs: Any) -> Page:
    response = client.get(url, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "Traceback" not in response.text
    return Page(response.text)
