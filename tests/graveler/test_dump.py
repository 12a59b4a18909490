"""`refs restore` against hostile dumps: each is refused whole, before anything is written,
or restores a repository every ref of which reads; never a repository that fails to read.
A restore stopped at any of its writes (raised out of, or its process killed) is finished by
restoring the same dump again, and refused for any other."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from branchwater.engine import CommitExpired, CorruptedData, InvalidArgument, Lake, NotFound
from branchwater.engine.api import Repository
from branchwater.engine.gc.retention.expired import mark_expiring
from branchwater.engine.graveler.dump import RESTORE_KEY
from branchwater.engine.graveler.graveler import Graveler
from tests.helpers.gc import age_claims, record_expired
from tests.helpers.hostile import REF_FIELDS, any_text, dumped_and_recreated, hostile_dump, stored

ROOT = Path(__file__).resolve().parents[2]

HOSTILE_VALUES = st.one_of(
    st.sampled_from(["../../../../etc/passwd", "/etc/passwd", "", "main", "0" * 63]),
    st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
    any_text(),
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False),
    st.lists(st.text(max_size=3) | st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=2),
)
"""What a hostile dump puts where an id, a name or a field belongs: any JSON value."""
EXPIRED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
EXPIRY_RUN = "18f2a9c3b7d1-a1b2c3"
COMMIT_FIELDS = [
    "id",
    "metarange_id",
    "parents",
    "parent",
    "message",
    "metadata",
    "metadata value",
    "committer",
    "generation",
    "creation_date",
    "extra field",
]


class Restored:
    """A bare repository over a namespace a genuine dump was taken from, and that dump."""

    def __init__(self, lake: Lake, repo: Repository, path: Path) -> None:
        self.lake = lake
        self.dump = path / "refs.json"
        self.repo, self.log = dumped_and_recreated(lake, repo, self.dump)
        self.document = json.loads(self.dump.read_text())
        self.root = path

    def recreate(self) -> None:
        """Bare again, after a hostile dump that turned out valid was restored."""
        self.lake.delete_repository(self.repo.name)
        assert self.lake.wait_for_cleanup(10)
        namespace = self.repo.storage_namespace
        self.repo = self.lake.create_repository(self.repo.name, storage_namespace=namespace)


@pytest.fixture
def restored(lake: Lake, repo: Repository, tmp_path: Path) -> Restored:
    return Restored(lake, repo, tmp_path)


PLACES = st.sampled_from(
    COMMIT_FIELDS + [f"{kind} {field}" for kind in ("branch", "tag") for field in REF_FIELDS]
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(where=PLACES, value=HOSTILE_VALUES)
@example(where="metadata", value=None)
def test_a_hostile_dump_is_refused_whole_or_restores_a_readable_repository(
    restored: Restored, where: str, value: object
) -> None:
    damaged = restored.root / "hostile.json"
    damaged.write_text(json.dumps(hostile_dump(restored.document, where, value)))
    before = stored(restored.lake.graveler.kv, restored.root)
    try:
        restored.repo.restore_refs(damaged)
    except CorruptedData as refused:
        event("refused")
        assert re.match(rf"(refs dump )?{re.escape(repr(str(damaged)))} ", str(refused))
        assert stored(restored.lake.graveler.kv, restored.root) == before
        return
    event("restored")
    for name in [b.name for b in restored.repo.branches()] + [t.name for t in restored.repo.tags()]:
        for commit in restored.repo.log(name):
            list(restored.repo.ref(commit.id).list())
    restored.recreate()


def test_the_reported_dump_a_metarange_outside_the_namespace_is_refused(
    restored: Restored,
) -> None:
    """Issue 42: `../../../../etc/passwd` as a metarange id, the commit id recomputed."""
    damaged = restored.root / "hostile.json"
    document = hostile_dump(restored.document, "metarange_id", "../../../../etc/passwd")
    damaged.write_text(json.dumps(document))
    before = stored(restored.lake.graveler.kv, restored.root)
    with pytest.raises(CorruptedData, match=r"metarange id must be 64 lowercase hex digits"):
        restored.repo.restore_refs(damaged)
    assert stored(restored.lake.graveler.kv, restored.root) == before
    restored.repo.restore_refs(restored.dump)
    assert [c.id for c in restored.repo.log("dev")] == restored.log


def test_a_dump_whose_metarange_is_not_in_the_namespace_is_refused(restored: Restored) -> None:
    damaged = restored.root / "hostile.json"
    document = hostile_dump(restored.document, "metarange_id", "ab" * 32)
    damaged.write_text(json.dumps(document))
    with pytest.raises(CorruptedData, match="metarange abababababab is not there"):
        restored.repo.restore_refs(damaged)


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("generation", 7, "has generation 7, but its parents make it"),
        ("generation", True, "generation must be an integer"),
        ("branch twice", None, "branch 'dev' is in it twice"),
        ("tag twice", None, "tag 'v1' is in it twice"),
        ("tag name", "f" * 64, "full commit id"),
        ("branch commit_id", "../x", "commit id must be 64 lowercase hex digits"),
        ("parent", "../x", "parent id must be 64 lowercase hex digits"),
    ],
)
def test_what_a_hostile_dump_is_refused_for(
    restored: Restored, where: str, value: object, says: str
) -> None:
    damaged = restored.root / "hostile.json"
    damaged.write_text(json.dumps(hostile_dump(restored.document, where, value)))
    with pytest.raises(CorruptedData, match=re.escape(says)):
        restored.repo.restore_refs(damaged)


# --- a restore stopped part-way -------------------------------------------------------------

RECORD_WRITES = ("put_commit", "insert_tag", "insert_branch", "set_branch_if")
WRITE_STEPS = range(1, 9)
"""The fixture's dump restored: the restore's mark, 3 commits, 1 tag, `dev` created, `main`
moved, the mark removed."""


class Stopped(Exception):
    """Raised instead of a restore's write."""


def _raise() -> None:
    raise Stopped


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def stopped_before_write(g: Graveler, step: int, stop: Callable[[], None]) -> Iterator[None]:
    """`stop` runs in place of the `step`-th write a restore makes (1 is the first): its
    records' writes and those of its `RESTORE_KEY`."""
    seen = 0

    def counted(write: Callable[..., Any], counts: Callable[..., bool]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            nonlocal seen
            if counts(*args):
                seen += 1
                if seen == step:
                    stop()
            return write(*args, **kwargs)

        return run

    patched = [(g.refs, name, lambda *_: True) for name in RECORD_WRITES]
    marks = [(g.kv, name, lambda _p, key, *_: key == RESTORE_KEY) for name in ("set_if", "delete")]
    patched += marks
    for owner, name, counts in patched:
        setattr(owner, name, counted(getattr(owner, name), counts))
    try:
        yield
    finally:
        for owner, name, _ in patched:
            delattr(owner, name)


def restore_killed(kv_url: str, dump: str, step: str) -> None:
    """Restore `dump` into `sales`, this process killed at write `step` (run as a child)."""
    with Lake.connect(kv_url) as lake, stopped_before_write(lake.graveler, int(step), _kill):
        lake.repository("sales").restore_refs(dump)


def restored_view(repo: Repository, bare: str) -> dict[str, object]:
    """What a restore made of `repo`: its commits (but the bare repository's `bare`), branches,
    tags and logs; and what it must not leave: staged changes, its mark."""
    g = repo.lake.graveler
    branches = repo.branches()
    try:
        g.kv.get(repo.record.partition, RESTORE_KEY)
        marked = True
    except NotFound:
        marked = False
    return {
        "commits": sorted(c.encode() for c in g.refs.list_commits(repo.record) if c.id != bare),
        "branches": {b.name: b.commit_id for b in branches},
        "tags": repo.tags(),
        "logs": {b.name: [c.id for c in repo.log(b.name)] for b in branches},
        "staged": [b.name for b in branches if list(b.uncommitted())],
        "marked": marked,
    }


def straight_view(restored: Restored) -> dict[str, object]:
    """The view of an uninterrupted restore of the dump; the repository bare again after."""
    bare = restored.repo.branch("main").commit_id
    restored.repo.restore_refs(restored.dump)
    view = restored_view(restored.repo, bare)
    restored.recreate()
    return view


def stopped_at(restored: Restored, step: int) -> str:
    """The restore of the dump raised out of at write `step`; the bare commit."""
    bare = restored.repo.branch("main").commit_id
    with stopped_before_write(restored.lake.graveler, step, _raise), pytest.raises(Stopped):
        restored.repo.restore_refs(restored.dump)
    return bare


@pytest.mark.parametrize("step", WRITE_STEPS)
def test_a_restore_raised_out_of_at_each_write_is_finished_by_restoring_again(
    restored: Restored, step: int
) -> None:
    expected = straight_view(restored)
    bare = stopped_at(restored, step)
    assert restored.repo.restore_refs(restored.dump) == 6
    assert restored_view(restored.repo, bare) == expected
    with pytest.raises(InvalidArgument, match="not bare: restore refs into a newly created"):
        restored.repo.restore_refs(restored.dump)


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(3, id="after-two-commits"),
        pytest.param(6, id="between-tags-and-branches"),
        pytest.param(8, id="default-branch-moved"),
    ],
)
def test_a_restore_killed_at_a_write_is_finished_by_restoring_again(
    tmp_path: Path, step: int
) -> None:
    kv_url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(kv_url) as lake:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")
        restored = Restored(lake, repo, tmp_path)
        expected = straight_view(restored)
        bare = restored.repo.branch("main").commit_id
    script = (
        "import sys\n"
        "from tests.graveler.test_dump import restore_killed\n"
        "restore_killed(*sys.argv[1:])\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", script, kv_url, str(restored.dump), str(step)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("sales")
        repo.restore_refs(restored.dump)
        assert restored_view(repo, bare) == expected


def test_a_different_dump_after_a_stopped_restore_is_refused_writing_nothing(
    restored: Restored,
) -> None:
    expected = straight_view(restored)
    bare = stopped_at(restored, 4)
    other = restored.root / "other.json"
    other.write_text(json.dumps({**restored.document, "tags": []}))
    before = stored(restored.lake.graveler.kv, restored.root)
    with pytest.raises(InvalidArgument, match="holds part of another refs dump than"):
        restored.repo.restore_refs(other)
    assert stored(restored.lake.graveler.kv, restored.root) == before
    restored.repo.restore_refs(restored.dump)
    assert restored_view(restored.repo, bare) == expected


def test_a_different_dump_while_a_restore_is_about_to_write_is_refused_writing_nothing(
    restored: Restored,
) -> None:
    """Restore A stopped right after its mark: the repository still looks bare, but restore B,
    of another dump, took A's mark for its predicate and wrote, and A then wrote on top."""
    expected = straight_view(restored)
    bare = restored.repo.branch("main").commit_id
    other = restored.root / "other.json"
    other.write_text(json.dumps({**restored.document, "tags": []}))

    def restore_other() -> None:
        before = stored(restored.lake.graveler.kv, restored.root)
        with pytest.raises(InvalidArgument, match="holds part of another refs dump than"):
            restored.repo.restore_refs(other)
        assert stored(restored.lake.graveler.kv, restored.root) == before

    with stopped_before_write(restored.lake.graveler, 2, restore_other):
        assert restored.repo.restore_refs(restored.dump) == 6
    assert restored_view(restored.repo, bare) == expected


def test_the_same_dump_while_a_restore_of_it_is_about_to_write_goes_on(
    restored: Restored,
) -> None:
    """Their writes are the same: either may finish first."""
    expected = straight_view(restored)
    bare = restored.repo.branch("main").commit_id

    def restore_same() -> None:
        assert restored.repo.restore_refs(restored.dump) == 6

    with stopped_before_write(restored.lake.graveler, 2, restore_same):
        assert restored.repo.restore_refs(restored.dump) == 6
    assert restored_view(restored.repo, bare) == expected


def _tag_named_as_a_branch(document: dict[str, Any]) -> dict[str, Any]:
    return hostile_dump(document, "tag name", "dev")


def _tag_named_as_the_default_branch(document: dict[str, Any]) -> dict[str, Any]:
    """A dump taken where `main` was not the default branch, restored where it is."""
    branches = [b for b in document["branches"] if b["name"] != "main"]
    return {**hostile_dump(document, "tag name", "main"), "branches": branches}


@pytest.mark.parametrize(
    ("forge", "says"),
    [
        (_tag_named_as_a_branch, "holds a branch and a tag both named 'dev'"),
        (_tag_named_as_the_default_branch, "its tag 'main' is named as the repository's"),
    ],
)
def test_a_dump_whose_branch_and_tag_share_a_name_is_refused_writing_nothing(
    restored: Restored, forge: Callable[[dict[str, Any]], dict[str, Any]], says: str
) -> None:
    """Both restored, the tag and the branch would hide one another."""
    damaged = restored.root / "shadowing.json"
    damaged.write_text(json.dumps(forge(restored.document)))
    before = stored(restored.lake.graveler.kv, restored.root)
    with pytest.raises(CorruptedData, match=re.escape(says)):
        restored.repo.restore_refs(damaged)
    assert stored(restored.lake.graveler.kv, restored.root) == before


def _branch_of_its_own(repo: Repository) -> None:
    repo.create_branch("own", "main")


def _commit_on_main(repo: Repository) -> None:
    repo.branch("main").upload("own", b"own")
    repo.branch("main").commit("own")


def _staged_on_main(repo: Repository) -> None:
    repo.branch("main").upload("own", b"own")


def _tag_of_its_own(repo: Repository) -> None:
    repo.tag("own", repo.branch("main").commit_id)


@pytest.mark.parametrize(
    "change", [_branch_of_its_own, _commit_on_main, _staged_on_main, _tag_of_its_own]
)
def test_a_stopped_restore_meanwhile_changed_is_refused_as_not_bare(
    restored: Restored, change: Callable[[Repository], None]
) -> None:
    stopped_at(restored, 4)
    change(restored.repo)
    restored.lake.graveler.wait_for_background()
    before = stored(restored.lake.graveler.kv, restored.root)
    with pytest.raises(InvalidArgument, match="not bare: restore refs into a newly created"):
        restored.repo.restore_refs(restored.dump)
    assert stored(restored.lake.graveler.kv, restored.root) == before


def test_a_dump_through_a_link_writes_the_file_it_names_and_keeps_the_link(
    repo: Repository, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target, link = out / "target.json", out / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    count = repo.dump_refs(link)
    assert link.is_symlink() and link.resolve() == target
    assert len(json.loads(target.read_text())["commits"]) + 1 <= count
    assert sorted(p.name for p in out.iterdir()) == ["link.json", "target.json"]


def test_a_dump_into_a_pipe_is_written_in_place(repo: Repository, tmp_path: Path) -> None:
    """Replacing it by a file (as `/dev/full` once was) left the reader with nothing."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = subprocess.Popen(["cat", str(pipe)], stdout=subprocess.PIPE)
    try:
        repo.dump_refs(pipe)
        out, _ = reader.communicate(timeout=30)
    finally:
        reader.kill()
        reader.wait()
    assert json.loads(out)["repository"] == repo.name
    assert pipe.is_fifo()


def test_a_dump_to_dev_stdout_on_a_pipe_writes_the_pipe(tmp_path: Path) -> None:
    """`/dev/stdout` links to `pipe:[N]`, which no directory holds: a file beside it failed."""
    script = (
        "import sys\n"
        "from branchwater.engine import Lake\n"
        "with Lake.connect('memory://') as lake:\n"
        "    lake.create_repository('sales', sys.argv[1]).dump_refs('/dev/stdout')\n"
    )
    namespace = f"file://{tmp_path}/sales"
    dumped = subprocess.run(
        [sys.executable, "-c", script, namespace], cwd=ROOT, capture_output=True, timeout=120
    )
    assert dumped.returncode == 0, dumped.stderr.decode()
    assert json.loads(dumped.stdout)["repository"] == "sales"


@pytest.mark.parametrize(
    ("where", "reason"),
    [("folder", "it is a directory"), ("missing/refs.json", "No such file or directory")],
)
def test_a_dump_to_a_place_no_file_can_be_refused_leaving_nothing(
    repo: Repository, tmp_path: Path, where: str, reason: str
) -> None:
    out = tmp_path / "out"
    (out / "folder").mkdir(parents=True)
    with pytest.raises(InvalidArgument, match=f"cannot dump refs to .*{reason}"):
        repo.dump_refs(out / where)
    assert [p.name for p in out.iterdir()] == ["folder"]
    assert list((out / "folder").iterdir()) == []


def test_a_restore_retried_after_retention_expired_its_commits_lands_no_ref_on_them(
    restored: Restored,
) -> None:
    """Stopped after its commits, the restore left them unreachable; retention expired them
    (and deleted their data) before the retry, which then put branches on collected data."""
    bare = stopped_at(restored, 5)
    repo = restored.repo
    targets = {b["commit_id"] for b in restored.document["branches"]}
    record_expired(repo.lake.graveler.kv, repo.record, sorted(targets), EXPIRED_AT, EXPIRY_RUN)
    with pytest.raises(CommitExpired):
        repo.restore_refs(restored.dump)
    assert repo.tags() == []
    assert {b.name: b.commit_id for b in repo.branches()} == {"main": bare}


def test_a_restore_outlasting_the_margin_lands_no_ref_on_commits_a_run_fenced_meanwhile(
    restored: Restored,
) -> None:
    """The restore claims its targets before its first write and may outlast the margin
    while it writes its commits: a run then fences them (forced before its last commit), and
    the restore claims each target again before its ref, refusing with none landed."""
    repo = restored.repo
    g = repo.lake.graveler
    bare = repo.branch("main").commit_id
    targets = sorted(
        {b["commit_id"] for b in restored.document["branches"]}
        | {t["commit_id"] for t in restored.document["tags"]}
    )

    def margin_passed_and_fenced() -> None:
        age_claims(repo)
        assert mark_expiring(g.kv, repo.record, targets, EXPIRY_RUN) == targets

    last_commit = 4
    fenced = stopped_before_write(g, last_commit, margin_passed_and_fenced)
    with fenced, pytest.raises(CommitExpired):
        repo.restore_refs(restored.dump)
    assert repo.tags() == []
    assert {b.name: b.commit_id for b in repo.branches()} == {"main": bare}
