"""The wheel built from this tree works installed, with nothing of the checkout around it.

The editable install every other test runs against puts `src/` on `sys.path`, so it cannot
tell whether the wheel carries what the provider, the CLI and the GC job need, or whether
something in it still reaches for the checkout. Here the tree is copied as a fresh clone
would have it, built into a wheel, and installed with its `airflow` and `spark` extras into
an empty virtualenv that sees neither the project's `.venv` nor the checkout; then the console
script, the engine, Airflow's provider discovery, every module the provider declares, the GC
job and the `dags/` folder run from a temporary directory.

The dependencies come from a wheelhouse under `~/.cache/branchwater/wheelhouse/`, made once
per set of dependencies (pyproject's build requirements, dependencies and those extras, and
`requirements.lock`); later runs build and install offline from it. It is made of the wheels
`make install` installed the lock from (kept in the virtualenv's `wheelhouse/`), and what
they lack (the build requirements) is fetched wheel by wheel at its pin by several pip
processes at once: resolving against the index fetches one wheel after another, a second of
round trips each, and pip's HTTP cache keeps nothing the index here sends (no cache headers).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

# One worker builds and installs once for the module; the first test's timeout covers that
# (fetching the wheelhouse on a first run, installing Airflow and Spark on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging"), pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
EXTRAS = ("airflow", "spark")
"""An Airflow deployment's install: the provider, and the Spark job its GC operators submit."""
KEPT_WHEELHOUSES = 3
"""Wheelhouses (about 650 MB each) kept, most recently used first: this checkout's, and a few
for other checkouts or branches whose dependencies differ."""
SHIPPED_DAG_IDS = {
    "branchwater_example_etl",
    "branchwater_compaction_check",
    "branchwater_gc_clean",
    "branchwater_gc_optimized",
}


def run(
    command: Sequence[str | Path],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`command`, failing the test with its output (not just its exit status) when it fails."""
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, command))} exited {done.returncode}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )
    return done


def pip(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The project's own pip: the fresh virtualenv has none, so nothing in it is preinstalled."""
    return run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args])


def tree_files(root: Path) -> list[str]:
    """The files a fresh clone with this working tree's changes has: tracked or new, not
    ignored (no `.venv`, no stale `build/` or egg-info, whose leftovers setuptools packs)."""
    listed = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root
    ).stdout.split("\0")
    return sorted({name for name in listed if name and os.path.lexists(root / name)})


def copy_tree(root: Path, dest: Path) -> Path:
    """A copy of the tree to build from, symbolic links (`src/branchwater/*`) kept as links."""
    for name in tree_files(root):
        source, target = root / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)
    return dest


def requirement(project: Path | str) -> str:
    """`project` (a folder or a wheel's URL) with the extras a deployment installs."""
    extras = ",".join(EXTRAS)
    if isinstance(project, Path):
        return f"{project}[{extras}]"
    return f"branchwater[{extras}] @ {project}"


def build_requires(source: Path) -> list[str]:
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    return list(pyproject["build-system"]["requires"])


def dependency_key(source: Path) -> str:
    """Names the wheelhouse by everything that decides its contents, so editing code reuses it
    and changing a dependency or a pin makes a new one."""
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    decisive = {
        "build": build_requires(source),
        "dependencies": project["dependencies"],
        "extras": [project["optional-dependencies"][extra] for extra in EXTRAS],
        "lock": (source / "requirements.lock").read_text(),
    }
    return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()[:16]


def cache_root() -> Path:
    """Where wheelhouses live between runs: fetching Airflow's and Spark's 200 wheels takes
    minutes, installing them from a folder a fraction of that."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "branchwater" / "wheelhouse"


def prune_wheelhouses(root: Path, current: Path) -> None:
    """Keeps the `KEPT_WHEELHOUSES` most recently used (each run touches its own), so every
    change to the lock does not leave another 650 MB behind."""
    current.touch()
    houses = [house for house in root.iterdir() if not house.name.endswith(".partial")]
    houses.sort(key=lambda house: house.stat().st_mtime, reverse=True)
    for house in houses[KEPT_WHEELHOUSES:]:
        shutil.rmtree(house, ignore_errors=True)


FETCHERS = 8
"""pip processes fetching the wheelhouse at once: each wheel costs about a second of index
round trips however small it is, and pip fetches one after another, so a wheelhouse of 180
wheels took minutes of waiting and seconds of transfer."""


def lock_pins(lock: Path) -> dict[str, str]:
    """`requirements.lock`'s pins by canonical name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            pins[canonicalize_name(requirement.name)] = str(requirement.specifier)
    return pins


def wanted(source: Path) -> list[str]:
    """What the wheelhouse must hold, without asking the index: the build requirements and
    the closure of the project's dependencies with its extras, walked through the metadata
    of the packages this interpreter has installed (`make install` installed the lock), each
    at its pinned version. One the lock leaves out is fetched at its newest version, as the
    index would give it. The offline install proves the list complete (`install` tops the
    wheelhouse up from the index when it is not)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    roots = [*project["dependencies"]]
    for extra in EXTRAS:
        roots += project["optional-dependencies"][extra]
    pins = lock_pins(source / "requirements.lock")
    todo = [Requirement(line) for line in roots]
    extras_seen: dict[str, set[str]] = {}
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        extras = set(requirement.extras)
        if name in extras_seen and extras <= extras_seen[name]:
            continue
        extras_seen[name] = extras_seen.get(name, set()) | extras
        try:
            declared = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in declared:
            child = Requirement(line)
            marker = child.marker
            if marker is None or any(
                marker.evaluate({"extra": extra}) for extra in {"", *extras_seen[name]}
            ):
                todo.append(child)
    listed = [f"{name}{pins.get(name, '')}" for name in sorted(extras_seen)]
    return [*listed, *build_requires(source)]


def installed_wheels() -> dict[str, list[tuple[str, Path]]]:
    """The wheels `make install` installed the lock from (the Makefile's `WHEELS`, in the
    running virtualenv), as (version, file) by canonical name."""
    from packaging.utils import parse_wheel_filename

    found: dict[str, list[tuple[str, Path]]] = {}
    for wheel in (Path(sys.prefix) / "wheelhouse").glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        found.setdefault(name, []).append((str(version), wheel))
    return found


def take_installed(names: list[str], folder: Path) -> list[str]:
    """Link (or copy) into `folder` the installed wheels that satisfy `names`; the names
    left to fetch."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    installed = installed_wheels()
    missing = []
    for name in names:
        requirement = Requirement(name)
        have = installed.get(canonicalize_name(requirement.name), [])
        wheel = next((w for v, w in have if requirement.specifier.contains(v, True)), None)
        if wheel is None:
            missing.append(name)
            continue
        try:
            os.link(wheel, folder / wheel.name)
        except OSError:
            shutil.copy2(wheel, folder / wheel.name)
    return missing


def fill_wheelhouse(source: Path, folder: Path) -> None:
    """`wanted(source)`: the wheels `make install` kept, and the rest fetched by `FETCHERS`
    pip processes at once, each wheel pinned (no resolution, which the install does offline
    from the folder: `install` tops the folder up should the walk have missed a dependency)."""
    folder.mkdir(parents=True)
    names = take_installed(wanted(source), folder)
    fetchers = [
        subprocess.Popen(
            [
                sys.executable,
                *("-m", "pip", "--disable-pip-version-check", "wheel", "--quiet"),
                *("--no-deps", "-w", str(folder), *names[i::FETCHERS]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(min(FETCHERS, len(names)))
    ]
    failed = []
    for fetcher in fetchers:
        output, _ = fetcher.communicate(timeout=420)
        if fetcher.returncode != 0:
            failed.append(output[-3000:])
    if failed:
        pytest.fail("fetching the wheelhouse failed:\n" + "\n".join(failed))


def top_up(house: Path, *requirements: str) -> None:
    """What resolving `requirements` against the index adds to the wheelhouse (the wheels it
    already holds are taken from it): the slow path, for a dependency `wanted` missed."""
    pip("wheel", "--quiet", "--find-links", house, "-w", house, "-c", LOCK, *requirements)
    for own in house.glob("branchwater-*.whl"):
        own.unlink()


def wheelhouse(source: Path) -> Path:
    """Wheels of the build requirements and of the extras' dependencies at the lock's
    versions, fetched once; written aside and renamed, so a concurrent run never installs
    from a half-filled one."""
    house = cache_root() / dependency_key(source)
    if not house.is_dir():
        partial = house.with_name(f"{house.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        fill_wheelhouse(source, partial)
        for own in partial.glob("branchwater-*.whl"):
            own.unlink()
        try:
            partial.rename(house)
        except OSError:  # another run filled it first
            shutil.rmtree(partial, ignore_errors=True)
    prune_wheelhouses(cache_root(), house)
    return house


def build_wheel(source: Path, house: Path, out: Path) -> Path:
    """The wheel, built the way an installer builds it (isolated, from pyproject's build
    requirements), offline from the wheelhouse."""
    pip("wheel", "--quiet", "--no-deps", "--no-index", "--find-links", house, "-w", out, source)
    (wheel,) = out.glob("branchwater-*.whl")
    return wheel


def install(wheel: Path, house: Path, venv: Path) -> Path:
    """An empty virtualenv (from the base interpreter, not the project's `.venv`) with the
    wheel and its extras' dependencies installed offline; `pip check` proves the wheel's
    declared dependencies are complete and consistent. Returns its `bin/`."""
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling Airflow takes longer than installing it; imports compile
    # what they use.
    offline = ["--quiet", "--no-compile", "--no-index", "--find-links", str(house)]
    command = ["--python", str(python), "install", *offline, "-c", str(LOCK)]
    command.append(requirement(wheel.as_uri()))
    tried = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *command],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    if tried.returncode != 0:
        # A wheel missing from the folder reads as either; a real conflict in the wheel's
        # dependencies fails again after the top-up, against the index.
        missing = ("No matching distribution found", "ResolutionImpossible")
        if not any(sign in tried.stderr for sign in missing):
            pytest.fail(f"pip {' '.join(command)} failed:\n{tried.stderr[-4000:]}")
        top_up(house, requirement(wheel.as_uri()))
        pip(*command)
    pip("--python", python, "check")
    return venv / "bin"


class Installed(NamedTuple):
    bin: Path
    """The fresh virtualenv's `bin/`."""
    tree: Path
    """The copy of the tree the wheel was built from."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh virtualenv holding only the built wheel and its dependencies."""
    work = tmp_path_factory.mktemp("packaging")
    tree = copy_tree(ROOT, work / "tree")
    house = wheelhouse(tree)
    wheel = build_wheel(tree, house, work / "dist")
    return Installed(install(wheel, house, work / "venv"), tree)


class Outside(NamedTuple):
    """Where installed commands run: a directory outside the checkout, and an environment
    with nothing of the project's (no `.venv` on `PATH`, no `PYTHONPATH`)."""

    cwd: Path
    env: dict[str, str]
    bin: Path

    def run(self, program: str, *args: str, stdin: str | None = None) -> str:
        """`program` from the fresh virtualenv's `bin/`; its stdout."""
        return run([self.bin / program, *args], cwd=self.cwd, env=self.env, stdin=stdin).stdout


@pytest.fixture
def outside(installed: Installed, tmp_path: Path) -> Outside:
    """Airflow's home and the lake under `tmp_path`, the working directory too."""
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{installed.bin}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmp_path),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "BRANCHWATER_KV_URL": f"sqlite:///{tmp_path / 'lake.db'}",
    }
    return Outside(tmp_path, env, installed.bin)


def test_wheel_leaves_out_what_needs_the_checkout(installed: Installed) -> None:
    """The demo and the stack run on the checkout's `dags/`, so the wheel leaves them out."""
    (site,) = (installed.bin.parent / "lib").glob("python3.*/site-packages")
    shipped = {path.name for path in (site / "branchwater").iterdir()}
    assert {"engine", "plugin", "spark_jobs", "py.typed"} <= shipped
    assert not {"demo", "stack"} & shipped


def test_wheel_metadata_names_the_license(installed: Installed) -> None:
    """The license is a PEP 639 SPDX expression, which the build requirement's setuptools
    writes as `License-Expression`, and its text ships beside the metadata."""
    (metadata,) = (installed.bin.parent / "lib").glob(
        "python3.*/site-packages/branchwater-*/METADATA"
    )
    lines = metadata.read_text().splitlines()
    assert "License-Expression: Apache-2.0" in lines
    assert "License-File: LICENSE" in lines
    shipped = metadata.parent / "licenses" / "LICENSE"
    assert "Apache License" in shipped.read_text()


def test_cli_runs_installed(outside: Outside) -> None:
    """The console script starts, and a lake made through it keeps what was committed."""
    assert "Git for a data lake" in outside.run("branchwater", "--help")
    namespace = (outside.cwd / "data").as_uri()
    outside.run("branchwater", "repo", "create", "sales", "--namespace", namespace)
    csv = "id,amount\n1,10\n"
    outside.run("branchwater", "upload", "sales", "main", "orders/a.csv", "-", stdin=csv)
    outside.run("branchwater", "commit", "sales", "main", "-m", "Load")
    assert outside.run("branchwater", "cat", "sales", "main", "orders/a.csv") == csv


def test_airflow_discovers_the_provider(outside: Outside) -> None:
    """Airflow finds the provider through the wheel's entry point alone."""
    listing = outside.run("airflow", "providers", "list", "--output", "json")
    providers = {provider["package_name"]: provider for provider in json.loads(listing)}
    assert providers["branchwater"]["version"] == "0.1.0"


IMPORT_EVERYTHING = """
import importlib, importlib.metadata as md, importlib.util, pathlib, sys

import branchwater
from branchwater.plugin import get_provider_info

venv = pathlib.Path(sys.prefix).resolve()
assert pathlib.Path(branchwater.__file__).resolve().is_relative_to(venv), branchwater.__file__


def dotted(value):
    if isinstance(value, str):
        if value.startswith("branchwater."):
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from dotted(item)
    elif isinstance(value, list):
        for item in value:
            yield from dotted(item)


names = sorted(set(dotted(get_provider_info())))
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        module, _, attribute = name.rpartition(".")
        getattr(importlib.import_module(module), attribute)

plugins = md.entry_points(group="airflow.plugins")
(plugin,) = [e for e in plugins if e.value.startswith("branchwater.")]
plugin.load()
app = importlib.import_module("branchwater.plugin.ui.app")
assert (pathlib.Path(app.__file__).parent / "templates" / "base.html").is_file()

for absent in ("branchwater.demo", "branchwater.stack"):
    assert importlib.util.find_spec(absent) is None, absent
print(len(names))
"""


def test_provider_modules_import_installed(outside: Outside) -> None:
    """Every module and class the provider declares to Airflow, and its UI plugin with its
    templates, import from the virtualenv."""
    declared = outside.run("python", "-c", IMPORT_EVERYTHING)
    assert int(declared) >= 5


JOB_FILES = """
from branchwater.engine.cli.gc import job_file as cli_job_file
from branchwater.plugin.operators.gc import job_file as operator_job_file

print(cli_job_file())
print(operator_job_file())
"""


def test_gc_job_runs_installed(outside: Outside) -> None:
    """The file the CLI and the operator give `spark-submit` is the installed job's, and it
    starts (as `python -m` does)."""
    jobs = set(outside.run("python", "-c", JOB_FILES).split())
    (job,) = jobs
    assert Path(job).resolve().is_relative_to(outside.bin.parent.resolve())
    assert "--mode" in outside.run("python", job, "--help")
    assert "--mode" in outside.run("python", "-m", "branchwater.spark_jobs.gc", "--help")


PARSE_DAGS = """
import json, sys
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(dag_folder=sys.argv[1])
errors = {str(path): error for path, error in bag.import_errors.items()}
print(json.dumps({"errors": errors, "ids": sorted(bag.dags)}))
"""


def test_dags_folder_parses_against_the_wheel(outside: Outside, installed: Installed) -> None:
    """The repository's `dags/`, copied into a deployment's DAG folder, needs nothing but the
    installed wheel (the wheel itself carries no DAG files)."""
    folder = shutil.copytree(installed.tree / "dags", outside.cwd / "dags")
    # Airflow logs to stdout too; the script's answer is the last line.
    output = outside.run("python", "-c", PARSE_DAGS, str(folder))
    parsed = json.loads(output.splitlines()[-1])
    assert parsed["errors"] == {}
    assert set(parsed["ids"]) == SHIPPED_DAG_IDS
