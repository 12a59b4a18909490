"""Branchwater's Airflow provider: hook, operators, sensors and triggers."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow through the `apache_airflow_provider` entry point."""
    return {
        "package-name": "branchwater",
        "name": "Branchwater",
        "description": "Git for a data lake: branches, commits and merges of lake objects.",
        "connection-types": [],
        "versions": ["0.1.0"],
    }
