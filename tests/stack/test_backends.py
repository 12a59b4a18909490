"""The stack's init step protects the example ETL's `main` (issue 39, item 4), once: run
again at every restart, it changes nothing."""

from __future__ import annotations

from pathlib import Path

from branchwater.demo.airflow_home import connection_variable
from branchwater.engine import Lake
from branchwater.stack.backends import EXAMPLE_REPOSITORY, protect_example


def test_init_creates_the_example_repository_with_main_protected(tmp_path: Path) -> None:
    kv_url = f"sqlite:///{tmp_path}/lake.db"
    namespace = f"file://{tmp_path}/lake"
    env = {
        **connection_variable(
            "branchwater_default",
            "branchwater",
            password=kv_url,
            extra={"default_namespace": namespace},
        ),
        **connection_variable("aws_default", "aws", login="key", password="secret"),
    }
    assert protect_example(env) == protect_example(env)
    with Lake.connect(kv_url) as lake:
        repo = lake.repository(EXAMPLE_REPOSITORY)
        assert repo.storage_namespace == f"{namespace}/{EXAMPLE_REPOSITORY}"
        (rule,) = repo.protections()
        assert (rule.pattern, rule.required_checks, rule.no_direct_writes) == (
            "main",
            ("quality",),
            True,
        )
        assert rule.no_delete and rule.no_reset
        assert [change.by for change in repo.protection_log()] == ["demo"]
