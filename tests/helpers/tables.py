"""What a store's opening made on a server: its PostgreSQL tables, the DynamoDB tables. The
tests of opening without creating (KV, CLI, filesystem) assert nothing was made with them."""

from __future__ import annotations

import psycopg


def pg_tables(postgres_url: str, table: str) -> set[str]:
    """The tables named `table` or after it (its partitions, `<table>_p<i>`) in the database
    `postgres_url` names."""
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename = %s OR tablename LIKE %s",
            (table, f"{table}\\_p%"),
        ).fetchall()
    return {row[0] for row in rows}


def dynamodb_tables(endpoint: str) -> list[str]:
    """The tables of the DynamoDB server at `endpoint`, every page (ListTables answers 100
    at most: the suite's session server holds more)."""
    import boto3

    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    pages = client.get_paginator("list_tables").paginate()
    return [name for page in pages for name in page["TableNames"]]
