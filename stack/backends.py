"""The stack's init step: create what Airflow's connections name, from Airflow's environment.

Run as `python -m branchwater.stack init` with the environment every Airflow service gets,
natively and in compose alike: it creates the metadata and KV databases on the PostgreSQL
server they name and the bucket of the Branchwater connection's default namespace on the
AWS connection's S3 endpoint. Each is created only when missing, so a restart is a no-op.
Then it creates the example ETL's repository there and protects its `main` as the demo does
(merges only, each of a commit whose `quality` check passed), so no run ever lands on an
unprotected `main`; protecting again changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from branchwater.demo.airflow_home import connection_env
from branchwater.engine import ConfigurationError, Unavailable

WAIT = 60.0
EXAMPLE_REPOSITORY = "etl-example"
"""The example ETL's default repository (its `repository` param)."""
"""Seconds the servers may take to accept connections (compose starts them together)."""


def connection(env: Mapping[str, str], conn_id: str) -> dict[str, Any]:
    variable = connection_env(conn_id)
    try:
        value = json.loads(env[variable])
    except KeyError:
        raise ConfigurationError(
            f"{variable} is not set: run with the stack's environment"
        ) from None
    if not isinstance(value, dict):
        raise ConfigurationError(f"{variable} must hold a JSON connection")
    return value


def databases(env: Mapping[str, str]) -> list[str]:
    """The PostgreSQL URLs of the Airflow metadata DB and the Branchwater KV."""
    metadata = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    kv = str(connection(env, "branchwater_default").get("password", ""))
    urls = [metadata.replace("postgresql+psycopg://", "postgresql://", 1), kv.split("?")[0]]
    for url in urls:
        if not url.startswith("postgresql://"):
            raise ConfigurationError(f"the stack runs on PostgreSQL, not {url.split(':')[0]!r}")
    return urls


def create_database(url: str) -> bool:
    """Create the database `url` names on its server unless it exists; True if created."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with _connect(admin) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    return True


def create_bucket(env: Mapping[str, str]) -> str:
    """The bucket of the Branchwater connection's default namespace, on the AWS connection's
    endpoint; returns its name."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    namespace = connection(env, "branchwater_default").get("extra", {}).get("default_namespace")
    if not namespace or not str(namespace).startswith("s3://"):
        raise ConfigurationError(f"the stack's namespace must be on S3, not {namespace!r}")
    bucket = urlsplit(str(namespace)).netloc
    aws = connection(env, "aws_default")
    client = boto3.session.Session().client(
        "s3",
        aws_access_key_id=aws.get("login"),
        aws_secret_access_key=aws.get("password"),
        endpoint_url=aws.get("extra", {}).get("endpoint_url"),
        region_name=aws.get("extra", {}).get("region_name"),
    )
    deadline = time.monotonic() + WAIT
    while True:
        try:
            client.head_bucket(Bucket=bucket)
            return bucket
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                raise Unavailable(f"S3 refused bucket {bucket!r}: {exc}") from exc
            client.create_bucket(Bucket=bucket)
            return bucket
        except BotoCoreError as exc:
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"S3 at {client.meta.endpoint_url} did not answer: {exc}"
                ) from exc
            time.sleep(1)


def init(env: Mapping[str, str]) -> list[str]:
    """Create the databases and the bucket; returns a line per thing created."""
    done = [
        f"database {urlsplit(url).path.lstrip('/')}"
        for url in databases(env)
        if create_database(url)
    ]
    done.append(f"bucket {create_bucket(env)}")
    done.append(protect_example(env))
    return done


def protect_example(env: Mapping[str, str]) -> str:
    """Create the example ETL's repository (where the connection's default namespace puts
    it) unless it exists, and protect its `main`; returns what it did, as a line."""
    from branchwater.demo.main_job import protect_main
    from branchwater.engine import AlreadyExists, Lake

    lake_conn = connection(env, "branchwater_default")
    namespace = str(lake_conn.get("extra", {}).get("default_namespace", "")).rstrip("/")
    aws = connection(env, "aws_default")
    s3_options = {
        "endpoint_url": aws.get("extra", {}).get("endpoint_url"),
        "aws_access_key_id": aws.get("login"),
        "aws_secret_access_key": aws.get("password"),
        "region_name": aws.get("extra", {}).get("region_name"),
    }
    with Lake.connect(str(lake_conn.get("password", "")), s3_options=s3_options) as lake:
        try:
            repo = lake.create_repository(EXAMPLE_REPOSITORY, f"{namespace}/{EXAMPLE_REPOSITORY}")
        except AlreadyExists:
            repo = lake.repository(EXAMPLE_REPOSITORY)
        protect_main(repo)
    return f"repository {EXAMPLE_REPOSITORY}: main protected, merges need 'quality' passed"


def _connect(url: str) -> Any:
    import psycopg

    deadline = time.monotonic() + WAIT
    while True:
        try:
            return psycopg.connect(url, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                host = urlsplit(url).hostname
                raise Unavailable(f"PostgreSQL on {host} is not reachable: {exc}") from exc
            time.sleep(1)
