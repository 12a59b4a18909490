"""No module or doc cites a file that does not exist: a path in backticks (`gc/copies.py`,
`docs/architecture.md`) names a file of this repository, relative to its root, to the
citing file's folder, or to one of the top-level code folders."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ["engine", "plugin", "spark_jobs", "stack", "demo", "dags"]
CITED = re.compile(r"`([\w./-]+/[\w.-]+\.(?:py|md|html|yaml|toml|json))`")


def cited_paths(path: Path) -> list[str]:
    return CITED.findall(path.read_text())


def exists(cited: str, citing: Path) -> bool:
    bases = [ROOT, citing.parent, *(ROOT / folder for folder in CODE)]
    return any((base / cited).exists() for base in bases)


def test_every_cited_file_exists() -> None:
    sources = [p for folder in CODE for p in (ROOT / folder).rglob("*.py")]
    sources += [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    missing = [
        f"{path.relative_to(ROOT)} cites {cited}"
        for path in sources
        for cited in cited_paths(path)
        if not exists(cited, path)
    ]
    assert missing == []
