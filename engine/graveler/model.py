"""Records of the versioned model and their byte encodings in the KV store.

`Entry` is a NamedTuple, not a dataclass, because commits build and decode millions of them:
tuple construction is several times cheaper. The staged-entry codec is a flat, NUL-separated
record for the same reason; an empty value is a tombstone. Size and mtime are digits and the
metadata is JSON (which escapes every control character), so only the address and the
checksum could hold a NUL: `encode_entry` refuses those, and text UTF-8 cannot encode, before
anything is stored, so no value can split into other fields than it was written with.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import cached_property, lru_cache
from typing import Any, Literal, NamedTuple

from branchwater.engine.errors import CorruptedData, InvalidArgument
from branchwater.engine.units import epoch_micros

Metadata = Mapping[str, str]
EMPTY_METADATA: Metadata = {}


class Entry(NamedTuple):
    """An object as a ref sees it. `address` is relative to the repository's namespace."""

    path: str
    address: str
    size: int
    checksum: str
    mtime: datetime
    metadata: Metadata = EMPTY_METADATA

    def identity(self) -> tuple[int, str, str]:
        """What makes two entries the same object: their content and metadata, never where the
        content is stored, so a rewrite of equal content is no change."""
        return (self.size, self.checksum, metadata_json(self.metadata))


ChangeType = Literal["added", "changed", "removed"]


class Change(NamedTuple):
    """A difference between two states of a ref; `entry` is the new one, or the old if removed."""

    path: str
    type: ChangeType
    entry: Entry

    @property
    def new_entry(self) -> Entry | None:
        """What the path holds after the change: `None` once removed."""
        return None if self.type == "removed" else self.entry


TOMBSTONE = b""
"""The staged value of a deleted path."""

_SEP = "\x00"
STAGED_SEPARATOR = _SEP
STAGED_FIELDS = ("address", "size", "checksum", "mtime_us", "metadata")
"""The fields of a staged value in order: what bulk readers split a value on `_SEP` into."""
_SEPARATORS = len(STAGED_FIELDS) - 1


METADATA_RULE = "metadata must map strings to strings"
TEXT_MAX_BYTES = 96 * 1024
"""The most a commit message, its committer, or a commit's or an entry's metadata may hold
as UTF-8: with the rest of its record, well inside the smallest KV value (DynamoDB's 400 KB
item), so a record too large is refused before anything is written, not by the store."""


def check_metadata(metadata: object, *, sized: bool = True) -> dict[str, str]:
    """`metadata` as a plain dict, or `InvalidArgument` naming what breaks the one rule every
    operation shares. Checked before anything is written: a commit must not seal its branch,
    nor an upload store its object, only to fail on the metadata afterwards."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidArgument(f"{METADATA_RULE}, not {type(metadata).__name__}")
    checked = dict(metadata)
    for key, value in checked.items():
        if not isinstance(key, str):
            raise InvalidArgument(f"{METADATA_RULE}: key {key!r} is of type {type(key).__name__}")
        if not isinstance(value, str):
            raise InvalidArgument(
                f"{METADATA_RULE}: the value of {key!r} is of type {type(value).__name__}"
            )
        if not (is_unicode(key) and is_unicode(value)):
            raise InvalidArgument(
                f"{METADATA_RULE} of valid Unicode: {key!r}: {value!r} holds a lone surrogate"
            )
    if sized:
        _check_size("metadata", sum(len(k.encode()) + len(v.encode()) for k, v in checked.items()))
    return checked


_STORE_AS_OBJECT = "store large content as an object and refer to its path"


def _check_size(what: str, size: int, advice: str = _STORE_AS_OBJECT) -> None:
    if size > TEXT_MAX_BYTES:
        raise InvalidArgument(
            f"{what} of {size:,} bytes is over the {TEXT_MAX_BYTES // 1024} KiB a record "
            f"holds: {advice}"
        )


def check_record_text(what: str, text: str, advice: str = _STORE_AS_OBJECT) -> str:
    """`text` as a record holds it: valid Unicode (no lone surrogate, which every later read
    would fail to encode) of at most `TEXT_MAX_BYTES` as UTF-8, else `InvalidArgument`
    naming `what` (with `advice` for text too long)."""
    if not is_unicode(text):
        raise InvalidArgument(
            f"{what} must be valid Unicode: {text[:64]!r} holds a lone surrogate (text "
            "decoded with errors='surrogateescape'?)"
        )
    _check_size(what, len(text.encode()), advice)
    return text


def check_flag(name: str, value: object) -> bool:
    """`value` if it is a bool: a flag given as text (`"False"`) would otherwise count as
    true."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, not {value!r}")
    return value


def check_commit_arguments(
    message: object, metadata: object, committer: object, *, sized: bool = True
) -> dict[str, str]:
    """The commit's metadata, once every argument a commit record holds is known to fit it:
    checked before the branch is sealed or a range written. Not `sized` for records stored
    once already (a refs dump), which lakes took before sizes were bounded."""
    if not isinstance(message, str):
        raise InvalidArgument(f"a commit message must be a string, not {type(message).__name__}")
    if not isinstance(committer, str):
        raise InvalidArgument(f"committer must be a string, not {type(committer).__name__}")
    if sized:
        check_record_text("a commit message", message)
        check_record_text("a committer", committer)
    return check_metadata(metadata, sized=sized)


def is_unicode(text: str) -> bool:
    """Whether `text` can be stored as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def metadata_json(metadata: Metadata) -> str:
    """The canonical JSON of entry metadata, "" when empty: what identity and ranges store."""
    return json.dumps(dict(metadata), sort_keys=True, separators=(",", ":")) if metadata else ""


def encode_entry(entry: Entry) -> bytes:
    """Encode the staged value of `entry` (the path is the KV key, so it is not repeated);
    `InvalidArgument` for a field that would not decode as written."""
    text = _SEP.join(
        (
            entry.address,
            str(entry.size),
            entry.checksum,
            str(epoch_micros(entry.mtime)),
            metadata_json(entry.metadata),
        )
    )
    if text.count(_SEP) != _SEPARATORS:
        raise InvalidArgument(
            f"the entry for {entry.path!r} has a NUL character in its address or checksum"
        )
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"the entry for {entry.path!r} has a lone surrogate in its address or checksum"
        ) from None


def decode_entry(path: str, value: bytes) -> Entry | None:
    """Decode a staged value; `None` for a tombstone."""
    if not value:
        return None
    try:
        address, size, checksum, mtime_us, metadata = value.decode().split(_SEP)
        return Entry(
            path,
            address,
            int(size),
            checksum,
            datetime.fromtimestamp(int(mtime_us) / 1_000_000, timezone.utc),
            json.loads(metadata) if metadata else EMPTY_METADATA,
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptedData(f"staged entry for {path!r} cannot be decoded: {exc}") from exc


def _dumps(record: Any) -> bytes:
    return json.dumps(asdict(record), sort_keys=True, separators=(",", ":"), default=str).encode()


@dataclass(frozen=True)
class RepositoryRecord:
    """A repository as stored under `repos/<name>`; `api.Repository` is the handle over it."""

    name: str
    storage_namespace: str
    default_branch: str
    unique_id: str
    creation_date: datetime

    @cached_property
    def partition(self) -> bytes:
        """Computed once: every KV call of a branch operation names it."""
        return f"{self.name}-{self.unique_id}".encode()

    def encode(self) -> bytes:
        return _dumps(self)

    @classmethod
    def decode(cls, value: bytes) -> RepositoryRecord:
        raw = json.loads(value)
        raw["creation_date"] = datetime.fromisoformat(raw["creation_date"])
        return cls(**raw)


def new_incarnation() -> str:
    """A `BranchRecord.incarnation` no record has had: random, so two processes creating or
    resetting a branch at once never pick the same one."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class BranchRecord:
    """A branch as stored (`api.Branch` is the handle over it). All of it lives in one KV
    value, so one `set_if` changes it atomically."""

    name: str
    commit_id: str
    staging_token: str
    sealed_tokens: tuple[str, ...] = ()
    compacted_metarange_id: str | None = None
    compaction_start_time: datetime | None = None
    compacted_from: str | None = None
    """The oldest sealed token whose changes the compacted metarange holds, kept by the
    compactions that extend it and by rebases: a commit whose tokens were absorbed tells by
    it that this compaction holds them, not one begun after another commit recorded them
    (`commit._read`). None with no compaction, or for one made before the field existed."""
    protection: str = ""
    """The protection rules matching this branch, as `graveler.protection` stamps them: in
    the record, so every write reads them under the branch's own compare-and-swap."""
    incarnation: str = field(default_factory=new_incarnation)
    """Fresh for every branch record made and every reset, kept by seals, commits, merges
    and compactions: a commit whose tokens left the branch tells by it whether a reset (or a
    delete and re-creation) came between, which HEAD alone cannot show when the reset kept
    HEAD or moved it to a descendant. "" for a record stored before the field existed."""

    def base(self, head_metarange_id: str) -> str:
        """What the staging sits on, given HEAD's metarange: the compacted one, else HEAD's."""
        return self.compacted_metarange_id or head_metarange_id

    def uncompacted(self, **changes: Any) -> BranchRecord:
        """The record with `changes` and no compaction (its metarange recorded or dropped)."""
        return dataclasses.replace(
            self,
            **{
                "compacted_metarange_id": None,
                "compaction_start_time": None,
                "compacted_from": None,
                **changes,
            },
        )

    def encode(self) -> bytes:
        """A field left empty (no rule ever matched, a record from before incarnations) is
        stored without it, so a record read and written back keeps the bytes it had."""
        raw = asdict(self)
        for optional in ("protection", "incarnation", "compacted_from"):
            if not raw[optional]:
                del raw[optional]
        return json.dumps(raw, sort_keys=True, separators=(",", ":"), default=str).encode()

    @classmethod
    def decode(cls, value: bytes) -> BranchRecord:
        """Records are immutable and a branch's value changes only with a commit or a seal,
        so a writer reading it twice per write decodes each value once (`_decode_branch`)."""
        return _decode_branch(value)

    @classmethod
    def _decode(cls, value: bytes) -> BranchRecord:
        raw = json.loads(value)
        raw["sealed_tokens"] = tuple(raw["sealed_tokens"])
        raw.setdefault("incarnation", "")
        if raw.get("compaction_start_time"):
            raw["compaction_start_time"] = datetime.fromisoformat(raw["compaction_start_time"])
        return cls(**raw)


_decode_branch = lru_cache(maxsize=256)(BranchRecord._decode)


@dataclass(frozen=True)
class Commit:
    id: str
    message: str
    metarange_id: str
    parents: tuple[str, ...]
    metadata: dict[str, str] = field(default_factory=dict)
    creation_date: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    committer: str = ""
    generation: int = 1

    def encode(self) -> bytes:
        return _dumps(self)

    @classmethod
    def decode(cls, value: bytes) -> Commit:
        raw = json.loads(value)
        raw["parents"] = tuple(raw["parents"])
        raw["creation_date"] = datetime.fromisoformat(raw["creation_date"])
        return cls(**raw)


@dataclass(frozen=True)
class Tag:
    name: str
    commit_id: str

    def encode(self) -> bytes:
        return _dumps(self)

    @classmethod
    def decode(cls, value: bytes) -> Tag:
        return cls(**json.loads(value))
