"""Helpers the tests share: names, ports, servers, committed data, the CLI runner, GC runs.

Fixtures live in `tests/conftest.py` and the plugins under `tests/fixtures/`; everything a
test imports by name lives here, in one place.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import multiprocessing as mp
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, Protocol

import pyarrow as pa
import pytest

from branchwater.engine import failpoints
from branchwater.engine.api import Branch, Lake, Ref, Repository
from branchwater.engine.errors import NotFound
from branchwater.engine.gc.context import GCContext
from branchwater.engine.gc.prepare import PreparedRun, read_run
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.graveler.checksums import content_checksum
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.committed.format import RANGES_PREFIX
from branchwater.engine.graveler.model import Commit, Entry
from branchwater.engine.graveler.refs import commit_id_for
from branchwater.engine.kv import Store
from branchwater.engine.kv.memory import MemoryStore
from branchwater.engine.objects import ObjectInfo, ObjectStore
from branchwater.engine.objects.local import LocalObjectStore
from branchwater.stack.config import Ports

if TYPE_CHECKING:
    from multiprocessing.managers import SyncManager
    from multiprocessing.pool import Pool

    from pyspark.sql import SparkSession

PG_HOST = os.environ.get("BRANCHWATER_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("BRANCHWATER_PG_PORT", "5432"))
PG_USER = os.environ.get("BRANCHWATER_PG_USER", "postgres")


def unavailable(reason: str) -> NoReturn:
    """Skip locally, fail in CI: a test that needs a server must never vanish silently there."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI requires it)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports: all are held open until every one is chosen."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def free_stack_ports() -> Ports:
    """A stack's every port free on loopback, so a test's stack never meets `make stack`'s."""
    names = [f.name for f in dataclasses.fields(Ports)]
    return Ports(**dict(zip(names, free_ports(len(names)), strict=True)))


@contextmanager
def spawned_pool(processes: int) -> Iterator[tuple[SyncManager, Pool]]:
    """Race workers: spawned, so each has its own interpreter and connections, with a
    manager for the events and counters they share. Both are stopped on the way out, a
    failed assertion included: read shared values inside the block."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(processes) as pool:
        yield manager, pool


def unique_name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# Read-after-write across processes ---------------------------------------------------------

SHARED_PATH = "shared"
OVERWRITES = 300
DELETE_EVERY = 7
"""Version `v` of the shared path is a delete where `v % DELETE_EVERY == 0`, else an upload
of `str(v)`; the last version is an upload."""


def overwrite(kv_url: str, repository: str, start, announced) -> None:
    """Write versions 1 to OVERWRITES of the shared path on main, announcing each once it is
    acknowledged: what another process reads after an announcement must be that new."""
    with Lake.connect(kv_url) as lake:
        main = lake.repository(repository).branch("main")
        start.wait(60)
        for version in range(1, OVERWRITES + 1):
            if version % DELETE_EVERY:
                main.upload(SHARED_PATH, str(version).encode())
            else:
                main.delete(SHARED_PATH)
            announced.value = version


def read_back(kv_url: str, repository: str, start, stop, announced) -> tuple[int, list[str]]:
    """Read the shared path until `stop`, by a lookup and by a listing in turn; returns the
    reads and the stale ones. A read must show a version from the one announced before it
    began to the one in flight after it ended: a value, or a delete among those versions when
    the path is absent."""
    versions = {content_checksum(str(v).encode()): v for v in range(1, OVERWRITES + 1)}
    reads, stale = 0, []
    with Lake.connect(kv_url) as lake:
        main = lake.repository(repository).branch("main")
        start.wait(60)
        while not stop.is_set():
            floor = announced.value
            if floor == 0:
                continue
            seen: int | None
            if reads % 2:
                listed = [e for e in main.list(prefix=SHARED_PATH) if e.path == SHARED_PATH]
                seen = versions[listed[0].checksum] if listed else None
            else:
                try:
                    seen = int(main.read(SHARED_PATH))
                except NotFound:
                    seen = None
            ceiling = announced.value + 1
            reads += 1
            if seen is None:
                if not any(v % DELETE_EVERY == 0 for v in range(floor, ceiling + 1)):
                    stale.append(f"absent, but versions {floor}-{ceiling} delete nothing")
            elif not floor <= seen <= ceiling:
                stale.append(f"read version {seen} after version {floor} was acknowledged")
    return reads, stale


class SharedPathRace:
    """`overwrite` and `read_back` started in a race's pool: one process overwriting the
    shared path of `repository`'s main, another reading it back until `stop`."""

    PROCESSES = 2

    def __init__(
        self, manager: SyncManager, pool: Pool, kv_url: str, repository: str, start, stop
    ) -> None:
        self._announced = manager.Value("i", 0)
        """Held here: the manager frees a shared value once the parent drops its proxy."""
        args = (kv_url, repository, start)
        self._writes = pool.apply_async(overwrite, (*args, self._announced))
        self._reads = pool.apply_async(read_back, (*args, stop, self._announced))

    def wait_for_writes(self, timeout: float) -> None:
        self._writes.get(timeout)

    def check_reads(self, timeout: float) -> None:
        """Once `stop` is set: the reader read, and never saw the path older than it was."""
        reads, stale = self._reads.get(timeout)
        assert reads >= 1 and stale == []

    @staticmethod
    def check_committed(ref: Ref) -> None:
        assert ref.read(SHARED_PATH) == str(OVERWRITES).encode()


# Committed-layer data --------------------------------------------------------------------

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

POLICIES = {
    "hash": RangePolicy(target_entries=7, max_entries=1_000, max_bytes=10**9),
    "tiny": RangePolicy(target_entries=2, max_entries=5, max_bytes=10**9),
    "entry-cap": RangePolicy(target_entries=10**6, max_entries=6, max_bytes=10**9),
    "byte-cap": RangePolicy(target_entries=50, max_entries=1_000, max_bytes=300),
}


class SpyStore(LocalObjectStore):
    """A real local store that records the keys it is asked to write and read."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.puts: list[str] = []
        self.gets: list[str] = []

    def put(self, key: str, data: bytes) -> ObjectInfo:
        self.puts.append(key)
        return super().put(key, data)

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return super().get(key)

    def range_reads(self) -> int:
        return sum(key.startswith(RANGES_PREFIX) for key in self.gets)

    def reset(self) -> None:
        self.puts.clear()
        self.gets.clear()


def entry(
    path: str, n: int = 0, *, tz: timezone = UTC, metadata: dict[str, str] | None = None
) -> Entry:
    return Entry(
        path,
        f"data/g1/{n:08x}-{path}",
        n * 11,
        f"sha-{n}",
        (T0 + timedelta(seconds=n, microseconds=n)).astimezone(tz),
        metadata or {},
    )


def random_entries(rng: random.Random, count: int) -> list[Entry]:
    """Sorted entries with unicode paths, metadata on some, mtimes in several time zones."""
    paths = {f"d{rng.randrange(6)}/é{rng.randrange(100_000):05d}" for _ in range(count)}
    zones = [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-7, minutes=-30))]
    return [
        entry(
            path,
            rng.randrange(10**6),
            tz=rng.choice(zones),
            metadata={"k": str(n), "ü": "v"} if rng.random() < 0.3 else None,
        )
        for n, path in enumerate(sorted(paths))
    ]


# The in-process CLI runner -----------------------------------------------------------------


class Run(NamedTuple):
    code: int
    out: str
    err: str


class CliLake(NamedTuple):
    """A CLI test's lake: its KV URL, its namespace URL and its directory."""

    kv: str
    namespace: str
    root: Path


class Bw(Protocol):
    """The in-process CLI runner; `kv=None` leaves the lake to `$BRANCHWATER_KV_URL` or default."""

    def __call__(self, *args: str, kv: str | None = ...) -> Run: ...


def ok(result: Run) -> Run:
    assert result.code == 0, result.err
    assert result.err == ""
    return result


def assert_user_error(result: Run, code: int, *fragments: str) -> None:
    """The error contract: the code, one stderr line in the fixed format, nothing on stdout."""
    assert result.code == code, result
    assert result.out == ""
    assert "Traceback" not in result.err
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("branchwater: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def make_repo(bw: Bw, lake: CliLake, name: str = "sales") -> None:
    ok(bw("repo", "create", name, "--namespace", f"{lake.namespace}/{name}"))


def local_file(lake: CliLake, name: str, data: bytes) -> str:
    path = lake.root / name
    path.write_bytes(data)
    return str(path)


# Uncommitted GC ----------------------------------------------------------------------------


class FakeClock:
    """Wall time that moves only when a test says so."""

    def __init__(self, now: datetime = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


def upload_to(branch: Branch, address: str, data: bytes) -> None:
    """Write `data` at `address` as another tool would before linking it."""
    repo = branch.repository
    repo.lake.graveler.objects(repo.storage_namespace).put(address, data)


def staged_paths(branch: Branch) -> list[str]:
    return [c.path for c in branch.uncommitted()]


def use_clock(lake: Lake, clock: FakeClock, settings: GCSettings | None = None) -> None:
    """Give the lake's GC a fake clock (and settings)."""
    lake.gc.close()
    lake.gc = GCContext(lake.graveler.kv, settings, clock=clock)


def compact(repo: Repository, branch_name: str) -> str | None:
    """Staging compaction through `Branch.compact()`; the compacted metarange, or None when
    nothing was staged (the branch is left as it was)."""
    result = repo.branch(branch_name).compact()
    assert result.outcome in ("compacted", "nothing-staged"), result
    return result.metarange_id


def run_table(repo: Repository, run: PreparedRun) -> pa.Table:
    return read_run(repo.lake.graveler.objects(repo.storage_namespace), run.run_id)


def run_rows(repo: Repository, run: PreparedRun) -> set[tuple[str, str, str]]:
    """(address, branch, source) of every row of a finished run."""
    table = run_table(repo, run)
    columns = [table.column(name).to_pylist() for name in ("address", "branch", "source")]
    return set(zip(*columns, strict=True))


def run_addresses(repo: Repository, run: PreparedRun) -> set[str]:
    return {address for address, _, _ in run_rows(repo, run)}


# Uncommitted GC on Spark -------------------------------------------------------------------


def put_garbage(lake: Lake, repo: Repository, count: int = 1) -> list[str]:
    """Objects written at fresh addresses that no entry will ever name."""
    objects = lake.graveler.objects(repo.storage_namespace)
    keys = [lake.addresses.next_address() for _ in range(count)]
    for key in keys:
        objects.put(key, b"garbage")
    return keys


def data_objects(lake: Lake, repo: Repository) -> dict[str, ObjectInfo]:
    """Every object under the repository's `data/`, by key."""
    objects = lake.graveler.objects(repo.storage_namespace)
    return {info.key: info for info in objects.list_objects("data/")}


@dataclasses.dataclass
class GCLake:
    """A lake on SQLite with one repository, and the job run on the test session's Spark.

    Runs default to a zero minimum age (objects written before the run count) and no bound
    on the candidates' share, since test histories are mostly garbage.
    """

    spark: SparkSession
    lake: Lake
    repo: Repository
    kv_url: str
    s3_options: dict[str, str]

    @property
    def objects(self) -> ObjectStore:
        return self.lake.graveler.objects(self.repo.storage_namespace)

    def run(self, events: Callable[[dict[str, Any]], None] | None = None, **settings: Any) -> Any:
        """Run the GC job in this process; returns its `RunSummary`."""
        from branchwater.engine.gc.runs.config import JobConfig
        from branchwater.spark_jobs.gc.job import GCJob

        settings.setdefault("min_age", timedelta(0))
        settings.setdefault("max_share", 1.0)
        config = JobConfig(self.kv_url, self.repo.name, s3_options=self.s3_options, **settings)
        return GCJob(self.spark, config, events).run()

    def data_objects(self) -> dict[str, ObjectInfo]:
        return data_objects(self.lake, self.repo)

    def put_garbage(self, count: int = 1) -> list[str]:
        return put_garbage(self.lake, self.repo, count)


ROWID_KV_TABLE = (
    "CREATE TABLE branchwater_kv (partition_key BLOB NOT NULL, key BLOB NOT NULL, "
    "value BLOB NOT NULL, PRIMARY KEY (partition_key, key))"
)
"""The SQLite table as stores made before the `WITHOUT ROWID` layout created it."""


def rowid_sqlite_file(path: Path) -> str:
    """A SQLite KV file in the older rowid layout; returns its URL."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute(ROWID_KV_TABLE)
    return f"sqlite:///{path}"


# Airflow's REST API ----------------------------------------------------------------------


@dataclasses.dataclass
class AirflowClient:
    """Airflow's public REST API (/api/v2) with a JWT from /auth/token, as a user would call it."""

    base_url: str
    username: str
    password: str
    _token: str = ""

    def _headers(self) -> dict[str, str]:
        import httpx

        if not self._token:
            response = httpx.post(
                f"{self.base_url}/auth/token",
                json={"username": self.username, "password": self.password},
                timeout=30,
            )
            response.raise_for_status()
            self._token = response.json()["access_token"]
        return {"Authorization": f"Bearer {self._token}"}

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        response = httpx.request(
            method, f"{self.base_url}/api/v2{path}", headers=self._headers(), timeout=30, **kwargs
        )
        response.raise_for_status()
        return response.json()

    def wait_for_dag(self, dag_id: str, timeout: float) -> None:
        """Until the DAG processor has parsed `dag_id`."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("GET", f"/dags/{dag_id}")
                return
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        run = self.request(
            "POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        return str(run["dag_run_id"])

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> str:
        """The run's final state (`success` or `failed`)."""
        deadline = time.monotonic() + timeout
        while True:
            state = str(self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])
            if state in ("success", "failed") or time.monotonic() > deadline:
                return state
            time.sleep(2)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        """Each task instance's state, keyed `task_id[map_index]`."""
        instances = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {
            f"{ti['task_id']}[{ti.get('map_index', -1)}]": str(ti["state"])
            for ti in instances["task_instances"]
        }

    def failed_tasks(self, dag_id: str, run_id: str) -> list[str]:
        states = self.task_states(dag_id, run_id)
        return [
            f"{task}: {state}"
            for task, state in states.items()
            if state not in ("success", "skipped")
        ]


GC_TASKS = ("prepare", "mark", "gate", "sweep", "report")
"""The tasks of the GC DAGs (`dags/branchwater_gc.py`), in order."""


# Failpoints --------------------------------------------------------------------------------

PAUSE_TIMEOUT = 60


class Pause:
    """Holds the first thread that reaches a failpoint until `release`; later ones pass."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._go = threading.Event()
        self._lock = threading.Lock()
        self._taken = False

    def hold(self) -> None:
        with self._lock:
            if self._taken:
                return
            self._taken = True
        self.reached.set()
        assert self._go.wait(PAUSE_TIMEOUT), "a paused operation was never released"

    def wait(self) -> None:
        assert self.reached.wait(PAUSE_TIMEOUT), "the operation never reached its failpoint"

    def release(self) -> None:
        self._go.set()


@contextmanager
def paused_at(point: str) -> Iterator[Pause]:
    """Arm `point` to hold the first thread that reaches it; released on the way out too."""
    pause = Pause()
    try:
        with failpoints.armed(point, pause.hold):
            yield pause
    finally:
        pause.release()


# Nothing written ---------------------------------------------------------------------------


class Stored(NamedTuple):
    """Every KV row and every file (and folder, as None) under some folders: equal before and
    after an operation that was refused means it wrote nothing."""

    rows: frozenset[tuple[bytes, bytes, bytes]]
    files: dict[str, bytes | None]


def stored(kv: Store | str, *roots: Path) -> Stored:
    """What a lake holds, from its store (in memory) or its SQLite URL, and `roots`' files."""
    return Stored(
        frozenset(_kv_rows(kv)),
        {
            str(path): path.read_bytes() if path.is_file() else None
            for root in roots
            for path in sorted(root.rglob("*"))
        },
    )


def _kv_rows(kv: Store | str) -> Iterator[tuple[bytes, bytes, bytes]]:
    if isinstance(kv, MemoryStore):
        for partition, part in kv._partitions.items():
            yield from ((partition, key, value) for key, value in part.values.items())
        return
    assert isinstance(kv, str) and kv.startswith("sqlite:///"), kv
    import sqlite3

    path = Path(kv.removeprefix("sqlite:///"))
    if not path.exists():
        return
    with closing(sqlite3.connect(path)) as conn:
        yield from conn.execute("SELECT partition_key, key, value FROM branchwater_kv")


# Hostile URLs ------------------------------------------------------------------------------

URL_RESERVED = ":/?#[]@!$&'()*+,;=% "
"""Every character RFC 3986 reserves (and `%`, and a space), to put unencoded in credentials."""


class Credentials(NamedTuple):
    """A user and password for a URL, and the pieces of the password no message may show."""

    user: str
    password: str
    pieces: tuple[str, ...]


def credentials() -> Any:
    """Users and passwords with reserved characters anywhere; the password's pieces look like
    nothing a message says on its own (`Qxyz42`), so finding one in a message is a leak."""
    from hypothesis import strategies as st

    piece = st.from_regex(r"[A-Z][a-z]{3}[0-9]{2}", fullmatch=True)
    reserved = st.text(st.sampled_from(URL_RESERVED), max_size=2)
    user = st.text(st.sampled_from("bob" + URL_RESERVED), min_size=1, max_size=6).filter(
        lambda text: not text.startswith("/")  # `sqlite:///…` is a path, not a user
    )

    @st.composite
    def build(draw: Any) -> Credentials:
        pieces = draw(st.lists(piece, min_size=1, max_size=3, unique=True))
        password = "".join(draw(reserved) + p for p in pieces) + draw(reserved)
        return Credentials(draw(user), password, tuple(pieces))

    return build()


def assert_no_secret(text: str, secret: Credentials) -> None:
    for piece in secret.pieces:
        assert piece not in text, (piece, text)


def error_chain(error: BaseException) -> str:
    """The messages of an error and every error it was raised from or during."""
    seen: list[str] = []
    current: BaseException | None = error
    while current is not None and len(seen) < 10:
        seen.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(seen)


# Hostile names and paths -------------------------------------------------------------------


def any_text(max_size: int = 12) -> Any:
    """Text of every code point, lone surrogates (what Python makes of non-UTF-8 bytes in
    `argv`) included."""
    from hypothesis import strategies as st

    return st.text(st.characters() | st.characters(categories=["Cs"]), max_size=max_size)


def unencodable_texts() -> Any:
    """Strings no name or path can be: any text with a lone surrogate somewhere."""
    from hypothesis import strategies as st

    surrogate = st.characters(categories=["Cs"])
    return st.builds(lambda a, b, c: a + b + c, any_text(6), surrogate, any_text(6))


def not_text() -> Any:
    """What a caller may pass where a name or path belongs and must get `InvalidName` or
    `InvalidArgument` for, not a raw `TypeError`."""
    from hypothesis import strategies as st

    return st.none() | st.integers() | st.binary(max_size=8) | st.lists(st.text(), max_size=2)


# Refs dumps --------------------------------------------------------------------------------


def dumped_and_recreated(lake: Lake, repo: Repository, dump: Path) -> tuple[Repository, list[str]]:
    """Two branches and a tag dumped to `dump`; the repository then deleted and created again,
    bare, over its namespace. Returns it and the dumped log of `dev`."""
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    repo.create_branch("dev", source="main").upload("b", b"2")
    repo.branch("dev").commit("b")
    repo.tag("v1", "dev")
    assert repo.dump_refs(dump) > 0
    expected = [c.id for c in repo.log("dev")]
    lake.delete_repository("sales")
    lake.graveler.wait_for_background()
    return lake.create_repository("sales", storage_namespace=repo.storage_namespace), expected


REF_FIELDS = ("name", "commit_id", "twice")
"""What `hostile_dump` can change in a branch or tag record."""


def _tip_of(document: dict[str, Any]) -> dict[str, Any]:
    """A commit no other commit names as parent: one whose id can change with its content."""
    parents = {p for c in document["commits"] for p in c["parents"]}
    return next(c for c in document["commits"] if c["id"] not in parents and c["parents"])


def _recomputed(document: dict[str, Any], commit: dict[str, Any]) -> None:
    """Give `commit` the id of its (edited) content where the engine can compute one, and
    point the refs at it, so the edit is all that is wrong: the issue's forged dump."""
    try:
        new_id = commit_id_for(Commit.decode(json.dumps(commit).encode()))
    except (TypeError, ValueError, KeyError, AttributeError):
        return
    old_id, commit["id"] = commit["id"], new_id
    for ref in document["branches"] + document["tags"]:
        if ref["commit_id"] == old_id:
            ref["commit_id"] = new_id


def hostile_dump(document: dict[str, Any], where: str, value: object) -> dict[str, Any]:
    """A copy of a dump with `value` at `where`: a field of a tip commit (its id recomputed),
    `branch <field>` or `tag <field>` of the last ref, or `<kind> twice` for a duplicate."""
    edited = copy.deepcopy(document)
    if where.startswith(("branch ", "tag ")):
        kind, field = where.split(" ")
        refs = edited["branches" if kind == "branch" else "tags"]
        if field == "twice":
            refs.append(dict(refs[0], commit_id=refs[-1]["commit_id"]))
        else:
            refs[-1][field] = value
        return edited
    commit = _tip_of(edited)
    if where == "parent":
        commit["parents"] = [*commit["parents"], value]
    elif where == "metadata value":
        commit["metadata"] = {"k": value}
    elif where == "extra field":
        commit["extra"] = value
    else:
        commit[where] = value
    if where != "id":
        _recomputed(edited, commit)
    return edited
