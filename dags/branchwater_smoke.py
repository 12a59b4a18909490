"""`branchwater_smoke`: proves a worker can import and use the engine, and nothing more.

Run it after deploying (or in the test harness through `dag.test()`): if it succeeds, the
scheduler parsed a Branchwater DAG and a worker round-tripped a key through the engine.
"""

from __future__ import annotations

from airflow.sdk import dag, task

SMOKE_VALUE = "branchwater-ok"


@task
def kv_round_trip() -> str:
    """Upload and read back one object on an in-memory lake, through the engine's public API."""
    import tempfile
    from pathlib import Path

    from branchwater.engine import Lake

    with tempfile.TemporaryDirectory() as namespace, Lake.connect("memory://") as lake:
        repo = lake.create_repository("smoke", storage_namespace=Path(namespace).as_uri())
        main = repo.branch("main")
        main.upload("smoke/key", SMOKE_VALUE.encode())
        return main.read("smoke/key").decode()


@task
def confirm(value: str) -> str:
    """Fail the run if the value did not survive XCom; the return value is the report."""
    if value != SMOKE_VALUE:
        raise ValueError(f"engine returned {value!r}, expected {SMOKE_VALUE!r}")
    return f"engine ok: {value}"


@dag(
    dag_id="branchwater_smoke",
    schedule=None,
    catchup=False,
    tags=["branchwater", "smoke"],
    doc_md=__doc__,
)
def branchwater_smoke() -> None:
    confirm(kv_round_trip())


branchwater_smoke()
