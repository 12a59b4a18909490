"""The documentation: `mkdocs build --strict` passes (every docs link and anchor resolves, the
API reference renders from the docstrings, the CLI reference from `--help`, the benchmarks'
tables from the results file), the README stays a ten-minute read whose links all stay
inside the repository, and its code examples (which `tests/test_walkthroughs.py` runs) are
the ones the docs show."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.test_walkthroughs import python_blocks

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_site_builds_strictly_without_a_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    assert "WARNING" not in output, output
    api = (site / "reference" / "python" / "index.html").read_text()
    for name in ("Lake", "Repository", "Branch", "Ref", "create_branch", "merge"):
        assert f">{name}<" in api or f"{name}</code>" in api, name
    errors = (site / "reference" / "errors" / "index.html").read_text()
    assert "MergeRaceLost" in errors and "GCRunLocked" in errors
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "usage: branchwater gc run" in cli and "<!-- cli-reference -->" not in cli
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    assert "<code>gc-clean</code>" in benchmarks and "<!-- benchmarks -->" not in benchmarks
    assert (site / "benchmarks" / "results.json").exists()


def test_the_readme_is_short_and_its_links_stay_in_the_repository() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 250
    assert "http://" not in text and "https://" not in text
    for target in LINK.findall(text):
        path = target.split("#", 1)[0]
        assert path and (ROOT / path).exists(), f"README links to {target}, which is not there"


def test_the_readmes_examples_are_the_ones_the_docs_show() -> None:
    docs = "\n".join(page.read_text() for page in DOCS.rglob("*.md"))
    for block in python_blocks(README.read_text()):
        assert block in docs, f"README example not in docs/:\n{block}"
