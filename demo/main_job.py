"""The main job, step by step: concurrent ETL runs merging into `main`, the compaction check,
a clean GC run, more work, an optimized GC run; then a summary of what happened."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from branchwater.demo.airflow_home import HomeFamily, connection_variable
from branchwater.demo.dag_run import RunResult
from branchwater.engine import Lake, Repository

REPOSITORY = "sales"
QUALITY_CHECK = "quality"
"""What `main` requires of every merge: the example ETL's Great Expectations validation."""
ETL_DAG = "branchwater_example_etl"
COMPACTION_DAG = "branchwater_compaction_check"
GC_CLEAN_DAG = "branchwater_gc_clean"
GC_OPTIMIZED_DAG = "branchwater_gc_optimized"
GC_GROUP = "collect"
"""The GC DAGs' task group, mapped over the repositories they collect."""


def gc_task(task: str, index: int = 0) -> str:
    """A GC DAG's task as `RunResult` keys it: `task` of the `index`-th repository."""
    return f"{GC_GROUP}.{task}[{index}]"


@dataclass(frozen=True)
class DemoConfig:
    root: Path
    etl_runs: int = 3
    partitions_per_run: int = 2
    rows: int = 200
    garbage_objects: int = 120
    later_garbage_objects: int = 40
    tombstones: int = 1_500
    compaction_threshold: int = 1_000
    """The compaction check's `max_tombstones`: a branch is due at this many or more."""


@dataclass
class Progress:
    """Numbered steps on stdout, each with its duration, as the demo goes."""

    total: int
    done: int = 0

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        self.done += 1
        print(f"[{self.done}/{self.total}] {what} …", flush=True)
        began = time.monotonic()
        yield
        print(f"      done in {time.monotonic() - began:.0f} s", flush=True)


@dataclass(frozen=True)
class DemoLake:
    """Where the demo's lake lives, and the Airflow connections that reach it."""

    root: Path

    @property
    def kv_url(self) -> str:
        return f"sqlite:///{self.root / 'lake.db'}"

    @property
    def namespace_root(self) -> Path:
        return self.root / "lake-data"

    def connections(self) -> dict[str, str]:
        return {
            **connection_variable(
                "branchwater_default",
                "branchwater",
                password=self.kv_url,
                extra={"default_namespace": self.namespace_root.as_uri()},
            ),
            **connection_variable("spark_default", "spark", host="local[2]"),
        }


class DagRunner:
    """Runs DAGs of `dags/` in child processes, each in a fresh Airflow home of one family:
    runs at once in a child each, runs one after another (the later ETL run among them) in
    one child kept for them all (`serial`), started early so that it has imported Airflow by
    its first run."""

    def __init__(self, family: HomeFamily, logs: Path) -> None:
        self.family = family
        self.logs = logs
        self.count = 0
        self.serial: tuple[subprocess.Popen[bytes], Path] | None = None

    def start(
        self, name: str, arguments: list[str], **pipes: Any
    ) -> tuple[subprocess.Popen[bytes], Path]:
        environment = self.family.home(name)
        log = self.logs / f"{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "branchwater.demo.dag_run", *arguments],
                env={**os.environ, **environment},
                stdout=sink,
                stderr=subprocess.STDOUT,
                **pipes,
            )
        return process, log

    def out(self, dag_id: str) -> Path:
        self.count += 1
        return self.logs / f"{self.count:02d}-{dag_id}.json"

    def start_serial(self) -> None:
        self.serial = self.start("serial", ["--serve"], stdin=subprocess.PIPE)

    def close(self) -> None:
        """Let the serial child end (its stdin closed), or end it if it does not."""
        if self.serial is None:
            return
        process, _ = self.serial
        self.serial = None
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @staticmethod
    def result(out: Path, log: Path) -> RunResult:
        result = RunResult.from_json(out.read_text())
        if result.state != "success":
            failed = sorted(t for t, s in result.states.items() if s != "success")
            raise SystemExit(
                f"{result.dag_id} ended {result.state} (tasks {', '.join(failed)}); see {log}"
            )
        return result

    def run_all(self, runs: list[tuple[str, dict[str, Any]]]) -> list[RunResult]:
        """Start every run at once, wait for all, and fail naming the log of any that failed."""
        started = []
        for dag_id, conf in runs:
            out = self.out(dag_id)
            arguments = [dag_id, json.dumps(conf), "--out", str(out)]
            started.append((*self.start(out.stem, arguments), out))
        results = []
        for process, log, out in started:
            code = process.wait()
            if code != 0 or not out.exists():
                raise SystemExit(f"a DAG run failed to run ({code}); see {log}")
            results.append(self.result(out, log))
        return results

    def run(self, dag_id: str, conf: dict[str, Any]) -> RunResult:
        """One run, in the serial child (started here if it is not yet)."""
        if self.serial is None:
            self.start_serial()
        assert self.serial is not None
        process, log = self.serial
        out = self.out(dag_id)
        request = json.dumps({"dag_id": dag_id, "conf": conf, "out": str(out)}) + "\n"
        assert process.stdin is not None
        try:
            process.stdin.write(request.encode())
            process.stdin.flush()
        except BrokenPipeError:
            pass
        while not out.exists():
            if process.poll() is not None:
                raise SystemExit(
                    f"the DAG runner ended ({process.returncode}) before {dag_id} did; see {log}"
                )
            time.sleep(0.2)
        return self.result(out, log)


def etl_conf(run: int, config: DemoConfig) -> dict[str, Any]:
    partitions = [f"r{run}-p{p}" for p in range(config.partitions_per_run)]
    return {"repository": REPOSITORY, "partitions": partitions, "rows": config.rows}


def make_garbage(repo: Repository, branch_name: str, objects: int) -> int:
    """Objects written and never committed: a branch deleted with its staged work, and
    overwritten versions. Returns the bytes they hold."""
    branch = repo.create_branch(branch_name, source="main")
    written = 0
    for i in range(objects):
        body = os.urandom(2_000 + 37 * i)
        branch.upload(f"scratch/{i:05d}.bin", body)
        written += len(body)
    branch.upload("scratch/00000.bin", b"the last version stays staged")
    repo.delete_branch(branch_name)
    return written


def stage_tombstones(repo: Repository, count: int) -> None:
    """A long-lived branch with many staged deletes over its committed tree: compaction due."""
    ingest = repo.create_branch("ingest", source="main")
    for i in range(count):
        ingest.upload(f"staging/{i:06d}.json", b"{}")
    ingest.commit("Stage a batch to replace")
    for i in range(count):
        ingest.delete(f"staging/{i:06d}.json")


def protect_main(repo: Repository) -> None:
    """`main` takes merges only, each of a commit whose `quality` check passed, and is
    neither deleted nor reset: write-audit-publish as a rule of the lake."""
    repo.protect(
        "main",
        no_direct_writes=True,
        required_checks=[QUALITY_CHECK],
        no_delete=True,
        no_reset=True,
        by="demo",
    )


def checked_merges(repo: Repository) -> tuple[int, int]:
    """Merge commits on `main`, and how many of them merged a commit whose quality passed."""
    merges = [c for c in repo.log("main") if len(c.parents) > 1]
    passed = sum(
        1
        for merge in merges
        if any(c.name == QUALITY_CHECK and c.passed for c in repo.checks(merge.parents[1]))
    )
    return len(merges), passed


def run(config: DemoConfig) -> dict[str, Any]:
    """The main job; what each step's DAG runs returned, as the summary printed it."""
    root = config.root.resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    lake_place = DemoLake(root)
    family = HomeFamily(root / "airflow", lake_place.connections())
    logs = root / "runs"
    logs.mkdir()
    runner = DagRunner(family, logs)
    progress = Progress(total=6)
    summary: dict[str, Any] = {}

    with Lake.connect(lake_place.kv_url) as lake, closing(runner):
        repo = lake.create_repository(REPOSITORY, (lake_place.namespace_root / REPOSITORY).as_uri())
        protect_main(repo)
        with progress.step("Migrating Airflow's metadata DB (SQLite)"):
            family.prepare()
        runner.start_serial()
        with progress.step(
            f"{config.etl_runs} ETL runs at once, {config.etl_runs * config.partitions_per_run} "
            "branches merging into main"
        ):
            etl = runner.run_all([(ETL_DAG, etl_conf(r, config)) for r in range(config.etl_runs)])
        summary["etl"] = etl
        with progress.step(
            f"Staging {config.tombstones} deletes and garbage, then the compaction check"
        ):
            stage_tombstones(repo, config.tombstones)
            garbage = make_garbage(repo, "scratch-1", config.garbage_objects)
            summary["compaction"] = runner.run(
                COMPACTION_DAG,
                {"repositories": [REPOSITORY], "max_tombstones": config.compaction_threshold},
            )
        with progress.step("GC clean run on Spark, behind the Great Expectations gate"):
            summary["gc_clean"] = runner.run(GC_CLEAN_DAG, gc_conf())
        with progress.step("More work: another ETL run and more garbage"):
            summary["etl"].append(runner.run(ETL_DAG, etl_conf(config.etl_runs, config)))
            garbage += make_garbage(repo, "scratch-2", config.later_garbage_objects)
        with progress.step("GC optimized run: only new ranges and slices"):
            summary["gc_optimized"] = runner.run(GC_OPTIMIZED_DAG, gc_conf())
        summary["garbage_bytes"] = garbage
        print_summary(repo, summary, root)
    return summary


def gc_conf() -> dict[str, Any]:
    """Every repository of the lake (`sales` alone), as a scheduled run collects. The demo's
    objects are seconds old: it waives the minimum age, which the report flags. The gate
    keeps its default bound on the candidates' share of the namespace."""
    return {"min_age": "0s", "dry_run": False}


def merge_attempts(etl: list[RunResult]) -> list[int]:
    """How many tries each merge into `main` took (the engine retries lost races itself)."""
    return [a for result in etl for a in result.values("load.merge", "merge_attempts")]


def gc_line(result: RunResult) -> str:
    record = result.value(gc_task("report"))
    gate = "passed" if record["gate_success"] else "FAILED"
    return (
        f"{record['mode']} run {record['run_id']}: gate {gate}, {record['candidates']} "
        f"candidates, {record['deleted']} objects ({record['deleted_bytes']:,} bytes) deleted"
    )


def print_summary(repo: Repository, summary: dict[str, Any], root: Path) -> None:
    commits = list(repo.log("main"))
    merges = [c for c in commits if len(c.parents) > 1]
    attempts = merge_attempts(summary["etl"])
    compacted = [r for r in summary["compaction"].values("compact") if r and r["compacted"]]
    print()
    print("Summary")
    print(
        f"  main: {len(commits)} commits, {len(merges)} of them merge commits "
        "(the merge operator writes one even where main could fast-forward)"
    )
    if attempts:
        raced = sum(1 for a in attempts if a > 1)
        print(
            f"  merges: {len(attempts)} from {len(summary['etl'])} ETL DAG runs, the first "
            f"{len(summary['etl']) - 1} at once; {raced} lost a race and retried on their own "
            f"work (attempts {sorted(attempts)})"
        )
    merged, passed = checked_merges(repo)
    print(
        f"  protection: main takes merges only, each needing {QUALITY_CHECK!r} passed on the "
        f"commit merged; {passed} of {merged} merges carried it"
    )
    for record in compacted:
        print(
            f"  compaction: {record['tombstones_removed']} tombstones folded away, "
            f"{record['ranges_written']} range{'' if record['ranges_written'] == 1 else 's'} "
            f"written in {record['seconds']:.2f} s"
        )
    print(f"  garbage written: {summary['garbage_bytes']:,} bytes of uncommitted objects")
    for key in ("gc_clean", "gc_optimized"):
        print(f"  GC {gc_line(summary[key])}")
    print(f"  GC report: {summary['gc_optimized'].value(gc_task('report'))['report']}")
    print(f"  the lake: {root / 'lake.db'} (KV) and {root / 'lake-data'} (objects)")
    print(f"  Airflow homes, task logs and run results: {root / 'airflow'}, {root / 'runs'}")
    print(
        f"  look around: BRANCHWATER_KV_URL={DemoLake(root).kv_url} "
        f"branchwater log {REPOSITORY} main"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="branchwater.demo", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path(".branchwater/demo"))
    parser.add_argument("--etl-runs", type=int, default=3)
    args = parser.parse_args(argv)
    run(DemoConfig(root=args.root, etl_runs=args.etl_runs))
    return 0
