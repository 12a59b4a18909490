"""Restore: stage a commit's version of some paths on a branch, as `git restore --source`.

Each path named is taken with everything under it as a folder (`orders` is `orders` and
`orders/…`; a name ending in `/`, or "", is a prefix only). Where the source commit holds a
path, its entry is staged; where the branch shows a path the source lacks, a delete is. A path
the branch already shows as the source holds it (by identity) is left alone, so a restore run
twice stages nothing the second time. Entries are read from a commit only, never from a
branch's uncommitted layers: GC's merge row covers them. The source commit is claimed
against retention before the first write and again before each later one (`fence.py`):
a restore refused midway, as one killed there, keeps the paths it staged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

from branchwater.engine import failpoints
from branchwater.engine.errors import InvalidArgument, NotFound
from branchwater.engine.graveler.fence import claim, claim_again
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import Entry, RepositoryRecord, check_flag
from branchwater.engine.graveler.names import check_path
from branchwater.engine.graveler.reads import list_branch, list_commit
from branchwater.engine.graveler.writes import stage_delete, stage_entry


def restore(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    paths: str | Sequence[str],
    source: str,
    every_path: bool = False,
) -> int:
    """Stage `source`'s version of `paths` (or of every path) on the branch; returns how many
    paths changed."""
    specs = _specs(paths, every_path)
    commit_id = g.refs.resolve(repo, source).commit_id
    claim(g, repo, commit_id)
    staged = 0
    for spec in specs:
        for path, wanted, _ in _differences(g, repo, branch_name, commit_id, spec):
            failpoints.hit("restore.before_stage")
            claim_again(g, repo, commit_id)
            _stage(g, repo, branch_name, path, wanted)
            staged += 1
    return staged


def _stage(
    g: Graveler, repo: RepositoryRecord, branch_name: str, path: str, entry: Entry | None
) -> None:
    """Stage `entry` at `path`, or a delete when None."""
    if entry is not None:
        stage_entry(g, repo, branch_name, entry)
    else:
        with contextlib.suppress(NotFound):  # deleted meanwhile: as restored
            stage_delete(g, repo, branch_name, path)


def _specs(paths: object, every_path: bool) -> list[str]:
    """The path specs, checked; overlapping ones (`a` and `a/b`) are restored once. An empty
    path is refused, as git refuses an empty pathspec: it is the prefix of every path, so an
    unset variable would restore the whole branch over its uncommitted changes."""
    check_flag("every_path", every_path)
    items = [paths] if isinstance(paths, str) else paths
    if every_path:
        if items:
            raise InvalidArgument("restore takes paths or every_path=True, not both")
        return [""]
    if not isinstance(items, Sequence) or not items:
        raise InvalidArgument("restore needs a path, a prefix or a list of them")
    if any(item == "" for item in items):
        raise InvalidArgument(
            "an empty restore path would restore every path of the branch (an unset "
            "variable?): pass every_path=True for that"
        )
    specs = sorted({check_path(item, "restore path") for item in items})
    kept: list[str] = []
    for spec in specs:
        if not any(_covers(outer, spec) for outer in kept):
            kept.append(spec)
    return kept


def _covers(outer: str, spec: str) -> bool:
    folder = outer if outer == "" or outer.endswith("/") else outer + "/"
    return spec == outer or spec.startswith(folder)


def _differences(
    g: Graveler, repo: RepositoryRecord, branch_name: str, commit_id: str, spec: str
) -> Iterator[tuple[str, Entry | None, Entry | None]]:
    """(path, the source's entry, the branch's entry) for every path under `spec` where they
    differ by identity, in path order."""
    prefixes = [spec] if spec == "" or spec.endswith("/") else [spec, spec + "/"]
    for prefix in prefixes:
        exact = prefix == spec and prefixes != [spec]
        wanted = _under(list_commit(g, repo, commit_id, prefix), prefix, exact)
        shown = _under(list_branch(g, repo, branch_name, prefix), prefix, exact)
        for path, ours, theirs in _joined(wanted, shown):
            same = ours is not None and theirs is not None and ours.identity() == theirs.identity()
            if not same:
                yield path, ours, theirs


def _under(entries: Iterable[Entry], prefix: str, exact: bool) -> Iterator[Entry]:
    """The listing's entries, only `prefix` itself where `exact` (a listing by prefix `a`
    also yields `ab`)."""
    for entry in entries:
        if exact and entry.path != prefix:
            if entry.path > prefix:
                return
            continue
        yield entry


def _joined(
    left: Iterator[Entry], right: Iterator[Entry]
) -> Iterator[tuple[str, Entry | None, Entry | None]]:
    """Two listings sorted by path, joined on it."""
    a, b = next(left, None), next(right, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a.path < b.path):
            assert a is not None
            yield a.path, a, None
            a = next(left, None)
        elif a is None or b.path < a.path:
            yield b.path, None, b
            b = next(right, None)
        else:
            yield a.path, a, b
            a, b = next(left, None), next(right, None)
