"""Hostile input through the command line: arguments that are not UTF-8 (Python hands them
over with lone surrogates), forged refs dumps and malformed GC ids. Every verb answers with
one line naming the problem and exit 1, and writes nothing."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from branchwater.engine.cli import app
from branchwater.engine.gc.addresses import newest_first_id
from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok
from tests.helpers.hostile import HOSTILE_TEXTS, hostile_dump, stored

WORD = st.text(st.characters(min_codepoint=ord("a"), max_codepoint=ord("z")), max_size=4)
NOT_UTF8 = st.builds(
    lambda head, byte, tail: os.fsdecode(head.encode() + bytes([byte]) + tail.encode()),
    WORD,
    st.integers(0x80, 0xFF),
    WORD,
)
"""What Python makes of a command-line argument holding a byte UTF-8 cannot decode."""

VERBS = [
    ("branch", "create", "sales", "{}", "--source", "main"),
    ("branch", "create", "sales", "fresh", "--source", "{}"),
    ("branch", "delete", "sales", "{}"),
    ("tag", "create", "sales", "{}", "main"),
    ("tag", "create", "sales", "fresh", "{}"),
    ("upload", "sales", "main", "{}", "{file}"),
    ("cat", "sales", "main", "{}"),
    ("rm", "sales", "main", "{}"),
    ("ls", "sales", "{}"),
    ("ls", "sales", "main", "{}"),
    ("ls", "sales", "main", "--after", "{}"),
    ("log", "sales", "{}"),
    ("diff", "sales", "main", "{}"),
    ("merge", "sales", "{}", "main"),
    ("merge", "sales", "main", "{}"),
    ("cp", "sales", "main", "{}", "dst"),
    ("cp", "sales", "main", "a.csv", "{}"),
    ("repo", "create", "{}", "--namespace", "{namespace}"),
]


def prepared(bw: Bw, lake: CliLake) -> str:
    """Repository `sales` with `a.csv` committed on `main`; returns a local file to upload."""
    make_repo(bw, lake)
    file = local_file(lake, "a.csv", b"id\n1\n")
    ok(bw("upload", "sales", "main", "a.csv", file))
    ok(bw("commit", "sales", "main", "-m", "load"))
    return file


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(argument=NOT_UTF8)
def test_a_non_utf8_argument_is_one_line_exit_1_and_writes_nothing(
    bw: Bw, lake: CliLake, argument: str
) -> None:
    if not (lake.root / "ns").exists():
        prepared(bw, lake)
    file = str(lake.root / "a.csv")
    before = stored(lake.kv, lake.root / "ns")
    for verb in VERBS:
        args = [a.format(argument, file=file, namespace=f"{lake.namespace}/other") for a in verb]
        assert_user_error(bw(*args), 1, repr(argument))
    assert stored(lake.kv, lake.root / "ns") == before


def test_the_installed_command_reports_a_non_utf8_argument_in_one_line(
    bw: Bw, lake: CliLake
) -> None:
    """Through a real argv of bytes, not an in-process list of strings."""
    prepared(bw, lake)
    before = stored(lake.kv, lake.root / "ns")
    argv = [sys.executable, "-m", "branchwater.engine.cli", "--kv", lake.kv, "cat", "sales", "main"]
    result = subprocess.run(
        [*map(os.fsencode, argv), b"caf\xe9.csv"], capture_output=True, timeout=60
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout == b""
    assert result.stderr.splitlines() == [
        b"branchwater: error: invalid object path 'caf\\udce9.csv': it must be valid "
        b"Unicode: no lone surrogates (non-UTF-8 bytes from a shell)"
    ]
    assert stored(lake.kv, lake.root / "ns") == before


def test_a_count_beyond_any_machine_integer_shows_everything(bw: Bw, lake: CliLake) -> None:
    """`islice` takes at most `sys.maxsize`: a larger `--limit` or `--depth` is no limit."""
    prepared(bw, lake)
    huge = str(10**30)
    commits = json.loads(ok(bw("--json", "log", "sales", "main", "--limit", huge)).out)
    walked = json.loads(ok(bw("--json", "log", "sales", "main", "--depth", huge)).out)
    assert [c["message"] for c in commits] == [c["message"] for c in walked]
    assert commits[0]["message"] == "load" and len(commits) == 2
    listed = json.loads(ok(bw("--json", "ls", "sales", "main", "--limit", huge)).out)
    assert [e["path"] for e in listed] == ["a.csv"]


@pytest.mark.parametrize(
    ("verb", "option"),
    [(("gc", "explain", "sales", "data/x"), "--min-age"), (("gc", "run", "sales"), "--lock-ttl")],
)
def test_a_duration_beyond_a_century_is_one_line_exit_1(
    bw: Bw, lake: CliLake, verb: tuple[str, ...], option: str
) -> None:
    """Dates computed from it would leave the calendar (an `OverflowError` once)."""
    prepared(bw, lake)
    for value in ("9" * 30 + "d", "1" + "0" * 400 + "s"):
        assert_user_error(bw(*verb, option, value), 1, f"argument {option}", "longer than 36500d")


def test_json_nested_deeper_than_the_parser_goes_is_one_line_exit_1_and_writes_nothing(
    bw: Bw, lake: CliLake
) -> None:
    """Check details, GC rules and a refs dump: Python's parser raises `RecursionError`."""
    prepared(bw, lake)
    ok(bw("repo", "create", "bare", "--namespace", f"{lake.namespace}/bare"))
    deep = lake.root / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    deeper = lake.root / "deeper.json"
    deeper.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    before = stored(lake.kv, lake.root / "ns")
    record = ("checks", "record", "sales", "main", "quality", "--passed", "--details-file")
    for verb, said in (
        ((*record, str(deep)), "--details is not JSON"),
        (("gc", "rules", "set", "sales", "--file", str(deep)), "GC rules are not valid JSON"),
        (("refs", "restore", "bare", str(deeper)), "cannot be read"),
    ):
        assert_user_error(bw(*verb), 1, said, "recursion")
    assert stored(lake.kv, lake.root / "ns") == before


HOSTILE_VALUES = [
    *HOSTILE_TEXTS,
    *("0", "-1", "9" * 30, "nan", "inf", "1e400", "../../x", "%00", "main^^", "-", "--"),
    *("a=b", "=", "{}", "[1]", "*", "**/x", "s3://", "file:///"),
    *("10s", "9" * 20 + "d", "1e400s", "-5m"),
]
"""Values each argument slot of `VERB_SLOTS` takes in turn: `HOSTILE_TEXTS`, signed, huge
and non-finite numbers, traversal, an escaped NUL, globs, URLs, durations."""
VERB_SLOTS = [
    "repo create {} --namespace {ns}", "repo delete {}",
    "branch create sales {} --source main", "branch create sales b2 --source {}",
    "branch delete sales {}", "branch reset sales dev --to {}",
    "upload sales dev {} {file}", "upload sales dev p {}", "upload sales dev p {file} --meta {}",
    "cat sales main {}", "cat sales {} a.csv", "ls sales {}", "ls sales main {}",
    "ls sales main --after {}", "ls sales main --limit {}", "rm sales dev {}",
    "cp sales dev {} y", "cp sales dev a.csv {}", "import sales dev {}",
    "import sales dev {src} --prefix {}", "commit sales dev -m {}",
    "commit sales dev -m m --meta {}", "merge sales {} main", "merge sales dev {}",
    "merge sales dev main --strategy {}", "log sales {}", "log sales main --limit {}",
    "log sales main --depth {}", "log sales main --after {}", "log sales main --where {}",
    "log sales main --path {}", "diff sales main {}", "uncommitted sales {}",
    "revert sales dev {}", "revert sales dev main --parent {}", "cherry-pick sales dev {}",
    "restore sales dev {} --source main", "restore sales dev a.csv --source {}",
    "protect sales {} --no-delete", "protect sales main --require-check {}",
    "protect sales {} --remove", "checks sales {}", "checks record sales main {} --passed",
    "checks record sales main q --passed --details {}",
    "checks record sales main q --passed --by {}",
    "tag create sales {} main", "tag create sales t1 {}", "tag delete sales {}",
    "refs dump sales {}", "refs restore sales {}", "compact sales {}",
    "compact sales dev --max-tombstones {}", "compact sales dev --guard-seconds {}",
    "compaction-status sales {}", "compaction-status sales dev --scan-budget {}",
    "gc prepare sales --run {}", "gc explain sales {}", "gc explain sales data/x --min-age {}",
    "gc explain sales data/x --run {}", "gc rules get {}", "gc prune-runs sales --keep-runs {}",
    "publish sales {} main", "publish sales dev {}",
]  # fmt: skip
"""Every verb that takes an argument (`gc run` but for its Spark job), one slot at a time."""


def test_no_verb_answers_a_hostile_argument_with_a_traceback(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each verb, each value in its slot: it succeeds, or says what is wrong in one line
    (exit 1, or 2 for a lost race), never with a traceback; run against one lake, so the
    verbs also meet what earlier hostile runs left. The command line's parser is built once
    for the thousands of runs (building it is most of an in-process run's time): parsing
    leaves it as it was, so each run parses as a fresh `branchwater` process would."""
    monkeypatch.setattr(app, "build_parser", functools.cache(app.build_parser))
    file = prepared(bw, lake)
    ok(bw("branch", "create", "sales", "dev", "--source", "main"))
    src = lake.root / "src"
    src.mkdir()
    (src / "f.csv").write_text("x")
    slots = {"ns": f"{lake.namespace}/other", "file": file, "src": f"file://{src}"}
    failures = []
    for template in VERB_SLOTS:
        for value in HOSTILE_VALUES:
            argv = [w.format(value, **slots) if "{" in w else w for w in template.split(" ")]
            result = bw(*argv)
            lines = result.err.splitlines()
            one_line = len(lines) == 1 and lines[0].startswith("branchwater: error: ")
            if result.code not in (0, 1, 2) or (result.code and not one_line):
                failures.append(f"{argv!r}: exit {result.code}: {result.err[-200:]!r}")
    assert failures == []


def test_restoring_a_hostile_dump_is_one_line_exit_1_and_writes_nothing(
    bw: Bw, lake: CliLake
) -> None:
    """Issue 42's dump: a metarange id out of the namespace, the commit id recomputed."""
    prepared(bw, lake)
    genuine = lake.root / "refs.json"
    ok(bw("refs", "dump", "sales", str(genuine)))
    ok(bw("repo", "delete", "sales"))
    ok(bw("repo", "create", "sales", "--namespace", f"{lake.namespace}/sales"))
    document = json.loads(genuine.read_text())
    forged = lake.root / "forged.json"
    forged.write_text(json.dumps(hostile_dump(document, "metarange_id", "../../../../etc/passwd")))
    before = stored(lake.kv, lake.root / "ns")
    assert_user_error(bw("refs", "restore", "sales", str(forged)), 1, "metarange id must be")
    assert stored(lake.kv, lake.root / "ns") == before
    ok(bw("refs", "restore", "sales", str(genuine)))
    assert "load" in ok(bw("log", "sales", "main")).out


@pytest.mark.parametrize(
    "run_id", ["0123456789ab-abcdef\n", "000000000000-abcdef", "../../x", "caf\udce9"]
)
def test_gc_prepare_with_a_malformed_run_id_is_one_line_and_writes_nothing(
    bw: Bw, lake: CliLake, run_id: str
) -> None:
    prepared(bw, lake)
    before = stored(lake.kv, lake.root / "ns")
    assert_user_error(bw("gc", "prepare", "sales", "--run", run_id), 1, repr(run_id))
    assert stored(lake.kv, lake.root / "ns") == before


def test_gc_prepare_with_an_expired_run_id_is_one_line_and_writes_nothing(
    bw: Bw, lake: CliLake
) -> None:
    prepared(bw, lake)
    before = stored(lake.kv, lake.root / "ns")
    expired = newest_first_id(datetime(2026, 1, 1, tzinfo=UTC))
    assert_user_error(bw("gc", "prepare", "sales", "--run", expired), 1, "start a new run")
    assert stored(lake.kv, lake.root / "ns") == before


def test_gc_explain_of_an_address_with_a_line_end_is_one_line_and_exit_1(
    bw: Bw, lake: CliLake
) -> None:
    prepared(bw, lake)
    (listed,) = json.loads(ok(bw("ls", "sales", "main", "--json")).out)
    assert "kept" in ok(bw("gc", "explain", "sales", listed["address"])).out
    for end in ("\n", "\r\n", "\x00", "\udcff"):
        address = listed["address"] + end
        assert_user_error(bw("gc", "explain", "sales", address), 1, repr(address))
