"""`python -m branchwater.engine.walkthrough`: the engine on the embedded default (SQLite + files).

It builds a fresh lake under `.branchwater/walkthrough/` each run (the main job's is
`.branchwater/demo/`): a repository, an ETL branch, uploads and deletes, commits, the log, a
diff and a merge, printed as a user would see them.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from branchwater.engine.api import Lake


def run(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    kv_url = f"sqlite:///{root.resolve()}/lake.db"
    namespace = f"file://{root.resolve()}/lake-data/sales"
    with Lake.connect(kv_url) as lake:
        repo = lake.create_repository("sales", storage_namespace=namespace)
        print(f"created repository {repo.name} at {namespace} (KV {kv_url})")
        main = repo.branch("main")
        for day in ("2026-11-01", "2026-11-02"):
            main.upload(f"orders/date={day}/part-0.csv", f"id,amount\n1,{day[-2:]}\n".encode())
        print(f"main: {main.commit('Load first two days of orders').id[:12]} load orders")

        etl = repo.create_branch("etl", source="main")
        etl.upload("orders/date=2026-11-03/part-0.csv", b"id,amount\n7,30\n")
        etl.delete("orders/date=2026-11-01/part-0.csv")
        print("etl: staged changes")
        for change in etl.uncommitted():
            print(f"  {change.type:8} {change.path}")
        commit = etl.commit("Add 2026-11-03, retire 2026-11-01", metadata={"job": "demo"})
        print(f"etl: {commit.id[:12]} {commit.message}")
        repo.tag("v1", "etl")

        print("log etl:")
        for c in repo.log("etl"):
            print(f"  {c.id[:12]}  {c.creation_date:%Y-%m-%d %H:%M:%S}  {c.message}")
        print("diff main..etl:")
        for change in repo.diff("main", "etl"):
            print(f"  {change.type:8} {change.path}")
        print("ls v1:")
        for entry in repo.ref("v1").list():
            print(f"  {entry.size:6}  {entry.path}")
        path = "orders/date=2026-11-03/part-0.csv"
        print(f"cat v1 {path}: {repo.ref('v1').read(path)!r}")

        main.upload("customers/part-0.csv", b"id,name\n1,Ada\n")
        main.commit("Load customers")
        result = repo.merge("etl", into="main")
        print(f"merge etl into main: {result.commit.id[:12]} ({result.attempts} attempt)")
        print("ls main:")
        for entry in main.list():
            print(f"  {entry.size:6}  {entry.path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(".branchwater/walkthrough"))
    run(parser.parse_args(argv).root)


if __name__ == "__main__":
    main()
