"""`BranchwaterViewPlugin`, registered through the `airflow.plugins` entry point.

Airflow imports plugins in all its processes; building the app here opens nothing (the lake
is opened by the first page that needs it, in the API server).
"""

from __future__ import annotations

from airflow.sdk.plugins_manager import AirflowPlugin

from branchwater.plugin.ui.app import create_app
from branchwater.plugin.ui.paths import URL_PREFIX

NAME = "branchwater"


class BranchwaterViewPlugin(AirflowPlugin):
    """Serves the view and adds it to the UI's Browse menu, embedded in Airflow's page."""

    name = NAME
    fastapi_apps = [
        {"app": create_app(airflow_login=True), "url_prefix": URL_PREFIX, "name": "Branchwater"}
    ]
    external_views = [
        {
            "name": "Branchwater",
            "href": f"{URL_PREFIX.lstrip('/')}/",
            "url_route": NAME,
            "destination": "nav",
            "category": "browse",
        }
    ]
