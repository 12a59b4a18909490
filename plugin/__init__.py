"""Branchwater's Airflow provider: hook, operators, sensors, triggers and links.

Users import from the family modules (`branchwater.plugin.operators`, `.sensors`, `.hooks`,
`.triggers`, `.links`); this module only describes the provider, and imports nothing of
Airflow, so the entry point is cheap to load.
"""

from __future__ import annotations

from typing import Any

INTEGRATION = "Branchwater"
PACKAGE = "branchwater.plugin"


def _modules(*names: str) -> list[dict[str, Any]]:
    return [{"integration-name": INTEGRATION, "python-modules": [f"{PACKAGE}.{n}" for n in names]}]


def _text_field(label: str, description: str) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": {"type": ["string", "null"]}}


CONNECTION_TYPE: dict[str, Any] = {
    "hook-class-name": f"{PACKAGE}.hooks.BranchwaterHook",
    "hook-name": "Branchwater",
    "connection-type": "branchwater",
    "ui-field-behaviour": {
        "hidden-fields": ["host", "schema", "login", "port"],
        "relabeling": {"password": "KV URL"},
        "placeholders": {"password": "postgresql://user:secret@db.example.com:5432/lake"},
    },
    "conn-fields": {
        "default_namespace": _text_field(
            "Default storage namespace",
            "Where repositories created through this connection keep their data, as "
            "<namespace>/<repository>: file:///… or s3://bucket/prefix",
        ),
        "aws_conn_id": _text_field(
            "AWS connection",
            "An Amazon Web Services connection whose credentials, region and endpoint reach "
            "the S3 namespaces; empty: boto3's default credential chain",
        ),
        "link_template": _text_field(
            "Commit link",
            "URL of a commit's page, with {repository}, {branch} and {commit_id} "
            "placeholders; empty: the commit's page in the Branchwater view of this Airflow",
        ),
    },
}


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow through the `apache_airflow_provider` entry point."""
    return {
        "package-name": "branchwater",
        "name": "Branchwater",
        "description": "Git for a data lake: branches, commits and merges of lake objects.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "tags": ["software"],
            }
        ],
        "hooks": _modules("hooks"),
        "operators": _modules("operators"),
        "sensors": _modules("sensors"),
        "triggers": _modules("triggers"),
        "extra-links": [
            f"{PACKAGE}.links.BranchwaterCommitLink",
            f"{PACKAGE}.links.BranchwaterGCReportLink",
        ],
        "connection-types": [CONNECTION_TYPE],
    }
