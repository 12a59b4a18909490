"""The job on a Spark standalone cluster: a master and a worker on loopback, started with the
pyspark distribution's own `spark-class`, and `branchwater gc run --master spark://…`.

It is also the command line's run that sweeps (the summary, the report, and `gc explain` of
what it deleted): tests/cli/test_gc_run.py keeps the refused run and the sweep without Spark."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import pytest

from branchwater.engine.cli import main
from branchwater.engine.cli.gc import spark_home
from tests.fixtures.spark import DRIVER_JVM
from tests.helpers.servers import unavailable

pytestmark = [pytest.mark.spark, pytest.mark.slow]

LOOPBACK = "127.0.0.1"
READY_TIMEOUT = 120.0
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")

T = TypeVar("T")


def start(home: str, scratch: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    """One daemon of the cluster in its own process group, its log in `scratch`."""
    env = {
        **os.environ,
        "SPARK_HOME": home,
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_WORKER_DIR": str(scratch / "work"),
        "SPARK_DAEMON_JAVA_OPTS": " ".join(DRIVER_JVM),
        "PYSPARK_PYTHON": sys.executable,
    }
    log = open(scratch / f"{name}.log", "wb")  # noqa: SIM115 - the daemon writes it until stopped
    return subprocess.Popen(
        [str(Path(home) / "bin" / "spark-class"), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def master_address(scratch: Path) -> tuple[str, int] | None:
    """The master's URL and web UI port, once its log has both."""
    log = (scratch / "master.log").read_text(errors="replace")
    url, ui = MASTER_URL.search(log), MASTER_UI.search(log)
    return (url[1], int(ui[1])) if url and ui else None


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{ui_port}/json/", timeout=2) as page:
            return int(json.load(page).get("aliveworkers", 0))
    except OSError:
        return 0


def await_ready(
    scratch: Path,
    daemons: list[subprocess.Popen[bytes]],
    deadline: float,
    ready: Callable[[], T | None],
) -> T:
    """`ready()`'s first value that is not None; the daemons' logs if none comes in time."""
    while (value := ready()) is None:
        if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
            logs = "\n".join(p.read_text()[-2000:] for p in scratch.glob("*.log"))
            unavailable(f"the standalone cluster did not come up:\n{logs}")
        time.sleep(0.5)
    return value


@dataclass(frozen=True)
class Cluster:
    master: str
    work_dir: Path
    """Where the worker runs its executors, one folder per application."""


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and one worker (1 GiB, 2 cores). Each daemon binds ports of its own choosing
    and the master's log says which: a port chosen here and released before a JVM binds it
    can be taken meanwhile by any other process of the suite."""
    home = spark_home()
    if home is None:
        unavailable("pyspark is not installed")
    scratch = tmp_path_factory.mktemp("standalone")
    any_port = ("--port", "0", "--webui-port", "0")
    daemons = [
        start(
            home,
            scratch,
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", LOOPBACK, *any_port),
        )
    ]
    deadline = time.monotonic() + READY_TIMEOUT
    try:
        url, ui = await_ready(scratch, daemons, deadline, lambda: master_address(scratch))
        daemons.append(
            start(
                home,
                scratch,
                "worker",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", LOOPBACK, *any_port, "--cores", "2", "--memory", "1g", url),
            )
        )
        await_ready(scratch, daemons, deadline, lambda: alive_workers(ui) or None)
        yield Cluster(url, scratch / "work")
    finally:
        for daemon in reversed(daemons):
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
                daemon.wait(timeout=30)


@pytest.mark.usefixtures("spark_submit_conf")
def test_a_clean_run_on_a_standalone_cluster(
    standalone: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from branchwater.engine import Lake

    monkeypatch.chdir(tmp_path)
    kv = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(kv) as lake:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
        main_branch = repo.branch("main")
        kept = main_branch.upload("a", b"a").address
        main_branch.commit("a")
        dropped = main_branch.upload("b", b"b").address
        main_branch.delete("b")

    code = main(
        [
            *("--kv", kv, "gc", "run", "sales", "--json"),
            *("--master", standalone.master, "--min-age", "0s", "--max-share", "1"),
            *("--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2"),
            *("--conf", f"spark.executor.extraJavaOptions={' '.join(DRIVER_JVM)}"),
        ]
    )

    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["status"] == "swept" and summary["min_age_override"]
    assert summary["counts"]["deleted"] == {"objects": 1, "bytes": 1}
    assert Path(urlsplit(summary["report_uri"]).path).is_file()
    assert (tmp_path / "ns" / kept).is_file() and not (tmp_path / "ns" / dropped).exists()
    assert list(standalone.work_dir.glob("app-*/*/stderr")), "no executor ran on the worker"

    assert main(["--kv", kv, "gc", "explain", "sales", dropped]) == 0
    assert f"deleted by GC run {summary['run_id']}" in capsys.readouterr().out
