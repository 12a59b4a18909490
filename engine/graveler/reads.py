"""The reader flow of the metadata-KV design: staging token → sealed tokens → committed.

A committer drops a sealed token's entries once its commit is on the branch, so a lookup is
trusted only once a fresh read of the branch still holds every layer it consulted: none of
them can have been dropped before it was read. Tokens sealed above them meanwhile are probed
on their own, so a busy branch costs a lookup extra probes, not restarts. Listings are
validated page by page, so a branch of any size streams in bounded memory; a page, too,
is corrected with the tokens sealed above its layers rather than read again.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice, takewhile
from typing import Any, BinaryIO, TypeVar, cast

from branchwater.engine.errors import CommitExpired, CorruptedData, NotFound, too_many_tries
from branchwater.engine.graveler.checksums import imported_version
from branchwater.engine.graveler.external import external_location, is_external
from branchwater.engine.graveler.fence import check_unfenced
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.iterators import Layer, combine, committed_layer, visible
from branchwater.engine.graveler.model import BranchRecord, Change, Entry, RepositoryRecord
from branchwater.engine.graveler.sources import open_source
from branchwater.engine.graveler.uncommitted import uncommitted_from
from branchwater.engine.graveler.verified import verified
from branchwater.engine.objects.views import FileView

PAGE_SIZE = 1000
CHANGES_PAGE_SIZE = 8192
"""Changes a page of `uncommitted()` holds: several join batches, so a page's set-up (two
KV reads, a new scan) is spread over many changes."""
T = TypeVar("T")
Above = Callable[[tuple[str, ...], str, str | None, list[T]], list[T]]
"""Corrects a page for tokens sealed above its layers: (the tokens, newest first, where the
page starts, the last path it covers or None when it runs to the end, its items)."""


def committed_lookup(
    g: Graveler, repo: RepositoryRecord, metarange_id: str, path: str
) -> Entry | None:
    try:
        return g.committed(repo).get(metarange_id, path)
    except NotFound:
        return None


def get_branch_entry(g: Graveler, repo: RepositoryRecord, branch_name: str, path: str) -> Entry:
    entry = find_branch_entry(g, repo, branch_name, path)
    if entry is None:
        raise NotFound(f"path {path!r} not found on branch {branch_name!r} of {repo.name!r}")
    return entry


def find_branch_entry(
    g: Graveler, repo: RepositoryRecord, branch_name: str, path: str
) -> Entry | None:
    """What the branch shows at `path`, `None` if nothing."""
    return find_branch_look(g, repo, branch_name, path).value


def find_branch_look(g: Graveler, repo: RepositoryRecord, branch_name: str, path: str) -> Look:
    """What the branch shows at `path` and the layer it comes from. The answer is checked
    against a fresh read of the branch even when the staging token had it: the first read may
    come from the branch cache, and a token another process has sealed since may still hold
    an older value than the one it wrote to the token it opened. Attempts are not paced as
    `g.retry` paces a compare-and-swap: a pause between a look and the read that checks it
    would only give the branch longer to change."""
    branch = g.read_branch(repo, branch_name, cached=True)
    look = look_up(g, repo, branch, path)
    for _ in range(g.retry.attempts):
        branch = g.read_branch(repo, branch_name)
        gained = gained_above(look, branch)
        if gained == ():
            return look
        if gained is None:
            look = look_up(g, repo, branch, path)
        else:
            look = look_above(g, gained, path, look)
    raise too_many_tries(
        f"read of {path!r} on branch {branch_name!r} of {repo.name!r}", g.retry.attempts
    )


@dataclass(frozen=True)
class Look:
    """A lookup's answer and the layers it rests on: the tokens probed, newest first, down to
    the one that had the path, and the branch's base when no token had it."""

    value: Entry | None
    tokens: tuple[str, ...]
    base: tuple[str, str | None] | None

    @property
    def from_sealed_token(self) -> bool:
        """The answer is a sealed token's row (of a validated look, whose first token is the
        staging token). Such a row may be a late write the commit absorbing the token never
        read: it shows now, but the branch may not keep it."""
        return self.base is None and len(self.tokens) > 1


def token_layers(branch: BranchRecord) -> tuple[str, ...]:
    return (branch.staging_token, *branch.sealed_tokens)


def base_layer(branch: BranchRecord) -> tuple[str, str | None]:
    return (branch.commit_id, branch.compacted_metarange_id)


def every_layer(branch: BranchRecord) -> Look:
    """What a listing page rests on: all of the branch's layers."""
    return Look(None, token_layers(branch), base_layer(branch))


def look_up(g: Graveler, repo: RepositoryRecord, branch: BranchRecord, path: str) -> Look:
    tokens = token_layers(branch)
    found = _probe(g, tokens, path)
    if found is not None:
        return found
    value = committed_lookup(g, repo, g.base_metarange(repo, branch), path)
    return Look(value, tokens, base_layer(branch))


def look_above(g: Graveler, tokens: tuple[str, ...], path: str, below: Look) -> Look:
    """`below` seen through tokens the branch gained above its layers."""
    found = _probe(g, tokens, path)
    return found or Look(below.value, tokens + below.tokens, below.base)


def _probe(g: Graveler, tokens: tuple[str, ...], path: str) -> Look | None:
    for i, token in enumerate(tokens):
        found, value = g.staging.get(token, path)
        if found:
            return Look(value, tokens[: i + 1], None)
    return None


def gained_above(look: Look, branch: BranchRecord) -> tuple[str, ...] | None:
    """The tokens `branch` holds above the layers `look` rests on, `()` if none; `None` when
    one of those layers went away (a commit or a compaction took it, or a reset)."""
    tokens = token_layers(branch)
    if look.base is not None:
        top = len(tokens) - len(look.tokens)
        intact = top >= 0 and tokens[top:] == look.tokens and base_layer(branch) == look.base
    else:
        top = tokens.index(look.tokens[0]) if look.tokens[0] in tokens else -1
        intact = top >= 0 and tokens[top : top + len(look.tokens)] == look.tokens
    return tokens[:top] if intact else None


def get_commit_entry(
    g: Graveler, repo: RepositoryRecord, commit_id: str, path: str, ref: str
) -> Entry:
    entry = committed_lookup(g, repo, g.refs.get_commit(repo, commit_id).metarange_id, path)
    if entry is None:
        raise NotFound(f"path {path!r} not found at ref {ref!r} of {repo.name!r}")
    return entry


def list_branch(
    g: Graveler, repo: RepositoryRecord, branch_name: str, prefix: str = "", after: str = ""
) -> Iterator[Entry]:
    def page(branch: BranchRecord, start: str) -> Iterator[Entry]:
        return visible(branch_stream(g, repo, branch, start, prefix))

    def above(
        tokens: tuple[str, ...], start: str, bound: str | None, items: list[Entry]
    ) -> list[Entry]:
        layers = [_up_to(layer, bound) for layer in token_scans(g, tokens, start, prefix)]
        return list(visible(combine([*layers, committed_layer(items)])))

    return _validated_pages(g, repo, branch_name, page, after, _entry_path, above=above)


def _entry_path(entry: Entry) -> str:
    return entry.path


def _up_to(layer: Layer, bound: str | None) -> Layer:
    return layer if bound is None else takewhile(lambda row: row[0] <= bound, layer)


def list_commit(
    g: Graveler, repo: RepositoryRecord, commit_id: str, prefix: str = "", after: str = ""
) -> Iterator[Entry]:
    metarange_id = g.refs.get_commit(repo, commit_id).metarange_id
    return g.committed(repo).iterate(metarange_id, after=after, prefix=prefix)


def staging_layers(g: Graveler, branch: BranchRecord, after: str, prefix: str = "") -> list[Layer]:
    """The branch's staged layers, newest first: its staging token, then its sealed tokens."""
    return token_scans(g, token_layers(branch), after, prefix)


def token_scans(g: Graveler, tokens: tuple[str, ...], after: str, prefix: str) -> list[Layer]:
    return [g.staging.scan(token, after, prefix) for token in tokens]


def branch_stream(
    g: Graveler, repo: RepositoryRecord, branch: BranchRecord, after: str, prefix: str
) -> Iterator[tuple[str, Entry | None]]:
    """Every layer of the branch combined, tombstones included."""
    layers = staging_layers(g, branch, after, prefix)
    base = g.base_metarange(repo, branch)
    layers.append(committed_layer(g.committed(repo).iterate(base, after=after, prefix=prefix)))
    return combine(layers)


def uncommitted_changes(g: Graveler, repo: RepositoryRecord, branch_name: str) -> Iterator[Change]:
    """What a commit now would record, page by page (see the `uncommitted` module)."""

    def page(branch: BranchRecord, start: str) -> Iterator[Change]:
        return uncommitted_from(g, repo, branch, start)

    return _validated_pages(g, repo, branch_name, page, "", _change_path, CHANGES_PAGE_SIZE)


def _change_path(change: Change) -> str:
    return change.path


def _validated_pages(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    page: Callable[[BranchRecord, str], Iterator[T]],
    after: str,
    path_of: Callable[[T], str],
    page_size: int | None = None,
    above: Above[T] | None = None,
) -> Iterator[T]:
    """Pages of `page(branch, after)`, each trusted once a fresh read of the branch still
    holds every layer it was read from. Where the branch only gained tokens above them (a
    commit or compaction sealed its staging token meanwhile), `above` corrects the page with
    those tokens' entries in its span; without `above`, or when a layer went away, the page
    is read again."""
    size = page_size or PAGE_SIZE
    branch = g.read_branch(repo, branch_name, cached=True)

    def read(current: BranchRecord) -> tuple[list[T], str | None, Look]:
        items = list(islice(page(current, after), size))
        bound = path_of(items[-1]) if len(items) == size else None
        return items, bound, every_layer(current)

    while True:
        items, bound, rests = read(branch)
        for _ in range(g.retry.attempts):
            branch = g.read_branch(repo, branch_name)
            gained = gained_above(rests, branch)
            if gained == ():
                break
            if gained is None or above is None:
                items, bound, rests = read(branch)
            else:
                items = above(gained, after, bound, items)
                rests = every_layer(branch)
        else:
            raise too_many_tries(
                f"listing of branch {branch_name!r} of {repo.name!r}", g.retry.attempts
            )
        yield from items
        if bound is None:
            return
        after = bound


def object_location(repo: RepositoryRecord, address: str) -> tuple[str, str]:
    """The store URL and key an entry's address names: its namespace and the address, or for
    an imported object the bucket or file system it lives in (`external`)."""
    if is_external(address):
        return external_location(address)
    return repo.storage_namespace, address


def read_object(
    g: Graveler,
    repo: RepositoryRecord,
    entry: Entry,
    verify: bool = True,
    *,
    ref: str | None = None,
    commit_id: str | None = None,
) -> bytes:
    """The object an entry names, checked against it unless `verify` is off: a read, a deep
    copy, never returns or copies bytes its entry does not describe. `ref` and `commit_id`
    as in `open_object`."""
    with open_object(g, repo, entry, verify, ref=ref, commit_id=commit_id) as f:
        return f.read()


def open_object(
    g: Graveler,
    repo: RepositoryRecord,
    entry: Entry,
    verify: bool = True,
    *,
    ref: str | None = None,
    commit_id: str | None = None,
    missing: Callable[[NotFound], BaseException] | None = None,
) -> BinaryIO:
    """A seekable file object over the object an entry names; with `verify`, its size is
    checked now and its checksum once a read reaches its end (`verified`), and an imported
    object is held to the version its import recorded (`sources`), raising `CorruptedData`
    naming path and address.

    `ref` and `commit_id` say what the entry was read at (a `Ref` resolved before a GC
    sweep still reads its commit): data found missing, when opening or by a read of the
    open file, is then `CommitExpired` if retention expired or is collecting that commit,
    else `NotFound` naming the path, the ref and the address (`ReadAt`). The expiry is read
    on that error path alone, so a read costs nothing more. A read of the open file raises
    `missing(that error)` instead, where given (the fsspec filesystem's `FileNotFoundError`),
    so a caller uses the file as it is rather than buffering it again under a guard of its
    own."""
    store_url, key = object_location(repo, entry.address)
    at = ReadAt(g, repo, entry, store_url, ref, commit_id)
    store = g.objects(store_url)

    def corrupted(mismatch: str) -> CorruptedData:
        return CorruptedData(
            f"object {entry.path!r}{at.where} at {entry.address} in {store_url} was "
            f"truncated or rewritten in storage: {mismatch}"
        )

    imported = imported_version(entry) if verify else None
    try:
        f = store.open(key) if imported is None else open_source(store, key, imported, corrupted)
    except NotFound:
        raise at.missing() from None
    guarded = Guarded(f, lambda _: at.missing(while_open=True))
    if missing is not None:
        guarded = Guarded(cast(BinaryIO, guarded), missing)
    if not verify:
        return cast(BinaryIO, io.BufferedReader(guarded))
    return verified(cast(BinaryIO, guarded), entry, corrupted)


@dataclass(frozen=True)
class ReadAt:
    """What a read of `entry` names when its data turns out missing: the object layer knows
    only the physical key, the reader needs the lake path, the ref and why."""

    g: Graveler
    repo: RepositoryRecord
    entry: Entry
    store_url: str
    ref: str | None
    commit_id: str | None

    @property
    def where(self) -> str:
        return "" if self.ref is None else f" at ref {self.ref!r} of {self.repo.name!r}"

    def missing(self, *, while_open: bool = False) -> NotFound:
        """`CommitExpired` when retention expired (or is collecting) the commit read, else
        the data is missing for another reason: `NotFound` naming path, ref and address."""
        expired = self.expiry()
        if expired is not None:
            return expired
        address = self.entry.address
        when = "was deleted while it was open" if while_open else "is missing"
        explain = (
            ""
            if is_external(address)
            else f"; `branchwater gc explain {self.repo.name} {address}` says if GC deleted it"
        )
        return NotFound(
            f"object {self.entry.path!r}{self.where} is staged or committed but its data at "
            f"{address} {when} from {self.store_url}{explain}"
        )

    def expiry(self) -> CommitExpired | None:
        """The `CommitExpired` the commit read raises now, if any (one KV get)."""
        if self.commit_id is None:
            return None
        try:
            check_unfenced(self.g.kv, self.repo, self.commit_id)
        except CommitExpired as exc:
            return exc
        return None


class Guarded(FileView):
    """`f` as the raw layer under a buffer (`io.BufferedReader`, or `verified`'s), except that
    a `NotFound` from a read or seek, the object deleted while open (an S3 ranged GET after a
    sweep), is `missing(error)`: the store's error names only the physical key (the engine
    names the path and ref, `ReadAt.missing`; the fsspec filesystem's, over that one, raises
    its `FileNotFoundError`)."""

    def __init__(self, f: BinaryIO, missing: Callable[[NotFound], BaseException]) -> None:
        super().__init__(f)
        self._missing = missing

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._guard(lambda: self._f.seek(offset, whence))

    def readinto(self, buffer: Any) -> int:
        return self._guard(lambda: cast(io.BufferedIOBase, self._f).readinto(buffer))

    def readall(self) -> bytes:
        """One read to the end (on S3 one GET), not a loop of buffer-sized ones."""
        return self._guard(self._f.read)

    def _guard(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except NotFound as exc:
            raise self._missing(exc) from exc
