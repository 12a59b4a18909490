"""What every Branchwater operator shares: the hook's lifetime, failure policy, run metadata
and lineage."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.definitions._internal.mixins import ResolveMixin
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from branchwater.engine import (
    AlreadyExists,
    BranchProtected,
    ConfigurationError,
    Conflict,
    DirtyBranch,
    InvalidArgument,
    InvalidName,
    NoChanges,
    NotFound,
    check_flag,
)
from branchwater.plugin.hooks import DEFAULT_CONN_ID, BranchwaterHook, unset

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pydantic.types import JsonValue

    from branchwater.engine import Branch, Commit, Entry, Repository

RENDERED_FLAGS = {
    **dict.fromkeys(("true", "1", "yes", "on"), True),
    **dict.fromkeys(("false", "0", "no", "off"), False),
}
"""The text a template renders a flag as (`{{ params.dry_run }}`), as Airflow's own
`conf.getboolean` reads it."""


class InvalidOperatorArgument(InvalidArgument, AirflowFailException):
    """An argument an operator refuses where the task is built. Built when the DAG file is
    parsed, it is an import error naming the task; a mapped task is built only when it runs
    (Airflow unmaps it as it renders its templates), where this fails the task without its
    retries, which would build it as wrongly again."""


@contextmanager
def checked_where_declared(task_id: str) -> Iterator[None]:
    """The checks of an operator's `__init__`: what they refuse (`InvalidArgument`, or a name
    the engine's rules refuse: `InvalidName`) is an `InvalidOperatorArgument` naming the task."""
    try:
        yield
    except (InvalidArgument, InvalidName) as exc:
        raise InvalidOperatorArgument(f"task {task_id!r}: {exc}") from None


def declared_flag(task_id: str, name: str, value: object) -> bool:
    """A flag the operator acts on, checked where the DAG declares the task: an import error
    that names the task, not only the flag."""
    with checked_where_declared(task_id):
        return check_flag(name, value)


TEMPLATE_MARKERS = ("{{", "{%", "{#")


def resolved_later(value: object) -> bool:
    """Whether a template field's value is known only once Airflow renders it: a Jinja
    template, or a value Airflow resolves when the task runs (an XComArg, `.output` or a
    `@task`'s result; a DAG param). Its `__init__` check waits for the rendered value."""
    if isinstance(value, ResolveMixin):
        return True
    return isinstance(value, str) and any(marker in value for marker in TEMPLATE_MARKERS)


def mapping_field(task_id: str, name: str, value: object) -> dict[str, Any]:
    """A mapping field (`metadata`, `policy`, `details`) as rendered: a mapping, or the JSON
    text of an object, as a template gives it (`| tojson`); unset (`unset`) is empty.
    Without native rendering a template renders a dict as Python's text, not JSON: that is
    refused with the way out, rather than read as the characters of a string."""
    if unset(value):
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    shown = f"the text {value[:80]!r}" if isinstance(value, str) else type(value).__name__
    raise InvalidArgument(
        f"task {task_id!r}: {name} must be a mapping or the JSON text of an object, not "
        f"{shown}: template it with tojson ({{{{ ti.xcom_pull('task') | tojson }}}}) or render "
        "native objects (render_template_as_native_obj=True on the DAG)"
    )


def rendered_flag(name: str, value: object) -> bool:
    """A templated flag: a bool, or its text. Anything else is refused rather than taken for
    false, since a flag such as `skip_sweep` guards a delete."""
    if isinstance(value, bool):
        return value
    flag = RENDERED_FLAGS.get(value.strip().lower()) if isinstance(value, str) else None
    if flag is not None:
        return flag
    raise InvalidArgument(f"{name} must be True or False (or their text), not {value!r}")


FINAL_ERRORS = (
    AlreadyExists,
    BranchProtected,
    Conflict,
    DirtyBranch,
    NoChanges,
    NotFound,
    InvalidName,
    InvalidArgument,
    ConfigurationError,
)
"""Engine errors a task retry cannot fix: the task fails at once instead of retrying. A
repository, branch or ref that is not there (`NotFound`) is a DAG's mistake or an upstream
task that did not run; waiting does not make it appear. A protected branch (`BranchProtected`,
`ChecksMissing`) refuses again until its rules or the checks change, which a retry does not
do; a dirty branch (`DirtyBranch`) stays dirty until someone commits or resets it."""

METADATA_PREFIX = "airflow."
IDENTITY_KEYS = ("dag_id", "run_id", "task_id", "map_index")
"""The metadata naming one task instance across its tries and the reruns of its DAG run."""
RUN_KEYS = ("dag_id", "run_id")
"""The metadata naming one DAG run."""
LOOKUP_DEPTH = 1_000
"""How many of a ref's newest commits a task looks through for one it made earlier."""


@contextmanager
def failing_at_once() -> Iterator[None]:
    """Errors a retry cannot fix (`FINAL_ERRORS`) fail the task without its retries."""
    try:
        yield
    except FINAL_ERRORS as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc


def run_metadata(context: Context) -> dict[str, str]:
    """Metadata recording which task instance and try made a commit."""
    ti = context["ti"]
    logical_date = context.get("logical_date")
    values = {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": str(ti.map_index if ti.map_index is not None else -1),
        "try_number": str(ti.try_number),
        "logical_date": logical_date.isoformat() if logical_date else "",
    }
    return {METADATA_PREFIX + key: value for key, value in values.items()}


def kept_state(context: Context, key: str, **matching: object) -> dict[str, Any] | None:
    """What an earlier try of this task kept under `key` in its state store, if it kept it
    for the same `matching` values (other work's is not this try's); None without a store
    or with nothing kept for them."""
    store = context.get("task_state_store")
    kept = store.get(key) if store is not None else None
    if isinstance(kept, dict) and all(kept.get(name) == v for name, v in matching.items()):
        return kept
    return None


def keep_state(context: Context, key: str, **value: str) -> None:
    """Keep `value` under `key` in the task's state store, for a later try (`kept_state`)."""
    store = context.get("task_state_store")
    if store is not None:
        kept: dict[str, JsonValue] = dict(value)
        store.set(key, kept)


def identity(context: Context, keys: Sequence[str] = IDENTITY_KEYS) -> dict[str, str]:
    """The run metadata naming this task instance (or, with `RUN_KEYS`, its DAG run)."""
    ours = run_metadata(context)
    return {METADATA_PREFIX + key: ours[METADATA_PREFIX + key] for key in keys}


def made_by(made: Commit | Entry, context: Context, keys: Sequence[str] = IDENTITY_KEYS) -> bool:
    """True when this task instance (or, with `RUN_KEYS`, its DAG run) made `made`, a commit
    or an object stamped with `identity`."""
    return all(made.metadata.get(key) == value for key, value in identity(context, keys).items())


def made_earlier(
    repo: Repository, ref: str, context: Context, depth: int = LOOKUP_DEPTH
) -> Commit | None:
    """The newest commit this task instance made in `ref`'s history: an earlier try's, or an
    earlier run's of this DAG run (cleared since, as a backfill does). The history is read
    newest first, up to `depth` commits and no further than the match."""
    return next(repo.log(ref, where=identity(context), limit=1, depth=depth), None)


def branch_or_skip(repo: Repository, name: str, missing_ok: bool) -> Branch:
    """The branch; when it is gone, a skip if `missing_ok` (a branch deleted after a DAG
    listed it: nothing left to do), else `NotFound`."""
    try:
        return repo.branch(name)
    except NotFound as exc:
        if missing_ok:
            raise AirflowSkipException(f"{exc}: nothing to do") from exc
        raise


@dataclass(frozen=True)
class LineageDataset:
    """A ref of a repository as OpenLineage names it: namespace `branchwater://<repository>`."""

    repository: str
    ref: str

    @property
    def namespace(self) -> str:
        return f"branchwater://{self.repository}"


@dataclass(frozen=True)
class Lineage:
    inputs: tuple[LineageDataset, ...] = ()
    outputs: tuple[LineageDataset, ...] = ()


class BranchwaterOperator(BaseOperator):
    """Base of the Branchwater operators.

    The hook is made on first use in `execute`, never when the DAG file is parsed, and its
    lake is closed when the task ends, whatever the outcome. Errors a retry cannot fix
    (conflicts, bad names, a missing repository or ref) fail the task without retrying it.

    :param repository: the repository's name (templated)
    :param branchwater_conn_id: the `branchwater` connection of the lake (default
        `branchwater_default`)
    """

    template_fields: Sequence[str] = ("repository",)
    ui_color = "#cfe8f3"

    def __init__(
        self, *, repository: str, branchwater_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.repository = repository
        self.branchwater_conn_id = branchwater_conn_id
        self.commit_url = ""
        self.lineage = Lineage()

    @cached_property
    def hook(self) -> BranchwaterHook:
        return BranchwaterHook(self.branchwater_conn_id)

    def execute(self, context: Context) -> Any:
        try:
            with failing_at_once():
                return self.run(context)
        finally:
            self.hook.close()

    def run(self, context: Context) -> Any:
        """The task's work: by default `execute_on` its repository, which must exist."""
        return self.execute_on(self.hook.repository(self.repository), context)

    def execute_on(self, repo: Repository, context: Context) -> Any:
        """The operator's work on its repository; the return value goes to XCom."""
        raise NotImplementedError

    def resolved_once(
        self, repo: Repository, ref: str, context: Context, key: str, **scope: str
    ) -> str:
        """The commit `ref` named on this task's first try, kept in its state store under
        `key` with `scope` (the task's other arguments), else `ref`'s commit now, kept: once
        the work ran, `ref` may name another commit (`main` the revert itself, `main~1` one
        further back, a branch that moved on), and a retry must look for, or redo, the work
        the first try meant."""
        kept = kept_state(context, key, ref=ref, **scope)
        if kept is not None:
            self.log.info("%s is the commit the first try resolved %s to", kept["commit"], ref)
            return str(kept["commit"])
        commit_id = repo.ref(ref).commit_id
        keep_state(context, key, ref=ref, commit=commit_id, **scope)
        return commit_id

    def record_commit(self, branch: str, commit_id: str) -> None:
        """Remember the commit this task made, for its extra link."""
        self.commit_url = self.hook.commit_url(self.repository, branch, commit_id)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The refs read and written as OpenLineage datasets; None without the provider."""
        try:
            from airflow.providers.common.compat.openlineage.facet import Dataset
            from airflow.providers.openlineage.extractors import OperatorLineage
        except ImportError:
            return None
        return OperatorLineage(
            inputs=[Dataset(namespace=d.namespace, name=d.ref) for d in self.lineage.inputs],
            outputs=[Dataset(namespace=d.namespace, name=d.ref) for d in self.lineage.outputs],
        )
