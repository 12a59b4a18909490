"""Rendering results: human text by default, exactly one JSON document with `--json`.

Each record has one JSON form here (`*_to_json`) and, where a listing shows it line by line,
one text form, so every verb that prints a record prints it the same way.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC
from typing import TypeVar

from branchwater.engine.api import Repository
from branchwater.engine.cli.progress import Progress
from branchwater.engine.graveler.compaction import CompactionResult, CompactionStatus
from branchwater.engine.graveler.merge import MergeResult
from branchwater.engine.graveler.model import Change, Commit, Entry, Tag
from branchwater.engine.units import human_size, timestamp

SHORT_ID = 12
"""Abbreviated commit ids in tables; `Repository.ref` resolves any unique prefix."""

DIFF_MARKS = {"added": "+", "changed": "~", "removed": "-"}

T = TypeVar("T")


class Output:
    """Renders results as human text or, with `--json`, as exactly one JSON document; long
    work reports through `progress`."""

    def __init__(self, as_json: bool, progress: Progress) -> None:
        self.as_json = as_json
        self.progress = progress

    def _write(self, text: str) -> None:
        write_all(text.encode(sys.stdout.encoding, sys.stdout.errors or "strict"))

    def document(self, doc: object, text: str) -> None:
        """One result: `doc` for machines, `text` (one or more lines) for people."""
        if self.as_json:
            self._write(json.dumps(doc, indent=2) + "\n")
        else:
            self._write(text + "\n")

    def stream(
        self, items: Iterable[T], to_json: Callable[[T], object], to_text: Callable[[T], str]
    ) -> None:
        """A listing that may be long: text lines go out as the items arrive."""
        if self.as_json:
            self._write(json.dumps([to_json(item) for item in items], indent=2) + "\n")
            return
        for item in items:
            self._write(to_text(item) + "\n")

    def table(
        self,
        items: Sequence[T],
        to_json: Callable[[T], object],
        header: Sequence[str],
        to_row: Callable[[T], Sequence[str]],
    ) -> None:
        """A short listing (repositories, branches, tags) as aligned columns under a header."""
        if self.as_json:
            self._write(json.dumps([to_json(item) for item in items], indent=2) + "\n")
            return
        if items:
            self._write("".join(line + "\n" for line in align([header, *map(to_row, items)])))

    def raw(self, data: bytes) -> None:
        """Object bytes, unchanged: `cat` must round-trip binary data."""
        write_all(data)


def write_all(data: bytes) -> None:
    """Every byte of `data` to stdout, or an `OSError`: a buffered write the disk takes only
    part of (a full disk) reports the shortfall in its count alone, and the command would
    exit 0 with its output cut short."""
    sys.stdout.flush()
    out = sys.stdout.buffer
    view = memoryview(data)
    while view:
        written = out.write(view)
        if not written:
            raise OSError(errno.ENOSPC, "stdout took none of the output")
        view = view[written:]
    out.flush()


def align(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-align columns two spaces apart; the last column is never padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]


def short(commit_id: str) -> str:
    return commit_id[:SHORT_ID]


# ---------------------------------------------------------------------------- JSON records


def repository_to_json(repo: Repository) -> dict[str, object]:
    return {
        "name": repo.name,
        "storage_namespace": repo.storage_namespace,
        "default_branch": repo.default_branch,
        "creation_date": repo.record.creation_date.isoformat(),
    }


def branch_to_json(name: str, commit_id: str) -> dict[str, object]:
    """A branch by its head as read once, so the JSON and the text show the same commit."""
    return {"name": name, "commit_id": commit_id}


def entry_to_json(entry: Entry) -> dict[str, object]:
    return {
        "path": entry.path,
        "address": entry.address,
        "size": entry.size,
        "checksum": entry.checksum,
        "mtime": entry.mtime.astimezone(UTC).isoformat(),
        "metadata": dict(entry.metadata),
    }


def change_to_json(change: Change) -> dict[str, object]:
    return {"path": change.path, "type": change.type, "entry": entry_to_json(change.entry)}


def commit_to_json(commit: Commit) -> dict[str, object]:
    return {
        "id": commit.id,
        "message": commit.message,
        "metarange_id": commit.metarange_id,
        "parents": list(commit.parents),
        "metadata": commit.metadata,
        "creation_date": commit.creation_date.isoformat(),
        "committer": commit.committer,
    }


def merge_to_json(result: MergeResult) -> dict[str, object]:
    """The merge commit, plus how it was reached."""
    return {
        **commit_to_json(result.commit),
        "attempts": result.attempts,
        "fast_forward": result.fast_forward,
    }


def tag_to_json(tag: Tag) -> dict[str, object]:
    return {"name": tag.name, "commit_id": tag.commit_id}


def compaction_status_to_json(status: CompactionStatus) -> dict[str, object]:
    return {**dataclasses.asdict(status), "reasons": list(status.reasons), "due": status.due}


def compaction_result_to_json(result: CompactionResult) -> dict[str, object]:
    return {**dataclasses.asdict(result), "compacted": result.compacted}


# ------------------------------------------------------------------------------- text forms


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"}


def shown(text: str) -> str:
    """`text` (a path, a metadata value) as one line a terminal prints as it is: quoted with
    C escapes, as git quotes paths, when it holds a character that is not printable (a line
    break would split a listing's line, an escape sequence would drive the terminal), a
    quote or a backslash. `--json` carries it unchanged."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return (
        '"'
        + "".join(_ESCAPES.get(c) or (c if c.isprintable() else _escaped(c)) for c in text)
        + '"'
    )


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def entry_line(entry: Entry) -> str:
    return f"{human_size(entry.size):>10}  {timestamp(entry.mtime)}  {shown(entry.path)}"


def change_line(change: Change) -> str:
    return f"{DIFF_MARKS[change.type]} {shown(change.path)}"


def commit_block(commit: Commit) -> str:
    """A commit as `git log` shows it: id, merge parents, author, date, metadata, message."""
    lines = [f"commit {commit.id}"]
    if len(commit.parents) > 1:
        lines.append("Merge:  " + " ".join(short(p) for p in commit.parents))
    if commit.committer:
        lines.append(f"Author: {shown(commit.committer)}")
    lines.append(f"Date:   {timestamp(commit.creation_date)}")
    for key, value in sorted(commit.metadata.items()):
        lines.append(f"Meta:   {shown(key)}={shown(value)}")
    lines.append("")
    lines.extend(f"    {line}" for line in commit.message.splitlines() or [""])
    return "\n".join(lines) + "\n"


def compaction_status_row(status: CompactionStatus) -> tuple[str, ...]:
    """A branch's figures; counts the scan budget cut short end in "+" (at least that)."""
    more = "" if status.complete else "+"
    if status.due:
        verdict = "due: " + "; ".join(status.reasons)
    elif status.reasons:
        verdict = "guarded: a compaction started recently"
    else:
        verdict = "ok"
    return (
        status.branch,
        f"{status.staged_entries}{more}",
        f"{status.staged_tombstones}{more}",
        str(status.sealed_tokens),
        "yes" if status.compacted else "no",
        age(status.last_compaction_age),
        verdict,
    )


def age(seconds: float | None) -> str:
    """How long ago, coarsely: `-` for never."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def compaction_result_text(result: CompactionResult) -> str:
    if not result.compacted:
        return f"Not compacted ({result.outcome}): {result.message}"
    return (
        f"Compacted {result.branch!r}: {result.entries_applied} entries and "
        f"{result.tombstones_removed} tombstones from {result.sealed_tokens} sealed token(s); "
        f"{result.ranges_written} ranges written, {result.ranges_reused} reused "
        f"in {result.seconds:.2f} s"
    )
