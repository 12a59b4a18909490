"""What one lake connection keeps for uncommitted GC: settings, addresses, tokens, copies."""

from __future__ import annotations

from branchwater.engine.gc.addresses import AddressAllocator
from branchwater.engine.gc.copies import CopyTracker
from branchwater.engine.gc.housekeeping import Housekeeper
from branchwater.engine.gc.lakewide import LakeLimits
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.gc.tokens import Clock, LinkTokens, utc_now
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.kv import Store


class GCContext:
    def __init__(
        self,
        kv: Store,
        settings: GCSettings | None = None,
        *,
        addresses: AddressAllocator | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.settings = settings or GCSettings()
        self.clock = clock
        self.addresses = addresses or AddressAllocator()
        self.limits = LakeLimits(kv, self.settings)
        self.tokens = LinkTokens(kv, self.settings.token_expiry, clock, self.limits.cover)
        self.copies = CopyTracker(kv, self.settings.copy_record_ttl, clock, self.limits.cover)
        self.housekeeper = Housekeeper()

    def sweep_later(self, repo: RepositoryRecord) -> None:
        """Remove the repository's expired copy records and used tokens in the background."""
        partition = repo.partition.decode()
        self.housekeeper.maybe_run(f"copies/{partition}", lambda: self.copies.sweep(repo))
        self.housekeeper.maybe_run(f"tokens/{partition}", lambda: self.tokens.sweep(repo))

    def close(self) -> None:
        self.housekeeper.close()
