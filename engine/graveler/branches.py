"""Branch lifecycle: create from any ref, delete, and reset (drop uncommitted changes, and
optionally move to another commit)."""

from __future__ import annotations

import contextlib

from branchwater.engine import failpoints
from branchwater.engine.errors import InvalidArgument, NotFound, PredicateFailed, too_many_tries
from branchwater.engine.graveler import protection
from branchwater.engine.graveler.fence import claim
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import BranchRecord, RepositoryRecord, new_incarnation
from branchwater.engine.graveler.names import check_ref_name
from branchwater.engine.graveler.staging import new_staging_token
from branchwater.engine.graveler.tags import refuse_shadowing


def create_branch(g: Graveler, repo: RepositoryRecord, name: str, source: str) -> BranchRecord:
    """Branch off the commit `source` resolves to (a branch's HEAD, as in lakeFS and git)."""
    check_ref_name(name)
    commit_id = g.refs.resolve(repo, source).commit_id
    fresh = BranchRecord(name, commit_id, new_staging_token(repo, name))
    claim(g, repo, commit_id)
    branch = protection.insert_new_branch(g, repo, fresh)
    _refuse_deleted_repository(g, repo, branch)
    refuse_shadowing(g, repo, "branch", name, lambda: _take_back(g, repo, branch))
    return branch


def _take_back(g: Graveler, repo: RepositoryRecord, branch: BranchRecord) -> None:
    with contextlib.suppress(NotFound, PredicateFailed):
        g.refs.remove_branch_if(repo, branch.name, branch.encode())


def _refuse_deleted_repository(g: Graveler, repo: RepositoryRecord, branch: BranchRecord) -> None:
    """A repository delete removes its record, then fences the branches it finds: read after
    the insert, a record still there means the fence will find this branch; one gone means
    the fence may have passed, so the creation takes its branch back (and the empty rule
    book it may have started) and is refused."""
    try:
        live = g.refs.get_repository(repo.name).unique_id == repo.unique_id
    except NotFound:
        live = False
    if not live:
        _take_back(g, repo, branch)
        protection.discard_empty_book(g, repo)
        raise NotFound(f"repository {repo.name!r} not found: it was deleted")


def delete_branch(g: Graveler, repo: RepositoryRecord, name: str) -> None:
    if name == repo.default_branch:
        raise InvalidArgument(
            f"cannot delete {name!r}: it is the default branch of repository {repo.name!r}"
        )
    for _ in g.retry:
        branch, predicate = g.refs.get_branch(repo, name)
        protection.check(repo, branch, "delete", f"deleting branch {name!r}")
        failpoints.hit("branch.before_delete")
        if g.remove_branch_dropping(repo, branch, predicate):
            return
    raise too_many_tries(f"delete of branch {name!r} of {repo.name!r}", g.retry.attempts)


def reset_branch(
    g: Graveler, repo: RepositoryRecord, name: str, to: str | None = None
) -> BranchRecord:
    """Drop every uncommitted change: a new empty staging token, no sealed tokens, no
    compaction. With `to` (any ref; a branch means its HEAD) the branch also points at that
    commit, in the same `set_if`, as `git reset --hard`; the commit it leaves stays readable
    by id, as commits are never deleted. A new incarnation tells a commit under way that
    its sealed changes may have been dropped, not recorded (`commit._left`)."""
    target = None if to is None else g.refs.resolve(repo, to).commit_id
    if target is not None:
        claim(g, repo, target)
    for _ in g.retry:
        branch, predicate = g.refs.get_branch(repo, name)
        what = "reset" if to is None else f"reset to {to!r}"
        protection.check(repo, branch, "reset", what, to_commit=target)
        reset = branch.uncompacted(
            commit_id=target or branch.commit_id,
            staging_token=new_staging_token(repo, name),
            sealed_tokens=(),
            incarnation=new_incarnation(),
        )
        if g.update_branch_dropping(
            repo, reset, predicate, (branch.staging_token, *branch.sealed_tokens)
        ):
            return reset
    raise too_many_tries(f"reset of branch {name!r} of {repo.name!r}", g.retry.attempts)
