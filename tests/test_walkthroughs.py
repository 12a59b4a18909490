"""The walk-throughs a new user runs first: the README's Python tour, as written but with its
namespace under a temporary folder, its Airflow DAG examples, parsed as a DAG processor
parses them, and `python -m branchwater.engine.walkthrough`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from branchwater.engine import walkthrough

README = Path(__file__).parents[1] / "README.md"
TOUR_NAMESPACE = "file:///data/sales"


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, re.S)


def readme_tour() -> str:
    """The first Python block of the README's tour."""
    return python_blocks(README.read_text().split("## A five-minute tour", 1)[1])[0]


def test_the_readme_tour_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = readme_tour()
    assert TOUR_NAMESPACE in code
    monkeypatch.chdir(tmp_path)
    code = code.replace(TOUR_NAMESPACE, f"file://{tmp_path}/data/sales")
    exec(compile(code, str(README), "exec"), {})
    added, listed, merged = capsys.readouterr().out.splitlines()
    assert added == "added orders/2026-11-01.csv"
    assert listed == "[]"
    assert merged.endswith(" 1")
    assert (tmp_path / "lake.db").is_file()


def test_the_engine_walkthrough_goes_from_upload_to_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "demo"
    (root / "left-over").mkdir(parents=True)
    walkthrough.main(["--root", str(root)])
    printed = capsys.readouterr().out
    assert "merge etl into main:" in printed and "(1 attempt)" in printed
    shown = printed.split("ls main:\n", 1)[1].split()
    assert shown[1::2] == [
        "customers/part-0.csv",
        "orders/date=2026-11-02/part-0.csv",
        "orders/date=2026-11-03/part-0.csv",
    ]
    assert not (root / "left-over").exists()


def test_the_readme_dag_examples_parse(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    blocks = python_blocks(README.read_text())
    examples = [code for code in blocks if "from airflow.sdk import" in code]
    for number, code in enumerate(examples):
        (tmp_path / f"readme_example_{number}.py").write_text(code)
    bag = DagBag(dag_folder=tmp_path)
    assert bag.import_errors == {}
    assert set(bag.dags) == {"daily_orders", "on_sales_commit", "compact_sales_etl"}


def test_the_old_name_of_the_walkthrough_still_runs_it_and_says_it_moved() -> None:
    import importlib
    import sys

    sys.modules.pop("branchwater.engine.demo", None)
    with pytest.warns(DeprecationWarning, match="branchwater.engine.walkthrough"):
        old = importlib.import_module("branchwater.engine.demo")
    assert old.main is walkthrough.main
