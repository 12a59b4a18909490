"""Who may see the view when the API server serves it: users that Airflow's auth manager
lets see plugins' views (`AccessView.PLUGINS`), known by the token the UI keeps in its
cookie or by a bearer token, as Airflow's own API knows them. Without one, the browser is
sent to Airflow's login page and comes back."""

from __future__ import annotations

from fastapi import Request


class LoginRequired(Exception):
    """No valid Airflow token came with the request."""

    def __init__(self, login_url: str) -> None:
        super().__init__("log in to Airflow to see the Branchwater view")
        self.login_url = login_url


class NotAllowed(Exception):
    """The user may not see plugins' views."""


async def airflow_user_may_view(request: Request) -> None:
    """A FastAPI dependency: pass, or raise `LoginRequired` / `NotAllowed`."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from jwt import InvalidTokenError

    manager = get_auth_manager()
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    token = (
        credentials if scheme.lower() == "bearer" else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    )
    login = LoginRequired(manager.get_url_login(next_url=str(request.url)))
    if not token:
        raise login
    try:
        user = await manager.get_user_from_token(token)
    except InvalidTokenError:
        raise login from None
    if not manager.is_authorized_view(access_view=AccessView.PLUGINS, user=user):
        raise NotAllowed(f"user {user.get_name()!r} may not see plugins' views in this Airflow")
