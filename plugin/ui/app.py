"""The Branchwater view: server-rendered pages of a lake, a FastAPI app the API server mounts.

Pages: repositories; a repository's branches with their compaction figures, and its tags;
a ref's commit log; a commit with its diff from its first parent; a ref's objects and one
object's page with a preview (`browser`); the GC runs saved in the repository's namespace and
each run's own report. Bad input (an unknown repository, ref,
commit or run) is a 404 page with the engine's message; no page ever shows a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException

from branchwater.engine import (
    Branch,
    BranchwaterError,
    Commit,
    CompactionStatus,
    ConfigurationError,
    InvalidArgument,
    InvalidName,
    NotFound,
    Unavailable,
    human_size,
    timestamp,
)
from branchwater.engine.gc.runs import history
from branchwater.plugin.ui.auth import LoginRequired, NotAllowed, airflow_user_may_view
from branchwater.plugin.ui.browser import add_browser_pages
from branchwater.plugin.ui.lake import LakeAccess

log = logging.getLogger(__name__)
T = TypeVar("T")

LOG_PAGE = 50
"""Commits per log page."""
REF_PAGE = 100
"""Branches, and tags, per repository page: each branch shown costs a bounded staging scan."""
DIFF_LIMIT = 1_000
"""Changes shown on a commit's page; the page says when there are more."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'"
)
"""Pages are inline-styled HTML and nothing else: no script runs in Airflow's origin, even
from a report file someone else wrote into a namespace (reports also get `sandbox`)."""

_STATUS = {NotFound: 404, InvalidName: 404, InvalidArgument: 404}
_UNAVAILABLE = (ConfigurationError, Unavailable)


def create_app(access: LakeAccess | None = None, *, airflow_login: bool = False) -> FastAPI:
    """The view's app; `access` says which lake it shows (default: the configured connection).

    `airflow_login`: every page asks Airflow's auth manager who the user is (the API server
    serves the app so); without it, anyone who reaches the app sees the lake's metadata.
    """
    lake_access = access or LakeAccess()
    app = FastAPI(
        title="Branchwater",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=_closing(lake_access),
        dependencies=[Depends(airflow_user_may_view)] if airflow_login else [],
    )
    app.state.lake_access = lake_access
    page = _Renderer(_templates())

    @app.middleware("http")
    async def content_security_policy(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        return _with_policy(await call_next(request))

    _add_pages(app, lake_access, page)
    add_browser_pages(app, lake_access, page)
    _add_error_pages(app, page)
    return app


def _add_pages(app: FastAPI, lake_access: LakeAccess, page: _Renderer) -> None:
    @app.get("/", name="repositories", response_class=HTMLResponse)
    def repositories(request: Request) -> Response:
        repos = sorted(lake_access.lake().repositories(), key=lambda r: r.name)
        return page(request, "repositories.html", repositories=repos)

    @app.get("/repositories/{repository}", name="repository", response_class=HTMLResponse)
    def repository(
        request: Request, repository: str, after: str = "", tags_after: str = ""
    ) -> Response:
        repo = lake_access.lake().repository(repository)
        branches, more_branches = _first(repo.branches(after=after, limit=REF_PAGE + 1), REF_PAGE)
        tags, more_tags = _first(repo.tags(after=tags_after, limit=REF_PAGE + 1), REF_PAGE)
        return page(
            request,
            "repository.html",
            repo=repo,
            branches=_branch_rows(branches),
            tags=tags,
            after=after,
            tags_after=tags_after,
            next_after=branches[-1].name if more_branches else None,
            next_tags_after=tags[-1].name if more_tags else None,
            protections=repo.protections(),
        )

    @app.get("/repositories/{repository}/log/{ref:path}", name="log", response_class=HTMLResponse)
    def commit_log(
        request: Request, repository: str, ref: str, after: str | None = None
    ) -> Response:
        repo = lake_access.lake().repository(repository)
        commits, more = _first(repo.log(ref, limit=LOG_PAGE + 1, after=after), LOG_PAGE)
        return page(request, "log.html", repo=repo, ref=ref, commits=commits, more=more)

    @app.get(
        "/repositories/{repository}/commits/{commit_id}",
        name="commit",
        response_class=HTMLResponse,
    )
    def commit(
        request: Request, repository: str, commit_id: str, branch: str | None = None
    ) -> Response:
        repo = lake_access.lake().repository(repository)
        found = repo.commit(commit_id)
        parent = found.parents[0] if found.parents else None
        changes: list[Any] = []
        more = False
        if parent is not None:
            changes, more = _first(repo.diff(parent, found.id), DIFF_LIMIT)
        return page(
            request,
            "commit.html",
            repo=repo,
            commit=found,
            checks=repo.checks(found.id),
            branch=branch,
            parent=parent,
            changes=changes,
            more=more,
        )

    @app.get("/repositories/{repository}/gc", name="gc_runs", response_class=HTMLResponse)
    def runs(request: Request, repository: str) -> Response:
        repo = lake_access.lake().repository(repository)
        found = history.list_runs(lake_access.objects(repo))
        return page(request, "gc_runs.html", repo=repo, runs=found, limit=history.MAX_RUNS)

    @app.get(
        "/repositories/{repository}/gc/{run_id}/report.html",
        name="gc_report",
        response_class=HTMLResponse,
    )
    def report(repository: str, run_id: str) -> Response:
        repo = lake_access.lake().repository(repository)
        return HTMLResponse(
            history.read_report(lake_access.objects(repo), run_id),
            headers={"Content-Security-Policy": f"{CONTENT_SECURITY_POLICY}; sandbox"},
        )

    @app.get("/repositories/{repository}/gc/{run_id}/summary.json", name="gc_summary")
    def summary(repository: str, run_id: str) -> Response:
        repo = lake_access.lake().repository(repository)
        return JSONResponse(history.read_summary(lake_access.objects(repo), run_id))


def _add_error_pages(app: FastAPI, page: _Renderer) -> None:
    """Every failure is a page of its own: a `BranchwaterError` by its kind (404, 503…), a
    login redirect, and, for anything unexpected, a 500 page with no traceback."""

    @app.exception_handler(BranchwaterError)
    def lake_error(request: Request, exc: BranchwaterError) -> Response:
        if isinstance(exc, _UNAVAILABLE):
            return page.error(request, 503, "The lake cannot be reached", str(exc))
        status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)
        if status == 500:
            log.error("Branchwater view: %s: %s", type(exc).__name__, exc)
        return page.error(request, status, _TITLES.get(status, "Error"), str(exc))

    @app.exception_handler(LoginRequired)
    def login_required(request: Request, exc: LoginRequired) -> Response:
        return RedirectResponse(exc.login_url, status_code=303)

    @app.exception_handler(NotAllowed)
    def not_allowed(request: Request, exc: NotAllowed) -> Response:
        return page.error(request, 403, "Not allowed", str(exc))

    @app.exception_handler(HTTPException)
    def http_error(request: Request, exc: HTTPException) -> Response:
        return page.error(
            request, exc.status_code, _TITLES.get(exc.status_code, "Error"), exc.detail
        )

    @app.exception_handler(Exception)
    def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("Branchwater view failed on %s", request.url.path)
        message = f"{type(exc).__name__}: the API server's log has the details"
        return _with_policy(page.error(request, 500, "Internal error", message))


def _with_policy(response: Response) -> Response:
    """`CONTENT_SECURITY_POLICY` unless the response sets its own. The unexpected-error page
    needs it set by its handler: Starlette serves that page from its outermost middleware,
    past the app's own."""
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    return response


def _closing(access: LakeAccess) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Close the lake when a server that runs the app's lifespan stops (a mounted app's
    lifespan is not run: the lake then lives as long as the API server process)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        access.close()

    return lifespan


_TITLES = {
    403: "Not allowed",
    404: "Not found",
    405: "Method not allowed",
    500: "Error",
}


def _branch_rows(branches: list[Branch]) -> list[tuple[Branch, Commit, CompactionStatus]]:
    """Each branch with its head and compaction figures; one deleted since it was listed is
    left out."""
    rows = []
    for branch in branches:
        try:
            rows.append((branch, branch.head(), branch.compaction_status()))
        except NotFound:
            continue
    return rows


def _first(items: Iterable[T], limit: int) -> tuple[list[T], bool]:
    """Up to `limit` items, and whether there were more."""
    shown = list(islice(items, limit + 1))
    return shown[:limit], len(shown) > limit


class _Renderer:
    """Renders a page or an error page with the view's templates and helpers."""

    def __init__(self, templates: Jinja2Templates) -> None:
        self.templates = templates

    def __call__(
        self, request: Request, name: str, status_code: int = 200, **context: Any
    ) -> Response:
        return self.templates.TemplateResponse(
            request, name, {"link": _linker(request), **context}, status_code=status_code
        )

    def error(self, request: Request, status: int, title: str, message: str) -> Response:
        return self(request, "error.html", status, title=title, message=message, status=status)


def _linker(request: Request) -> Callable[..., str]:
    """`link(route, **params)`: the path of a page, its parameters quoted (branch names may
    hold `/`, `#` or `%`), relative to the server's root so it works behind a proxy."""

    def link(route: str, query: dict[str, str] | None = None, **params: str) -> str:
        quoted = {k: quote(str(v), safe="") for k, v in params.items()}
        url = str(request.url_for(route, **quoted).path)
        if query:
            pairs = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items() if v)
            url = f"{url}?{pairs}" if pairs else url
        return url

    return link


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=Path(__file__).with_name("templates"))
    templates.env.filters["short"] = lambda commit_id: str(commit_id)[:12]
    templates.env.filters["size"] = human_size
    templates.env.filters["when"] = timestamp
    templates.env.filters["age"] = _age
    return templates


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit} ago"
    return f"{seconds:.0f} s ago"
