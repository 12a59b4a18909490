"""The lake the view shows: opened from a `branchwater` connection on the first request that
needs it, then kept for the API server's life, with one object store per namespace."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from branchwater.engine import open_object_store
from branchwater.plugin.hooks import DEFAULT_CONN_ID, BranchwaterHook

if TYPE_CHECKING:
    from branchwater.engine import Lake, ObjectStore, Repository

CONFIG_SECTION = "branchwater"
CONN_ID_OPTION = "ui_conn_id"


def configured_conn_id() -> str:
    """The connection the view reads: `[branchwater] ui_conn_id`, else `branchwater_default`
    (`AIRFLOW__BRANCHWATER__UI_CONN_ID` sets it from the environment)."""
    from airflow.configuration import conf

    return str(conf.get(CONFIG_SECTION, CONN_ID_OPTION, fallback=DEFAULT_CONN_ID))


class LakeAccess:
    """One hook, one lake and its object stores, shared by the view's requests.

    Nothing is opened until a page needs it, so importing the plugin (every Airflow process
    does) costs no KV or network access; a failed open is not kept, the next request retries.
    """

    def __init__(self, conn_id: str | None = None) -> None:
        self._conn_id = conn_id
        self._lock = threading.Lock()
        self._hook: BranchwaterHook | None = None
        self._stores: dict[str, ObjectStore] = {}

    def _opened_hook(self) -> BranchwaterHook:
        with self._lock:
            if self._hook is None:
                hook = BranchwaterHook(self._conn_id or configured_conn_id())
                hook.get_conn()
                self._hook = hook
            return self._hook

    def lake(self) -> Lake:
        return self._opened_hook().get_conn()

    def objects(self, repo: Repository) -> ObjectStore:
        """The object store of a repository's namespace, with the connection's S3 options."""
        hook = self._opened_hook()
        namespace = repo.storage_namespace
        with self._lock:
            store = self._stores.get(namespace)
            if store is None:
                store = open_object_store(namespace, **(hook.s3_options_for(namespace) or {}))
                self._stores[namespace] = store
            return store

    def close(self) -> None:
        with self._lock:
            hook, self._hook = self._hook, None
            stores, self._stores = self._stores, {}
        for store in stores.values():
            store.close()
        if hook is not None:
            hook.close()
