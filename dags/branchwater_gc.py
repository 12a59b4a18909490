"""`branchwater_gc_clean` and `branchwater_gc_optimized`: garbage collection of uncommitted
objects, with a quality gate before anything is deleted.

For each repository (those of the `repositories` param; empty: every repository of the
lake), a mapped task group `collect`:

    prepare → mark → gate → sweep → report

- `prepare` lists every branch's uncommitted addresses (the GC run's id is this run's);
- `mark` runs the Spark GC job through `spark-submit` on that prepare run: it finds what no
  commit and no branch holds, older than the minimum age, and, where the repository has GC
  rules, what only expired commits hold, saves it and runs its Great Expectations gate. It
  deletes nothing. The rules are the repository's (`branchwater gc rules set`), never the
  DAG's: a run triggered with `branchwater_gc_retention` pins the rules it expects, and a
  repository whose rules differ fails its mark before the job starts. The mark's rendered
  `retention_rules`, its XCom and the report show the rules the run used;
- `gate` reads the mark's saved gate results and fails, naming each failed expectation
  with GX's figures, when one did not hold: that repository's sweep does not run;
- `sweep` deletes what the mark holds (skipped when `dry_run` is true);
- `report` returns the run's figures and its HTML report's URI, also shown as a link.

Marks run one at a time, and sweeps one at a time (each is a Spark application); a
repository that fails stops none of the others. The clean run reads every commit and lists
the whole namespace; the optimized run starts from the last swept run of the repository
and reads only what is new (a clean run when there is none). The Spark master comes from
the `spark_default` connection (`local[*]` without one); the lake from
`branchwater_default`, whose KV URL reaches the job in its environment, never on its
command line. Configured by params, never by editing this file.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow.sdk import DAG, Param, task, task_group

from branchwater.engine import REPOSITORY_NAME_PATTERN
from branchwater.engine.gc.runs.config import KEEP_RUNS
from branchwater.plugin.hooks import BranchwaterHook
from branchwater.plugin.operators import (
    BranchwaterGCGateOperator,
    BranchwaterGCMarkOperator,
    BranchwaterGCReportOperator,
    BranchwaterGCSweepOperator,
    BranchwaterPrepareUncommittedOperator,
)

GROUP = "collect"
"""The task group mapped over the repositories."""
RUN_ID = f"{{{{ ti.xcom_pull(task_ids='{GROUP}.prepare', map_indexes=ti.map_index)['run_id'] }}}}"
"""The GC run of this repository: its prepare task's run id."""
SPARK_JOBS_AT_ONCE = 1
"""How many marks, and how many sweeps, of one DAG run go at once: each is a Spark
application, so a DAG run has at most one mark and one sweep running."""
PARAMS = {
    "repositories": Param(
        [],
        type="array",
        items={"type": "string", "pattern": REPOSITORY_NAME_PATTERN},
        description="The repositories to collect; empty: every repository of the lake",
    ),
    "min_age": Param(
        "",
        type="string",
        pattern=r"^$|^\d+(\.\d+)?[smhd]?$",
        description="Objects younger than this are kept (90s, 30m, 6h, 2d); empty: the "
        "lake's default, the link-token lifetime. Shorter is an override the report flags",
    ),
    "max_share": Param(
        0.5,
        type="number",
        minimum=0,
        maximum=1,
        description="The gate fails when candidates exceed this share of the namespace's "
        "objects old enough to be considered",
    ),
    "dry_run": Param(False, type="boolean", description="Mark and gate only: the sweep is skipped"),
    "keep_runs": Param(
        KEEP_RUNS,
        type="integer",
        minimum=1,
        description="The newest GC runs of a repository whose data a run keeps; older runs "
        "keep only their summary and report",
    ),
    "only": Param(
        "",
        type="string",
        enum=["", "uncommitted", "committed"],
        description="uncommitted or committed: that part of GC only; empty: both, the "
        "committed one where the repository has GC rules",
    ),
    "branchwater_gc_retention": Param(
        None,
        type=["null", "object"],
        description="null: each repository's GC rules decide (`branchwater gc rules get REPO`). "
        "Rules in that JSON shape pin them: a repository whose rules differ is refused before "
        "anything is marked; they never replace its rules. The mark's rendered retention_rules, "
        "XCom and report show the rules the run used",
    ),
}


@task
def repositories(params: dict[str, Any]) -> list[str]:
    """The repositories to collect, each checked to exist."""
    hook = BranchwaterHook()
    try:
        return [repo.name for repo in hook.repositories(params["repositories"])]
    finally:
        hook.close()


def gc_dag(dag_id: str, mode: str, schedule: str, doc: str) -> DAG:
    """One GC DAG; the clean and optimized ones differ only by the job's mode and schedule."""

    @task_group(group_id=GROUP)
    def collect(repository: str) -> None:
        """One repository's GC run."""
        (
            BranchwaterPrepareUncommittedOperator(task_id="prepare", repository=repository)
            >> BranchwaterGCMarkOperator(
                task_id="mark",
                repository=repository,
                prepare_run=RUN_ID,
                mode=mode,
                min_age="{{ params.min_age }}",
                max_share="{{ params.max_share }}",
                keep_runs="{{ params.keep_runs }}",
                only="{{ params.only }}",
                retention_rules="{{ params.branchwater_gc_retention | tojson }}",
                name=f"{dag_id}-mark",
                max_active_tis_per_dagrun=SPARK_JOBS_AT_ONCE,
            )
            >> BranchwaterGCGateOperator(task_id="gate", repository=repository, run_id=RUN_ID)
            >> BranchwaterGCSweepOperator(
                task_id="sweep",
                repository=repository,
                run_id=RUN_ID,
                skip_sweep="{{ params.dry_run }}",
                keep_runs="{{ params.keep_runs }}",
                name=f"{dag_id}-sweep",
                max_active_tis_per_dagrun=SPARK_JOBS_AT_ONCE,
            )
            >> BranchwaterGCReportOperator(
                task_id="report", repository=repository, run_id=RUN_ID, trigger_rule="none_failed"
            )
        )

    with DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["branchwater", "maintenance", "gc"],
        doc_md=f"{doc}\n\n{__doc__}",
        params=PARAMS,
    ) as dag:
        collect.expand(repository=repositories())
    return dag


CLEAN_SCHEDULE = "0 0 * * 0"
OPTIMIZED_SCHEDULE = "0 0 * * 1-6"
"""Sundays clean, the other days optimized: one GC run per repository at a time (a second
fails with `GCRunLocked`), and a clean run does all an optimized one would."""

clean = gc_dag(
    "branchwater_gc_clean",
    "clean",
    CLEAN_SCHEDULE,
    "A clean run: every commit read, the whole namespace listed.",
)
optimized = gc_dag(
    "branchwater_gc_optimized",
    "optimized",
    OPTIMIZED_SCHEDULE,
    "An optimized run: from the last swept run on, only new commits and slices.",
)
