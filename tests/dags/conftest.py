"""The DAG tests use the provider tests' lake, connection and `dag.test()` fixtures."""

from __future__ import annotations

from tests.plugin.conftest import kv_url, lake_conn, no_aws_credentials, run_dag

__all__ = ["kv_url", "lake_conn", "no_aws_credentials", "run_dag"]
