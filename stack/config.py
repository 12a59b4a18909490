"""The production-like stack as one data structure: services, ports, environment, connections.

`make stack` runs these services natively on loopback and `docker/compose.yaml` runs the
same ones in containers; both are derived from `services()` here, the native stack directly
and the compose file through a test that compares them, so the two cannot drift apart. What
differs between the two is only *where* things are: a `Placement` says which host each
service is reached on, where its files live and what the secrets are (generated values
natively, `${VARIABLES}` in compose).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from branchwater.demo.airflow_home import connection_env

REPO = Path(__file__).resolve().parents[1]
"""The project checkout: the native stack's DAGs folder is its `dags/`."""
LOOPBACK = "127.0.0.1"

AIRFLOW_IMAGE = "apache/airflow:3.3.2-python3.11"
POSTGRES_IMAGE = "postgres:16"
SEAWEEDFS_IMAGE = "chrislusf/seaweedfs:4.48"
SPARK_IMAGE = "apache/spark:4.3.0"
BRANCHWATER_IMAGE = "branchwater:0.1.0"
"""The project's own image (docker/Dockerfile: the Airflow image plus Java and Branchwater)."""

SIMPLE_AUTH_MANAGER = (
    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
)
CONN_IDS = ("branchwater_default", "aws_default", "spark_default")
AIRFLOW_SERVICES = (
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)


@dataclass(frozen=True)
class Ports:
    """Every port the stack listens on; `make stack` uses these, the stack test free ones."""

    postgres: int = 5432
    airflow: int = 8080
    s3: int = 8333
    s3_grpc: int = 18333
    weed_master: int = 9333
    weed_master_grpc: int = 19333
    weed_volume: int = 8334
    weed_volume_grpc: int = 18334
    weed_filer: int = 8888
    weed_filer_grpc: int = 18888
    spark_master: int = 7077
    spark_master_ui: int = 8090
    spark_worker: int = 7078
    spark_worker_ui: int = 8091

    def weed_flags(self) -> dict[str, int]:
        """`weed server`'s port flags: every listener it opens, none left at its default."""
        return {
            "master.port": self.weed_master,
            "master.port.grpc": self.weed_master_grpc,
            "volume.port": self.weed_volume,
            "volume.port.grpc": self.weed_volume_grpc,
            "filer.port": self.weed_filer,
            "filer.port.grpc": self.weed_filer_grpc,
            "s3.port": self.s3,
            "s3.port.grpc": self.s3_grpc,
        }


@dataclass(frozen=True)
class Secrets:
    """What must not be in the repository: drawn per stack natively, `${…}` in compose."""

    fernet_key: str
    jwt_secret: str
    s3_access_key: str
    s3_secret_key: str
    postgres_password: str

    @classmethod
    def placeholders(cls) -> Secrets:
        """Compose's variables for each secret (`python -m branchwater.stack env` prints them)."""
        return cls(**{name: f"${{{variable}}}" for name, variable in SECRET_VARIABLES.items()})

    @classmethod
    def generate(cls, postgres_password: str = "") -> Secrets:
        """Fresh secrets; the native stack uses the machine's PostgreSQL and its own login."""
        import base64
        import secrets

        return cls(
            fernet_key=base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
            jwt_secret=secrets.token_urlsafe(32),
            s3_access_key="BW" + secrets.token_hex(9).upper(),
            s3_secret_key=secrets.token_urlsafe(30),
            postgres_password=postgres_password,
        )


SECRET_VARIABLES = {
    "fernet_key": "BRANCHWATER_FERNET_KEY",
    "jwt_secret": "BRANCHWATER_JWT_SECRET",
    "s3_access_key": "BRANCHWATER_S3_ACCESS_KEY",
    "s3_secret_key": "BRANCHWATER_S3_SECRET_KEY",
    "postgres_password": "BRANCHWATER_POSTGRES_PASSWORD",
}


@dataclass(frozen=True)
class Placement:
    """Where each service is reached and keeps its files: loopback natively, names in compose.

    `hosts` maps a service name to the host others reach it on; `bind` is the address
    servers listen on; `paths` maps a logical folder (airflow home, dags, data) to a path.
    """

    hosts: Mapping[str, str]
    bind: str
    paths: Mapping[str, str]
    python: str
    public_host: str
    spark_local_ip: str = ""

    def host(self, service: str) -> str:
        return self.hosts.get(service, self.hosts["*"])


@dataclass(frozen=True)
class StackConfig:
    """The stack's settings; `StackConfig()` is what `make stack` runs."""

    ports: Ports = field(default_factory=Ports)
    airflow_database: str = "branchwater_airflow"
    kv_database: str = "branchwater_kv"
    postgres_user: str = "postgres"
    bucket: str = "branchwater"
    namespace_prefix: str = "lakes"
    region: str = "us-east-1"
    admin_user: str = "admin"
    admin_password: str = "branchwater"
    spark_worker_cores: int = 2
    spark_worker_memory: str = "2g"
    parallelism: int = 8
    scheduled_runs: bool = True
    """Whether the scheduler makes the DAGs' scheduled runs (the tests, which trigger each
    run they check, turn them off: the first run of an unpaused DAG would go ahead)."""

    def with_ports(self, ports: Ports) -> StackConfig:
        return replace(self, ports=ports)

    @property
    def default_namespace(self) -> str:
        return f"s3://{self.bucket}/{self.namespace_prefix}"


@dataclass(frozen=True)
class Volume:
    """A folder a service keeps: a named volume in compose, a folder of the state dir natively."""

    name: str
    path_key: str


@dataclass(frozen=True)
class Service:
    """One long-running process (one compose service).

    `program` is the logical executable: resolved on this machine natively, run as
    `image_program` inside `image` in compose.
    """

    name: str
    image: str
    program: str
    image_program: str
    args: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[int, ...] = ()
    volumes: tuple[Volume, ...] = ()
    depends_on: tuple[str, ...] = ()
    image_entrypoint: tuple[str, ...] = ()
    """Replaces the image's entrypoint in compose when it would not run `image_program`."""


def postgres_url(config: StackConfig, place: Placement, secrets: Secrets, database: str) -> str:
    login = config.postgres_user
    if secrets.postgres_password:
        login += f":{secrets.postgres_password}"
    return f"postgresql://{login}@{place.host('postgres')}:{config.ports.postgres}/{database}"


def s3_endpoint(config: StackConfig, place: Placement) -> str:
    return f"http://{place.host('seaweedfs')}:{config.ports.s3}"


def spark_master_url(config: StackConfig, place: Placement) -> str:
    return f"spark://{place.host('spark-master')}:{config.ports.spark_master}"


def airflow_url(config: StackConfig, place: Placement, public: bool = False) -> str:
    host = place.public_host if public else place.host("airflow-api-server")
    return f"http://{host}:{config.ports.airflow}"


def connections(config: StackConfig, place: Placement, secrets: Secrets) -> dict[str, Any]:
    """The Airflow connections the shipped DAGs use, by connection id."""
    return {
        "branchwater_default": {
            "conn_type": "branchwater",
            "password": postgres_url(config, place, secrets, config.kv_database),
            "extra": {"default_namespace": config.default_namespace, "aws_conn_id": "aws_default"},
        },
        "aws_default": {
            "conn_type": "aws",
            "login": secrets.s3_access_key,
            "password": secrets.s3_secret_key,
            "extra": {"endpoint_url": s3_endpoint(config, place), "region_name": config.region},
        },
        "spark_default": {
            "conn_type": "spark",
            "host": f"spark://{place.host('spark-master')}",
            "port": config.ports.spark_master,
            "extra": {"deploy-mode": "client"},
        },
    }


def airflow_environment(config: StackConfig, place: Placement, secrets: Secrets) -> dict[str, str]:
    """The environment of every Airflow process: LocalExecutor on PostgreSQL, simple auth, the
    connections as `AIRFLOW_CONN_*` variables, the project's DAGs."""
    metadata = postgres_url(config, place, secrets, config.airflow_database)
    sqlalchemy = metadata.replace("postgresql://", "postgresql+psycopg://", 1)
    home = place.paths["airflow_home"]
    env = {
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": place.paths["dags"],
        "AIRFLOW__CORE__PARALLELISM": str(config.parallelism),
        "AIRFLOW__CORE__FERNET_KEY": secrets.fernet_key,
        "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{config.admin_user}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": f"{home}/passwords.json",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{airflow_url(config, place)}/execution/",
        "AIRFLOW__API__BASE_URL": airflow_url(config, place, public=True),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.jwt_secret,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlalchemy,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": sqlalchemy,
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": f"{home}/logs",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(config.scheduled_runs),
        **spark_environment(place),
    }
    for conn_id, conn in connections(config, place, secrets).items():
        env[connection_env(conn_id)] = json.dumps(conn, sort_keys=True)
    return env


SPARK_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
}
"""`spark-defaults.conf` of every driver the stack starts: no application UI (nothing listens
beyond the stack's ports, and task logs carry no progress bars), few shuffle partitions."""


def spark_defaults_file() -> str:
    return "".join(f"{key} {value}\n" for key, value in SPARK_DEFAULTS.items())


def spark_environment(place: Placement) -> dict[str, str]:
    """Executors run the stack's Python (Branchwater's writers run on them); natively every
    Spark process binds to loopback."""
    env = {"PYSPARK_PYTHON": place.python, "SPARK_CONF_DIR": place.paths["spark_conf"]}
    if place.spark_local_ip:
        env["SPARK_LOCAL_IP"] = place.spark_local_ip
    return env


def s3_environment(config: StackConfig, place: Placement, secrets: Secrets) -> dict[str, str]:
    """The S3 server in boto3's and pyarrow's own variables, for the Spark worker: its
    executors read and write the lake with them, as a cluster node would with its instance
    role. Drivers take theirs from the `aws_default` connection instead."""
    return {
        "AWS_ACCESS_KEY_ID": secrets.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": secrets.s3_secret_key,
        "AWS_ENDPOINT_URL": s3_endpoint(config, place),
        "AWS_DEFAULT_REGION": config.region,
    }


def passwords_file(config: StackConfig) -> dict[str, str]:
    """The simple auth manager's passwords file: the stack's known admin login."""
    return {config.admin_user: config.admin_password}


def identity_config(access_key: str, secret_key: str) -> dict[str, Any]:
    """SeaweedFS's `-s3.config` identities: one admin key pair, so unsigned requests are refused."""
    return {
        "identities": [
            {
                "name": "branchwater",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }


def weed_args(ports: Ports, place: Placement) -> tuple[str, ...]:
    """`weed server` with master, volume, filer and S3 in one process, nothing else listening.

    Buckets are never created on upload, unlike SeaweedFS's default, so a missing bucket is
    an error as on AWS.
    """
    data = place.paths["seaweedfs"]
    return (
        "-logtostderr",
        "server",
        f"-ip={place.host('seaweedfs')}",
        f"-ip.bind={place.bind}",
        f"-dir={data}",
        "-filer",
        "-s3",
        *(f"-{flag}={port}" for flag, port in ports.weed_flags().items()),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={place.paths['seaweedfs_config']}/s3.json",
        "-s3.autoCreateBucket=false",
        "-s3.allowDeleteBucketNotEmpty=true",
        f"-filer.localSocket={data}/filer.sock",
        f"-s3.localSocket={data}/s3.sock",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=256",
        "-volume.max=64",
        "-volume.preStopSeconds=0",
    )


SPARK_MASTER_OPTS = "-Dspark.deploy.defaultCores=1"
"""One core per application unless it asks for more: the sessions of concurrent Airflow tasks
share the worker instead of queueing behind the first one."""

WEED_ENV = {"WEED_MASTER_VOLUME_GROWTH_COPY_1": "1"}
"""Grow one volume per bucket, not seven: each bucket is its own collection of volumes."""


def services(config: StackConfig, place: Placement, secrets: Secrets) -> list[Service]:
    """Every long-running process of the stack, in start order (PostgreSQL is the machine's
    own server natively and the `postgres` image in compose, so it is not among them)."""
    return [
        _seaweedfs(config, place),
        *_spark(config, place, secrets),
        *_airflow(config, place, secrets),
    ]


def _seaweedfs(config: StackConfig, place: Placement) -> Service:
    return Service(
        name="seaweedfs",
        image=SEAWEEDFS_IMAGE,
        program="weed",
        image_program="weed",
        image_entrypoint=("/usr/bin/env",),
        args=weed_args(config.ports, place),
        environment=WEED_ENV,
        ports=(config.ports.s3,),
        volumes=(Volume("seaweedfs-data", "seaweedfs"),),
    )


def _spark(config: StackConfig, place: Placement, secrets: Secrets) -> list[Service]:
    """The standalone cluster: a master, and a worker that reaches the S3 server."""
    ports = config.ports
    spark_env = spark_environment(place)
    spark_class = "org.apache.spark.deploy"
    master = Service(
        name="spark-master",
        image=SPARK_IMAGE,
        program="spark-class",
        image_program="/opt/spark/bin/spark-class",
        args=(
            f"{spark_class}.master.Master",
            "--host",
            place.host("spark-master"),
            "--port",
            str(ports.spark_master),
            "--webui-port",
            str(ports.spark_master_ui),
        ),
        environment={**spark_env, "SPARK_MASTER_OPTS": SPARK_MASTER_OPTS},
        ports=(ports.spark_master, ports.spark_master_ui),
    )
    worker = Service(
        name="spark-worker",
        image=BRANCHWATER_IMAGE,
        program="spark-class",
        image_program="spark-class",
        image_entrypoint=("/usr/bin/dumb-init", "--"),
        args=(
            f"{spark_class}.worker.Worker",
            spark_master_url(config, place),
            "--host",
            place.host("spark-worker"),
            "--port",
            str(ports.spark_worker),
            "--webui-port",
            str(ports.spark_worker_ui),
            "--cores",
            str(config.spark_worker_cores),
            "--memory",
            config.spark_worker_memory,
            "--work-dir",
            place.paths["spark_work"],
        ),
        environment={**spark_env, **s3_environment(config, place, secrets)},
        ports=(ports.spark_worker_ui,),
        volumes=(Volume("spark-work", "spark_work"),),
        depends_on=("spark-master",),
    )
    return [master, worker]


def _airflow(config: StackConfig, place: Placement, secrets: Secrets) -> list[Service]:
    """Airflow's four services, one environment (the API server alone has a port)."""
    ports = config.ports
    api_server = (
        "api-server",
        "--host",
        f"{place.bind}",
        "--port",
        str(ports.airflow),
        "--workers=1",
    )
    commands = {
        "airflow-api-server": api_server,
        "airflow-scheduler": ("scheduler", "--skip-serve-logs"),
        "airflow-dag-processor": ("dag-processor",),
        "airflow-triggerer": ("triggerer", "--skip-serve-logs"),
    }
    environment = airflow_environment(config, place, secrets)
    return [
        Service(
            name=name,
            image=BRANCHWATER_IMAGE,
            program="airflow",
            image_program="airflow",
            args=args,
            environment=environment,
            ports=(ports.airflow,) if name == "airflow-api-server" else (),
            volumes=(Volume("airflow-home", "airflow_home"),),
            depends_on=("seaweedfs", "spark-master"),
        )
        for name, args in commands.items()
    ]


INIT_STEPS: tuple[tuple[str, ...], ...] = (
    ("python", "-m", "branchwater.stack", "init"),
    ("airflow", "db", "migrate"),
)
"""Run once before the Airflow services, with their environment: create the databases and the
bucket the connections name, then migrate the metadata DB."""


DOCKER = Placement(
    hosts={
        "*": "localhost",
        "postgres": "postgres",
        "seaweedfs": "seaweedfs",
        "spark-master": "spark-master",
        "spark-worker": "spark-worker",
        "airflow-api-server": "airflow-api-server",
    },
    bind="0.0.0.0",
    paths={
        "airflow_home": "/opt/airflow",
        "dags": "/opt/branchwater/dags",
        "seaweedfs": "/data",
        "seaweedfs_config": "/etc/seaweedfs",
        "spark_work": "/opt/spark-work",
        "spark_conf": "/opt/spark-conf",
    },
    python="python",
    public_host="localhost",
)
"""Compose's placement: services reach each other by service name, publish on the host."""


def native(state_dir: Path, python: str) -> Placement:
    """This machine's placement: everything on loopback, state under `state_dir`."""
    return Placement(
        hosts={"*": LOOPBACK},
        bind=LOOPBACK,
        paths={
            "airflow_home": str(state_dir / "airflow"),
            "dags": str(REPO / "dags"),
            "seaweedfs": str(state_dir / "seaweedfs"),
            "seaweedfs_config": str(state_dir / "seaweedfs"),
            "spark_work": str(state_dir / "spark-work"),
            "spark_conf": str(state_dir / "spark-conf"),
        },
        python=python,
        public_host=LOOPBACK,
        spark_local_ip=LOOPBACK,
    )
