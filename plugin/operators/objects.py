"""Operators that write objects to a branch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from branchwater.engine import InvalidArgument, NotFound, PathExists
from branchwater.plugin.operators.base import (
    BranchwaterOperator,
    Lineage,
    LineageDataset,
    identity,
    made_by,
    mapping_field,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Branch, Entry, Repository


class BranchwaterUploadOperator(BranchwaterOperator):
    """Stage one object on `branch` at `path`: `data` (text is written as UTF-8) or the
    contents of the local file `filename`.

    Returns the staged entry (`path`, `address`, `size`, `checksum`). Staging is idempotent,
    so a retry simply stages the object again, and content the branch shows already is not
    staged at all.

    With `if_absent=True` the upload is an exclusive creation (a marker, a lock file): the
    task fails at once, without retries, if the branch shows anything at `path`. The object's
    metadata then carries the task instance's identity (`airflow.dag_id`, `airflow.run_id`,
    `airflow.task_id`, `airflow.map_index`), so that a retry, or a rerun of the DAG run, that
    finds the object its earlier try created succeeds with it instead of failing for ever.

    :param branch: the branch to stage on (templated)
    :param path: the object's path in the repository (templated)
    :param data: the object's content, text (str, written as UTF-8) or bytes (bytes,
        bytearray, memoryview) (templated); anything else fails the task at once
    :param filename: a local file whose content is staged instead (templated)
    :param metadata: user metadata of the object, a mapping or its JSON text (templated)
    :param if_absent: create the object only where the branch shows nothing at `path`
    """

    template_fields: Sequence[str] = (
        "repository",
        "branch",
        "path",
        "data",
        "filename",
        "metadata",
    )

    def __init__(
        self,
        *,
        branch: str,
        path: str,
        data: str | bytes | bytearray | memoryview | None = None,
        filename: str | None = None,
        metadata: dict[str, str] | str | None = None,
        if_absent: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.branch = branch
        self.path = path
        self.data = data
        self.filename = filename
        self.metadata = metadata or {}
        self.if_absent = if_absent

    def content(self) -> bytes:
        """The object's content: `data` as UTF-8 text or bytes, or `filename`'s. `data` of any
        other type (an int or list a native-object template rendered, a dict) is refused
        (`InvalidArgument`, failing the task at once): `bytes(3)` would be three NUL bytes,
        `bytes([1, 2])` two bytes, `0` an empty object."""
        if (self.data is None) == (self.filename is None):
            raise InvalidArgument(f"task {self.task_id!r}: give exactly one of data and filename")
        if self.filename is not None:
            return Path(self.filename).read_bytes()
        data: object = self.data
        if isinstance(data, str):
            return data.encode()
        if isinstance(data, (bytes, bytearray, memoryview)):
            return bytes(data)
        raise InvalidArgument(
            f"task {self.task_id!r}: data must be text (str) or bytes (bytes, bytearray, "
            f"memoryview), not {type(data).__name__}"
        )

    def execute_on(self, repo: Repository, context: Context) -> dict[str, Any]:
        entry = self.upload(repo.branch(self.branch), context)
        self.lineage = Lineage(outputs=(LineageDataset(repo.name, self.branch),))
        return {
            "path": entry.path,
            "address": entry.address,
            "size": entry.size,
            "checksum": entry.checksum,
        }

    def upload(self, branch: Branch, context: Context) -> Entry:
        """The upload; an exclusive one stamped with this task instance's identity, so that a
        refusal by the entry an earlier try created (which may have lost its worker after
        the creation landed) is that entry. The engine checks `if_absent` is a bool."""
        ours = identity(context) if self.if_absent is True else {}
        metadata = {**mapping_field(self.task_id, "metadata", self.metadata), **ours}
        try:
            return branch.upload(self.path, self.content(), metadata, if_absent=self.if_absent)
        except PathExists as refused:
            try:
                found = branch.stat(self.path)
            except NotFound:
                raise refused from None
            if made_by(found, context):
                return found
            raise
