"""The layering rule of the code base, checked on the source itself.

Inside the engine a module imports only its own layer and those below it
(`kv` → `objects` → `graveler` → `gc` → `api`/`cli`); the Airflow provider, the Spark jobs,
the stack and the DAGs use only the engine's public API (`branchwater.engine`'s exports).
"""

from __future__ import annotations

import ast
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import branchwater.engine
from tests.helpers.source import parse

ROOT = Path(__file__).resolve().parent.parent
ENGINE = "branchwater.engine"

LAYERS: dict[str, int] = {
    "allocator": 0,
    "background": 0,
    "errors": 0,
    "failpoints": 0,
    "lru": 0,
    "per_process": 0,
    "units": 0,
    "urls": 0,
    "kv": 1,
    "objects": 2,
    "graveler": 3,
    "gc": 4,
    "api": 5,
    "cli": 6,
    "demo": 6,
    "walkthrough": 6,
    "filesystem": 6,
}
"""The layer of each top-level engine module or package; a higher number sits above."""

PUBLIC_PACKAGES = ("branchwater.engine.gc.runs", "branchwater.engine.failpoints")
"""Engine packages clients may import beside the facade: the GC run-files library is the
seam between the engine and the Spark job (and the provider's view of runs); failpoints
are named in the Spark job's driver too."""

CLIENT_FOLDERS = {
    "plugin": "branchwater.plugin",
    "spark_jobs": "branchwater.spark_jobs",
    "stack": "branchwater.stack",
    "demo": "branchwater.demo",
}


@dataclass(frozen=True)
class Import:
    module: str
    names: tuple[str, ...]
    line: int


def imports_of(source: str, package: str) -> Iterator[Import]:
    """Every import in `source`, lazy and type-checking ones included, made absolute."""
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            yield Import(base, tuple(alias.name for alias in node.names), node.lineno)


def engine_layer(module: str) -> int | None:
    """The layer of an engine module name, None outside the engine or for the facade."""
    if not module.startswith(ENGINE + "."):
        return None
    return LAYERS.get(module[len(ENGINE) + 1 :].split(".")[0])


def engine_violations(module: str, source: str, package: str) -> list[str]:
    own = engine_layer(module)
    if own is None:
        return []
    found = []
    for imp in imports_of(source, package):
        client = next((c for c in CLIENT_FOLDERS.values() if _within(imp.module, c)), None)
        if client is not None:
            found.append(f"{module}:{imp.line} imports {imp.module}: the engine imports no client")
        targets = [imp.module]
        if imp.module == ENGINE:
            targets = [f"{ENGINE}.{name}" for name in imp.names]
        for target in targets:
            layer = engine_layer(target)
            if layer is not None and layer > own:
                found.append(f"{module}:{imp.line} imports {target} from a higher layer")
    return found


def client_violations(module: str, source: str, package: str) -> list[str]:
    """A provider, Spark job or DAG may import `branchwater.engine`'s exports and nothing deeper."""
    exports = set(branchwater.engine.__all__)
    found = []
    for imp in imports_of(source, package):
        if any(_within(imp.module, public) for public in PUBLIC_PACKAGES):
            continue
        if imp.module.startswith(ENGINE + "."):
            found.append(f"{module}:{imp.line} imports {imp.module}, not the public API")
        elif imp.module == ENGINE:
            hidden = [name for name in imp.names if name not in exports]
            if hidden or not imp.names:
                found.append(f"{module}:{imp.line} imports {hidden or ENGINE}, not exports")
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def modules_under(folder: Path, package: str) -> Iterator[tuple[str, str, Path]]:
    """(module name, its package, path) for every Python file under `folder`."""
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        if is_init:
            parts.pop()
        name = ".".join([package, *parts]) if package else ".".join(parts)
        pkg = name if is_init else name.rpartition(".")[0]
        yield name, pkg, path


def test_engine_layers_import_only_downwards() -> None:
    found = []
    for name, pkg, path in modules_under(ROOT / "engine", ENGINE):
        found += engine_violations(name, path.read_text(), pkg)
    assert found == []


@pytest.mark.parametrize("folder", ["plugin", "spark_jobs", "stack", "demo", "dags"])
def test_clients_use_only_the_public_api(folder: str) -> None:
    package = CLIENT_FOLDERS.get(folder, "")
    found = []
    for name, pkg, path in modules_under(ROOT / folder, package):
        found += client_violations(name, path.read_text(), pkg)
    assert found == []


def test_every_engine_folder_has_a_layer() -> None:
    """A new top-level engine module must be placed in a layer before it can be checked."""
    names = {p.stem for p in (ROOT / "engine").iterdir() if p.suffix == ".py" or p.is_dir()}
    names -= {"__init__", "__main__", "__pycache__"}
    assert names <= set(LAYERS), f"place these in LAYERS: {sorted(names - set(LAYERS))}"


def test_the_checks_catch_violations() -> None:
    """The checker itself: an upward import, a relative one, a private import by a client, a
    public one, and a lazy import of a client by the engine."""
    upward = "from branchwater.engine.graveler.model import Entry\n"
    assert engine_violations("branchwater.engine.kv.sql", upward, "branchwater.engine.kv")
    relative = "def f():\n    from ..api import Lake\n"
    assert engine_violations("branchwater.engine.gc.x", relative, "branchwater.engine.gc")
    downward = "from branchwater.engine.kv import open_store\n"
    assert not engine_violations("branchwater.engine.api", downward, "branchwater.engine")
    private = "from branchwater.engine.kv import open_store\n"
    assert client_violations("dag", private, "")
    assert client_violations("dag", "from branchwater.engine import _LAZY\n", "")
    assert not client_violations("dag", "from branchwater.engine import Lake\n", "")
    public = "from branchwater.engine.gc.runs.files import RunSummary\n"
    assert not client_violations("dag", public, "")
    lazy_client = "def f():\n    from branchwater.spark_jobs.gc.job import GCJob\n"
    assert engine_violations("branchwater.engine.cli.gc", lazy_client, "branchwater.engine.cli")


class _ParsesWhenCollected:
    """Garbage whose finalizer parses, as py4j's does when it logs a failed send."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        ast.parse("a + b")


def test_sources_parse_while_finalizers_parse() -> None:
    source = (ROOT / "engine" / "graveler" / "merge.py").read_text()
    gc.collect()
    threshold = gc.get_threshold()
    for _ in range(2000):
        _ParsesWhenCollected()
    gc.set_threshold(50)
    try:
        assert isinstance(parse(source), ast.Module)
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
