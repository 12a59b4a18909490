"""`BranchwaterHook`: settings from the connection, one lazily opened lake, the UI's
connection test, repositories in the default namespace, the named (or every) repository,
links, secrets, S3 credentials."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from airflow.sdk.log import redact

from branchwater.engine import (
    ConfigurationError,
    InvalidArgument,
    LakeNotFound,
    NotFound,
    Repository,
)
from branchwater.plugin.hooks import BranchwaterHook, BranchwaterSettings, compaction_policy
from tests.fixtures.s3 import S3Server
from tests.helpers.tables import pg_tables
from tests.plugin.conftest import LakeConnection, set_connection


def test_settings_come_from_the_password_and_the_form_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_connection(
        monkeypatch,
        "bw_fields",
        "branchwater",
        password="postgresql://lake:pw-in-url@db/lake",
        extra={
            "default_namespace": "s3://bucket/lakes",
            "extra__branchwater__aws_conn_id": "aws_lake",
        },
    )
    settings = BranchwaterHook("bw_fields").settings
    assert settings == BranchwaterSettings(
        kv_url="postgresql://lake:pw-in-url@db/lake",
        default_namespace="s3://bucket/lakes",
        aws_conn_id="aws_lake",
    )
    assert "pw-in-url" not in repr(settings)


def test_a_connection_without_a_kv_url_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    set_connection(monkeypatch, "bw_empty", "branchwater")
    with pytest.raises(ConfigurationError, match="'bw_empty' has no KV URL"):
        BranchwaterHook("bw_empty").settings  # noqa: B018


def test_a_kv_url_is_taken_without_the_newline_a_secret_file_adds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`lake.db\n` opened a new, empty SQLite lake beside the real one."""
    set_connection(
        monkeypatch,
        "bw_secret_file",
        "branchwater",
        password="sqlite:////lakes/lake.db\n",
        extra={"default_namespace": " s3://bucket/lakes\n"},
    )
    settings = BranchwaterHook("bw_secret_file").settings
    assert settings.kv_url == "sqlite:////lakes/lake.db"
    assert settings.default_namespace == "s3://bucket/lakes"


@pytest.mark.parametrize("extra", ['["file:///tmp/ns"]', '"file:///tmp/ns"', "5"])
def test_an_extra_that_is_not_a_json_object_is_refused(
    monkeypatch: pytest.MonkeyPatch, extra: str
) -> None:
    set_connection(monkeypatch, "bw_extra", "branchwater", password="sqlite:///x.db", extra=extra)
    with pytest.raises(ConfigurationError, match=r"'bw_extra' has an extra of .*JSON object"):
        BranchwaterHook("bw_extra").settings  # noqa: B018


@pytest.mark.parametrize(
    ("field", "value", "type_name"),
    [
        ("default_namespace", ["file:///secret/ns"], "list"),
        ("aws_conn_id", {"id": "secret-aws"}, "dict"),
        ("link_template", 0, "int"),
        ("link_template", False, "bool"),
        ("extra__branchwater__default_namespace", 7.5, "float"),
    ],
)
def test_an_extra_field_that_is_not_text_is_refused_naming_its_type_not_its_value(
    monkeypatch: pytest.MonkeyPatch, field: str, value: object, type_name: str
) -> None:
    """`str(value)` made a list the namespace "['file:///…']" and a dict the AWS connection
    "{'id': …}"; 0 and false unset the link template unnoticed."""
    set_connection(
        monkeypatch, "bw_typed", "branchwater", password="sqlite:///x.db", extra={field: value}
    )
    with pytest.raises(ConfigurationError) as refused:
        BranchwaterHook("bw_typed").settings  # noqa: B018
    message = str(refused.value)
    assert message == (
        f"connection 'bw_typed': the extra field {field!r} must be text, not {type_name}"
    )
    assert "secret" not in message


def test_extra_fields_null_or_blank_are_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    set_connection(
        monkeypatch,
        "bw_unset",
        "branchwater",
        password="sqlite:///x.db",
        extra={"default_namespace": None, "aws_conn_id": " ", "link_template": ""},
    )
    assert BranchwaterHook("bw_unset").settings == BranchwaterSettings(kv_url="sqlite:///x.db")


def test_the_lake_opens_on_first_use_once_per_hook(lake_conn: LakeConnection) -> None:
    BranchwaterHook("not_defined_yet")
    hook = BranchwaterHook()
    lake = hook.get_conn()
    assert hook.get_conn() is lake
    hook.close()
    hook.close()
    reopened = hook.get_conn()
    assert reopened is not lake
    hook.close()


def test_the_filesystem_reads_and_writes_the_connections_lake(
    lake_conn: LakeConnection, repo: Repository
) -> None:
    """The task docs/airflow.md shows: pandas reads `main` at the commit an upstream merge
    pushed, through the hook's `branchwater://` filesystem, whatever lands on `main` since."""
    import io

    import pandas as pd

    def parquet(ids: list[int]) -> bytes:
        buffer = io.BytesIO()
        pd.DataFrame({"id": ids}).to_parquet(buffer)
        return buffer.getvalue()

    hook = BranchwaterHook()
    try:
        fs = hook.filesystem()
        assert fs.lake is hook.get_conn()
        fs.pipe(f"{repo.name}/main/tables/orders/part-0.parquet", parquet([1, 2]))
        merged = repo.branch("main").commit("orders").id
        fs.pipe(f"{repo.name}/main/tables/orders/part-1.parquet", parquet([3]))
        orders = pd.read_parquet(f"{repo.name}/{merged}/tables/orders/", filesystem=fs)
        assert orders["id"].tolist() == [1, 2]
        now = pd.read_parquet(f"{repo.name}/main/tables/orders/", filesystem=fs)
        assert sorted(now["id"].tolist()) == [1, 2, 3]
        hook.close()
        assert hook.filesystem().lake is not fs.lake
    finally:
        hook.close()


def test_the_connection_test_lists_repositories(
    lake_conn: LakeConnection, repo: Repository
) -> None:
    assert BranchwaterHook().test_connection() == (
        True,
        f"Connected to {lake_conn.kv_url}: 1 repositories",
    )


@pytest.mark.postgres
def test_the_connection_test_of_a_mistyped_table_says_so_and_creates_none(
    monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    table = f"bw_typo_{os.getpid()}"
    set_connection(monkeypatch, "bw_typo", "branchwater", password=f"{postgres_url}?table={table}")
    ok, message = BranchwaterHook("bw_typo").test_connection()
    assert not ok
    assert f"table '{table}' does not exist" in message
    assert pg_tables(postgres_url, table) == set()


@pytest.mark.postgres
def test_only_creating_a_repository_starts_a_lake_where_the_connection_names_none(
    monkeypatch: pytest.MonkeyPatch, postgres_url: str, tmp_path: Path
) -> None:
    """A task reading a lake the URL does not name (a mistyped table) fails and makes no
    table; creating a repository starts the lake, and then the same reads work."""
    table = f"bw_new_{os.getpid()}"
    extra = {"default_namespace": tmp_path.as_uri()}
    set_connection(
        monkeypatch, "bw_new", "branchwater", password=f"{postgres_url}?table={table}", extra=extra
    )
    hook = BranchwaterHook("bw_new")
    try:
        for read in (hook.repositories, lambda: hook.repository("sales"), hook.filesystem):
            with pytest.raises(LakeNotFound, match=f"table '{table}' does not exist"):
                read()
        assert pg_tables(postgres_url, table) == set()
        hook.create_repository("sales")
        assert [r.name for r in hook.repositories()] == ["sales"]
    finally:
        hook.close()
    assert table in pg_tables(postgres_url, table)


def test_a_failed_connection_test_says_why_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "postgresql://lake:pw-in-url@127.0.0.1:1/lake"
    set_connection(monkeypatch, "bw_down", "branchwater", password=url)
    ok, message = BranchwaterHook("bw_down").test_connection()
    assert not ok
    assert "127.0.0.1" in message
    assert "pw-in-url" not in message


def test_the_password_inside_the_kv_url_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql://lake:hunter%2Fsecret@db/lake"
    set_connection(monkeypatch, "bw_masked", "branchwater", password=url)
    BranchwaterHook("bw_masked").settings  # noqa: B018
    assert "hunter" not in str(redact("driver said: bad password hunter/secret"))
    assert "hunter" not in str(redact("driver said: bad password hunter%2Fsecret"))


@pytest.mark.parametrize(
    "password",
    ["Zq9se/cretXw7", "Zq9se#cretXw7", "Zq9se?cretXw7", "Zq9se@cretXw7", "[Zq9secretXw7"],
)
def test_a_password_with_reserved_characters_is_masked_too(
    monkeypatch: pytest.MonkeyPatch, password: str
) -> None:
    """Unencoded as users paste them: `urlsplit` reads another password, or refuses `[`."""
    from branchwater.plugin.hooks import mask_url_password

    mask_url_password(f"postgresql://bob:{password}@127.0.0.1:5432/lake")
    said = str(redact(f"driver said: bad password {password} for bob"))
    assert "Zq9se" not in said and "cretXw7" not in said


def test_repositories_are_created_in_the_default_namespace(
    lake_conn: LakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = BranchwaterHook()
    repo = hook.create_repository("made-by-hook")
    assert repo.storage_namespace == f"{lake_conn.namespace}/made-by-hook"
    assert lake_conn.lake.repository("made-by-hook").default_branch == "main"
    hook.close()
    set_connection(monkeypatch, "bw_no_ns", "branchwater", password=lake_conn.kv_url)
    with pytest.raises(ConfigurationError, match="no default namespace"):
        BranchwaterHook("bw_no_ns").create_repository("nowhere")


def test_the_named_repositories_or_every_one(lake_conn: LakeConnection) -> None:
    first, second = lake_conn.create_repository(), lake_conn.create_repository()
    hook = BranchwaterHook()
    try:
        assert [r.name for r in hook.repositories([second.name])] == [second.name]
        assert {r.name for r in hook.repositories()} == {first.name, second.name}
        with pytest.raises(NotFound, match="missing-repo"):
            hook.repositories([first.name, "missing-repo"])
    finally:
        hook.close()


def test_commit_urls_follow_the_connections_template(
    lake_conn: LakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert BranchwaterHook().commit_url("sales", "main", "c1") == (
        "https://airflow.example.com/branchwater/sales/main/c1"
    )
    set_connection(monkeypatch, "bw_no_link", "branchwater", password=lake_conn.kv_url)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example.com:8080/")
    assert BranchwaterHook("bw_no_link").commit_url("sales", "etl/a#1", "c1") == (
        "http://airflow.example.com:8080/branchwater/repositories/sales/commits/c1?branch=etl/a%231"
    )
    for template in ("https://x/{repo}", "https://x/{}", "https://x/{branch.upper}", "{"):
        set_connection(
            monkeypatch,
            "bw_bad_link",
            "branchwater",
            password=lake_conn.kv_url,
            extra={"link_template": template},
        )
        assert BranchwaterHook("bw_bad_link").commit_url("sales", "main", "c1") == "", template


def test_aws_credentials_are_read_for_s3_namespaces_only_and_their_absence_is_named(
    lake_conn: LakeConnection, monkeypatch: pytest.MonkeyPatch, no_aws_credentials: None
) -> None:
    extra = {**lake_conn.extra, "aws_conn_id": "aws_lake"}
    set_connection(monkeypatch, "bw_aws", "branchwater", password=lake_conn.kv_url, extra=extra)
    hook = BranchwaterHook("bw_aws")
    try:
        assert hook.s3_options_for(f"{lake_conn.namespace}/local") is None
        main = hook.create_repository("local-only").branch("main")
        main.upload("a.csv", b"a")
        main.commit("a")
        for _ in range(2):  # the lake asks again, and fails again, on each S3 namespace
            with pytest.raises(ConfigurationError) as failed:
                hook.get_conn().create_repository("remote", "s3://bucket/remote")
            assert "'bw_aws' reaches S3 through the AWS connection 'aws_lake'" in str(failed.value)
        with pytest.raises(ConfigurationError, match="define 'aws_lake'"):
            hook.s3_options_for("s3://bucket/remote")
    finally:
        hook.close()


@pytest.mark.s3
def test_s3_namespaces_use_the_aws_connections_credentials(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_connection(
        monkeypatch,
        "aws_lake",
        "aws",
        login=s3_server.access_key,
        password=s3_server.secret_key,
        extra={"endpoint_url": s3_server.endpoint_url, "region_name": s3_server.region},
    )
    set_connection(
        monkeypatch,
        "bw_s3",
        "branchwater",
        password=f"sqlite:///{tmp_path / 'lake.db'}",
        extra={"default_namespace": f"s3://{s3_bucket}/lakes", "aws_conn_id": "aws_lake"},
    )
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(variable, raising=False)
    hook = BranchwaterHook("bw_s3")
    assert hook.s3_options() == {
        "aws_access_key_id": s3_server.access_key,
        "aws_secret_access_key": s3_server.secret_key,
        "aws_session_token": None,
        "region_name": s3_server.region,
        "endpoint_url": s3_server.endpoint_url,
    }
    main = hook.create_repository("on-s3").branch("main")
    main.upload("a.csv", b"a")
    main.commit("a")
    assert hook.repository("on-s3").ref("main").read("a.csv") == b"a"
    assert hook.filesystem().cat("on-s3/main/a.csv") == b"a"
    hook.close()
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(key.startswith("lakes/on-s3/data/") for key in keys)


@pytest.mark.parametrize(
    ("thresholds", "expected"),
    [
        (
            {"max_tombstones": "500", "guard_seconds": "2.5"},
            {"max_tombstones": 500, "guard_seconds": 2.5},
        ),
        (
            {"max_tombstones": 500, "scan_budget": "", "guard_seconds": None},
            {"max_tombstones": 500},
        ),
        ({"max_tombstones": 2.0, "guard_seconds": 1.0}, {"max_tombstones": 2, "guard_seconds": 1}),
    ],
)
def test_compaction_thresholds_are_read_from_their_text(
    thresholds: dict[str, object], expected: dict[str, float]
) -> None:
    policy = compaction_policy(thresholds)
    assert policy is not None
    assert {name: getattr(policy, name) for name in expected} == expected


@pytest.mark.parametrize("value", [5.9, True, "5.9", "many"])
def test_a_count_threshold_is_never_rounded_or_taken_from_a_flag(value: object) -> None:
    with pytest.raises(InvalidArgument, match="max_tombstones must be a number"):
        compaction_policy({"max_tombstones": value})
