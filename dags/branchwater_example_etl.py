"""`branchwater_example_etl`: load partitions on isolated branches, validate, commit, merge.

Each partition gets its own branch, in a mapped task group: create the branch from `main`,
write the partition with PySpark through the link flow (each Spark task writes a Parquet
file at an address the branch handed out, then the files are linked), validate what the
branch now holds (read with pandas through the `branchwater://` filesystem) with Great
Expectations, commit, record the validation as the `quality` check on that commit, merge
into `main`, delete the branch. Nothing reaches `main` before
its validation passed; where `main` is protected with `quality` required (as the demo and
the stack set it up), the lake itself refuses any other merge. The partitions of one run merge
into `main` at the same time: a merge retries the races it loses on the work it already
did, and a task retry resumes from where the failed try stopped.

Configured by params and the `branchwater_default` connection, never by editing this file:
the repository is created under the connection's default namespace when it does not exist,
and S3 namespaces use the connection's AWS credentials. A run whose validation fails stops
before its commit and leaves its branch for inspection.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import Param, dag, task, task_group

from branchwater.engine import REPOSITORY_NAME_PATTERN
from branchwater.plugin.hooks import BranchwaterHook
from branchwater.plugin.operators import (
    BranchwaterCommitOperator,
    BranchwaterCreateBranchOperator,
    BranchwaterCreateRepositoryOperator,
    BranchwaterDeleteBranchOperator,
    BranchwaterMergeOperator,
)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

REPOSITORY = "{{ params.repository }}"
QUALITY_CHECK = "quality"
"""The check merges into a protected `main` require (`Repository.protect`)."""


@task
def plan(params: dict[str, Any], run_id: str) -> list[dict[str, str]]:
    """What each partition's task group works on: its branch, named after the run so runs
    never share one, its folder and its commit message."""
    run = re.sub(r"[^A-Za-z0-9_-]+", "-", run_id).strip("-")
    return [
        {
            "branch": f"etl/{run}/{partition}",
            "partition": partition,
            "prefix": f"sales/partition={partition}",
            "message": f"Load partition {partition} ({run_id})",
        }
        for partition in params["partitions"]
    ]


def spark_session(master: str) -> SparkSession:
    """The worker's Spark session: the running one if there is one, else a new one."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.master(master).appName("branchwater_example_etl").getOrCreate()


@task
def write(branch: str, partition: str, prefix: str, params: dict[str, Any]) -> list[str]:
    """Generate the partition's rows with Spark and write them to the branch as Parquet
    through the link flow. `bad_rows` rows break the amount rule on purpose."""
    from pyspark.sql import functions as F

    from branchwater.spark_jobs.writer import write_parquet

    spark = spark_session(params["spark_master"])  # before any column: F.col needs a session
    number = F.col("id")
    frame = spark.range(0, int(params["rows"]), numPartitions=2).select(
        F.concat(F.lit(f"{partition}-"), number.cast("string")).alias("id"),
        F.lit(partition).alias("partition"),
        F.when(number < int(params["bad_rows"]), F.lit(-1))
        .otherwise((number * 7) % 100)
        .cast("int")
        .alias("amount"),
    )
    hook = BranchwaterHook()
    try:
        repo = hook.repository(params["repository"])
        s3_options = hook.s3_options_for(repo.storage_namespace)
        entries = write_parquet(
            frame, repo.branch(branch), prefix, mode="overwrite", s3_options=s3_options
        )
    finally:
        hook.close()
    return [entry.path for entry in entries]


def read_partition(branch: str, prefix: str, params: dict[str, Any]) -> pd.DataFrame:
    """What the branch holds under `prefix`, uncommitted files included, read with pandas
    through the `branchwater://` filesystem straight from the object store: a partition's
    validation needs no Spark application of its own."""
    import pandas as pd

    hook = BranchwaterHook()
    try:
        ref = quote(branch, safe="")
        return pd.read_parquet(
            f"{params['repository']}/{ref}/{prefix}/", filesystem=hook.filesystem()
        )
    finally:
        hook.close()


@task
def validate(branch: str, partition: str, prefix: str, params: dict[str, Any]) -> dict[str, Any]:
    """Great Expectations on what the branch holds, before anything is committed: the row
    count, unique non-null ids, no negative amount. Returns the number of rows and GX's
    statistics: the `quality` check's details."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx

    frame = read_partition(branch, prefix, params)
    context = gx.get_context(mode="ephemeral")
    batch = (
        context.data_sources.add_pandas("branch")
        .add_dataframe_asset(name=partition)
        .add_batch_definition_whole_dataframe("written")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    suite = gx.ExpectationSuite(
        name=f"sales-{partition}",
        expectations=[
            gx.expectations.ExpectTableRowCountToEqual(value=int(params["rows"])),
            gx.expectations.ExpectColumnValuesToNotBeNull(column="id"),
            gx.expectations.ExpectColumnValuesToBeUnique(column="id"),
            gx.expectations.ExpectColumnValuesToBeBetween(column="amount", min_value=0),
        ],
    )
    result = batch.validate(suite)
    failed = [
        f"{r.expectation_config.type} ({r.result.get('unexpected_count', 'failed')})"
        for r in result.results
        if not r.success
    ]
    if failed:
        raise ValueError(f"partition {partition!r} on {branch!r} failed: {', '.join(failed)}")
    return {"rows": len(frame), "suite": suite.name, **result.statistics}


@task
def record_quality(commit_id: str, validation: dict[str, Any], params: dict[str, Any]) -> None:
    """The validation, as the `quality` check on the commit the merge brings to `main`. A
    retry records the same result again, which the lake accepts."""
    hook = BranchwaterHook()
    try:
        repo = hook.repository(params["repository"])
        repo.record_check(commit_id, QUALITY_CHECK, True, validation, by="branchwater_example_etl")
    finally:
        hook.close()


@task_group
def load(branch: str, partition: str, prefix: str, message: str) -> None:
    """One partition, from its own branch to `main`."""
    create = BranchwaterCreateBranchOperator(
        task_id="create_branch", repository=REPOSITORY, branch=branch
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
    written = write(branch, partition, prefix)
    checked = validate(branch, partition, prefix)
    recorded = record_quality(commit.output, checked)
    create >> written >> checked >> commit >> recorded >> merge >> delete


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
        "repository": Param("etl-example", type="string", pattern=REPOSITORY_NAME_PATTERN),
        "partitions": Param(
            ["north", "south"],
            type="array",
            items={"type": "string", "pattern": "^[a-z0-9-]+$"},
            description="One branch each; they merge into main at the same time",
        ),
        "rows": Param(100, type="integer", minimum=1),
        "spark_master": Param("local[*]", type="string", description="Where the writers run"),
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
    ensure_repository = BranchwaterCreateRepositoryOperator(
        task_id="ensure_repository", repository=REPOSITORY
    )
    ensure_repository >> loaded >> report()


branchwater_example_etl()
