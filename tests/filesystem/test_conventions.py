"""`branchwater://REPO/REF/PATH` follows fsspec's conventions for an object store (`ls`,
`info`, `find`, `glob`, `open`, `cat`, `put`, `get`, `cp`, `rm`), on SQLite + local files and
on PostgreSQL + SeaweedFS: reads at any ref, branch reads with their uncommitted changes,
writes staged on branches only, and transactions that land once or not at all."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

import fsspec
import pytest

from branchwater.engine import (
    BranchwaterFileSystem,
    ConfigurationError,
    InvalidArgument,
    Lake,
    MergeConflict,
    PathExists,
    ReadOnlyRef,
)
from branchwater.engine.errors import LakeNotFound
from branchwater.engine.graveler.transactions import PREFIX as TRANSACTION_PREFIX
from tests.filesystem.conftest import FsLake, staged
from tests.helpers.servers import unique_name
from tests.helpers.tables import pg_tables

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "a/x.txt": b"x" * 100,
    "a/b/y.txt": b"y-content",
    "a/b/z.txt": b"z-content",
    "c.txt": b"0123456789",
}


@pytest.fixture
def tree(fs_lake: FsLake) -> str:
    """FILES committed on main; returns the commit id."""
    main = fs_lake.repo.branch("main")
    for path, data in FILES.items():
        main.upload(path, data)
    return main.commit("tree").id


def test_the_protocol_is_declared_as_an_fsspec_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["fsspec.specs"]["branchwater"]
    module, _, name = target.partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is BranchwaterFileSystem
    assert fsspec.get_filesystem_class("branchwater") is BranchwaterFileSystem


def test_ls_lists_one_level_of_objects_and_folders(fs_lake: FsLake, tree: str) -> None:
    fs = fs_lake.fs
    assert fs.ls("sales/main", detail=False) == ["sales/main/a", "sales/main/c.txt"]
    assert fs.ls("branchwater://sales/main/a/", detail=False) == [
        "sales/main/a/b",
        "sales/main/a/x.txt",
    ]
    detailed = {info["name"]: info for info in fs.ls(f"sales/{tree}/a/b")}
    assert set(detailed) == {f"sales/{tree}/a/b/y.txt", f"sales/{tree}/a/b/z.txt"}
    assert detailed[f"sales/{tree}/a/b/y.txt"]["size"] == len(FILES["a/b/y.txt"])
    assert [i["type"] for i in fs.ls("sales/main")] == ["directory", "file"]
    assert fs.ls("sales/main/c.txt", detail=False) == ["sales/main/c.txt"]
    assert "sales/main" in fs.ls("sales", detail=False)
    assert "sales" in fs.ls("", detail=False)
    with pytest.raises(FileNotFoundError):
        fs.ls("sales/main/nothing")
    with pytest.raises(FileNotFoundError, match="no-such-branch"):
        fs.ls("sales/no-such-branch")
    with pytest.raises(FileNotFoundError):
        fs.ls("no-such-repo/main")


def test_info_exists_and_kinds(fs_lake: FsLake, tree: str) -> None:
    fs = fs_lake.fs
    entry = fs_lake.repo.ref(tree).stat("a/b/y.txt")
    info = fs.info(f"sales/{tree}/a/b/y.txt")
    assert info["type"] == "file" and info["size"] == entry.size
    assert info["checksum"] == entry.checksum and info["mtime"] == entry.mtime
    assert fs.modified(f"sales/{tree}/a/b/y.txt") == entry.mtime
    assert fs.info("sales/main/a/b") == {"name": "sales/main/a/b", "size": 0, "type": "directory"}
    assert fs.info("sales/main")["type"] == "directory"
    assert fs.isdir("sales/main/a") and not fs.isfile("sales/main/a")
    assert fs.isfile("sales/main/c.txt") and fs.exists("sales/main/c.txt")
    assert not fs.exists("sales/main/a/missing") and not fs.exists("sales/nope/c.txt")
    with pytest.raises(FileNotFoundError):
        fs.info("sales/main/a/missing")
    assert fs.size("sales/main/a/x.txt") == 100
    assert fs.du("sales/main") == sum(len(d) for d in FILES.values())


def test_find_and_glob(fs_lake: FsLake, tree: str) -> None:
    fs = fs_lake.fs
    every = [f"sales/main/{path}" for path in sorted(FILES)]
    assert fs.find("sales/main") == every
    assert fs.find("sales/main/a", maxdepth=1) == ["sales/main/a/x.txt"]
    assert fs.find("sales/main/a", withdirs=True) == [
        "sales/main/a",
        "sales/main/a/b",
        "sales/main/a/b/y.txt",
        "sales/main/a/b/z.txt",
        "sales/main/a/x.txt",
    ]
    assert fs.find("sales/main/c.txt") == ["sales/main/c.txt"]
    assert fs.find("sales/main/nothing") == []
    detail = fs.find("sales/main/a/b", detail=True)
    assert isinstance(detail, dict) and detail["sales/main/a/b/z.txt"]["size"] == 9
    assert fs.glob("sales/main/a/b/*.txt") == ["sales/main/a/b/y.txt", "sales/main/a/b/z.txt"]
    assert fs.glob("sales/main/**/*.txt") == every
    assert fs.glob(f"branchwater://sales/{tree}/*") == [f"sales/{tree}/a", f"sales/{tree}/c.txt"]
    assert fs.walk("sales/main").__next__() == ("sales/main", ["a"], ["c.txt"])


def test_a_read_handle_is_the_engines_file_with_fsspecs_attributes(
    fs_lake: FsLake, tree: str
) -> None:
    """The engine's file as `Ref.open` returns it, not a second buffer over it: `peek` and a
    `readline` served from its buffer, as readers of a local file expect."""
    name = f"sales/{tree}/c.txt"
    with fs_lake.fs.open(name) as f, fs_lake.repo.ref(tree).open("c.txt") as engine_file:
        assert (f.path, f.size) == (name, len(FILES["c.txt"]))
        assert isinstance(f, io.BufferedReader) and isinstance(engine_file, io.BufferedReader)
        assert type(f) is type(engine_file) and type(f.raw) is type(engine_file.raw)
        assert f.peek(1)[:1] == b"0"
        assert f.readline() == b"0123456789"


def test_open_and_cat_read_ranges(fs_lake: FsLake, tree: str) -> None:
    fs = fs_lake.fs
    with fs.open("sales/main/c.txt", "rb") as f:
        assert f.size == 10
        f.seek(3)
        assert f.read(4) == b"3456"
        f.seek(-2, 2)
        assert f.read() == b"89"
    with fs.open("sales/main/c.txt", "r") as text:
        assert text.read() == "0123456789"
    assert fs.cat_file("sales/main/c.txt", start=2, end=5) == b"234"
    assert fs.cat_file("sales/main/c.txt", start=-3) == b"789"
    assert fs.cat_file("sales/main/c.txt", end=-8) == b"01"
    assert fs.cat_file("sales/main/c.txt", start=20) == b""
    assert fs.cat("sales/main/a/b/*") == {
        "sales/main/a/b/y.txt": b"y-content",
        "sales/main/a/b/z.txt": b"z-content",
    }
    assert fs.read_block("sales/main/c.txt", 4, 3) == b"456"
    with pytest.raises(FileNotFoundError):
        fs.cat_file("sales/main/missing")
    with pytest.raises(IsADirectoryError):
        fs.open("sales/main")
    for read in (fs.cat_file, fs.open, fs.ukey):
        with pytest.raises(IsADirectoryError, match="a folder, not an object") as raised:
            read("sales/main/a/b")
        assert raised.value.filename == "branchwater://sales/main/a/b"


def test_branch_reads_see_uncommitted_changes_commit_ids_do_not(fs_lake: FsLake, tree: str) -> None:
    fs, main = fs_lake.fs, fs_lake.repo.branch("main")
    main.upload("c.txt", b"changed")
    main.delete("a/x.txt")
    assert fs.cat("sales/main/c.txt") == b"changed"
    assert not fs.exists("sales/main/a/x.txt")
    assert fs.cat(f"sales/{tree}/c.txt") == FILES["c.txt"]
    assert fs.cat("sales/main~0/c.txt") == FILES["c.txt"]
    fs_lake.repo.tag("v1", tree)
    assert fs.cat("sales/v1/a/x.txt") == FILES["a/x.txt"]


def test_ukey_and_checksum_are_the_content_identity(fs_lake: FsLake, tree: str) -> None:
    fs, main = fs_lake.fs, fs_lake.repo.branch("main")
    main.upload("copy-of-y.txt", FILES["a/b/y.txt"])
    assert fs.ukey("sales/main/copy-of-y.txt") == fs.ukey("sales/main/a/b/y.txt")
    assert fs.checksum("sales/main/copy-of-y.txt") == fs.checksum("sales/main/a/b/y.txt")
    assert fs.ukey("sales/main/a/b/z.txt") != fs.ukey("sales/main/a/b/y.txt")
    at_commit = fs.ukey(f"sales/{tree}/a/b/y.txt")
    main.upload("a/b/y.txt", b"rewritten")
    assert fs.ukey("sales/main/a/b/y.txt") != at_commit
    assert fs.ukey(f"sales/{tree}/a/b/y.txt") == at_commit


def test_writes_stage_on_the_branch(fs_lake: FsLake, tree: str, tmp_path: Path) -> None:
    fs = fs_lake.fs
    with fs.open("sales/main/new/opened.bin", "wb") as f:
        f.write(b"opened ")
        f.write(b"and written")
    fs.pipe("sales/main/new/piped.bin", b"piped")
    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "one.txt").write_bytes(b"one")
    (local / "sub" / "two.txt").write_bytes(b"two")
    fs.put(str(local), "sales/main/uploaded", recursive=True)
    fs.put_file(str(local / "one.txt"), "sales/main/single.txt")
    fs.cp("sales/main/c.txt", "sales/main/copied/c.txt")
    fs_lake.repo.tag("v1", tree)
    fs.cp("sales/v1/a/x.txt", "sales/main/from-tag.txt")
    fs.rm("sales/main/a/b", recursive=True)
    fs.rm("sales/main/a/x.txt")
    assert staged(fs_lake) == {
        "a/b/y.txt": "removed",
        "a/b/z.txt": "removed",
        "a/x.txt": "removed",
        "copied/c.txt": "added",
        "from-tag.txt": "added",
        "new/opened.bin": "added",
        "new/piped.bin": "added",
        "single.txt": "added",
        "uploaded/one.txt": "added",
        "uploaded/sub/two.txt": "added",
    }
    main = fs_lake.repo.branch("main")
    assert main.commit_id == tree
    assert main.read("new/opened.bin") == b"opened and written"
    assert main.read("uploaded/sub/two.txt") == b"two"
    assert main.read("copied/c.txt") == FILES["c.txt"]
    assert main.read("from-tag.txt") == FILES["a/x.txt"]
    fetched = tmp_path / "fetched"
    fs.get("sales/main/uploaded", str(fetched), recursive=True)
    assert (fetched / "sub" / "two.txt").read_bytes() == b"two"
    fs.get_file("sales/main/new/piped.bin", str(tmp_path / "piped"))
    assert (tmp_path / "piped").read_bytes() == b"piped"
    with pytest.raises(FileExistsError):
        fs.open("sales/main/c.txt", "xb")
    with pytest.raises(FileNotFoundError):
        fs.rm_file("sales/main/never-there.txt")
    with pytest.raises(FileNotFoundError):
        fs.rm("sales/main/never-there/", recursive=True)


def test_exclusive_creations_of_one_path_leave_one_winner(fs_lake: FsLake, tree: str) -> None:
    """Two `"xb"` files opened before either closes: the first closed creates the path, the
    second is refused when it closes (`PathExists`, a `FileExistsError`) and stages nothing;
    `pipe` and `put` with `mode="create"` are refused alike."""
    fs = fs_lake.fs
    first = fs.open("sales/main/lock", "xb")
    second = fs.open("sales/main/lock", "xb")
    first.write(b"first")
    second.write(b"second")
    first.close()
    with pytest.raises(PathExists):
        second.close()
    assert fs.cat_file("sales/main/lock") == b"first"
    with pytest.raises(FileExistsError):
        fs.pipe_file("sales/main/lock", b"piped", mode="create")
    with pytest.raises(FileExistsError):
        fs.put_file(__file__, "sales/main/lock", mode="create")
    fs.pipe_file("sales/main/fresh", b"piped", mode="create")
    assert staged(fs_lake) == {"lock": "added", "fresh": "added"}


def test_a_write_cut_short_uploads_nothing(fs_lake: FsLake, tree: str) -> None:
    with pytest.raises(RuntimeError), fs_lake.fs.open("sales/main/half.bin", "wb") as f:
        f.write(b"half")
        raise RuntimeError("the task failed mid-write")
    assert staged(fs_lake) == {}


@pytest.mark.parametrize("ref", ["v1", "commit", "main~1"])
def test_writes_at_a_ref_that_is_not_a_branch_are_refused(
    fs_lake: FsLake, tree: str, ref: str
) -> None:
    fs, repo = fs_lake.fs, fs_lake.repo
    repo.tag("v1", tree)
    repo.branch("main").upload("more.txt", b"more")
    repo.branch("main").commit("more")
    name = tree if ref == "commit" else ref
    writes = [
        lambda: fs.pipe(f"sales/{name}/x.txt", b"x"),
        lambda: fs.open(f"sales/{name}/x.txt", "wb"),
        lambda: fs.rm(f"sales/{name}/c.txt"),
        lambda: fs.cp("sales/main/c.txt", f"sales/{name}/c2.txt"),
    ]
    for write in writes:
        with pytest.raises(ReadOnlyRef, match=f"'{name}' of repository 'sales' is not a branch"):
            write()
    assert isinstance(ReadOnlyRef("x"), PermissionError)
    assert staged(fs_lake) == {}
    with pytest.raises(FileNotFoundError, match="no-such"):
        fs.pipe("sales/no-such/x.txt", b"x")
    with pytest.raises(InvalidArgument):
        fs.pipe("sales/main", b"x")


def test_a_transaction_commits_once_and_reads_its_own_writes(fs_lake: FsLake, tree: str) -> None:
    fs, repo = fs_lake.fs, fs_lake.repo
    with fs.transaction as tx:
        tx.message = "load orders"
        tx.metadata = {"airflow.dag_id": "orders"}
        fs.pipe("sales/main/orders/1.csv", b"id\n1\n")
        with fs.open("sales/main/orders/2.csv", "wb") as f:
            f.write(b"id\n2\n")
        fs.rm("sales/main/c.txt")
        assert fs.cat("sales/main/orders/1.csv") == b"id\n1\n"
        assert not fs.exists("sales/main/c.txt")
        assert repo.branch("main").commit_id == tree
        assert staged(fs_lake) == {}
    head = repo.branch("main").head()
    assert [landed.commit.id for landed in tx.landed] == [head.id]
    assert head.parents == (tree,)
    assert head.message == "load orders" and head.metadata["airflow.dag_id"] == "orders"
    assert repo.branch("main").read("orders/2.csv") == b"id\n2\n"
    assert staged(fs_lake) == {}
    assert [b.name for b in repo.branches()] == ["main"]
    assert not fs._intrans


def test_a_failed_transaction_commits_and_stages_nothing(fs_lake: FsLake, tree: str) -> None:
    fs, repo = fs_lake.fs, fs_lake.repo
    with pytest.raises(RuntimeError), fs.transaction:
        fs.pipe("sales/main/orders/1.csv", b"id\n1\n")
        fs.rm("sales/main/c.txt")
        raise RuntimeError("validation failed")
    assert repo.branch("main").commit_id == tree
    assert staged(fs_lake) == {}
    assert [b.name for b in repo.branches()] == ["main"]
    assert fs.cat("sales/main/c.txt") == FILES["c.txt"]
    fs.pipe("sales/main/after.txt", b"outside any transaction")
    assert staged(fs_lake) == {"after.txt": "added"}


def test_a_transaction_that_writes_nothing_commits_nothing(fs_lake: FsLake, tree: str) -> None:
    with fs_lake.fs.transaction as tx:
        assert fs_lake.fs.cat("sales/main/c.txt") == FILES["c.txt"]
    assert tx.landed == [] and fs_lake.repo.branch("main").commit_id == tree


def test_changes_staged_on_the_branch_stay_staged_above_the_transaction(
    fs_lake: FsLake, tree: str
) -> None:
    """Another writer's uncommitted changes are not the transaction's: they stay staged; one
    at a path the transaction also wrote, to other content, fails it with nothing landed."""
    fs, main = fs_lake.fs, fs_lake.repo.branch("main")
    main.upload("pending.txt", b"someone else's")
    with fs.transaction as tx:
        fs.pipe("sales/main/mine.txt", b"mine")
    assert main.head().id == tx.landed[0].commit.id and main.head().parents == (tree,)
    assert [e.path for e in fs_lake.repo.ref(main.commit_id).list()] == [*sorted(FILES), "mine.txt"]
    assert staged(fs_lake) == {"pending.txt": "added"}
    before = main.commit_id
    with pytest.raises(MergeConflict, match=r"1 path\(s\): c\.txt"), fs.transaction:
        fs.pipe("sales/main/c.txt", b"mine")
        main.upload("c.txt", b"theirs, staged")
    assert main.commit_id == before and main.read("c.txt") == b"theirs, staged"
    assert staged(fs_lake) == {"pending.txt": "added", "c.txt": "changed"}
    assert [b.name for b in fs_lake.repo.branches()] == ["main"]


def test_a_branch_moved_during_the_transaction_gets_one_commit_on_its_head(
    fs_lake: FsLake, tree: str
) -> None:
    """The worst interleavings, forced: another writer commits to the branch between the
    transaction's first write and its end; to other paths (merged into one commit on the
    new HEAD), then to the same one (a conflict: nothing lands, the transaction's branch is
    gone)."""
    fs, repo = fs_lake.fs, fs_lake.repo
    main = repo.branch("main")
    with fs.transaction as tx:
        fs.pipe("sales/main/mine.txt", b"mine")
        main.upload("theirs.txt", b"theirs")
        theirs = main.commit("concurrent").id
    head = main.head()
    assert head.id == tx.landed[0].commit.id
    assert head.parents == (theirs,)
    assert main.read("mine.txt") == b"mine" and main.read("theirs.txt") == b"theirs"
    before = main.commit_id
    with pytest.raises(MergeConflict), fs.transaction:
        fs.pipe("sales/main/c.txt", b"mine")
        main.upload("c.txt", b"theirs")
        main.commit("concurrent, same path")
    assert main.read("c.txt") == b"theirs"
    assert main.head().parents == (before,)
    assert not [b for b in repo.branches() if b.name.startswith(TRANSACTION_PREFIX)]


def test_bad_transaction_metadata_lands_nothing_and_leaves_no_branch(
    fs_lake: FsLake, tree: str
) -> None:
    fs, repo = fs_lake.fs, fs_lake.repo
    with pytest.raises(InvalidArgument, match="metadata"), fs.transaction as tx:
        fs.pipe("sales/main/mine.txt", b"mine")
        tx.metadata = {"key": 1}
    assert repo.branch("main").commit_id == tree and staged(fs_lake) == {}
    assert [b.name for b in repo.branches()] == ["main"]


def test_hostile_input_is_a_typed_error_and_stages_nothing(fs_lake: FsLake, tree: str) -> None:
    fs = fs_lake.fs
    with pytest.raises(InvalidArgument, match="NUL"):
        fs.pipe("sales/main/bad\x00name", b"x")
    with pytest.raises(InvalidArgument, match="bytes"):
        fs.pipe("sales/main/text.txt", "not bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="'ab'"):
        fs.open("sales/main/c.txt", "ab")
    with pytest.raises(InvalidArgument, match="recursive must be True or False"):
        fs.rm("sales/main/a", recursive="False")
    with pytest.raises(InvalidArgument, match="mode 'append' is not supported"):
        fs.pipe_file("sales/main/c.txt", b"x", mode="append")
    with pytest.raises(InvalidArgument, match="start must be a byte offset, not '1'"):
        fs.cat_file("sales/main/c.txt", start="1")
    for path in (5, None, b"sales/main/c.txt"):
        with pytest.raises(InvalidArgument, match="a branchwater path is text"):
            fs.info(path)
    with pytest.raises(InvalidArgument, match="either lake= or kv_url="):
        BranchwaterFileSystem(kv_url="memory://", lake=fs_lake.lake, skip_instance_cache=True)
    with pytest.raises(InvalidArgument, match="lake= takes an open Lake, not str"):
        BranchwaterFileSystem(lake="memory://", skip_instance_cache=True)
    with pytest.raises(ConfigurationError, match="S3 options must be a dict of settings"):
        BranchwaterFileSystem(kv_url="memory://", s3_options="x", skip_instance_cache=True)
    with pytest.raises(FileNotFoundError):
        fs.cat("sales/main/../c.txt")
    for missing in ("sales/main/a\nb", "sales/no\x1bsuch/c.txt", "no-such/main/c\x00.txt"):
        with pytest.raises(FileNotFoundError) as raised:
            fs.info(missing)
        assert str(raised.value).isprintable(), raised.value
        assert raised.value.filename.startswith("branchwater://")
    assert staged(fs_lake) == {}


def test_a_missing_sqlite_lake_is_refused_not_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through fsspec with no lake named (or a mistyped one), reads would otherwise open a new
    empty lake in the working directory and report every path missing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BRANCHWATER_KV_URL", raising=False)
    typo = tmp_path / "typo.db"
    with pytest.raises(ConfigurationError, match=f"no lake at '{typo}' \\(from kv_url=\\)"):
        fsspec.open(
            "branchwater://sales/main/a.csv", kv_url=f"sqlite:///{typo}", skip_instance_cache=True
        ).open()
    with pytest.raises(
        ConfigurationError,
        match=r"\(the default\): the file does not exist; pass kv_url=.*BRANCHWATER_KV_URL",
    ):
        BranchwaterFileSystem(skip_instance_cache=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.postgres
def test_a_mistyped_postgres_table_is_refused_not_created(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a SQLite file: the table named is not made, and the message masks the password;
    once a lake is there, the same URL opens it."""
    table = unique_name("fs_")
    url = f"{postgres_url}?table={table}"
    with_secret = url.replace("postgres@", "postgres:s3cr3t@", 1)
    masked = url.replace("postgres@", "postgres:***@", 1)
    with pytest.raises(ConfigurationError) as caught:
        fsspec.open(
            "branchwater://sales/main/a.csv", kv_url=with_secret, skip_instance_cache=True
        ).open()
    assert str(caught.value) == (
        f"no lake at {masked} (from kv_url=): table '{table}' does not exist; check the URL"
    )
    assert isinstance(caught.value.__cause__, LakeNotFound)
    monkeypatch.setenv("BRANCHWATER_KV_URL", url)
    with pytest.raises(ConfigurationError, match=r"\(from \$BRANCHWATER_KV_URL\): table"):
        BranchwaterFileSystem(skip_instance_cache=True)
    assert pg_tables(postgres_url, table) == set()
    with Lake.connect(url) as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/sales")
        repo.branch("main").upload("a.csv", b"a,b\n")
    try:
        fs = BranchwaterFileSystem(skip_instance_cache=True)
        assert fs.cat("sales/main/a.csv") == b"a,b\n"
    finally:
        BranchwaterFileSystem.clear_instance_cache()


def test_recursive_copy_and_move_within_a_branch(fs_lake: FsLake, tree: str) -> None:
    fs = fs_lake.fs
    fs.cp("sales/main/a", "sales/main/copy", recursive=True)
    assert fs.find("sales/main/copy") == [
        "sales/main/copy/b/y.txt",
        "sales/main/copy/b/z.txt",
        "sales/main/copy/x.txt",
    ]
    fs.mv("sales/main/copy/x.txt", "sales/main/moved.txt")
    assert fs.cat("sales/main/moved.txt") == FILES["a/x.txt"]
    assert not fs.exists("sales/main/copy/x.txt")
    assert fs.cat(f"sales/{tree}/a/x.txt") == FILES["a/x.txt"]


def test_rm_of_a_name_holding_glob_characters_deletes_that_object(fs_lake: FsLake) -> None:
    """`cat_file` reads `report?.csv` literally, so `rm` of it must not delete `report1.csv`
    (nor `data[1].csv` become `data1.csv`); a path naming nothing is still a pattern."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    names = ["report?.csv", "report1.csv", "reportX.csv", "data[1].csv", "data1.csv"]
    for name in [*names, "dir[1]/x.csv", "dir1/y.csv"]:
        main.upload(name, b"x")
    main.commit("names with glob characters")
    fs.rm("sales/main/report?.csv")
    fs.rm(["sales/main/data[1].csv"])
    fs.rm("sales/main/dir[1]", recursive=True)
    assert staged(fs_lake) == {
        "report?.csv": "removed",
        "data[1].csv": "removed",
        "dir[1]/x.csv": "removed",
    }
    fs.rm("sales/main/report[1X].csv")
    assert staged(fs_lake)["report1.csv"] == staged(fs_lake)["reportX.csv"] == "removed"
    with pytest.raises(FileNotFoundError):
        fs.rm("sales/main/nothing*.csv")


def test_a_path_ending_in_a_slash_names_a_folder_never_an_object(fs_lake: FsLake) -> None:
    """The engine stores `obj` and `obj/` as two objects; fsspec strips a trailing `/`, so
    without a refusal `obj/` would read, write or delete `obj`."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    for key in ("obj", "obj/", "trail/"):
        main.upload(key, key.encode())
    main.commit("keys ending in a slash")
    reads = [
        lambda: fs.cat_file("sales/main/obj/"),
        lambda: fs.cat("branchwater://sales/main/obj/"),
        lambda: fs.open("sales/main/trail/"),
        lambda: fs.open("sales/main/obj/", "r"),
        lambda: fs.size("sales/main/obj/"),
        lambda: fs.ukey("sales/main/obj/"),
    ]
    for read in reads:
        with pytest.raises((IsADirectoryError, FileNotFoundError)):
            read()
    writes = [
        lambda: fs.pipe("sales/main/trail2/", b"x"),
        lambda: fs.pipe({"sales/main/trail2/": b"x"}),
        lambda: fs.pipe_file("sales/main/obj/", b"x"),
        lambda: fs.open("sales/main/trail2/", "wb"),
        lambda: fs.rm("sales/main/trail/"),
        lambda: fs.rm_file("sales/main/obj/"),
    ]
    for write in writes:
        with pytest.raises(IsADirectoryError, match="may not end in '/'") as raised:
            write()
        assert raised.value.filename.endswith("/")
    assert staged(fs_lake) == {}
    assert fs.cat_file("sales/main/obj") == b"obj"


def test_listings_name_no_entry_twice_nor_the_listed_folder(fs_lake: FsLake) -> None:
    """Keys with an empty part (`/lead`, `a//b`, `trail/`) are left out of listings (read
    them by name); a folder named like an object is listed once, as the object."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    for key in ("/lead", "a//b", "trail/", "dup", "dup.txt", "dup/x", "ok.csv"):
        main.upload(key, key.encode())
    assert fs.ls("sales/main", detail=False) == [
        "sales/main/dup",
        "sales/main/dup.txt",
        "sales/main/ok.csv",
    ]
    assert list(fs.walk("sales/main")) == [("sales/main", [], ["dup", "dup.txt", "ok.csv"])]
    assert fs.find("sales/main", withdirs=True) == [
        "sales/main/dup",
        "sales/main/dup.txt",
        "sales/main/dup/x",
        "sales/main/ok.csv",
    ]
    assert not fs.exists("sales/main/trail") and not fs.exists("sales/main/a")
    assert fs.cat_file("sales/main//lead") == b"/lead"
    assert fs.cat_file("sales/main/a//b") == b"a//b"


def test_find_and_glob_of_a_missing_repository_or_ref_find_nothing(
    fs_lake: FsLake, tree: str
) -> None:
    fs = fs_lake.fs
    for path in ("sales/nope/a", "nope/main/a", "sales/nope/a/*.txt", "nope/main/**"):
        assert fs.glob(path) == [] and fs.find(path) == [] and fs.find(path, detail=True) == {}


def test_a_name_holding_glob_characters_is_that_object_for_every_operation(
    fs_lake: FsLake, tmp_path: Path
) -> None:
    """`lit[1].csv` exists as spelled, so `cat`, `cp`, `get`, `du` and `mv` act on it, as
    `open` does, never on `lit1.csv` (which mv would have left while deleting the object it
    was asked to move); a name that exists nowhere is still a pattern."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    for key, data in {"lit[1].csv": b"literal", "lit1.csv": b"OTHER"}.items():
        main.upload(key, data)
    for key in ("dir[1]/x.csv", "dir1/y.csv"):
        main.upload(key, key.encode())
    main.commit("names with glob characters")
    name = "sales/main/lit[1].csv"
    assert fs.cat(name) == b"literal"
    assert fs.cat([name]) == {name: b"literal"}
    assert fs.du(name) == len(b"literal")
    fs.cp(name, "sales/main/copy.csv")
    fs.cp("sales/main/dir[1]", "sales/main/tree", recursive=True)
    fs.get(name, str(tmp_path / "got.csv"))
    fs.get(name, f"{tmp_path}/into/")
    assert (tmp_path / "got.csv").read_bytes() == b"literal"
    assert (tmp_path / "into" / "lit[1].csv").read_bytes() == b"literal"
    fs.mv(name, "sales/main/moved.csv")
    assert staged(fs_lake) == {
        "copy.csv": "added",
        "tree/x.csv": "added",
        "moved.csv": "added",
        "lit[1].csv": "removed",
    }
    assert main.read("copy.csv") == main.read("moved.csv") == b"literal"
    assert main.read("lit1.csv") == b"OTHER"
    assert fs.cat("sales/main/lit[1X].csv") == {"sales/main/lit1.csv": b"OTHER"}


@pytest.mark.timeout(30)
def test_a_folder_whose_keys_start_with_the_greatest_character_is_listed_once(
    fs_lake: FsLake,
) -> None:
    """A listing skips a folder by restarting after `dir/` + U+10FFFF, which keys in it
    starting with U+10FFFF sort after: the restart must still move on (it looped forever),
    list the folder once, and miss no key after it (`dir0` is the first key past `dir/`)."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    top = "\U0010ffff"
    keys = ["dir/a.csv", f"dir/{top}z.csv", f"dir/{top}{top}y.csv", f"dir/{top}/sub.csv"]
    for key in [*keys, "dir0", "other.csv"]:
        main.upload(key, b"x")
    assert fs.ls("sales/main/", detail=False) == [
        "sales/main/dir",
        "sales/main/dir0",
        "sales/main/other.csv",
    ]
    assert fs.ls("sales/main/dir", detail=False) == [
        "sales/main/dir/a.csv",
        f"sales/main/dir/{top}",
        f"sales/main/dir/{top}z.csv",
        f"sales/main/dir/{top}{top}y.csv",
    ]
    assert [(root, dirs, sorted(files)) for root, dirs, files in fs.walk("sales/main")] == [
        ("sales/main", ["dir"], ["dir0", "other.csv"]),
        ("sales/main/dir", [top], ["a.csv", f"{top}z.csv", f"{top}{top}y.csv"]),
        (f"sales/main/dir/{top}", [], ["sub.csv"]),
    ]
    assert fs.info("sales/main/dir")["type"] == "directory"
