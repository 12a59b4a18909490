"""The provider is discoverable the way Airflow discovers providers: through its entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

from branchwater.plugin import get_provider_info


def test_entry_point_resolves_to_get_provider_info() -> None:
    (point,) = [
        p
        for p in entry_points(group="apache_airflow_provider")
        if p.value.startswith("branchwater")
    ]
    assert point.load() is get_provider_info


def test_provider_info_names_the_package() -> None:
    info = get_provider_info()
    assert info["package-name"] == "branchwater"
    assert info["name"] == "Branchwater"
