"""Objects written by other tools (Spark, aws cli): hand out an address, then link it.

The address is in the current slice and comes with a signed, expiring, single-use token
(`tokens.py`). Linking checks the token, that the object is there with the size given, then
uses the token up, checks its expiry again and stages the entry; an object stamped before
its token was issued (put in place by a tool that keeps an older modification time: `mv`,
`cp -p`, `rsync -a`) would look older to GC than its token promises, and is staged from a
fresh copy instead (`fresh_object`); if staging fails the token
is given back, so a failed link leaves neither an entry nor a spent token. A link of content
the branch already shows at that path (same identity) stages nothing, as an upload would
not: the linked object is then unreferenced, and GC's to collect.
"""

from __future__ import annotations

from collections.abc import Mapping

from branchwater.engine import failpoints
from branchwater.engine.errors import InvalidAddress, InvalidArgument, NotFound
from branchwater.engine.gc.addresses import check_data_address
from branchwater.engine.gc.context import GCContext
from branchwater.engine.gc.tokens import PhysicalAddress
from branchwater.engine.graveler import protection, writes
from branchwater.engine.graveler.checksums import check_checksum
from branchwater.engine.graveler.fence import OPERATION_MARGIN
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import Entry, RepositoryRecord, check_metadata
from branchwater.engine.graveler.uploads import fresh_object
from branchwater.engine.objects import ObjectInfo


def get_physical_address(
    g: Graveler, gc: GCContext, repo: RepositoryRecord, branch_name: str
) -> PhysicalAddress:
    """An address and its link token; a branch its rules keep from direct writes is refused
    now, before anything is written to the address, as its link would be."""
    branch = g.read_branch(repo, branch_name)
    protection.check(repo, branch, "write", "get_physical_address")
    return gc.tokens.issue(repo, branch_name, gc.addresses.next_address())


def link_physical_address(
    g: Graveler,
    gc: GCContext,
    repo: RepositoryRecord,
    branch_name: str,
    path: str,
    token: str,
    *,
    size: int,
    checksum: str,
    metadata: Mapping[str, str] | None = None,
    address: str | None = None,
) -> Entry:
    """Stage the object written at the token's address as `path`; `address`, if given, must
    be the token's."""
    _check_size(size)
    checksum = check_checksum(checksum)
    meta = check_metadata(metadata)
    claim = gc.tokens.verify(repo, branch_name, token)
    if address is not None and check_data_address(address) != claim.address:
        raise InvalidAddress(
            f"address {address!r} is not the one this token was issued for ({claim.address})"
        )
    info = _uploaded(g, repo, claim.address)
    if info.size != size:
        raise InvalidArgument(
            f"the object at {claim.address} has {info.size} bytes, not the {size} given; "
            "link it once the upload is complete"
        )
    store = g.objects(repo.storage_namespace)
    address, info = fresh_object(
        store,
        claim.address,
        info,
        gc.addresses.next_address,
        stale=info.mtime < claim.expires - gc.tokens.expiry - OPERATION_MARGIN,
        drop_written=False,
    )
    gc.tokens.use(repo, claim)
    entry = Entry(path, address, size, checksum, info.mtime, meta)
    try:
        current = writes.shown_entry(g, repo, branch_name, path, entry)
        if current is not None:
            return current
        failpoints.hit("link.before_stage")
        gc.tokens.check_live(claim)
        writes.stage_entry(g, repo, branch_name, entry)
    except BaseException:
        gc.tokens.give_back(repo, claim)
        raise
    gc.sweep_later(repo)
    return entry


def _uploaded(g: Graveler, repo: RepositoryRecord, address: str) -> ObjectInfo:
    try:
        return g.objects(repo.storage_namespace).stat(address)
    except NotFound:
        raise NotFound(
            f"nothing was written at {address} in {repo.storage_namespace}; upload the object "
            "there before linking it"
        ) from None


def _check_size(size: object) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidArgument(f"size must be a non-negative integer, not {size!r}")
