"""An Airflow home on SQLite for running the shipped DAGs outside a deployment."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from branchwater.engine import ConfigurationError

REPOSITORY_ROOT = Path(__file__).resolve().parents[1]
DAGS_FOLDER = REPOSITORY_ROOT / "dags"


def new_secrets() -> dict[str, str]:
    """A Fernet key and a JWT secret shared by every process of one home family. The secret
    holds 64 random bytes, what RFC 7518 asks of a key for Airflow's HS512 tokens.

    Unit-test mode draws new ones in every process; fixed ones let one process read what
    another (the CLI, an API server) wrote."""
    return {
        "fernet": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "jwt": secrets.token_urlsafe(64),
    }


def airflow_environment(home: Path, keys: dict[str, str]) -> dict[str, str]:
    """The settings that point Airflow at `home` instead of `~/airflow`."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__CORE__FERNET_KEY": keys["fernet"],
        "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt"],
    }


def connection_env(conn_id: str) -> str:
    """The environment variable Airflow reads connection `conn_id` from."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def connection_variable(conn_id: str, conn_type: str, **fields: Any) -> dict[str, str]:
    """A connection as a deployment can define it: an `AIRFLOW_CONN_…` variable of JSON."""
    return {connection_env(conn_id): json.dumps({"conn_type": conn_type, **fields})}


def airflow_command() -> list[str]:
    """The `airflow` CLI of this interpreter's environment."""
    airflow = Path(sys.executable).with_name("airflow")
    return [str(airflow)] if airflow.exists() else [sys.executable, "-m", "airflow"]


def migrate(environment: dict[str, str]) -> None:
    """`airflow db migrate` as users run it, in a child with `environment` applied."""
    home = Path(environment["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [*airflow_command(), "db", "migrate"],
        cwd=home,
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise ConfigurationError(f"`airflow db migrate` failed ({result.returncode}):\n{output}")


@dataclass(frozen=True)
class HomeFamily:
    """Airflow homes that share one migrated metadata DB template, so each concurrent DAG run
    gets its own SQLite file (SQLite takes one writer at a time) without migrating again."""

    root: Path
    connections: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=new_secrets)

    @property
    def template(self) -> Path:
        return self.root / "template"

    def prepare(self) -> None:
        migrate({**airflow_environment(self.template, self.keys), **self.connections})

    def home(self, name: str) -> dict[str, str]:
        """A fresh home `name`, a copy of the template; returns its environment."""
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.template / "airflow.db", home / "airflow.db")
        return {**airflow_environment(home, self.keys), **self.connections}
