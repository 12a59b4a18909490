"""The view's object browser through FastAPI's test client, on a real lake (SQLite and local
files): folders and objects at a branch, a tag and a commit, paging, the object page's entry
and last change, bounded Parquet and CSV previews, and hostile refs and paths from the URL."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from branchwater.engine import Commit, Repository, human_size
from branchwater.plugin.ui import browser
from tests.plugin.conftest import LakeConnection
from tests.plugin.ui.conftest import Page, get

BRANCH = "feature/orders"


def parquet(rows: list[dict[str, Any]], row_group_size: int | None = None) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=row_group_size)
    return out.getvalue()


@dataclass(frozen=True)
class BrowseLake:
    repo: Repository
    loaded: Commit
    fixed: Commit


@pytest.fixture
def browse_lake(lake_conn: LakeConnection) -> BrowseLake:
    """`main`: a Parquet table in two partitions, CSVs (one with markup in a cell), other
    objects; a tag on its first commit; a branch with a staged object and a staged delete."""
    repo = lake_conn.create_repository("browse-")
    main = repo.branch("main")
    main.upload(
        "tables/orders/day=1/part-0.parquet",
        parquet([{"id": i, "amount": i * 1.5} for i in range(30)]),
        metadata={"writer": "spark"},
    )
    main.upload("tables/orders/day=2/part-0.parquet", parquet([{"id": 99, "amount": 0.5}]))
    main.upload("raw/orders.csv", b"id,note\n1,<script>alert(1)</script>\n2,plain\n")
    main.upload("raw/notes.txt", b"not a table")
    main.upload("raw/broken.parquet", b"PAR1 but not really")
    main.upload("README", b"hello")
    loaded = main.commit("Load orders")
    repo.tag("v1", loaded.id)
    main.upload("raw/orders.csv", b"id,note\n1,<script>alert(1)</script>\n2,fixed\n")
    fixed = main.commit("Fix a note")
    feature = repo.create_branch(BRANCH, source="main")
    feature.upload("raw/draft.csv", b"id\n7\n")
    feature.delete("README")
    return BrowseLake(repo, loaded, fixed)


def fetched(page: Page) -> float:
    """The bytes a preview says it fetched, as near as its rounded figure says."""
    found = re.search(r"fetched ([0-9.]+) (B|KiB|MiB) from", page.text)
    assert found, page.text
    return float(found[1]) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[found[2]]


def objects_url(repo: Repository, ref: str, prefix: str = "") -> str:
    url = f"/repositories/{repo.name}/objects/{quote(ref, safe='')}"
    return f"{url}?prefix={quote(prefix, safe='')}" if prefix else url


def object_url(repo: Repository, ref: str, path: str) -> str:
    return f"/repositories/{repo.name}/object/{quote(ref, safe='')}?path={quote(path, safe='')}"


def test_the_root_lists_folders_then_objects_with_sizes_and_checksums(
    browse_lake: BrowseLake, client: TestClient
) -> None:
    repo = browse_lake.repo
    readme = repo.branch("main").stat("README")
    page = get(client, objects_url(repo, "main"))
    rows = page.tables["objects"]
    assert rows.startswith(" Name Size Checksum Modified README 5 B " + readme.checksum[:16])
    assert rows.index("README") < rows.index("raw/") < rows.index("tables/")
    assert f"{browse_lake.fixed.id[:12]} Fix a note" in page.tables["ref"]
    assert "uncommitted changes shown" in page.tables["ref"]

    raw = get(client, page.links["raw/"])
    assert "orders.csv" in raw.tables["objects"] and "draft.csv" not in raw.tables["objects"]
    day = get(client, get(client, page.links["tables/"]).links["orders/"])
    assert day.tables["objects"].split() == [
        "Name",
        "Size",
        "Checksum",
        "Modified",
        "day=1/",
        "folder",
        "day=2/",
        "folder",
    ]


def test_a_branch_shows_its_uncommitted_changes_a_tag_and_a_commit_their_own(
    browse_lake: BrowseLake, client: TestClient
) -> None:
    repo = browse_lake.repo
    feature = get(client, objects_url(repo, BRANCH, "raw/")).tables["objects"]
    assert "draft.csv" in feature
    root = get(client, objects_url(repo, BRANCH)).tables["objects"]
    assert "README" not in root
    tag = get(client, objects_url(repo, "v1"))
    assert "README" in tag.tables["objects"]
    assert "uncommitted" not in tag.tables["ref"]
    assert f"{browse_lake.loaded.id[:12]} Load orders" in tag.tables["ref"]
    at_commit = get(client, objects_url(repo, browse_lake.loaded.id[:10], "raw/"))
    assert "orders.csv" in at_commit.tables["objects"]


def test_listings_page_on(
    browse_lake: BrowseLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browser, "PAGE", 2)
    repo = browse_lake.repo
    first = get(client, objects_url(repo, "main"))
    assert "README" in first.tables["objects"] and "raw/" in first.links
    assert "tables/" not in first.links
    second = get(client, first.links["More objects"])
    assert list(second.links).count("tables/") == 1
    assert "More objects" not in second.links
    assert "README" not in second.tables["objects"] and "raw/" not in second.links


def test_a_folder_whose_names_start_with_the_greatest_character_is_one_row(
    lake_conn: LakeConnection, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing skips a folder by starting after `dir/` + U+10FFFF, which names in it
    starting with U+10FFFF sort after: they must not make the folder a row again (page after
    page), nor hide `dir0`, the first key past `dir/`."""
    repo = lake_conn.create_repository("browse-")
    main = repo.branch("main")
    top = "\U0010ffff"
    for key in ("dir/a.csv", f"dir/{top}z.csv", f"dir/{top}{top}y.csv", "dir0", "other.csv"):
        main.upload(key, b"x")
    whole = get(client, objects_url(repo, "main")).tables["objects"].split()
    assert [whole.count(name) for name in ("dir/", "dir0", "other.csv")] == [1, 1, 1]
    monkeypatch.setattr(browser, "PAGE", 1)
    page = get(client, objects_url(repo, "main"))
    rows = [page.tables["objects"].split()[4]]
    while "More objects" in page.links and len(rows) < 5:
        page = get(client, page.links["More objects"])
        rows.append(page.tables["objects"].split()[4])
    assert rows == ["dir/", "dir0", "other.csv"]


def test_an_objects_page_shows_its_entry_last_change_and_a_parquet_preview(
    browse_lake: BrowseLake, client: TestClient
) -> None:
    repo = browse_lake.repo
    path = "tables/orders/day=1/part-0.parquet"
    entry = repo.branch("main").stat(path)
    page = get(client, object_url(repo, "main", path))
    assert entry.checksum in page.tables["object"]
    assert f"{browse_lake.loaded.id[:12]} Load orders" in page.tables["object"]
    assert page.tables["metadata"].split() == ["writer", "spark"]
    assert page.tables["schema"].split() == ["Column", "Type", "id", "int64", "amount", "double"]
    rows = page.tables["rows"].split()
    assert rows[:6] == ["id", "amount", "0", "0.0", "1", "1.5"]
    assert len(rows) == 2 + 2 * browser.PREVIEW_ROWS
    size = human_size(entry.size)
    assert f"fetched {size} from an object of {size}" in page.text


def test_the_last_change_is_the_commit_that_changed_that_path_or_the_staging_area(
    browse_lake: BrowseLake, client: TestClient
) -> None:
    repo = browse_lake.repo
    csv = get(client, object_url(repo, "main", "raw/orders.csv")).tables["object"]
    assert f"{browse_lake.fixed.id[:12]} Fix a note" in csv
    notes = get(client, object_url(repo, "main", "raw/notes.txt")).tables["object"]
    assert "Load orders" in notes
    draft = get(client, object_url(repo, BRANCH, "raw/draft.csv")).tables["object"]
    assert f"uncommitted: staged on branch {BRANCH}" in draft


def test_a_csv_preview_escapes_what_the_object_holds(
    browse_lake: BrowseLake, client: TestClient
) -> None:
    repo = browse_lake.repo
    response = client.get(object_url(repo, "v1", "raw/orders.csv"))
    assert response.status_code == 200
    assert "<script>" not in response.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in response.text
    page = Page(response.text)
    assert page.tables["schema"].split() == ["Column", "Type", "id", "int64", "note", "string"]
    assert page.tables["rows"] == " id note 1 <script>alert(1)</script> 2 plain"


def test_previews_never_read_more_than_their_bound(
    browse_lake: BrowseLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Parquet file whose first row group is larger than the bound shows its schema only;
    a large CSV shows its first rows; neither reads more than the bound."""
    bound = 64 << 10
    monkeypatch.setattr(browser, "PREVIEW_BYTES", bound)
    monkeypatch.setattr(browser, "CSV_BLOCK", 16 << 10)
    main = browse_lake.repo.branch("main")
    blob = [{"id": i, "text": f"{i:08d}" * 64} for i in range(2_000)]
    main.upload("big/one-group.parquet", parquet(blob))
    main.upload(
        "big/orders.csv",
        b"id,text\n" + b"".join(b"%d,%s\n" % (i, b"x" * 500) for i in range(4_000)),
    )

    wide = get(client, object_url(main.repository, "main", "big/one-group.parquet"))
    assert wide.tables["schema"].split() == ["Column", "Type", "id", "int64", "text", "string"]
    assert "rows" not in wide.tables
    beyond = f"rows not shown: they lie beyond the first {human_size(bound)} a preview reads"
    assert beyond in wide.text
    long = get(client, object_url(main.repository, "main", "big/orders.csv"))
    assert long.tables["rows"].split()[:3] == ["id", "text", "0"]
    assert 0 < fetched(wide) <= bound and 0 < fetched(long) <= bound


def test_parquet_rows_that_decode_past_the_bound_are_not_decoded(
    browse_lake: BrowseLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few KiB of Parquet may hold megabytes of zeros: the footer's uncompressed sizes of
    the row groups the first rows lie in (here a small group, then a large one) decide."""
    bound = 1 << 20
    monkeypatch.setattr(browser, "PREVIEW_DECODED", bound)
    main = browse_lake.repo.branch("main")
    rows = [{"id": 0, "blob": b"small"}, {"id": 1, "blob": bytes(2 * bound)}]
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=1, compression="zstd")
    assert len(out.getvalue()) < bound // 8
    main.upload("big/bomb.parquet", out.getvalue())

    page = get(client, object_url(main.repository, "main", "big/bomb.parquet"))
    assert page.tables["schema"].split() == ["Column", "Type", "id", "int64", "blob", "binary"]
    assert "rows" not in page.tables
    assert "rows not shown: too large to preview" in page.text
    assert f"(a preview decodes at most {human_size(bound)})" in page.text


def test_long_cells_are_cut_in_arrow_before_they_become_python_values(
    browse_lake: BrowseLake, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    longest = 0
    cell = browser._cell

    def measured(value: Any) -> str:
        nonlocal longest
        longest = max(longest, len(value) if isinstance(value, str | bytes) else 0)
        return cell(value)

    monkeypatch.setattr(browser, "_cell", measured)
    main = browse_lake.repo.branch("main")
    text = "é" * 100_000
    main.upload("big/long.parquet", parquet([{"text": text, "blob": b"\xab" * 100_000}]))
    main.upload("big/long.csv", b"text\n" + text.encode() + b"\n")

    cells = get(client, object_url(main.repository, "main", "big/long.parquet")).tables["rows"]
    limit = browser.CELL_CHARS
    assert cells.split() == ["text", "blob", "é" * (limit - 1) + "…", "ab" * 99 + "a…"]
    csv = get(client, object_url(main.repository, "main", "big/long.csv")).tables["rows"]
    assert csv.split() == ["text", "é" * (limit - 1) + "…"]
    assert 0 < longest <= limit + 1


def test_objects_without_a_preview_say_why(browse_lake: BrowseLake, client: TestClient) -> None:
    repo = browse_lake.repo
    text = get(client, object_url(repo, "main", "raw/notes.txt")).text
    assert "Previews show Parquet and CSV objects." in text
    broken = get(client, object_url(repo, "main", "raw/broken.parquet")).text
    assert "cannot read it as Parquet: ArrowInvalid" in broken


@pytest.mark.parametrize(
    ("ref", "path", "message"),
    [
        ("nope", "README", "ref 'nope' not found"),
        ("main", "raw/none.csv", "raw/none.csv"),
        ("main", "raw/", "names no object"),
        ("main", "", "names no object"),
        ("../../etc", "README", "not found"),
        ("main\x00x", "README", ""),
        ("main", "raw/\x00.csv", ""),
        ("<script>x</script>", "README", "<script>x</script>"),
        ("main", "<img src=x onerror=alert(1)>", "<img src=x onerror=alert(1)>"),
    ],
)
def test_hostile_refs_and_paths_are_4xx_pages(
    browse_lake: BrowseLake, client: TestClient, ref: str, path: str, message: str
) -> None:
    repo = browse_lake.repo
    for url in (object_url(repo, ref, path), objects_url(repo, ref, f"{path}nothing-here/")):
        response = client.get(url)
        assert 400 <= response.status_code < 500, (url, response.status_code)
        assert "Traceback" not in response.text
        assert "<script>x" not in response.text and "<img src" not in response.text
    assert message in Page(client.get(object_url(repo, ref, path)).text).text


def test_links_lead_from_the_repository_to_objects_and_back(
    browse_lake: BrowseLake, client: TestClient
) -> None:
    repo = browse_lake.repo
    log = get(client, f"/repositories/{repo.name}/log/{quote(BRANCH, safe='')}")
    assert log.links[f"Objects at {BRANCH}"] == objects_url(repo, BRANCH)
    raw = get(client, get(client, log.links[f"Objects at {BRANCH}"]).links["raw/"])
    draft = get(client, raw.links["draft.csv"])
    assert draft.tables["rows"].split() == ["id", "7"]
    assert get(client, draft.links["raw"]).tables["objects"] == raw.tables["objects"]
    commit = get(client, draft.links[browse_lake.fixed.id[:12]])
    assert "README" in get(client, commit.links["browse at this commit"]).tables["objects"]


def test_an_object_rewritten_in_storage_is_named_not_previewed(
    browse_lake: BrowseLake, client: TestClient
) -> None:
    """The small object is fetched whole, so its checksum is checked before any row shows."""
    repo = browse_lake.repo
    entry = repo.ref("v1").stat("raw/orders.csv")
    physical = Path(unquote(urlsplit(repo.storage_namespace).path)) / entry.address
    physical.write_bytes(physical.read_bytes().replace(b"plain", b"PLAIN"))
    page = get(client, object_url(repo, "v1", "raw/orders.csv"))
    assert "rows" not in page.tables
    assert "cannot preview: object 'raw/orders.csv'" in page.text
    assert "truncated or rewritten in storage" in page.text
