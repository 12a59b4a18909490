"""The shipped DAG folder parses as a DAG processor parses it: no import errors, under a
second a file, and no connection to a KV store, a metadata DB or the network meanwhile."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from branchwater.demo.airflow_home import DAGS_FOLDER
from tests.plugin.conftest import set_connection

PARSE_SECONDS = 1.0
WATCHED_EVENTS = {"socket.connect", "socket.getaddrinfo", "sqlite3.connect", "open"}

_seen: list[tuple[str, str]] | None = None
"""Audit events recorded while `_seen` is a list; audit hooks cannot be removed."""


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _seen is None or event not in WATCHED_EVENTS:
        return
    detail = str(args[0]) if args else ""
    if event == "open" and not detail.endswith((".db", ".db-wal", ".sqlite")):
        return
    _seen.append((event, detail))


_hooked: list[bool] = []


@contextmanager
def watching() -> Iterator[list[tuple[str, str]]]:
    """The connections and database files opened within the block."""
    global _seen
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)
    _seen = seen = []
    try:
        yield seen
    finally:
        _seen = None


def test_the_watch_sees_a_database_opened(tmp_path: Path) -> None:
    with watching() as seen:
        sqlite3.connect(tmp_path / "probe.db").close()
    assert ("sqlite3.connect", str(tmp_path / "probe.db")) in seen


def test_every_dag_file_parses_quickly_without_touching_a_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    unreachable = "postgresql://lake:secret@192.0.2.1:5432/lake"
    set_connection(monkeypatch, "branchwater_default", "branchwater", password=unreachable)
    files = sorted(DAGS_FOLDER.glob("*.py"))
    timings = {}
    dag_ids: set[str] = set()
    with watching() as seen:
        for path in files:
            start = time.perf_counter()
            bag = DagBag(dag_folder=path)
            timings[path.name] = time.perf_counter() - start
            assert bag.import_errors == {}, path.name
            assert bag.dags, path.name
            dag_ids |= set(bag.dags)
    assert seen == []
    assert dag_ids == {
        "branchwater_example_etl",
        "branchwater_compaction_check",
        "branchwater_gc_clean",
        "branchwater_gc_optimized",
    }
    slow = {name: seconds for name, seconds in timings.items() if seconds > PARSE_SECONDS}
    assert slow == {}


@pytest.fixture(scope="module")
def shipped_dags() -> list[Any]:
    """The DAG folder's DAGs, parsed once for the tests that only read them."""
    from airflow.dag_processing.dagbag import DagBag

    return list(DagBag(dag_folder=DAGS_FOLDER).dags.values())


@pytest.mark.parametrize("name", ["ab", "Sales", "-sales", "sales_2024", "a" * 64])
def test_every_dags_repository_params_refuse_what_the_engine_refuses(
    name: str, shipped_dags: list[Any]
) -> None:
    """A bad repository name in a run's conf fails the trigger, not a task of the run."""
    from airflow.sdk.definitions.param import ParamValidationError

    from branchwater.engine import InvalidName
    from branchwater.engine.graveler.names import check_repository_name

    with pytest.raises(InvalidName):
        check_repository_name(name)
    checked = set()
    for dag in shipped_dags:
        for key, good, bad in (
            ("repository", "sales", name),
            ("repositories", ["sales", "etl-example"], [name]),
        ):
            if key not in dag.params:
                continue
            param = dag.params.get_param(key)
            assert param.resolve(good) == good
            with pytest.raises(ParamValidationError):
                param.resolve(bad)
            checked.add(dag.dag_id)
    assert checked == {
        "branchwater_example_etl",
        "branchwater_compaction_check",
        "branchwater_gc_clean",
        "branchwater_gc_optimized",
    }


def test_the_two_gc_dags_never_start_together() -> None:
    """A second GC run of a repository fails at once (`GCRunLocked`): `@weekly` and `@daily`
    both fired on Sundays at midnight, failing one of them every week."""
    from airflow.dag_processing.dagbag import DagBag
    from croniter import croniter

    bag = DagBag(dag_folder=DAGS_FOLDER / "branchwater_gc.py")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    starts = {}
    for dag_id in ("branchwater_gc_clean", "branchwater_gc_optimized"):
        times = croniter(bag.dags[dag_id].timetable.expression, start)
        starts[dag_id] = {times.get_next(datetime) for _ in range(120)}
    clean, optimized = starts["branchwater_gc_clean"], starts["branchwater_gc_optimized"]
    assert not clean & optimized
    assert {t.weekday() for t in clean} == {6}
    assert {t.weekday() for t in optimized} == {0, 1, 2, 3, 4, 5}
