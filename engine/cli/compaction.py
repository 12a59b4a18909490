"""`compact | compaction-status`: the staging-compaction sensor and compactor by hand."""

from __future__ import annotations

import argparse

from branchwater.engine.api import Lake
from branchwater.engine.cli.output import (
    Output,
    compaction_result_text,
    compaction_result_to_json,
    compaction_status_row,
    compaction_status_to_json,
)
from branchwater.engine.cli.verbs import Subparsers, positive_int, verb
from branchwater.engine.graveler.compaction import CompactionPolicy, CompactionStatus

STATUS_HEADER = (
    "BRANCH",
    "STAGED",
    "TOMBSTONES",
    "SEALED",
    "COMPACTED",
    "LAST COMPACTION",
    "VERDICT",
)


def policy_of(args: argparse.Namespace) -> CompactionPolicy:
    """The thresholds given on the command line, the defaults for the rest."""
    given = {
        name: getattr(args, name)
        for name in ("max_tombstones", "max_sealed_tokens", "scan_budget", "guard_seconds")
        if getattr(args, name) is not None
    }
    return CompactionPolicy(**given)


def cmd_compact(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    branch = lake.repository(args.repo).branch(args.branch)
    result = branch.compact(if_needed=args.if_needed, policy=policy_of(args))
    doc = compaction_result_to_json(result)
    text = compaction_result_text(result)
    if args.metrics:
        exposition = lake.metrics.exposition()
        doc["metrics"] = exposition
        text = f"{text}\n{exposition.rstrip()}"
    out.document(doc, text)


def cmd_compaction_status(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    repo = lake.repository(args.repo)
    policy = policy_of(args)
    statuses: list[CompactionStatus]
    if args.branch:
        statuses = [repo.branch(args.branch).compaction_status(policy)]
    else:
        statuses = repo.compaction_status(policy)
    out.table(statuses, compaction_status_to_json, STATUS_HEADER, compaction_status_row)


def _policy_options(parser: argparse.ArgumentParser) -> None:
    defaults = CompactionPolicy()
    parser.add_argument(
        "--max-tombstones",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"due at this many staged tombstones (default {defaults.max_tombstones})",
    )
    parser.add_argument(
        "--max-sealed-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"due at this many sealed tokens (default {defaults.max_sealed_tokens})",
    )
    parser.add_argument(
        "--scan-budget",
        type=positive_int,
        default=None,
        metavar="ROWS",
        help=f"staged rows the sensor reads at most (default {defaults.scan_budget})",
    )
    parser.add_argument(
        "--guard-seconds",
        type=float,
        default=None,
        metavar="S",
        help="skip a branch whose last compaction started this recently "
        f"(default {defaults.guard_seconds:.0f})",
    )


def register(sub: Subparsers) -> None:
    compact = verb(
        sub, "compact", cmd_compact, "fold a branch's staging area into a compacted metarange"
    )
    compact.add_argument("repo", metavar="REPO")
    compact.add_argument("branch", metavar="BRANCH")
    compact.add_argument(
        "--if-needed", action="store_true", help="only when a threshold is reached (a sensor)"
    )
    compact.add_argument(
        "--metrics", action="store_true", help="print the Prometheus metrics afterwards"
    )
    _policy_options(compact)
    status = verb(
        sub,
        "compaction-status",
        cmd_compaction_status,
        "show what staging compaction decides on, per branch, and the verdict",
    )
    status.add_argument("repo", metavar="REPO")
    status.add_argument("branch", metavar="BRANCH", nargs="?", default=None)
    _policy_options(status)
