"""`protect` (set, list, remove protection rules and read their log) and `checks` (list and
record the checks on a commit)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from branchwater.engine.api import Lake, Repository
from branchwater.engine.cli.commits import default_committer
from branchwater.engine.cli.output import Output, short, shown
from branchwater.engine.cli.verbs import Subparsers, UserError, trailing_list, verb
from branchwater.engine.graveler.checks import CheckResult
from branchwater.engine.graveler.protection import ProtectionChange, ProtectionRule


def rule_to_json(rule: ProtectionRule) -> dict[str, object]:
    return rule.to_json()


def rule_text(rule: ProtectionRule | None) -> str:
    """The rules a pattern sets, as its flags read: `no_direct_writes, require quality`."""
    if rule is None:
        return "-"
    said = [name for name in rule.rule_names if name != "required_checks"]
    said += [f"require {name}" for name in rule.required_checks]
    return ", ".join(said)


def change_to_json(change: ProtectionChange) -> dict[str, object]:
    return change.to_json()


def check_to_json(result: CheckResult) -> dict[str, object]:
    return json.loads(result.encode())


def cmd_protect(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    repo = lake.repository(args.repo)
    setting = args.no_direct_writes or args.require_check or args.no_delete or args.no_reset
    if args.log:
        _refuse_with(args, "--log", setting or args.remove or args.pattern)
        _print_log(repo, out)
    elif args.pattern is None:
        _refuse_with(args, "listing (no PATTERN)", setting or args.remove)
        out.table(_listing(repo), _listed_json, ("PATTERN", "RULES"), _listed_row)
    elif args.remove:
        _refuse_with(args, "--remove", setting)
        repo.unprotect(args.pattern, by=_by(args))
        out.document(
            {"repository": args.repo, "pattern": args.pattern, "removed": True},
            f"Removed the protection of {args.pattern!r}",
        )
    elif not setting:
        raise UserError(
            "say what to protect: --no-direct-writes, --require-check NAME, --no-delete or "
            "--no-reset (or --remove the pattern's rule)"
        )
    else:
        rule = repo.protect(
            args.pattern,
            no_direct_writes=args.no_direct_writes,
            required_checks=args.require_check,
            no_delete=args.no_delete,
            no_reset=args.no_reset,
            by=_by(args),
        )
        out.document(rule_to_json(rule), f"Protected {rule.pattern!r}: {rule_text(rule)}")


Listed = tuple[str, ProtectionRule | None]
"""A pattern as listed: its rule, or None for a removal whose fence is pending."""

PENDING = "pending: not yet enforced on existing branches: run protect again"
REMOVAL_PENDING = (
    "removed, pending: still enforced on some existing branches: run protect --remove again"
)


def _listing(repo: Repository) -> list[Listed]:
    rules: list[Listed] = [(rule.pattern, rule) for rule in repo.protections()]
    removals: list[Listed] = [(pattern, None) for pattern in repo.pending_unprotects()]
    return sorted(rules + removals, key=lambda listed: listed[0])


def _listed_json(listed: Listed) -> dict[str, object]:
    pattern, rule = listed
    if rule is None:
        return {"pattern": pattern, "removed": True, "pending": True}
    return {**rule.to_json(), "pending": rule.pending}


def _listed_row(listed: Listed) -> tuple[str, str]:
    pattern, rule = listed
    if rule is None:
        return pattern, f"- ({REMOVAL_PENDING})"
    return pattern, rule_text(rule) + (f" ({PENDING})" if rule.pending else "")


def _refuse_with(args: argparse.Namespace, mode: str, conflicting: object) -> None:
    if conflicting:
        raise UserError(f"{mode} takes no PATTERN, rule flags or --remove")


def _by(args: argparse.Namespace) -> str:
    return args.by if args.by is not None else default_committer()


def _print_log(repo: Repository, out: Output) -> None:
    out.table(
        repo.protection_log(),
        change_to_json,
        ("VERSION", "WHEN", "BY", "ACTION", "PATTERN", "RULES"),
        lambda c: (
            str(c.version),
            f"{c.at:%Y-%m-%d %H:%M:%S}",
            shown(c.by) if c.by else "-",
            c.action,
            c.pattern,
            rule_text(c.rule),
        ),
    )


def cmd_checks(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    words = args.words
    if words[0] == "record" and len(words) == 4:
        _record(lake.repository(words[1]), words[2], words[3], args, out)
        return
    if len(words) != 2:
        raise UserError(
            "usage: branchwater checks REPO COMMIT, or checks record REPO COMMIT NAME "
            "(--passed | --failed) [--details JSON | --details-file PATH]"
        )
    if args.passed or args.failed or args.details or args.details_file:
        raise UserError("--passed, --failed and --details go with 'checks record'")
    out.table(
        lake.repository(words[0]).checks(words[1]),
        check_to_json,
        ("CHECK", "RESULT", "BY", "WHEN", "DETAILS"),
        lambda r: (
            r.name,
            "passed" if r.passed else "failed",
            shown(r.recorded_by) if r.recorded_by else "-",
            f"{r.recorded_at:%Y-%m-%d %H:%M:%S}",
            _brief(r.details),
        ),
    )


def _record(
    repo: Repository, commit: str, name: str, args: argparse.Namespace, out: Output
) -> None:
    if args.passed == args.failed:
        raise UserError("say how the check went: --passed or --failed")
    result = repo.record_check(commit, name, args.passed, _details(args), by=_by(args))
    verdict = "passed" if result.passed else "failed"
    out.document(
        check_to_json(result),
        f"Recorded {name!r} ({verdict}) on {short(result.commit_id)} of {repo.name!r}",
    )


def _details(args: argparse.Namespace) -> Any:
    """The parsed JSON, whatever it is: the engine says what details must be."""
    if args.details and args.details_file:
        raise UserError("give --details or --details-file, not both")
    text = args.details
    if args.details_file:
        try:
            text = Path(args.details_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read --details-file {args.details_file!r}: {exc}") from exc
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UserError(f"--details is not JSON: {exc}") from exc


def _brief(details: dict[str, object], width: int = 60) -> str:
    text = json.dumps(details, sort_keys=True) if details else "-"
    return text if len(text) <= width else text[: width - 3] + "..."


def register(sub: Subparsers) -> None:
    protect = verb(
        sub,
        "protect",
        cmd_protect,
        "protect branches matching PATTERN; without PATTERN, list the rules",
    )
    protect.add_argument("repo", metavar="REPO")
    protect.add_argument(
        "pattern",
        metavar="PATTERN",
        nargs="?",
        help="a branch name or glob (* within a /-separated part, ** across them)",
    )
    protect.add_argument(
        "--no-direct-writes",
        action="store_true",
        help="refuse uploads, deletes, commits, reverts, cherry-picks: only merges",
    )
    protect.add_argument(
        "--require-check",
        action="append",
        default=[],
        metavar="NAME",
        help="merges need this check passed on the commit merged (repeatable)",
    )
    protect.add_argument("--no-delete", action="store_true", help="refuse deleting the branch")
    protect.add_argument(
        "--no-reset", action="store_true", help="refuse resetting it to another commit"
    )
    protect.add_argument("--remove", action="store_true", help="remove PATTERN's rule")
    protect.add_argument("--log", action="store_true", help="list every rule change")
    protect.add_argument("--by", metavar="WHO", help="who changes the rules (default: you)")
    checks = verb(
        sub,
        "checks",
        cmd_checks,
        "list the checks on COMMIT, or record one (checks record REPO COMMIT NAME)",
    )
    checks.usage = (
        "%(prog)s REPO COMMIT\n       %(prog)s record REPO COMMIT NAME (--passed | --failed) "
        "[--details JSON | --details-file PATH] [--by WHO]"
    )
    trailing_list(checks, "words", "+", metavar="ARG", help="REPO COMMIT, or record ...")
    checks.add_argument("--passed", action="store_true", help="the check passed")
    checks.add_argument("--failed", action="store_true", help="the check failed")
    checks.add_argument("--details", metavar="JSON", help="a JSON object of at most 16 KiB")
    checks.add_argument("--details-file", metavar="PATH", help="read the details from a file")
    checks.add_argument("--by", metavar="WHO", help="who records it (default: you)")
