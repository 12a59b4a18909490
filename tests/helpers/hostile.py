"""Hostile input: what was stored before and after, URLs with secrets, texts of every code
point, the names, paths and metadata the engine must refuse or keep exactly, forged refs
dumps; and `draw`, which takes one value of any of these strategies from a seeded random
outside a hypothesis test (the history checker's workers)."""

from __future__ import annotations

import copy
import json
import random
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
    from hypothesis.strategies import SearchStrategy


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


HOSTILE_TEXTS = [
    *("", "\x00", "\udcff", "a\nb", "\x1b[2J", "x" * 3000, "main~999999999999"),
    *("*a" * 30 + "*b", "[" * 5000 + "]" * 5000),
]
"""Texts the CLI and API sweeps give every argument: empty, NUL, a lone surrogate, a line
break, an escape sequence, long text, a ref past the first commit, a glob that backtracks,
JSON nested past the parser's depth."""
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


def hostile_names() -> Any:
    """What no repository, branch or tag name can be, so every operation taking one refuses
    it with `InvalidName`: not text, or text with a lone surrogate."""
    return unencodable_texts() | not_text()


def hostile_paths() -> Any:
    """What no object path can be, so every operation taking one refuses it with
    `InvalidArgument`: the hostile names, the empty path, and any text with NUL."""
    from hypothesis import strategies as st

    return hostile_names() | st.just("") | st.builds("{}\x00{}".format, st.text(), st.text())


def object_paths(max_size: int = 12) -> Any:
    """Paths the engine must store as given, however odd: any non-empty valid Unicode
    without NUL (`..`, `//`, line ends, a leading `/` and the rest of Unicode included)."""
    return any_text(max_size).filter(
        lambda path: bool(path) and "\x00" not in path and _encodes(path)
    )


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def valid_metadata(max_size: int = 6) -> Any:
    """User metadata every operation stores exactly: strings of any valid Unicode."""
    from hypothesis import strategies as st

    unicode = st.characters(exclude_categories=["Cs"])
    text = st.text(unicode, max_size=max_size)
    return st.dictionaries(text, text)


def any_value() -> Any:
    """Any Python value, nested: what a caller may pass where metadata belongs."""
    from hypothesis import strategies as st

    return st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.binary(max_size=4)
        | st.text(max_size=4)
        | st.builds(object),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.tuples(inner, inner)
            | st.dictionaries(
                st.text(max_size=3) | st.integers() | st.binary(max_size=2), inner, max_size=3
            )
            | st.frozensets(st.integers(), max_size=2)
        ),
        max_leaves=6,
    )


def is_valid_metadata(value: Any) -> bool:
    """The metadata rule, stated apart from the engine's: None, or strings to strings of
    valid Unicode."""
    return value is None or (
        isinstance(value, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        and all(_encodes(k) and _encodes(v) for k, v in value.items())
    )


def bad_metadata() -> Any:
    """Metadata every operation refuses with `InvalidArgument` before any write."""
    from hypothesis import strategies as st

    return (
        any_value()
        | st.dictionaries(st.text(max_size=3), st.text(max_size=3), min_size=1, max_size=3)
        | st.just({1: "a", "1": "b"})
    ).filter(lambda value: not is_valid_metadata(value))


def draw(strategy: SearchStrategy[Any], rng: random.Random) -> Any:
    """One value of `strategy` from `rng`: the same for the same state of `rng` in any
    process. Hypothesis mixes in constants it finds in the loaded modules' source, which
    differ between processes, so the provider here draws only its fixed ones."""
    from hypothesis.control import BuildContext
    from hypothesis.errors import StopTest
    from hypothesis.internal.conjecture.data import ConjectureData

    for _ in range(100):
        data = ConjectureData(random=rng, provider=_FixedConstants)
        try:
            with BuildContext(data, is_final=True, wrapped_test=draw):
                return data.draw(strategy)
        except StopTest:
            continue
    raise AssertionError(f"no value of {strategy!r} in 100 tries")


def _fixed_constants() -> type:
    from hypothesis.internal.conjecture.choice import choice_permitted
    from hypothesis.internal.conjecture.providers import GLOBAL_CONSTANTS, HypothesisProvider

    class FixedConstants(HypothesisProvider):
        def _maybe_draw_constant(
            self, choice_type: Any, constraints: Any, *, p: float = 0.05
        ) -> Any:
            assert self._random is not None
            if self._random.random() > p:
                return None
            allowed = [
                c
                for c in GLOBAL_CONSTANTS.set_for_type(choice_type)
                if choice_permitted(c, constraints)
            ]
            return self._random.choice(allowed) if allowed else None

    return FixedConstants


_FixedConstants = _fixed_constants()


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
