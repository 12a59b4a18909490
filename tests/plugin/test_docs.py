"""Every parameter of every operator and sensor is documented: a `:param name:` in a
docstring of its class (or of a Branchwater base class), and a row of `docs/airflow.md`."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from branchwater.plugin import operators, sensors

DOCS = Path(__file__).parents[2] / "docs" / "airflow.md"
README = DOCS.parents[1] / "README.md"
CLASSES = [
    getattr(operators, name) for name in operators.__all__ if name != "BranchwaterOperator"
] + [sensors.BranchwaterCommitSensor, sensors.BranchwaterCompactionSensor]


def ours(cls: type) -> list[type]:
    """The classes of `cls`'s MRO that Branchwater defines."""
    return [c for c in cls.__mro__ if c.__module__.startswith("branchwater.plugin")]


def parameters(cls: type) -> set[str]:
    """The keyword parameters Branchwater's classes add to the operator or sensor."""
    names: set[str] = set()
    for c in ours(cls):
        if "__init__" in vars(c):
            signature = inspect.signature(vars(c)["__init__"])
            names |= {
                p.name
                for p in signature.parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY
            }
    return names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_parameter_has_a_docstring_param_and_a_docs_row(cls: type) -> None:
    docstrings = "".join(c.__doc__ or "" for c in ours(cls))
    docs = DOCS.read_text()
    assert cls.__name__ in docs
    for name in sorted(parameters(cls)):
        assert f":param {name}:" in docstrings, f"{cls.__name__}: no :param {name}:"
        assert f"`{name}`" in docs, f"docs/airflow.md does not name {cls.__name__}'s {name}"


def test_the_readme_points_at_the_reference_and_the_test_button_setting() -> None:
    readme = README.read_text()
    assert "(docs/airflow.md)" in readme
    assert "AIRFLOW__CORE__TEST_CONNECTION=Enabled" in readme
    assert "AIRFLOW__CORE__TEST_CONNECTION=Enabled" in DOCS.read_text()
