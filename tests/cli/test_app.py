"""The entry point's contract: exit codes, one-line errors, choosing the lake, `-m` and the
console script."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import api
from branchwater.engine.cli import app, main
from branchwater.engine.cli.verbs import KV_ENV
from branchwater.engine.errors import Conflict, TooManyTries
from tests.helpers.cli import Bw, CliLake, Run, assert_user_error, local_file, make_repo, ok
from tests.helpers.servers import forked_context, forked_process, unique_name
from tests.helpers.tables import dynamodb_tables, pg_tables

# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("ls", "nosuch", "main"), ("nosuch",)),
        (("repo", "create", "Bad_Name", "--namespace", "file:///tmp/x"), ("Bad_Name",)),
        (("upload", "sales", "main", "p", "/definitely/not/here.csv"), ("not/here.csv",)),
        (("commit", "sales", "main", "-m", "nothing"), ("nothing to commit",)),
        (("cat", "sales", "main", "missing.txt"), ("missing.txt",)),
        (("branch", "create", "sales", "dev", "--source", "nope"), ("nope",)),
        (("refs", "restore", "sales", "/no/such/dump.json"), ("dump.json",)),
    ],
)
def test_user_errors_exit_1_with_one_line(
    bw: Bw, lake: CliLake, args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    make_repo(bw, lake)
    assert_user_error(bw(*args), 1, *fragments)


def test_unknown_kv_scheme_is_a_user_error(bw: Bw) -> None:
    assert_user_error(bw("repo", "list", kv="redis://localhost/0"), 1, "redis")


@pytest.mark.parametrize(
    "args",
    [
        ("commit", "sales", "main"),  # -m is required
        ("commit", "sales", "main", "-m", "x", "--meta", "novalue"),
        ("ls", "sales", "main", "--limit", "0"),
        ("frobnicate",),
        ("repo",),
    ],
)
def test_usage_errors_exit_1_with_one_line(bw: Bw, args: tuple[str, ...]) -> None:
    assert_user_error(bw(*args), 1, "see 'branchwater")


@pytest.mark.parametrize("error", [Conflict("they disagree"), TooManyTries("lost races")])
def test_conflicts_exit_2(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "p", local_file(lake, "p", b"p")))

    def lose(*_args: object, **_kwargs: object) -> None:
        raise error

    monkeypatch.setattr(api.Branch, "commit", lose)
    assert_user_error(bw("commit", "sales", "main", "-m", "x"), 2, str(error))


def test_keyboard_interrupt_exits_130_quietly(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_repo(bw, lake)

    def interrupted(_self: object) -> list[object]:
        raise KeyboardInterrupt

    monkeypatch.setattr(api.Lake, "repositories", interrupted)
    assert bw("repo", "list") == Run(130, "", "")


def test_lake_is_closed_on_success_and_on_error(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_repo(bw, lake)
    closed: list[bool] = []
    real_close = api.Lake.close

    def close(self: api.Lake) -> None:
        closed.append(True)
        real_close(self)

    monkeypatch.setattr(api.Lake, "close", close)
    ok(bw("repo", "list"))
    assert bw("ls", "nosuch", "main").code == 1
    assert closed == [True, True]


# ------------------------------------------------------------------------ choosing the lake


def test_env_var_selects_the_lake(bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch) -> None:
    make_repo(bw, lake)
    env_url = f"sqlite:///{lake.root}/from-env/lake.db"
    monkeypatch.setenv(KV_ENV, env_url)
    ok(bw("repo", "create", "viaenv", "--namespace", lake.namespace, kv=None))
    assert (lake.root / "from-env" / "lake.db").is_file()
    assert "viaenv" in ok(bw("repo", "list", kv=env_url)).out
    listed = ok(bw("repo", "list", kv=lake.kv)).out  # --kv wins over the env var
    assert "sales" in listed and "viaenv" not in listed
    assert not (lake.root / ".branchwater").exists()


def test_default_lake_is_created_under_the_cwd(bw: Bw, lake: CliLake) -> None:
    ok(bw("repo", "create", "local", "--namespace", lake.namespace, kv=None))
    assert (lake.root / ".branchwater" / "lake.db").is_file()
    assert "local" in ok(bw("repo", "list", kv=None)).out


@pytest.mark.parametrize(
    "args",
    [
        ("repo", "list"),
        ("repo", "delete", "sales"),
        ("ls", "sales", "main"),
        ("refs", "restore", "sales", "dump.json"),
        ("gc", "rules", "get", "sales"),
    ],
)
def test_a_verb_on_a_missing_lake_fails_without_creating_it(
    bw: Bw, lake: CliLake, args: tuple[str, ...]
) -> None:
    """A mistyped `--kv` is reported, not opened as a new empty lake that lists nothing."""
    typo = lake.root / "typo" / "lake.db"
    result = bw(*args, kv=f"sqlite:///{typo}?synchronous=normal")
    assert_user_error(result, 1, f"no lake at '{typo}' (from --kv)", "branchwater repo create")
    assert not typo.parent.exists()


def test_a_missing_lake_named_by_the_env_var_is_found_as_the_store_finds_it(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sqlite:///rel.db` is relative to the cwd, as `SQLiteStore` opens it."""
    monkeypatch.setenv(KV_ENV, "sqlite:///lakes/typo.db")
    assert_user_error(
        bw("log", "sales", "main", kv=None), 1, f"'{lake.root}/lakes/typo.db' (from ${KV_ENV})"
    )
    assert not (lake.root / "lakes").exists()
    ok(bw("repo", "create", "sales", "--namespace", lake.namespace, kv=None))
    assert (lake.root / "lakes" / "typo.db").is_file()
    assert "sales" in ok(bw("repo", "list", kv=None)).out


def test_a_fresh_directory_has_no_lake(bw: Bw, lake: CliLake) -> None:
    assert_user_error(
        bw("repo", "list", kv=None),
        1,
        f"no lake here ('{lake.root}/.branchwater/lake.db': the file does not exist)",
        "branchwater repo create",
        f"--kv or ${KV_ENV}",
    )
    assert not (lake.root / ".branchwater").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("Bad_Name", "--namespace", "{ns}"), "invalid repository name 'Bad_Name'"),
        (("sales", "--namespace", "{ns}", "--default-branch", "a..b"), "invalid branch name"),
        (("sales", "--namespace", "data/sales"), "must be a URL such as file:///data/sales"),
    ],
)
def test_a_refused_creation_starts_no_lake(
    bw: Bw, lake: CliLake, args: tuple[str, ...], message: str
) -> None:
    shown = tuple(arg.format(ns=lake.namespace) for arg in args)
    assert_user_error(bw("repo", "create", *shown, kv=None), 1, message)
    assert not (lake.root / ".branchwater").exists()


def test_the_engines_warnings_are_cli_lines_only_while_a_command_runs(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A program calling `main` keeps its own logging: the CLI's warning lines replace it
    during a command and are gone after it."""
    make_repo(bw, lake)
    logger = logging.getLogger("branchwater.engine.graveler.merge")

    def warned(*_args: object, **_kwargs: object) -> Iterator[object]:
        logger.warning("said during a command")
        return iter(())

    monkeypatch.setattr(api.Repository, "log", warned)
    result = bw("log", "sales", "main")
    assert result.code == 0 and result.err == "branchwater: warning: said during a command\n"
    assert "said during a command" not in caplog.text
    logger.warning("said after it")
    assert "said after it" in caplog.text
    assert logging.getLogger("branchwater").handlers == []


def test_only_repo_create_starts_a_lake() -> None:
    assert list(verbs_that_start_a_lake(app.build_parser(), ())) == ["repo create"]


def verbs_that_start_a_lake(
    parser: argparse.ArgumentParser, words: tuple[str, ...]
) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from verbs_that_start_a_lake(sub, (*words, name))
    if parser.get_default("creates_lake"):
        yield " ".join(words)


# ----------------------------------------------------------------- lakes on database servers

SECRET = "s3cr3t-pass"


@pytest.fixture
def pg_lake(bw: Bw, lake: CliLake, postgres_url: str) -> str:
    """A lake in a PostgreSQL table of its own, holding repository `sales`; its URL."""
    url = f"{postgres_url}?table={unique_name('kv_')}"
    ok(bw("repo", "create", "sales", "--namespace", lake.namespace, kv=url))
    return url


@pytest.mark.postgres
@pytest.mark.parametrize(
    "args",
    [
        ("repo", "list"),
        ("log", "sales", "main"),
        ("ls", "sales", "main"),
        ("gc", "rules", "get", "sales"),
    ],
)
def test_a_verb_on_a_mistyped_postgres_table_fails_without_creating_it(
    bw: Bw, pg_lake: str, postgres_url: str, args: tuple[str, ...]
) -> None:
    """The table is named, the URL shown with its password masked, and no table is made:
    an empty one would list no repository, as if the lake had none."""
    typo = unique_name("kv_")
    with_secret = postgres_url.replace("postgres@", f"postgres:{SECRET}@", 1)
    result = bw(*args, kv=f"{with_secret}?table={typo}")
    masked = postgres_url.replace("postgres@", "postgres:***@", 1)
    assert_user_error(
        result,
        1,
        f"no lake at {masked}?table={typo} (from --kv): table '{typo}' does not exist",
        "branchwater repo create",
    )
    assert SECRET not in result.err
    assert pg_tables(postgres_url, typo) == set()
    assert "sales" in ok(bw("repo", "list", kv=pg_lake)).out


@pytest.mark.postgres
def test_repo_create_starts_a_postgres_lake_the_env_var_names(
    bw: Bw, lake: CliLake, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = unique_name("kv_")
    monkeypatch.setenv(KV_ENV, f"{postgres_url}?table={table}&partitions=2")
    assert_user_error(
        bw("branch", "list", "sales", kv=None),
        1,
        f"(from ${KV_ENV}): table '{table}' does not exist",
    )
    assert pg_tables(postgres_url, table) == set()
    ok(bw("repo", "create", "sales", "--namespace", lake.namespace, kv=None))
    assert pg_tables(postgres_url, table) == {table, f"{table}_p0", f"{table}_p1"}
    assert "sales" in ok(bw("repo", "list", kv=None)).out


@pytest.mark.s3
def test_a_verb_on_a_mistyped_dynamodb_table_fails_without_creating_it(
    bw: Bw, lake: CliLake, dynamodb_endpoint: str
) -> None:
    table = unique_name("kv-")
    url = f"dynamodb://{table}?endpoint_url={dynamodb_endpoint}&region=us-east-1"
    assert_user_error(
        bw("repo", "list", kv=url),
        1,
        f"no lake at {url} (from --kv): DynamoDB table '{table}' does not exist",
    )
    assert table not in dynamodb_tables(dynamodb_endpoint)
    ok(bw("repo", "create", "sales", "--namespace", lake.namespace, kv=url))
    assert table in dynamodb_tables(dynamodb_endpoint)
    assert "sales" in ok(bw("repo", "list", kv=url)).out


def cli_worker(argv: list[str], barrier: Any, results: Any) -> None:
    """In a process of its own: `main(argv)` once every worker is ready, its exit code and
    output put on `results` (a failure's traceback, if it raised)."""
    try:
        barrier.wait(120)
        with captured() as (out, err):
            code = main(argv)
        results.put((argv, code, text(out), text(err)))
    except BaseException:
        results.put((argv, -1, "", traceback.format_exc()))


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.TextIOWrapper, io.TextIOWrapper]]:
    """stdout and stderr written to memory, as UTF-8 text streams like a terminal's."""
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for _ in range(2))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode()


@pytest.mark.postgres
def test_creations_and_reads_racing_on_a_fresh_postgres_table(
    lake: CliLake, postgres_url: str
) -> None:
    """Processes released together, creating repositories on a table nobody made yet, all
    succeed on one table (they queue on its advisory lock); a read among them finds no lake
    or the lake, never a half-made one (an error of another kind)."""
    table = unique_name("kv_")
    url = f"{postgres_url}?table={table}"
    names = ["one", "two", "three", "four"]
    commands = [
        ["--kv", url, "repo", "create", name, "--namespace", f"{lake.namespace}/{name}"]
        for name in names
    ]
    commands += [["--kv", url, "--json", "repo", "list"]] * 3
    ctx = forked_context()
    barrier, results = ctx.Barrier(len(commands)), ctx.Queue()
    processes = [forked_process(cli_worker, argv, barrier, results) for argv in commands]
    for process in processes:
        process.start()
    try:
        outcomes = [results.get(timeout=120) for _ in processes]
    finally:
        for process in processes:
            process.join(60)
    assert [p.exitcode for p in processes] == [0] * len(processes)
    for argv, code, out, err in outcomes:
        if "create" in argv:
            assert (code, err) == (0, ""), err
        elif code:
            assert code == 1 and err.startswith("branchwater: error: no lake at "), err
            assert f"table '{table}' does not exist" in err and err.count("\n") == 1
        else:
            assert err == "", err
            assert {r["name"] for r in json.loads(out)} <= set(names), out
    assert pg_tables(postgres_url, table) == {table, *(f"{table}_p{i}" for i in range(16))}
    listed = main_json(["--kv", url, "--json", "repo", "list"])
    assert sorted(r["name"] for r in listed) == sorted(names)


def main_json(argv: list[str]) -> Any:
    with captured() as (out, err):
        code = main(argv)
    assert code == 0, text(err)
    return json.loads(text(out))


# ---------------------------------------------------------------------------- entry points


def run_module(lake: CliLake, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != KV_ENV}
    return subprocess.run(
        [sys.executable, "-m", "branchwater.engine.cli", "--kv", lake.kv, *args],
        input=stdin,
        capture_output=True,
        cwd=lake.root,
        env=env,
        timeout=120,
        check=False,
    )


def test_module_entry_point_exit_codes_and_stdin(lake: CliLake) -> None:
    created = run_module(lake, "repo", "create", "proc", "--namespace", lake.namespace)
    assert created.returncode == 0, created.stderr
    uploaded = run_module(lake, "upload", "proc", "main", "in.bin", "-", stdin=b"\x00\xffdata")
    assert uploaded.returncode == 0, uploaded.stderr
    assert run_module(lake, "cat", "proc", "main", "in.bin").stdout == b"\x00\xffdata"

    missing = run_module(lake, "ls", "nosuch", "main")
    assert missing.returncode == 1
    assert missing.stderr.decode().startswith("branchwater: error: ")
    assert b"Traceback" not in missing.stderr and missing.stderr.count(b"\n") == 1

    usage = run_module(lake, "commit", "proc", "main")
    assert usage.returncode == 1 and b"Traceback" not in usage.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("branchwater")
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 0
    assert result.stdout.decode().startswith("branchwater ")
    bad = subprocess.run(
        [str(script), "--kv", "bogus://x", "repo", "list"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and b"bogus" in bad.stderr and b"Traceback" not in bad.stderr
