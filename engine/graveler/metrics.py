"""Prometheus metrics of staging compaction, in a registry of their own.

Each `Graveler` owns one registry, so two lakes in a process (or two tests) never share
counters. A process exposes it with prometheus_client, for instance
`start_http_server(port, registry=lake.metrics.registry)`; `exposition()` is the same text a
scrape returns, which `branchwater compact --metrics` prints.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
"""Seconds: from a branch with a handful of staged rows to one with millions."""


class CompactionMetrics:
    """What a compaction sensor and compactor report, labelled by repository (and branch)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.duration = Histogram(
            "branchwater_compaction_duration_seconds",
            "Seconds a successful compaction took, from sealing to the branch update.",
            ["repository"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.sealed_tokens = Gauge(
            "branchwater_sealed_tokens",
            "Sealed staging tokens of a branch when a sensor or compactor last looked.",
            ["repository", "branch"],
            registry=self.registry,
        )
        self.tombstones = Counter(
            "branchwater_compaction_tombstones",
            "Staged tombstones that compactions removed from the staging area.",
            ["repository"],
            registry=self.registry,
        )
        self.skipped = Counter(
            "branchwater_compactions_skipped",
            "Compactions skipped because another one started within the guard window.",
            ["repository"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "branchwater_compactions",
            "Compaction requests by outcome (compacted, superseded, guarded, not-due, ...).",
            ["repository", "outcome"],
            registry=self.registry,
        )

    def exposition(self) -> str:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry).decode()
