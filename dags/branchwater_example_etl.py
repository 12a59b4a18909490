"""`branchwater_example_etl`: load partitions on isolated branches, validate, commit, merge.

Each partition gets its own branch, in a mapped task group: create the branch from `main`,
write the partition's data to it, validate what was written, commit, merge into `main`,
delete the branch. Nothing reaches `main` before its validation passed, and the partitions
of one run merge into `main` at the same time: a merge retries the races it loses on the
work it already did, and a task retry resumes from where the failed try stopped.

Configured by params and the `branchwater_default` connection, never by editing this file:
the repository is created under the connection's default namespace when it does not exist.
A run whose validation fails stops before its commit and leaves its branch for inspection.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, task, task_group

from branchwater.engine import NotFound
from branchwater.plugin.hooks import BranchwaterHook
from branchwater.plugin.operators import (
    BranchwaterCommitOperator,
    BranchwaterCreateBranchOperator,
    BranchwaterDeleteBranchOperator,
    BranchwaterMergeOperator,
    BranchwaterUploadOperator,
)

REPOSITORY = "{{ params.repository }}"
COLUMNS = ("id", "partition", "amount")


@task
def ensure_repository(params: dict[str, Any]) -> str:
    """Create the repository on the first run."""
    hook = BranchwaterHook()
    try:
        hook.repository(params["repository"])
    except NotFound:
        hook.create_repository(params["repository"])
    finally:
        hook.close()
    return str(params["repository"])


@task
def plan(params: dict[str, Any], run_id: str) -> list[dict[str, str]]:
    """What each partition's task group works on: its branch, named after the run so runs
    never share one, its object path and its commit message."""
    run = re.sub(r"[^A-Za-z0-9_-]+", "-", run_id).strip("-")
    return [
        {
            "branch": f"etl/{run}/{partition}",
            "partition": partition,
            "path": object_path(partition),
            "message": f"Load partition {partition} ({run_id})",
        }
        for partition in params["partitions"]
    ]


@task
def extract(partition: str, params: dict[str, Any]) -> str:
    """The partition's rows as CSV; `bad_rows` of them break the amount rule on purpose."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    rows, bad = int(params["rows"]), int(params["bad_rows"])
    for i in range(rows):
        amount = -1 if i < bad else (i * 7) % 100
        writer.writerow((f"{partition}-{i}", partition, amount))
    return out.getvalue()


@task
def validate(branch: str, partition: str, params: dict[str, Any]) -> int:
    """Check what the branch holds before anything is committed: row count, unique ids,
    no negative amount. Returns the number of rows."""
    hook = BranchwaterHook()
    try:
        data = hook.repository(params["repository"]).branch(branch).read(object_path(partition))
    finally:
        hook.close()
    rows = list(csv.DictReader(io.StringIO(data.decode())))
    problems = []
    if len(rows) != int(params["rows"]):
        problems.append(f"{len(rows)} rows, expected {params['rows']}")
    if len({r["id"] for r in rows}) != len(rows):
        problems.append("duplicate ids")
    negative = sum(1 for r in rows if int(r["amount"]) < 0)
    if negative:
        problems.append(f"{negative} negative amounts")
    if problems:
        raise ValueError(f"partition {partition!r} on {branch!r}: {'; '.join(problems)}")
    return len(rows)


def object_path(partition: str) -> str:
    return f"sales/partition={partition}/data.csv"


@task_group
def load(branch: str, partition: str, path: str, message: str) -> None:
    """One partition, from its own branch to `main`."""
    create = BranchwaterCreateBranchOperator(
        task_id="create_branch", repository=REPOSITORY, branch=branch
    )
    write = BranchwaterUploadOperator(
        task_id="write",
        repository=REPOSITORY,
        branch=branch,
        path=path,
        data=extract(partition),
    )
    commit = BranchwaterCommitOperator(
        task_id="commit",
        repository=REPOSITORY,
        branch=branch,
        message=message,
        metadata={"partition": partition},
    )
    merge = BranchwaterMergeOperator(
        task_id="merge",
        repository=REPOSITORY,
        source_ref=branch,
        retries=3,
        retry_delay=timedelta(seconds=5),
    )
    delete = BranchwaterDeleteBranchOperator(
        task_id="delete_branch", repository=REPOSITORY, branch=branch
    )
    create >> write >> validate(branch, partition) >> commit >> merge >> delete


@task
def report(params: dict[str, Any]) -> dict[str, Any]:
    """What `main` holds after the run: its HEAD and the partitions loaded so far."""
    hook = BranchwaterHook()
    try:
        main = hook.repository(params["repository"]).branch("main")
        paths = [entry.path for entry in main.list(prefix="sales/")]
        return {"commit_id": main.commit_id, "objects": paths}
    finally:
        hook.close()


@dag(
    dag_id="branchwater_example_etl",
    schedule=None,
    catchup=False,
    tags=["branchwater", "example"],
    doc_md=__doc__,
    params={
        "repository": Param(
            "etl-example", type="string", pattern="^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$"
        ),
        "partitions": Param(
            ["north", "south"],
            type="array",
            items={"type": "string", "pattern": "^[a-z0-9-]+$"},
            description="One branch each; they merge into main at the same time",
        ),
        "rows": Param(100, type="integer", minimum=1),
        "bad_rows": Param(
            0,
            type="integer",
            minimum=0,
            description="Rows with a negative amount: validation stops the run before its commit",
        ),
    },
)
def branchwater_example_etl() -> None:
    loaded = load.expand_kwargs(plan())
    ensure_repository() >> loaded >> report()


branchwater_example_etl()
