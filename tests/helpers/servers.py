"""Names, ports and processes: the servers tests need, skipped locally and failing in CI when
absent."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import socket
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import pytest

from branchwater.stack.config import Ports

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.managers import SyncManager
    from multiprocessing.pool import Pool


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


FORK_PRELOAD = [
    "pytest",
    "branchwater.engine",
    "branchwater.engine.kv.sqlite",
    "branchwater.engine.kv.postgres",
    "branchwater.engine.objects.s3",
    "tests.helpers.races",
    "tests.gc_model",
    "tests.history.operations",
]
"""What the fork server imports once, before any child forks from it (the KV drivers and the
S3 store are otherwise imported on first connect): the engine and the test helpers race
workers run."""


def forked_context() -> mp.context.ForkServerContext:
    """Race processes forked from this test process's one fork server, which imported
    `FORK_PRELOAD` and opened nothing: each child is a process of its own, with connections
    of its own made after the fork, as a spawned one is, but costs a fork rather than an
    interpreter's start and seconds of imports. Start children through `forked_pool` and
    `forked_process`, which give each the environment and working directory this process
    has then (the server keeps those it started with)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORK_PRELOAD)
    return ctx


def adopt(environ: dict[str, str], cwd: str) -> None:
    """In a forked child: take the parent's environment and working directory of the moment
    it was started, and arm the failpoints it names, as a spawned child would at import."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    from branchwater.engine import failpoints

    failpoints.arm_from_env()


def _adopted(environ: dict[str, str], cwd: str, target: Callable[..., Any], *args: Any) -> None:
    adopt(environ, cwd)
    target(*args)


def forked_process(
    target: Callable[..., Any], *args: Any, env: dict[str, str] | None = None
) -> Any:
    """A `forked_context` process (not started) running `target(*args)` with this process's
    environment and `env` over it."""
    return forked_context().Process(
        target=_adopted, args=({**os.environ, **(env or {})}, os.getcwd(), target, *args)
    )


@contextmanager
def forked_pool(processes: int) -> Iterator[tuple[SyncManager, Pool]]:
    """Race workers, each a `forked_context` process of its own, with a manager for the
    events and counters they share. Both are stopped on the way out, a failed assertion
    included: read shared values inside the block."""
    ctx = forked_context()
    with (
        ctx.Manager() as manager,
        ctx.Pool(processes, initializer=adopt, initargs=(dict(os.environ), os.getcwd())) as pool,
    ):
        yield manager, pool


class Exited(NamedTuple):
    """How a `forked_run` child ended."""

    code: int
    """Its exit code: negative for the signal that ended it."""
    returned: Any
    """What its target returned (None unless it returned)."""
    error: str
    """The traceback of what its target raised ("" unless it raised)."""


def _reporting(answers: Connection, target: Callable[..., Any], *args: Any) -> None:
    try:
        returned = target(*args)
    except BaseException:
        answers.send((None, traceback.format_exc()))
        raise
    answers.send((returned, ""))


def forked_run(target: Callable[..., Any], *args: Any, env: dict[str, str] | None = None) -> Exited:
    """Run `target(*args)` in a `forked_process` (`env` over this process's environment,
    arming the failpoints it names, as `subprocess.run` of a script would) and say how it
    ended. It is killed by its pid if it outlives `CHILD_TIMEOUT`."""
    reader, writer = forked_context().Pipe(duplex=False)
    child = forked_process(_reporting, writer, target, *args, env=env)
    child.start()
    writer.close()
    answer: tuple[Any, str] = (None, "")
    try:
        if reader.poll(CHILD_TIMEOUT):
            with suppress(EOFError):
                answer = reader.recv()
    finally:
        reader.close()
        child.join(CHILD_TIMEOUT)
        if child.is_alive():
            child.kill()
            child.join()
            raise AssertionError(f"{target.__name__} outlived {CHILD_TIMEOUT}s")
    return Exited(child.exitcode, *answer)


def child_answer(target: Callable[..., None], *args: Any, method: str = "fork") -> Any:
    """What `target(*args, answers)`, run in a child started by `method`, puts on `answers`
    first, once the child has exited cleanly; it is killed by its pid if it outlives
    `CHILD_TIMEOUT`."""
    ctx = mp.get_context(method)
    answers = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, answers))
    child.start()
    try:
        answer = answers.get(timeout=CHILD_TIMEOUT)
    finally:
        child.join(CHILD_TIMEOUT)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0, f"the child answered {answer!r}, then exited {child.exitcode}"
    return answer


CHILD_TIMEOUT = 120


def unique_name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@contextmanager
def private_database(prefix: str) -> Iterator[str]:
    """The name of a fresh database on the local PostgreSQL server, dropped (sessions and
    all) after; a server that cannot be reached is `unavailable`."""
    import psycopg

    admin = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres"
    name = unique_name(prefix)
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        unavailable(f"PostgreSQL on {PG_HOST}:{PG_PORT} is not reachable: {exc}")
    try:
        yield name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
