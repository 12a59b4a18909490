"""Where the Branchwater view lives in Airflow's API server, and the link to a commit's page.

Imports nothing of FastAPI or the engine: the hook builds commit links from here on workers,
which never serve the view.
"""

from __future__ import annotations

URL_PREFIX = "/branchwater"
"""The view's mount point under the API server's base URL (`[api] base_url`)."""

COMMIT_PATH = "/repositories/{repository}/commits/{commit_id}?branch={branch}"
"""A commit's page inside the view, as a link template (`{repository}`, `{branch}`,
`{commit_id}`): the commit page shows the branch it was made on when given one."""


def default_link_template(base_url: str | None) -> str:
    """The link template extra links use when the connection names none: this view's commit
    page under the API server's base URL (a path from the server's root without one)."""
    return f"{(base_url or '').rstrip('/')}{URL_PREFIX}{COMMIT_PATH}"
