"""Run one DAG of `dags/` through `dag.test()` and report what its tasks did.

`python -m branchwater.demo.dag_run DAG_ID [CONF_JSON] --out FILE` runs in a child whose
environment names its Airflow home; the result (states, tries, XCom values) is written to
FILE as JSON for the parent to read. With `--serve` the child runs one DAG after another,
each asked for as a JSON line on its stdin, in the same home.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

    from airflow.sdk import DAG


@dataclass
class RunResult:
    """A finished DAG run as its metadata DB holds it."""

    dag_id: str
    run_id: str
    state: str
    states: dict[str, str]
    """Each task instance's state, keyed `task_id` or `task_id[map_index]` when mapped."""
    tries: dict[str, int]
    xcoms: dict[tuple[str, str], Any]
    """XCom values keyed (`task_id` or `task_id[map_index]`, key)."""
    rendered: dict[str, dict[str, Any]]
    """Each task instance's rendered template fields, as the UI shows them."""

    def value(self, task: str, key: str = "return_value") -> Any:
        return self.xcoms[(task, key)]

    def values(self, task: str, key: str = "return_value") -> list[Any]:
        """The values of every map index of a mapped task, in map-index order."""
        found = [(name, v) for (name, k), v in self.xcoms.items() if k == key]
        mapped = [(name, v) for name, v in found if name.startswith(f"{task}[")]
        return [v for _, v in sorted(mapped, key=lambda nv: int(nv[0][len(task) + 1 : -1]))]

    def to_json(self) -> str:
        data = asdict(self)
        data["xcoms"] = [[task, key, value] for (task, key), value in self.xcoms.items()]
        return json.dumps(data, default=str)

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        data = json.loads(text)
        data["xcoms"] = {(task, key): value for task, key, value in data["xcoms"]}
        return cls(**data)


def register(dag: DAG) -> None:
    """Write `dag` to the metadata DB as the DAG processor would: `dag.test()` only runs DAGs
    that are serialized there."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    DagBundlesManager().sync_bundles_to_db()
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session
        )


def collect(dag_id: str, run_id: str, state: str) -> RunResult:
    """What the metadata DB holds of run `run_id`."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    def name(task_id: str, map_index: int) -> str:
        return task_id if map_index < 0 else f"{task_id}[{map_index}]"

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        ).all()
        xcoms = session.scalars(XComModel.get_many(run_id=run_id, dag_ids=dag_id)).all()
        rendered = session.scalars(
            select(RenderedTaskInstanceFields).where(
                RenderedTaskInstanceFields.dag_id == dag_id,
                RenderedTaskInstanceFields.run_id == run_id,
            )
        ).all()
        return RunResult(
            dag_id=dag_id,
            run_id=run_id,
            state=state,
            states={name(ti.task_id, ti.map_index): str(ti.state) for ti in tis},
            tries={name(ti.task_id, ti.map_index): ti.try_number for ti in tis},
            xcoms={
                (name(x.task_id, x.map_index), x.key): XComModel.deserialize_value(x) for x in xcoms
            },
            rendered={name(r.task_id, r.map_index): r.rendered_fields for r in rendered},
        )


def run_dag(
    dag: DAG, conf: dict[str, Any] | None = None, *, logical_date: datetime | None = None
) -> RunResult:
    """Register `dag`, run it once with `dag.test()`, and collect the run. The run of a
    `logical_date` (default: now) is named after it, so running a date again reruns that DAG
    run under the same run id, as clearing it does."""
    register(dag)
    if logical_date is None:
        dag_run = dag.test(run_conf=conf)
    else:
        dag_run = dag.test(run_conf=conf, logical_date=logical_date, run_after=logical_date)
    return collect(dag.dag_id, dag_run.run_id, str(dag_run.state))


def load_dags() -> dict[str, DAG]:
    """The project's `dags/` folder, parsed as the DAG processor parses it."""
    from airflow.dag_processing.dagbag import DagBag

    from branchwater.demo.airflow_home import DAGS_FOLDER

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    if bag.import_errors:
        raise SystemExit(f"dags/ does not import: {bag.import_errors}")
    return dict(bag.dags)


def pick(dags: dict[str, DAG], dag_id: str) -> DAG:
    if dag_id not in dags:
        from branchwater.demo.airflow_home import DAGS_FOLDER

        raise SystemExit(f"no DAG {dag_id!r} in {DAGS_FOLDER}")
    return dags[dag_id]


def write_result(out: Path, result: RunResult) -> None:
    """Whole or not at all: the parent takes the file's appearance for the run's end."""
    part = out.with_suffix(".part")
    part.write_text(result.to_json())
    part.replace(out)


def serve(requests: IO[str]) -> None:
    """Run DAGs one after another as requests come, a JSON line each (`dag_id`, `conf`,
    `out`), in one process: importing Airflow and parsing `dags/` cost as much as a short
    DAG run, paid here once. Returns when `requests` ends."""
    dags = load_dags()
    for line in requests:
        request = json.loads(line)
        result = run_dag(pick(dags, request["dag_id"]), request["conf"])
        write_result(Path(request["out"]), result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="branchwater.demo.dag_run", description=__doc__)
    parser.add_argument("dag_id", nargs="?")
    parser.add_argument("conf", nargs="?", default="{}", help="the run's conf, as JSON")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--serve", action="store_true", help="take runs as JSON lines on stdin")
    args = parser.parse_args(argv)
    if args.serve:
        serve(sys.stdin)
        return 0
    if args.dag_id is None or args.out is None:
        parser.error("DAG_ID and --out are needed unless --serve")
    result = run_dag(pick(load_dags(), args.dag_id), json.loads(args.conf))
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
