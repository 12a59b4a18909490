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


def test_provider_info_matches_airflows_schema() -> None:
    import json
    from pathlib import Path

    import airflow
    import jsonschema

    schema_path = Path(airflow.__file__).with_name("provider_info.schema.json")
    jsonschema.validate(get_provider_info(), json.loads(schema_path.read_text()))


def test_everything_the_provider_info_names_exists() -> None:
    from importlib import import_module

    from airflow.sdk._shared.module_loading import import_string

    info = get_provider_info()
    for family in ("hooks", "operators", "sensors", "triggers"):
        for module in info[family][0]["python-modules"]:
            import_module(module)
    for link in info["extra-links"]:
        import_string(link)
    for family, name in [
        ("operators", "BranchwaterCompactOperator"),
        ("operators", "BranchwaterGCMarkOperator"),
        ("operators", "BranchwaterImportOperator"),
        ("sensors", "BranchwaterCompactionSensor"),
        ("triggers", "BranchwaterCompactionTrigger"),
    ]:
        import_string(f"{info[family][0]['python-modules'][0]}.{name}")
    assert info["extra-links"][1].endswith("BranchwaterGCReportLink")
    for connection in info["connection-types"]:
        assert import_string(connection["hook-class-name"]).conn_type == "branchwater"


def test_airflow_registers_the_connection_form() -> None:
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    manager = ProvidersManager()
    hook = ProvidersManagerTaskRuntime().hooks["branchwater"]
    assert hook is not None
    assert hook.hook_class_name == "branchwater.plugin.hooks.BranchwaterHook"
    assert hook.connection_testable
    assert manager.field_behaviours["branchwater"]["relabeling"] == {"password": "KV URL"}
    fields = {
        widget.field_name
        for name, widget in manager.connection_form_widgets.items()
        if name.startswith("extra__branchwater__")
    }
    assert fields == {"default_namespace", "aws_conn_id", "link_template"}
