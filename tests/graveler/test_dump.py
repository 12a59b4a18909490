"""`refs restore` against hostile dumps: each is refused whole, before anything is written,
or restores a repository every ref of which reads; never a repository that fails to read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from branchwater.engine import CorruptedData, Lake
from branchwater.engine.api import Repository
from tests.helpers.hostile import REF_FIELDS, any_text, dumped_and_recreated, hostile_dump, stored

HOSTILE_VALUES = st.one_of(
    st.sampled_from(["../../../../etc/passwd", "/etc/passwd", "", "main", "0" * 63]),
    st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
    any_text(),
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False),
    st.lists(st.text(max_size=3) | st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=2),
)
"""What a hostile dump puts where an id, a name or a field belongs: any JSON value."""
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
