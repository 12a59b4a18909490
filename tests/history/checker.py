"""The checker: a pure function of a history (every worker's log records) and the final
state read back, returning what the model says went wrong.

What the model knows, by branch:

- A worker's own branch (`w<N>`) is changed by that worker alone, one operation after
  another, so its model is exact: each staged write, delete, copy and link changes the view,
  each read and listing must show the view, a commit's tree (the branch's HEAD after the
  commit, whichever attempt landed it) must equal the view, a reset, revert, cherry-pick or
  merge into it makes its view the tree of the commit it lands on, a restore makes the view
  of the paths it names its source commit's (a cut attempt stages nothing: its failpoints
  come before the first path is staged), an import lands on HEAD a commit of HEAD's tree
  and its files (under `IMPORTED`, where nothing is staged, so the view shows them too),
  and refusals must be right (a delete or copy
  `NotFound` where the view lacks the path, `DirtyBranch` where the view differs from
  HEAD's tree, an exclusive creation `PathExists` where the view shows the path, and one
  acknowledged only where it does not).
- `shared` is written by every worker at once, so the model bounds what a read may show.
  A read of a path over [start, end] may show the value of a change acknowledged before
  it started that no later change acknowledged before it started overwrote, the value of
  any change running at some point of the read, or the initial value when no change was
  acknowledged before it started. A commit of `shared` is such a read of every path over
  the commit's span (its tree is the branch's view at one moment of it). An operation that
  did not finish, and an attempt of a copy a failpoint cut short (what it copied is not in
  the log), may have shown anything from its start to its end. An import into `shared` is
  a change of each of its files, as a write. An exclusive creation acknowledged is a write
  that needs the path absent at some point of its span (its own change aside), and one
  refused needs it shown; two acknowledged creations of a path need a delete between them
  (one whose span leaves room for it to come after the one and before the other).
- `main` takes merges only: every merge acknowledged into it stays in its history.

Merges, syncs (`main` into a worker's branch), reverts and cherry-picks (of `main`'s HEAD
onto a worker's branch) must equal the model's three-way merge of the trees their commit's
parents name, with the merge base the engine finds for those parents (and records in the
commit), or for a pick the picked commit's parent; fast-forwards must land on the source's
HEAD.
Every acknowledged commit exists afterwards; branches and tags made and not deleted name
what they were made on, and no other branch or tag exists; a commit acknowledged with user
metadata holds it exactly.

Hostile input (`args["expect"]`): the operation must be refused with that error type, and
it changes no model, so every later read, listing, commit and the final state must show
nothing of it; an operation given none must not be refused as hostile. `CommitExpired` may
refuse only a move onto a commit.

GC: after the final GC run (a retention run at the history's end, then the uncommitted one)
every object a branch, tag, staged entry (copies and links included) or unexpired commit
references reads with its checksum (objects only expired commits held may be gone), every
branch shows what it showed before the run, every commit a retention run reported expiring
is recorded expired, every commit recorded expired refuses a read with `CommitExpired`, and
no branch or tag names a commit a read refuses.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from branchwater.engine.graveler.checksums import content_checksum
from branchwater.engine.graveler.imports import SOURCE_KEY as IMPORT_SOURCE_KEY
from tests.history.operations import IMPORT_FILES, IMPORTED, MAIN, MOVES, SHARED

Tree = dict[str, str]
STAGED = ("write", "create", "link", "delete", "copy")
ANY = "*"
"""A change whose value the log cannot tell."""


@dataclass
class CommitState:
    parents: list[str]
    metadata: dict[str, str]
    tree: Tree


@dataclass
class FinalState:
    initial: str
    """`main`'s first commit, which every branch starts from."""
    commits: dict[str, CommitState]
    bases: dict[str, list[str]]
    """The engine's merge bases of each two-parent commit's parents."""
    branches: dict[str, str]
    views: dict[str, Tree]
    views_after_gc: dict[str, Tree]
    tags: dict[str, str]
    broken: list[str]
    """What `assert_references_intact` found after the final GC run."""
    gc_deleted: int
    expired: set[str] = field(default_factory=set)
    """The commits retention recorded expired."""
    refused: set[str] = field(default_factory=set)
    """The commits a read refuses with `CommitExpired` (expired, or fenced by a run)."""


@dataclass
class Op:
    worker: int
    k: int
    kind: str
    args: dict[str, Any]
    start: float
    end: float | None = None
    status: str | None = None
    """ok, refused or error once finished; None if no attempt finished."""
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 0
    cut: bool = False
    """Some attempt was stopped by a failpoint (raised or killed)."""

    def name(self) -> str:
        return f"w{self.worker}#{self.k} {self.kind}({self.args})"

    @property
    def hostile(self) -> bool:
        """Given input the engine must refuse (`args["expect"]` names the error)."""
        return "expect" in self.args


def operations(records: list[dict[str, Any]]) -> list[Op]:
    """One `Op` per planned operation, from its first invocation to its final completion."""
    ops: dict[tuple[int, int], Op] = {}
    open_attempt: dict[tuple[int, int], bool] = {}
    for record in sorted(records, key=lambda r: r["t"]):
        key = (record["w"], record["k"])
        if record["event"] == "invoke":
            op = ops.setdefault(
                key, Op(record["w"], record["k"], record["op"], record["args"], record["t"])
            )
            if open_attempt.get(key):
                op.cut = True
            op.attempts += 1
            open_attempt[key] = True
            continue
        op = ops[key]
        open_attempt[key] = False
        if record["status"] == "fault":
            op.cut = True
            continue
        op.end, op.status = record["t"], record["status"]
        op.result = record.get("result") or {}
        op.error = record.get("error")
    return sorted(ops.values(), key=lambda op: (op.worker, op.k))


def three_way(base: Tree, ours: Tree, theirs: Tree, strategy: str | None) -> Tree | None:
    """The merge of `theirs` into `ours` from `base`, by identity (content); None on a
    conflict the strategy does not resolve."""
    merged: Tree = {}
    for path in sorted(set(base) | set(ours) | set(theirs)):
        b, o, t = base.get(path), ours.get(path), theirs.get(path)
        if t == b or o == t:
            value = o
        elif o == b or strategy == "source-wins":
            value = t
        elif strategy == "dest-wins":
            value = o
        else:
            return None
        if value is not None:
            merged[path] = value
    return merged


def restored(view: Tree, source: Tree, spec: str) -> Tree:
    """`view` with `source`'s version of the path `spec` and everything under it as a
    folder (a `spec` ending in `/` is a folder only): what a restore stages."""
    folder = spec if spec.endswith("/") else spec + "/"

    def taken(path: str) -> bool:
        return path == spec or path.startswith(folder)

    kept = {path: value for path, value in view.items() if not taken(path)}
    return kept | {path: value for path, value in source.items() if taken(path)}


class Checker:
    def __init__(self, ops: list[Op], state: FinalState) -> None:
        self.ops = ops
        self.state = state
        self.found: list[str] = []
        self.imported = self.imported_files()

    def imported_files(self) -> Tree:
        """What an import lands under `IMPORTED`, as the commits imports made hold it: the
        same in each (the source never changes), one entry per file."""
        landed: Tree = {}
        for commit_id, commit in sorted(self.state.commits.items()):
            if IMPORT_SOURCE_KEY not in commit.metadata:
                continue
            held = {p: v for p, v in commit.tree.items() if p.startswith(IMPORTED)}
            if len(held) != len(IMPORT_FILES) or (landed and held != landed):
                self.fail(f"import commit {commit_id} holds {held}, not {landed or IMPORT_FILES}")
            landed = landed or held
        return landed

    def fail(self, message: str) -> None:
        self.found.append(message)

    def tree(self, commit_id: str) -> Tree:
        commit = self.state.commits.get(commit_id)
        if commit is None:
            self.fail(f"commit {commit_id} is gone")
            return {}
        return commit.tree

    def run(self) -> list[str]:
        for op in self.ops:
            if op.status is None:
                self.fail(f"{op.name()} never finished after {op.attempts} attempts")
            elif op.status == "error":
                self.fail(f"{op.name()} raised {op.error}")
            else:
                self.refusal(op)
        self.acknowledged_commits_exist()
        self.metadata()
        by_worker: dict[int, list[Op]] = defaultdict(list)
        for op in self.ops:
            if not op.hostile:
                by_worker[op.worker].append(op)
        for worker, ops in sorted(by_worker.items()):
            PrivateModel(self, worker).play(ops)
        SharedModel(self).check()
        self.merges()
        self.main_keeps_its_merges()
        self.names()
        self.gc()
        return self.found

    def refusal(self, op: Op) -> None:
        """Hostile input refused with its error type, and only hostile input so;
        `CommitExpired` only for a move."""
        expect = op.args.get("expect")
        if expect is not None:
            if op.status == "ok":
                self.fail(f"{op.name()} accepted, but must refuse with {expect}")
            elif op.error != expect:
                self.fail(f"{op.name()} refused with {op.error}, not {expect}")
        elif op.error in ("InvalidName", "InvalidArgument"):
            self.fail(f"{op.name()} refused valid input with {op.error}")
        elif op.error == "CommitExpired" and op.kind not in MOVES:
            self.fail(f"{op.name()} refused with CommitExpired, but moves onto no commit")

    def metadata(self) -> None:
        """User metadata comes back exactly: from a write or link, and in a new commit."""
        for op in self.ops:
            given = op.args.get("metadata")
            if op.hostile or op.status != "ok" or given is None:
                continue
            if op.kind in ("write", "link") and op.result.get("metadata") != given:
                self.fail(f"{op.name()}: the entry holds metadata {op.result.get('metadata')}")
            commit = self.state.commits.get(op.result.get("commit") or "")
            if op.kind == "commit" and commit is not None and commit.metadata != given:
                self.fail(f"{op.name()}: commit holds metadata {commit.metadata}")

    def acknowledged_commits_exist(self) -> None:
        for op in self.ops:
            if op.status == "ok":
                for key in ("commit", "head"):
                    commit_id = op.result.get(key)
                    if commit_id and commit_id not in self.state.commits:
                        self.fail(f"{op.name()} acknowledged commit {commit_id}, which is gone")

    def merges(self) -> None:
        """Each landed merge, sync, revert and cherry-pick against the model's three-way
        merge."""
        for op in self.ops:
            picks = ("revert", "cherry_pick")
            if op.status != "ok" or op.kind not in ("merge", "sync", *picks) or op.hostile:
                continue
            result = op.result["commit"]
            commit = self.state.commits.get(result)
            if commit is None or op.result.get("fast_forward"):
                continue
            if op.kind == "revert":
                reverted = self.state.commits.get(op.args["head"])
                if reverted is None or len(commit.parents) != 1:
                    self.fail(f"{op.name()}: revert commit {result} has parents {commit.parents}")
                    continue
                sides = [self.tree(commit.parents[0]), self.tree(reverted.parents[0])]
                expected = three_way(reverted.tree, *sides, None)
                what = f"revert of {op.args['head'][:12]}"
            elif op.kind == "cherry_pick":
                picked = self.state.commits.get(op.args["picked"])
                if picked is None or len(commit.parents) != 1:
                    self.fail(f"{op.name()}: pick commit {result} has parents {commit.parents}")
                    continue
                against = picked.parents[(op.args["parent"] or 1) - 1] if picked.parents else None
                base = self.tree(against) if against else {}
                expected = three_way(base, self.tree(commit.parents[0]), picked.tree, None)
                what = f"cherry-pick of {op.args['picked'][:12]}"
            else:
                if len(commit.parents) != 2:
                    self.fail(f"{op.name()}: merge commit {result} has parents {commit.parents}")
                    continue
                ours, theirs = commit.parents
                sides = [self.tree(ours), self.tree(theirs)]
                what = f"merge of {theirs[:12]} into {ours[:12]}"
                bases = self.state.bases.get(result, [])
                recorded = commit.metadata.get("branchwater.merge.bases", "")
                if set(filter(None, recorded.split(","))) != set(bases):
                    self.fail(f"{op.name()}: records bases {recorded}, the engine finds {bases}")
                if len(bases) != 1:
                    continue
                expected = three_way(self.tree(bases[0]), *sides, op.args["strategy"])
                what += f" from {bases[0][:12]}"
            if expected is None:
                self.fail(f"{op.name()}: {what} landed, but the model finds a conflict")
            elif commit.tree != expected:
                self.fail(f"{op.name()}: {what} is {commit.tree}, the model's is {expected}")

    def main_keeps_its_merges(self) -> None:
        head = self.state.branches.get(MAIN)
        reached = set()
        todo = [head] if head else []
        while todo:
            commit_id = todo.pop()
            if commit_id in reached or commit_id not in self.state.commits:
                continue
            reached.add(commit_id)
            todo.extend(self.state.commits[commit_id].parents)
        for op in self.ops:
            if op.kind == "merge" and op.status == "ok" and op.result["commit"] not in reached:
                self.fail(f"{op.name()}: merge {op.result['commit']} is lost from {MAIN}")

    def names(self) -> None:
        """A branch or tag made and not deleted names what it was made on; a deleted one is
        gone; no other exists."""
        last: dict[str, Op] = {}
        made = {MAIN, SHARED} | {name for name in self.state.branches if _private(name)}
        for op in self.ops:
            if op.kind not in ("branch_create", "branch_delete", "tag_create", "tag_delete"):
                continue
            if op.hostile:
                continue
            if op.kind.endswith("create") and op.status != "refused":
                made.add(op.args["name"])
            if op.status == "ok" or (op.kind.endswith("delete") and op.cut):
                last[op.args["name"]] = op
        for name in sorted(set(self.state.branches) | set(self.state.tags)):
            if name not in made:
                self.fail(f"{name!r} is a branch or tag no operation made")
        for name, op in sorted(last.items()):
            refs = self.state.branches if op.kind.startswith("branch") else self.state.tags
            if op.kind.endswith("delete"):
                if name in refs:
                    self.fail(f"{op.name()}: {name} is still there")
            elif refs.get(name) != op.args["head"]:
                self.fail(f"{op.name()}: {name} names {refs.get(name)}, not {op.args['head']}")

    def gc(self) -> None:
        state = self.state
        for broken in state.broken:
            self.fail(f"after the final GC run: {broken}")
        for name, view in state.views.items():
            if state.views_after_gc.get(name) != view:
                self.fail(f"the final GC run changed what {name} shows")
        for op in self.ops:
            if op.kind == "retention" and op.status == "ok":
                lost = sorted(set(op.result["expiring"]) - state.expired)
                if lost:
                    self.fail(f"{op.name()} expired {lost}, which are not recorded expired")
        for commit_id in sorted(state.expired - state.refused):
            self.fail(f"commit {commit_id} is recorded expired, but a read does not refuse it")
        refs = [("branch", state.branches), ("tag", state.tags)]
        for kind, named in refs:
            for name, commit_id in sorted(named.items()):
                if commit_id in state.refused:
                    self.fail(f"{kind} {name} names {commit_id}, which a read refuses")


def _private(name: str) -> bool:
    return name[:1] == "w" and name[1:].isdigit()


class PrivateModel:
    """A worker's own branch, exactly: see the module's docstring."""

    def __init__(self, checker: Checker, worker: int) -> None:
        self.checker = checker
        self.branch = f"w{worker}"
        self.head = checker.state.initial
        self.view = dict(checker.tree(self.head))

    def fail(self, op: Op, message: str) -> None:
        self.checker.fail(f"{op.name()}: {message}")

    def dirty(self) -> bool:
        return self.view != self.checker.tree(self.head)

    def land(self, op: Op, commit_id: str) -> None:
        self.head = commit_id
        self.view = dict(self.checker.tree(commit_id))

    def play(self, ops: list[Op]) -> None:
        for op in ops:
            if op.status in ("ok", "refused"):
                self.step(op)
        state = self.checker.state
        if state.branches.get(self.branch) != self.head:
            ended = state.branches.get(self.branch)
            self.checker.fail(f"{self.branch} ends at {ended}, the model at {self.head}")
        if state.views.get(self.branch) != self.view:
            shown = state.views.get(self.branch)
            self.checker.fail(f"{self.branch} ends showing {shown}, the model {self.view}")

    def step(self, op: Op) -> None:
        args, result, ok = op.args, op.result, op.status == "ok"
        kind = op.kind
        if args.get("branch", self.branch) != self.branch and kind != "merge" and kind != "sync":
            return
        if "head" in args and kind != "branch_delete" and args["head"] != self.head:
            self.fail(op, f"started on HEAD {args['head']}, the model's is {self.head}")
        judged = ok or op.error == "PathExists"
        if kind == "create" and judged and (args["path"] in self.view) == ok:
            shown = "shows" if ok else "does not show"
            self.fail(op, f"{'created' if ok else 'refused'}, but the branch {shown} the path")
        if kind in ("write", "create", "link"):
            if not ok:
                return
            expected = content_checksum(args["data"].encode())
            if result["value"] != expected:
                self.fail(op, f"staged {result['value']}, not its content's {expected}")
            self.view[args["path"]] = expected
        elif kind == "delete":
            if ok or op.cut:
                self.view.pop(args["path"], None)
            elif args["path"] in self.view:
                self.fail(op, f"NotFound, but the branch shows {args['path']}")
        elif kind == "copy":
            src = self.view.get(args["src"])
            if not ok:
                if src is not None:
                    self.fail(op, f"NotFound, but the branch shows {args['src']}")
            elif result["value"] != src:
                self.fail(op, f"copied {result['value']}, the source holds {src}")
            else:
                self.view[args["dst"]] = src
        elif kind == "read":
            value = result["value"] if ok else None
            if value != self.view.get(args["path"]):
                self.fail(op, f"read {value}, the model shows {self.view.get(args['path'])}")
        elif kind == "list":
            if ok and result["tree"] != self.view:
                self.fail(op, f"listed {result['tree']}, the model shows {self.view}")
        elif kind == "commit" and ok:
            if result["commit"] is None and not op.cut and result["head"] != self.head:
                self.fail(op, f"NoChanges, but HEAD moved to {result['head']}")
            self.head = result["head"]
            held = self.checker.tree(self.head)
            if held != self.view:
                self.fail(op, f"commit {self.head} holds {held}, the model's view is {self.view}")
        elif kind == "import" and ok:
            before = self.checker.tree(self.head)
            landed = result["commit"]
            if landed is not None:
                commit = self.checker.state.commits.get(landed)
                if commit is None or commit.parents != [self.head]:
                    self.fail(
                        op, f"landed {landed} on {commit and commit.parents}, not {self.head}"
                    )
                self.head = landed
            held = self.checker.tree(self.head)
            if held != {**before, **self.checker.imported}:
                self.fail(op, f"HEAD {self.head} holds {held} after the import onto {before}")
            self.view.update(self.checker.imported)
        elif kind == "reset" and ok:
            target = args["parents"][0] if args["back"] and args["parents"] else self.head
            if result["head"] != target:
                self.fail(op, f"reset to {result['head']}, not {target}")
            self.land(op, target)
        elif kind == "restore" and ok:
            self.view = restored(self.view, self.checker.tree(args["source"]), args["spec"])
        elif kind in ("revert", "cherry_pick", "sync"):
            if kind == "sync" and op.args["into"] != self.branch:
                return
            if ok:
                commit = self.checker.state.commits.get(result["commit"])
                moved = commit is not None and not result.get("fast_forward")
                if moved and commit.parents[0] != self.head:
                    self.fail(op, f"landed on {commit.parents[0]}, not HEAD {self.head}")
                self.land(op, result["commit"])
            elif op.error == "DirtyBranch" and not self.dirty():
                self.fail(op, "DirtyBranch, but the branch shows HEAD's tree")
        elif kind == "merge" and ok and op.args["source"] == self.branch:
            commit = self.checker.state.commits.get(result["commit"])
            source = (
                result["commit"]
                if result.get("fast_forward")
                else (commit.parents[1] if commit and len(commit.parents) == 2 else None)
            )
            if source != self.head:
                self.fail(op, f"merged {source}, the source's HEAD is {self.head}")


class SharedModel:
    """`shared`: what each read and commit may show, by the bounds in the module's docstring."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        self.initial = checker.tree(checker.state.initial)
        self.changes: dict[str, list[Change]] = defaultdict(list)
        self.created: dict[str, list[Change]] = defaultdict(list)
        """The acknowledged exclusive creations of each path, as their changes."""
        named = {op.args.get(key) for op in checker.ops for key in ("path", "src", "dst")}
        named |= set(checker.imported)
        self.paths = sorted(set(self.initial) | {p for p in named if isinstance(p, str)})
        """Every path the history names or an import lands: what a listing may show."""
        for op in checker.ops:
            if op.args.get("branch") != SHARED or op.hostile:
                continue
            if op.kind == "import":
                self.add_import(op)
                continue
            if op.kind not in STAGED:
                continue
            path = op.args["dst"] if op.kind == "copy" else op.args["path"]
            if op.status in (None, "error"):
                self.changes[path].append((op.start, None, ANY))
                continue
            if op.kind == "copy" and op.cut:
                self.changes[path].append((op.start, op.end, ANY))
            if op.status == "ok" or (op.kind == "delete" and op.cut):
                value = op.result.get("value")
                self.changes[path].append((op.start, op.end, value))
                if op.kind == "create":
                    self.created[path].append(self.changes[path][-1])

    def add_import(self, op: Op) -> None:
        """An import into `shared` changes each path it lands as a write would."""
        for path, value in self.checker.imported.items():
            if op.status in (None, "error"):
                self.changes[path].append((op.start, None, ANY))
            elif op.status == "ok":
                self.changes[path].append((op.start, op.end, value))

    def allowed(
        self, path: str, start: float, end: float, excluding: Change | None = None
    ) -> set[str | None] | None:
        """The values a read of `path` over [start, end] may show, with the change
        `excluding` left out (a creation's own); None for any."""
        changes = [c for c in self.changes[path] if c is not excluding]
        before = [c for c in changes if c[1] is not None and c[1] < start]
        values: set[str | None] = set()
        if not before:
            values.add(self.initial.get(path))
        for _, e, v in before:
            assert e is not None
            if not any(d[0] > e and d[1] is not None and d[1] < start for d in before):
                values.add(v)
        for s, e, v in changes:
            if s < end and (e is None or e >= start):
                values.add(v)
        return None if ANY in values else values

    def read(self, what: str, shown: Tree, paths: list[str], start: float, end: float) -> None:
        for path in paths:
            allowed = self.allowed(path, start, end)
            if allowed is not None and shown.get(path) not in allowed:
                self.checker.fail(
                    f"{what} shows {path} as {shown.get(path)}; the model allows {allowed}"
                )

    def read_all(self, what: str, shown: Tree, start: float, end: float) -> None:
        """A listing, a commit's tree or the final view: every path the history names
        within its bounds, and no other path."""
        unknown = sorted(set(shown) - set(self.paths))
        if unknown:
            self.checker.fail(f"{what} shows {unknown}, which no operation wrote")
        self.read(what, shown, self.paths, start, end)

    def check(self) -> None:
        for op in self.checker.ops:
            if op.args.get("branch") != SHARED or op.end is None or op.status == "error":
                continue
            if op.hostile:
                continue
            if op.kind == "read":
                shown = {op.args["path"]: op.result["value"]} if op.status == "ok" else {}
                self.read(op.name(), shown, [op.args["path"]], op.start, op.end)
            elif op.kind == "list" and op.status == "ok":
                self.read_all(op.name(), op.result["tree"], op.start, op.end)
            elif op.kind == "commit" and op.status == "ok" and op.result["commit"]:
                commit_tree = self.checker.tree(op.result["commit"])
                self.read_all(op.name(), commit_tree, op.start, op.end)
            elif op.kind == "create" and (op.status == "ok" or op.error == "PathExists"):
                self.check_creation(op)
        for path, created in self.created.items():
            self.check_one_creator(path, created)
        last = max((op.end or op.start for op in self.checker.ops), default=0.0) + 1.0
        shown = self.checker.state.views.get(SHARED, {})
        self.read_all(f"{SHARED} at the end", shown, last, last)

    def check_creation(self, op: Op) -> None:
        """Acknowledged: the path was absent at some point of the span (but for the
        creation's own change); refused: it was shown."""
        path, ok = op.args["path"], op.status == "ok"
        own = next((c for c in self.created[path] if c[:2] == (op.start, op.end)), None)
        assert op.end is not None
        allowed = self.allowed(path, op.start, op.end, excluding=own)
        if allowed is None:
            return
        if ok and None not in allowed:
            self.checker.fail(f"{op.name()} created {path}, which showed one of {allowed}")
        if not ok and allowed == {None}:
            self.checker.fail(f"{op.name()} was refused, but {path} was absent throughout")

    def check_one_creator(self, path: str, created: list[Change]) -> None:
        """Two acknowledged creations of `path` need a delete (or an operation that may
        have been one) that can come after the one and before the other."""
        removals = [c for c in self.changes[path] if c[2] is None or c[2] == ANY]
        for i, first in enumerate(created):
            for second in created[i + 1 :]:
                if not any(
                    _between(r, first, second) or _between(r, second, first) for r in removals
                ):
                    self.checker.fail(
                        f"{path} was created twice, over [{first[0]:.3f}, {first[1]}] and "
                        f"[{second[0]:.3f}, {second[1]}], with no delete between"
                    )


Change = tuple[float, float | None, str | None]
"""A change of a path on `shared`: its span (no end: never finished) and the value it wrote
(`None`: a delete; `ANY`: anything)."""


def _between(removal: Change, before: Change, after: Change) -> bool:
    """Whether `removal` can come after `before`'s point and before `after`'s."""
    return removal[0] < (after[1] or float("inf")) and (removal[1] or float("inf")) > before[0]


def check(records: list[dict[str, Any]], state: FinalState) -> list[str]:
    """Everything the history and the final state break of the model; empty when none."""
    return Checker(operations(records), state).run()
