"""The view's object browser: a ref's objects folder by folder, and one object's page with
its entry, the last commit that changed it and a preview of Parquet and CSV objects.

Listings are paged (`PAGE` rows): a folder costs one listing seek past its contents, never a
walk through them. The last commit is searched among the ref's newest `HISTORY_DEPTH`
commits only. A preview reads through `Ref.open` + pyarrow and never reads more than
`PREVIEW_BYTES` of the object: a Parquet footer and first row group, a CSV's first block. It
decodes no Parquet row groups whose footer says they expand past `PREVIEW_DECODED`, and cuts
long cells in Arrow, before any becomes a Python value.
Refs and paths come from the URL: names the engine refuses are 404 pages, and every value is
escaped by the templates.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from branchwater.engine import BranchwaterError, InvalidArgument, NotFound, human_size

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from branchwater.engine import Commit, Entry, Ref, Repository
    from branchwater.plugin.ui.app import _Renderer
    from branchwater.plugin.ui.lake import LakeAccess

PAGE = 200
"""Rows of a folder listing per page."""
HISTORY_DEPTH = 100
"""Commits searched for the last one that changed an object."""
PREVIEW_BYTES = 8 << 20
"""The most a preview reads of an object."""
PREVIEW_DECODED = 32 << 20
"""The most a Parquet preview decodes, as the footer states the uncompressed size of the row
groups its rows lie in: `PREVIEW_BYTES` bounds the compressed bytes fetched only, and those
can expand a thousandfold (a 10 KiB object can hold a 48 MiB cell of zeros)."""
PREVIEW_ROWS = 20
CELL_CHARS = 200
CSV_BLOCK = 1 << 20
"""A CSV preview reads (and infers its types from) this much of the object at most."""
WHOLE_BYTES = 1 << 20
"""An object this small is fetched once, whole (checksum verified), and previewed from memory."""
_PAST_FOLDER = "\U0010ffff"
"""The greatest character a path can hold: appended to a folder, a listing start past every
key in it but those whose name goes on with this character (`_next_row`)."""
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
CSV_SUFFIXES = {".csv": ",", ".tsv": "\t"}


@dataclass(frozen=True)
class Row:
    """One line of a folder listing: a sub-folder (`entry` None) or an object."""

    name: str
    path: str
    entry: Entry | None = None


@dataclass(frozen=True)
class Listing:
    rows: list[Row]
    next_after: str | None


@dataclass
class Preview:
    """The first rows of an object as text, or why there are none."""

    kind: str
    columns: list[tuple[str, str]] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    note: str | None = None
    bytes_read: int = 0


def add_browser_pages(app: FastAPI, lake_access: LakeAccess, page: _Renderer) -> None:
    @app.get(
        "/repositories/{repository}/objects/{ref:path}",
        name="objects",
        response_class=HTMLResponse,
    )
    def objects(
        request: Request, repository: str, ref: str, prefix: str = "", after: str = ""
    ) -> Response:
        repo = lake_access.lake().repository(repository)
        at = ref_at(repo, ref)
        folder = _folder(prefix)
        listing = list_folder(at, folder, after)
        if not listing.rows and not after and folder:
            raise NotFound(f"no objects under {folder!r} at {ref!r} in {repo.name!r}")
        return page(
            request,
            "objects.html",
            repo=repo,
            ref=ref,
            is_branch=_is_branch(at),
            head=at.head(),
            prefix=folder,
            crumbs=_crumbs(folder),
            listing=listing,
        )

    @app.get(
        "/repositories/{repository}/object/{ref:path}",
        name="object",
        response_class=HTMLResponse,
    )
    def object_page(request: Request, repository: str, ref: str, path: str = "") -> Response:
        repo = lake_access.lake().repository(repository)
        at = ref_at(repo, ref)
        if not path or path.endswith("/"):
            raise InvalidArgument(f"path {path!r} names no object: give an object's full path")
        entry = at.stat(path)
        return page(
            request,
            "object.html",
            repo=repo,
            ref=ref,
            is_branch=_is_branch(at),
            head=at.head(),
            entry=entry,
            crumbs=_crumbs(path.rsplit("/", 1)[0] + "/" if "/" in path else ""),
            object_name=path.rsplit("/", 1)[-1],
            changed=last_change(repo, at, entry),
            depth=HISTORY_DEPTH,
            preview=preview(at, entry),
            limit=human_size(PREVIEW_BYTES),
        )


def ref_at(repo: Repository, ref: str) -> Ref:
    """A branch (whose listing shows its uncommitted changes) or any other ref at its commit."""
    try:
        return repo.branch(ref)
    except NotFound:
        return repo.ref(ref)


def _is_branch(ref: Ref) -> bool:
    from branchwater.engine import Branch

    return isinstance(ref, Branch)


def _folder(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _crumbs(folder: str) -> list[tuple[str, str]]:
    """(name, prefix) of each folder from the root down to `folder`."""
    parts = folder.split("/")[:-1]
    return [(part, "/".join(parts[: i + 1]) + "/") for i, part in enumerate(parts)]


def list_folder(ref: Ref, folder: str, after: str = "", limit: int | None = None) -> Listing:
    """Up to `limit` (default `PAGE`) sub-folders and objects right under `folder`, from
    `after` on."""
    limit = PAGE if limit is None else limit
    rows: list[Row] = []
    start = after
    while len(rows) < limit:
        found = _next_row(ref, folder, start)
        if found is None:
            return Listing(rows, None)
        row, start = found
        rows.append(row)
    more = _next_row(ref, folder, start) is not None
    return Listing(rows, start if more else None)


def _next_row(ref: Ref, folder: str, after: str) -> tuple[Row, str] | None:
    """The row after `after` and where the one after it starts. A sub-folder is skipped by
    restarting after `_PAST_FOLDER`, or past its key if that sorts later (its name goes on
    with `_PAST_FOLDER` itself), so each restart moves on; a restart that lands inside a
    sub-folder follows its row, which is not repeated. (The engine's filesystem skips
    folders the same way, in its `_past_folder`, which the view may not import.)"""
    while True:
        for entry in ref.list(prefix=folder, after=after):
            name, slash, _ = entry.path[len(folder) :].partition("/")
            if not slash:
                return Row(name, entry.path, entry), entry.path
            sub = f"{folder}{name}/"
            listed = after.startswith(sub)
            after = max(sub + _PAST_FOLDER, entry.path)
            if not listed:
                return Row(f"{name}/", sub), after
            break
        else:
            return None


@dataclass(frozen=True)
class Change:
    """The newest commit that changed an object, or that it is staged on the branch."""

    commit: Commit | None
    staged: bool = False


def last_change(repo: Repository, ref: Ref, entry: Entry) -> Change:
    """Staged on the branch, or the newest of the ref's last `HISTORY_DEPTH` commits whose
    version of the path differs from its first parent's (None if none of them)."""
    head = ref.commit_id
    if _is_branch(ref) and _entry_at(repo, head, entry.path) != entry.identity():
        return Change(None, staged=True)
    for commit in repo.log(head, paths=[entry.path], depth=HISTORY_DEPTH):
        parent = commit.parents[0] if commit.parents else None
        before = _entry_at(repo, parent, entry.path) if parent else None
        if _entry_at(repo, commit.id, entry.path) != before:
            return Change(commit)
    return Change(None)


def _entry_at(repo: Repository, commit_id: str, path: str) -> tuple[int, str, str] | None:
    try:
        return repo.ref(commit_id).stat(path).identity()
    except NotFound:
        return None


def preview(ref: Ref, entry: Entry) -> Preview | None:
    """Schema and first rows of a Parquet or CSV object, within `PREVIEW_BYTES`; None for
    another kind of object."""
    name = entry.path.lower()
    if name.endswith(PARQUET_SUFFIXES):
        kind = "Parquet"
    elif (
        delimiter := next((d for s, d in CSV_SUFFIXES.items() if name.endswith(s)), None)
    ) is not None:
        kind = "CSV"
    else:
        return None
    result = Preview(kind)
    try:
        with ref.open(entry.path) as f:
            fetched = Bounded(f, PREVIEW_BYTES)
            source = fetched
            if entry.size <= min(WHOLE_BYTES, PREVIEW_BYTES):
                source = Bounded(io.BytesIO(fetched.read()), PREVIEW_BYTES)
            try:
                if kind == "Parquet":
                    _parquet(source, result)
                else:
                    _csv(source, delimiter or ",", result)
            finally:
                result.bytes_read = fetched.read_bytes
    except TooLarge:
        result.note = (
            f"rows not shown: they lie beyond the first {human_size(PREVIEW_BYTES)} a preview reads"
        )
    except BranchwaterError as exc:
        result.note = f"cannot preview: {exc}"
    except Exception as exc:
        result.note = f"cannot read it as {kind}: {type(exc).__name__}: {_cell(str(exc))}"
    return result


def _parquet(f: Bounded, result: Preview) -> None:
    """The schema, then the first rows unless the row groups they lie in decode to more than
    `PREVIEW_DECODED`."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(f)
    result.columns = _columns(file.schema_arrow)
    groups = _leading_groups(file.metadata)
    decoded = sum(_decoded_size(file.metadata.row_group(i)) for i in groups)
    if decoded > PREVIEW_DECODED:
        result.note = (
            f"rows not shown: too large to preview, their row groups decode to "
            f"{human_size(decoded)} (a preview decodes at most {human_size(PREVIEW_DECODED)})"
        )
        return
    for batch in file.iter_batches(batch_size=PREVIEW_ROWS, row_groups=groups):
        _rows(batch, result)
        break


def _leading_groups(metadata: pq.FileMetaData) -> list[int]:
    """The row groups the first `PREVIEW_ROWS` rows lie in: a batch of them reads on from a
    smaller group into the next."""
    groups: list[int] = []
    rows = 0
    for i in range(metadata.num_row_groups):
        if rows >= PREVIEW_ROWS:
            break
        groups.append(i)
        rows += metadata.row_group(i).num_rows
    return groups


def _decoded_size(group: pq.RowGroupMetaData) -> int:
    """A row group's uncompressed size as its footer states it: the group's own figure, or its
    columns' where those add up to more (a writer may set either carelessly)."""
    columns = sum(group.column(i).total_uncompressed_size for i in range(group.num_columns))
    return max(group.total_byte_size, columns)


def _csv(f: Bounded, delimiter: str, result: Preview) -> None:
    """The first `CSV_BLOCK` bytes, cut after their last complete line, parsed as CSV."""
    import pyarrow as pa
    import pyarrow.csv as csv

    head = f.read(CSV_BLOCK)
    if f.read(1):
        head = head[: head.rfind(b"\n") + 1]
    table = csv.read_csv(
        pa.BufferReader(head),
        read_options=csv.ReadOptions(use_threads=False),
        parse_options=csv.ParseOptions(delimiter=delimiter),
    )
    result.columns = _columns(table.schema)
    for batch in table.slice(0, PREVIEW_ROWS).to_batches():
        _rows(batch, result)
        break


def _columns(schema: pa.Schema) -> list[tuple[str, str]]:
    return [(f.name, str(f.type)) for f in schema]


def _rows(batch: pa.RecordBatch, result: Preview) -> None:
    shown = batch.slice(0, PREVIEW_ROWS)
    columns = [_cut(column).to_pylist() for column in shown.columns]
    result.rows = [[_cell(column[i]) for column in columns] for i in range(shown.num_rows)]


def _cut(column: pa.Array) -> pa.Array:
    """Strings and binaries cut in Arrow to what a cell shows, still marked as longer where
    they were: made Python values (and hexed) whole, one value costs its full size though a
    cell shows `CELL_CHARS` characters of it."""
    import pyarrow.compute as pc
    import pyarrow.types as types

    if types.is_string(column.type) or types.is_large_string(column.type):
        return pc.utf8_slice_codeunits(column, 0, CELL_CHARS + 1)
    if (
        types.is_binary(column.type)
        or types.is_large_binary(column.type)
        or types.is_fixed_size_binary(column.type)
    ):
        return pc.binary_slice(column, 0, CELL_CHARS // 2 + 1)
    return column


def _cell(value: Any) -> str:
    text = "null" if value is None else value.hex() if isinstance(value, bytes) else str(value)
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


class TooLarge(Exception):
    """A preview asked for more of an object than `PREVIEW_BYTES`."""


class Bounded(io.RawIOBase):
    """A read-only view of a file object that refuses to read past a byte budget."""

    def __init__(self, f: Any, budget: int) -> None:
        self._f = f
        self._budget = budget
        self._size = f.seek(0, io.SEEK_END)
        f.seek(0)
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._f.seek(offset, whence))

    def tell(self) -> int:
        return int(self._f.tell())

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), max(0, self._size - self._f.tell()))
        if self.read_bytes + wanted > self._budget:
            raise TooLarge(f"a read of {wanted} bytes would pass the preview's bound")
        data = self._f.read(wanted)
        view[: len(data)] = data
        self.read_bytes += len(data)
        return len(data)
