"""Hostile input: what was stored before and after, URLs with secrets, texts of every code
point, forged refs dumps."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from branchwater.engine.api import Lake, Repository
from branchwater.engine.graveler.model import Commit
from branchwater.engine.graveler.refs import commit_id_for
from branchwater.engine.kv import Store
from branchwater.engine.kv.memory import MemoryStore

if TYPE_CHECKING:
    pass


class Stored(NamedTuple):
    """Every KV row and every file (and folder, as None) under some folders: equal before and
    after an operation that was refused means it wrote nothing."""

    rows: frozenset[tuple[bytes, bytes, bytes]]
    files: dict[str, bytes | None]


def stored(kv: Store | str, *roots: Path) -> Stored:
    """What a lake holds, from its store (in memory) or its SQLite URL, and `roots`' files."""
    return Stored(
        frozenset(_kv_rows(kv)),
        {
            str(path): path.read_bytes() if path.is_file() else None
            for root in roots
            for path in sorted(root.rglob("*"))
        },
    )


def _kv_rows(kv: Store | str) -> Iterator[tuple[bytes, bytes, bytes]]:
    if isinstance(kv, MemoryStore):
        for partition, part in kv._partitions.items():
            yield from ((partition, key, value) for key, value in part.values.items())
        return
    assert isinstance(kv, str) and kv.startswith("sqlite:///"), kv
    import sqlite3

    path = Path(kv.removeprefix("sqlite:///"))
    if not path.exists():
        return
    with closing(sqlite3.connect(path)) as conn:
        yield from conn.execute("SELECT partition_key, key, value FROM branchwater_kv")


URL_RESERVED = ":/?#[]@!$&'()*+,;=% "
"""Every character RFC 3986 reserves (and `%`, and a space), to put unencoded in credentials."""


class Credentials(NamedTuple):
    """A user and password for a URL, and the pieces of the password no message may show."""

    user: str
    password: str
    pieces: tuple[str, ...]


def credentials() -> Any:
    """Users and passwords with reserved characters anywhere; the password's pieces look like
    nothing a message says on its own (`Qxyz42`), so finding one in a message is a leak."""
    from hypothesis import strategies as st

    piece = st.from_regex(r"[A-Z][a-z]{3}[0-9]{2}", fullmatch=True)
    reserved = st.text(st.sampled_from(URL_RESERVED), max_size=2)
    user = st.text(st.sampled_from("bob" + URL_RESERVED), min_size=1, max_size=6).filter(
        lambda text: not text.startswith("/")  # `sqlite:///…` is a path, not a user
    )

    @st.composite
    def build(draw: Any) -> Credentials:
        pieces = draw(st.lists(piece, min_size=1, max_size=3, unique=True))
        password = "".join(draw(reserved) + p for p in pieces) + draw(reserved)
        return Credentials(draw(user), password, tuple(pieces))

    return build()


def assert_no_secret(text: str, secret: Credentials) -> None:
    for piece in secret.pieces:
        assert piece not in text, (piece, text)


def error_chain(error: BaseException) -> str:
    """The messages of an error and every error it was raised from or during."""
    seen: list[str] = []
    current: BaseException | None = error
    while current is not None and len(seen) < 10:
        seen.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(seen)


def any_text(max_size: int = 12) -> Any:
    """Text of every code point, lone surrogates (what Python makes of non-UTF-8 bytes in
    `argv`) included."""
    from hypothesis import strategies as st

    return st.text(st.characters() | st.characters(categories=["Cs"]), max_size=max_size)


def unencodable_texts() -> Any:
    """Strings no name or path can be: any text with a lone surrogate somewhere."""
    from hypothesis import strategies as st

    surrogate = st.characters(categories=["Cs"])
    return st.builds(lambda a, b, c: a + b + c, any_text(6), surrogate, any_text(6))


def not_text() -> Any:
    """What a caller may pass where a name or path belongs and must get `InvalidName` or
    `InvalidArgument` for, not a raw `TypeError`."""
    from hypothesis import strategies as st

    return st.none() | st.integers() | st.binary(max_size=8) | st.lists(st.text(), max_size=2)


def dumped_and_recreated(lake: Lake, repo: Repository, dump: Path) -> tuple[Repository, list[str]]:
    """Two branches and a tag dumped to `dump`; the repository then deleted and created again,
    bare, over its namespace. Returns it and the dumped log of `dev`."""
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    repo.create_branch("dev", source="main").upload("b", b"2")
    repo.branch("dev").commit("b")
    repo.tag("v1", "dev")
    assert repo.dump_refs(dump) > 0
    expected = [c.id for c in repo.log("dev")]
    lake.delete_repository("sales")
    lake.graveler.wait_for_background()
    return lake.create_repository("sales", storage_namespace=repo.storage_namespace), expected


REF_FIELDS = ("name", "commit_id", "twice")
"""What `hostile_dump` can change in a branch or tag record."""


def _tip_of(document: dict[str, Any]) -> dict[str, Any]:
    """A commit no other commit names as parent: one whose id can change with its content."""
    parents = {p for c in document["commits"] for p in c["parents"]}
    return next(c for c in document["commits"] if c["id"] not in parents and c["parents"])


def _recomputed(document: dict[str, Any], commit: dict[str, Any]) -> None:
    """Give `commit` the id of its (edited) content where the engine can compute one, and
    point the refs at it, so the edit is all that is wrong: the issue's forged dump."""
    try:
        new_id = commit_id_for(Commit.decode(json.dumps(commit).encode()))
    except (TypeError, ValueError, KeyError, AttributeError):
        return
    old_id, commit["id"] = commit["id"], new_id
    for ref in document["branches"] + document["tags"]:
        if ref["commit_id"] == old_id:
            ref["commit_id"] = new_id


def hostile_dump(document: dict[str, Any], where: str, value: object) -> dict[str, Any]:
    """A copy of a dump with `value` at `where`: a field of a tip commit (its id recomputed),
    `branch <field>` or `tag <field>` of the last ref, or `<kind> twice` for a duplicate."""
    edited = copy.deepcopy(document)
    if where.startswith(("branch ", "tag ")):
        kind, field = where.split(" ")
        refs = edited["branches" if kind == "branch" else "tags"]
        if field == "twice":
            refs.append(dict(refs[0], commit_id=refs[-1]["commit_id"]))
        else:
            refs[-1][field] = value
        return edited
    commit = _tip_of(edited)
    if where == "parent":
        commit["parents"] = [*commit["parents"], value]
    elif where == "metadata value":
        commit["metadata"] = {"k": value}
    elif where == "extra field":
        commit["extra"] = value
    else:
        commit[where] = value
    if where != "id":
        _recomputed(edited, commit)
    return edited
