"""The operator that creates a repository: the first task of a DAG on a new lake."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from branchwater.engine import AlreadyExists, NotFound
from branchwater.plugin.operators.base import BranchwaterOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Repository


class BranchwaterCreateRepositoryOperator(BranchwaterOperator):
    """Create `repository` in `storage_namespace` (default: the connection's default
    namespace, at `<default_namespace>/<repository>`), its default branch `default_branch`.

    Returns the repository's `name`, `storage_namespace` and `default_branch`. A repository
    that exists already in the same namespace counts as created (a retry, another run that
    created it first, every scheduled run after the first); one in another namespace fails
    the task at once, as does a namespace another repository uses.

    :param storage_namespace: where the repository keeps its objects, `file:///…` or
        `s3://bucket/prefix` (templated; default: the connection's default namespace followed
        by the repository's name)
    :param default_branch: the name of its first branch (templated; default "main")
    """

    template_fields: Sequence[str] = ("repository", "storage_namespace", "default_branch")

    def __init__(
        self, *, storage_namespace: str | None = None, default_branch: str = "main", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.storage_namespace = storage_namespace
        self.default_branch = default_branch

    def run(self, context: Context) -> dict[str, str]:
        namespace = (self.storage_namespace or self.hook.namespace_for(self.repository)).rstrip("/")
        try:
            repo = self.hook.get_conn(create=True).create_repository(
                self.repository, namespace, default_branch=self.default_branch
            )
            self.log.info("Created repository %s in %s", repo.name, repo.storage_namespace)
        except AlreadyExists as taken:
            repo = self._existing(namespace, taken)
        return {
            "name": repo.name,
            "storage_namespace": repo.storage_namespace,
            "default_branch": repo.default_branch,
        }

    def _existing(self, namespace: str, taken: AlreadyExists) -> Repository:
        """The repository of that name if it lives in `namespace`; `AlreadyExists` otherwise
        (`taken` itself when no repository has the name: another one uses the namespace)."""
        try:
            repo = self.hook.repository(self.repository)
        except NotFound:
            raise taken from None
        if repo.storage_namespace != namespace:
            raise AlreadyExists(
                f"repository {repo.name!r} exists already in {repo.storage_namespace}, not in "
                f"{namespace}: choose another name, or give storage_namespace="
                f"{repo.storage_namespace!r}"
            )
        self.log.info("Repository %s exists already in %s", repo.name, namespace)
        return repo
