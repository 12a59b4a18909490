"""`BranchwaterHook`: one lake per hook, opened on first use, from a `branchwater` connection.

The connection keeps the KV URL in its password field, so Airflow masks it everywhere it
masks passwords; the hook also masks the password inside that URL, which a driver's error
could quote alone. S3 credentials come from an AWS connection of the Amazon provider.
Nothing here touches the KV store, the network or the metadata DB until a task uses the
hook, so DAG files that build operators parse without any of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from string import Formatter
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from branchwater.engine import ConfigurationError, InvalidArgument, redact_url, url_secrets
from branchwater.plugin.ui.paths import default_link_template

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from branchwater.engine import BranchwaterFileSystem, CompactionPolicy, Lake, Repository
    from branchwater.engine.gc.runs.files import RunSummary

CONN_TYPE = "branchwater"
DEFAULT_CONN_ID = "branchwater_default"


@dataclass(frozen=True)
class BranchwaterSettings:
    """What a `branchwater` connection holds, read once per hook."""

    kv_url: str = field(repr=False)
    default_namespace: str | None = None
    aws_conn_id: str | None = None
    link_template: str | None = None

    @classmethod
    def from_connection(cls, conn: Connection) -> BranchwaterSettings:
        """The connection's settings. The KV URL is taken without the whitespace around it
        that a secrets backend or a mounted secret file adds (`lake.db\n` was a new, empty
        SQLite lake)."""
        kv_url = (conn.password or "").strip()
        if not kv_url:
            raise ConfigurationError(
                f"connection {conn.conn_id!r} has no KV URL: put it in the password field "
                "(sqlite:///…, postgresql://…, dynamodb://…)"
            )
        extra = conn.extra_dejson
        if not isinstance(extra, Mapping):
            raise ConfigurationError(
                f"connection {conn.conn_id!r} has an extra of {type(extra).__name__}: it "
                'must be a JSON object, such as {"default_namespace": "s3://bucket/"}'
            )
        return cls(
            kv_url=kv_url,
            default_namespace=_extra_field(conn.conn_id, extra, "default_namespace"),
            aws_conn_id=_extra_field(conn.conn_id, extra, "aws_conn_id"),
            link_template=_extra_field(conn.conn_id, extra, "link_template"),
        )


def _extra_field(conn_id: str, extra: Mapping[str, Any], name: str) -> str | None:
    """A form field from the connection's extra, stored plain or with the legacy prefix: text,
    taken without the whitespace around it; null, absent or blank is unset. Any other value
    (a list, a mapping, a number, a flag) is `ConfigurationError` naming the field and the
    value's type, never the value, which may be a secret: turned into text, a list of
    namespaces became the namespace "['file:///…']", and 0 or false went unset unnoticed."""
    for key in (name, f"extra__{CONN_TYPE}__{name}"):
        value = extra.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigurationError(
                f"connection {conn_id!r}: the extra field {key!r} must be text, not "
                f"{type(value).__name__}"
            )
        if value.strip():
            return value.strip()
    return None


UNSET = ("", "None")
"""A rendered template field's text meaning "not given": empty, or a None rendered."""


def unset(value: object) -> bool:
    """Whether a template field's value leaves it unset: None, or None or empty rendered."""
    return value is None or (isinstance(value, str) and value in UNSET)


POLICY_FIELDS = {
    "max_tombstones": int,
    "max_sealed_tokens": int,
    "scan_budget": int,
    "guard_seconds": float,
}
"""`CompactionPolicy`'s thresholds, as operators, sensors and triggers take them: a plain
dict (JSON for a trigger, templated for a task), the engine's default for each one left out."""


def compaction_policy(thresholds: Mapping[str, Any] | None) -> CompactionPolicy | None:
    """The engine's policy from thresholds that may be rendered templates ("500"), read as
    text so that a count is never rounded (5.9) or taken from a flag (True); a threshold
    left unset (`unset`: a param of None renders "None") is the engine's default."""
    if not thresholds:
        return None
    from branchwater.engine import CompactionPolicy

    unknown = sorted(set(thresholds) - set(POLICY_FIELDS))
    if unknown:
        raise InvalidArgument(
            f"unknown compaction threshold(s) {', '.join(unknown)}: use {', '.join(POLICY_FIELDS)}"
        )
    values: dict[str, Any] = {}
    for name, value in thresholds.items():
        if unset(value):
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # an integer Param given as 2.0 (REST or CLI conf)
        try:
            values[name] = POLICY_FIELDS[name](str(value))
        except (TypeError, ValueError):
            raise InvalidArgument(
                f"compaction threshold {name} must be a number, not {value!r}"
            ) from None
    return CompactionPolicy(**values)


def api_base_url() -> str | None:
    """The API server's public address (`[api] base_url`), where the Branchwater view is."""
    from airflow.sdk.configuration import conf

    return conf.get("api", "base_url", fallback=None)


def mask_url_password(url: str) -> None:
    """Mask every form in which the URL's password may be echoed (as written, percent-decoded,
    its pieces), as the engine redacts its own messages: a password with `/`, `#`, `?` or
    `@` unencoded, or a URL `urlsplit` refuses, is masked too."""
    for secret in url_secrets(url):
        mask_secret(secret)


class BranchwaterHook(BaseHook):
    """A Branchwater lake reached through an Airflow connection.

    `get_conn()` opens the lake once per hook; `close()` waits for its background cleanup
    and releases it. Operators close their hook when the task ends.
    """

    conn_name_attr = "branchwater_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Branchwater"

    def __init__(self, branchwater_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.branchwater_conn_id = branchwater_conn_id
        self._lake: Lake | None = None

    @cached_property
    def settings(self) -> BranchwaterSettings:
        settings = BranchwaterSettings.from_connection(
            self.get_connection(self.branchwater_conn_id)
        )
        mask_url_password(settings.kv_url)
        return settings

    def s3_options(self) -> dict[str, str | None] | None:
        """S3 credentials, region and endpoint of the connection's AWS connection, if it names
        one; resolved on first use and kept for the hook's life.

        Without one, boto3's usual chain (environment, config files, instance roles) applies.
        Only S3 namespaces need these: `s3_options_for` and the lake ask for them when one is
        first touched, so a lake whose repositories are all local never does.
        """
        if not self.settings.aws_conn_id:
            return None
        return dict(self._aws_s3_options)

    def s3_options_for(self, namespace: str) -> dict[str, str | None] | None:
        """What opening `namespace` needs: the S3 options for an `s3://` one, none otherwise."""
        return self.s3_options() if urlsplit(namespace).scheme == "s3" else None

    @cached_property
    def _aws_s3_options(self) -> dict[str, str | None]:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        aws_conn_id = self.settings.aws_conn_id
        aws = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="s3")
        found = aws.get_session().get_credentials()
        if found is None:
            raise ConfigurationError(
                f"connection {self.branchwater_conn_id!r} reaches S3 through the AWS "
                f"connection {aws_conn_id!r}, which gave no credentials (it is not defined, "
                "or holds no keys and boto3's default chain found none): define "
                f"{aws_conn_id!r}, or clear the connection's 'aws_conn_id' field to use "
                "boto3's chain alone"
            )
        credentials = found.get_frozen_credentials()  # frozen: refreshable keys could race
        for secret in (credentials.secret_key, credentials.token):
            if secret:
                mask_secret(secret)
        return {
            "aws_access_key_id": credentials.access_key,
            "aws_secret_access_key": credentials.secret_key,
            "aws_session_token": credentials.token,
            "region_name": aws.region_name,
            "endpoint_url": aws.conn_config.get_service_endpoint_url("s3"),
        }

    def get_conn(self, create: bool = False) -> Lake:
        """The connection's lake, opened once per hook. Only creating a repository starts a
        lake where its URL names none (`create=True`); any other task on such a URL (a
        mistyped table or file) fails with `LakeNotFound` instead of making an empty lake."""
        if self._lake is None:
            from branchwater.engine import Lake  # pyarrow and the engine load on first use

            self.log.info("Opening Branchwater lake %s", redact_url(self.settings.kv_url))
            self._lake = Lake.connect(
                self.settings.kv_url, s3_options=self._lake_s3_options, create=create
            )
        return self._lake

    def _lake_s3_options(self) -> dict[str, str | None]:
        """The lake's S3 options, which it asks for when it first opens an S3 namespace."""
        return self.s3_options() or {}

    def close(self) -> None:
        """Wait for the lake's background cleanup and release it; the next use opens it again."""
        lake, self._lake = self._lake, None
        if lake is not None:
            lake.close()

    def filesystem(self) -> BranchwaterFileSystem:
        """The `branchwater://` fsspec filesystem on this hook's lake (and S3 credentials):
        pandas, Polars, pyarrow and DuckDB read any ref through it, and write to branches.
        Not kept in fsspec's instance cache, which would hold the lake past `close`."""
        from branchwater.engine import BranchwaterFileSystem

        return BranchwaterFileSystem(lake=self.get_conn(), skip_instance_cache=True)

    def repository(self, name: str) -> Repository:
        return self.get_conn().repository(name)

    def repositories(self, names: Sequence[str] = ()) -> list[Repository]:
        """The repositories `names` (`NotFound` names a missing one), or every repository of
        the lake when none is named: what a maintenance DAG goes over."""
        lake = self.get_conn()
        if names:
            return [lake.repository(name) for name in names]
        return list(lake.repositories())

    def create_repository(self, name: str, default_branch: str = "main") -> Repository:
        """Create `name` under the connection's default namespace, at `<namespace>/<name>`."""
        return self.get_conn(create=True).create_repository(
            name, self.namespace_for(name), default_branch=default_branch
        )

    def namespace_for(self, name: str) -> str:
        """Where repository `name` lives when created through this connection."""
        namespace = self.settings.default_namespace
        if not namespace:
            raise ConfigurationError(
                f"connection {self.branchwater_conn_id!r} has no default namespace to create "
                f"repository {name!r} in: set its 'default_namespace' field, or give the "
                "storage namespace"
            )
        return f"{namespace.rstrip('/')}/{name}"

    def gc_run(self, repository: str, run_id: str) -> RunSummary:
        """The saved summary of a GC run whose mark finished; `NotFound` otherwise."""
        from branchwater.engine.gc.runs.files import read_summary
        from branchwater.engine.gc.runs.storage import Namespace

        namespace = self.repository(repository).storage_namespace
        return read_summary(Namespace.of(namespace, self.s3_options_for(namespace)), run_id)

    def commit_url(self, repository: str, branch: str, commit_id: str) -> str:
        """The page of a commit from the connection's link template, by default the commit's
        page in the Branchwater view of Airflow's UI; "" when the template is unusable."""
        template = self.settings.link_template or default_link_template(api_base_url())
        values = {"repository": repository, "branch": branch, "commit_id": commit_id}
        try:
            fields = {name for _, name, _, _ in Formatter().parse(template) if name is not None}
            if not fields <= set(values):
                raise KeyError(f"fields {sorted(fields - set(values))}: use {sorted(values)}")
            return template.format(**{k: quote(v, safe="/") for k, v in values.items()})
        except (KeyError, ValueError) as exc:
            self.log.warning(
                "Connection %s: unusable link template: %r", self.branchwater_conn_id, exc
            )
            return ""

    def test_connection(self) -> tuple[bool, str]:
        """Open the lake and list its repositories, as the UI's Test button asks; a lake
        that is not there is reported, not started (a mistyped table stays uncreated)."""
        from branchwater.engine import Lake

        try:
            with Lake.connect(self.settings.kv_url, create=False) as lake:
                count = len(lake.repositories())
            return True, f"Connected to {redact_url(self.settings.kv_url)}: {count} repositories"
        except Exception as exc:  # the UI shows any failure as a message
            return False, str(exc)
