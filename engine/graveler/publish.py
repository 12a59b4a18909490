"""Publishing a merge preview: the destination moves to the previewed merge commit only if it
has not moved since the preview was built.

`merge(..., preview=True)` records the merge commit on the destination's HEAD without
landing it, so checks can gate the merged result itself (write-audit-publish on the result,
not only on the source). The preview's first parent is the HEAD it was built on; publishing
is one `set_if` of the branch record whose HEAD is still that parent. A destination that
moved in between is never overwritten: the preview is stale, and previewing again (with the
`MergeRaceLost.hint`, merging only what this preview brought in onto the new HEAD) is the
way on. A preview older than the retention can expire unpublished: publishing moves the
branch onto it, so it is claimed as a fast-forward's target is (`fence.claim`).
"""

from __future__ import annotations

from branchwater.engine import failpoints
from branchwater.engine.errors import InvalidArgument, MergeRaceLost, too_many_tries
from branchwater.engine.graveler.checks import check_merge
from branchwater.engine.graveler.commit import releasing
from branchwater.engine.graveler.fence import claim
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.merge import (
    PREVIEW_KEY,
    STRATEGY_KEY,
    Attempt,
    MergeResult,
    merge_hint,
    moved_to,
    ready_destination,
)
from branchwater.engine.graveler.model import Commit, RepositoryRecord

VERB = "publishing a merge preview into it"


def publish(g: Graveler, repo: RepositoryRecord, commit_ref: str, destination: str) -> MergeResult:
    """Move `destination` to the preview `commit_ref` names, if its HEAD is still the
    preview's first parent; `MergeRaceLost` (hint: the preview's work) if it moved. A
    destination already at the preview is a success, so a retried publish changes nothing."""
    preview = previewed_commit(g, repo, commit_ref, destination)
    with releasing(g, repo, destination) as opened:
        for attempt in g.retry:
            current, _ = g.refs.get_branch(repo, destination)
            if current.commit_id == preview.id:
                return MergeResult(preview, attempt)
            ready = ready_destination(g, repo, destination, VERB, opened)
            if ready is None:
                continue
            branch, predicate = ready
            what = f"publishing {preview.id[:12]} into {destination!r}"
            check_merge(g, repo, branch, (preview.id, preview.parents[1]), what)
            if branch.commit_id != preview.parents[0]:
                raise _stale(g, repo, preview, destination, branch.commit_id, attempt)
            claim(g, repo, preview.id)
            failpoints.hit("publish.before_set")
            moved = moved_to(branch, preview.id)
            if g.update_branch_dropping(repo, moved, predicate, branch.sealed_tokens):
                return MergeResult(preview, attempt)
        what = f"publishing {preview.id[:12]} into {destination!r} of {repo.name!r}"
        raise too_many_tries(what, g.retry.attempts)


def previewed_commit(
    g: Graveler, repo: RepositoryRecord, commit_ref: str, destination: str
) -> Commit:
    """The merge preview `commit_ref` names, built for `destination`; `InvalidArgument` for a
    commit that is not one (publishing any commit would be a reset without its rule)."""
    commit = g.refs.get_commit(repo, g.refs.resolve(repo, commit_ref).commit_id)
    into = commit.metadata.get(PREVIEW_KEY)
    if into is None or len(commit.parents) != 2:
        raise InvalidArgument(
            f"commit {commit.id[:12]} of {repo.name!r} is not a merge preview: publish takes "
            "the commit merge(..., preview=True) returned"
        )
    if into != destination:
        raise InvalidArgument(
            f"commit {commit.id[:12]} previews a merge into {into!r}, not into {destination!r}"
        )
    return commit


def _stale(
    g: Graveler,
    repo: RepositoryRecord,
    preview: Commit,
    destination: str,
    head: str,
    attempt: int,
) -> MergeRaceLost:
    onto, source = preview.parents
    strategy = preview.metadata.get(STRATEGY_KEY)
    hint = merge_hint(g, repo, Attempt(preview.metarange_id, onto, ()), source, strategy)
    message = (
        f"{destination!r} of {repo.name!r} moved to {head[:12]} since the preview "
        f"{preview.id[:12]} was built on {preview.parents[0][:12]}: nothing was published; "
        f"preview again (merge(..., preview=True, hint={hint!r}) reuses this preview's work) "
        "and publish the new preview"
    )
    return MergeRaceLost("publish", attempt, hint, message=message)
