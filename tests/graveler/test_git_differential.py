"""The engine against the git CLI: seeded random histories applied to both must agree.

Each step (write from a small alphabet of contents, delete, commit, reset, branch creation,
merge with or without a strategy, of a branch or of its previous commit, cross merges that
make criss-cross histories, reverts and cherry-picks of plain and merge commits (on either
parent, as `-m`), hard resets to another ref, and staging compaction, which git does not
have) runs on a lake and on a git repository with one worktree per branch; rewrites of equal
content are frequent, and git compares content. After every step the outcome (committed or
nothing to commit; merged, fast-forwarded, up to date, conflicted on the same paths, or
refused on a dirty destination, for merges, reverts and cherry-picks alike) and every
branch's files, staged and committed, must agree.

git runs its `recursive` strategy without rename detection (`ort` in git 2.39 ignores
`no-renames`). Contents are one line of text, so git's line merge conflicts wherever both
sides changed a file, as the engine does for any object; a virtual merge base then holds
conflict markers, which equal neither side, as the engine's does. The engine refuses any
merge into a branch with uncommitted changes, git only one that would touch them: a merge
into a branch `git status` shows dirty is compared as refused. Where git's `-X ours/theirs`
stops on a modify/delete conflict, the test resolves it as the strategy says, then commits.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from branchwater.engine import DirtyBranch, Lake, MergeConflict, NoChanges
from branchwater.engine.api import Repository
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.merge import BASES_KEY
from tests.helpers.gc import compact

PATHS = ("a", "b", "c", "d", "e")
CONTENTS = tuple(f"{n}\n".encode() for n in range(1, 4))
BRANCHES = ("main", "x", "y", "z")
WEIGHTS = {
    "write": 40,
    "delete": 10,
    "commit": 8,
    "reset": 2,
    "create": 4,
    "merge": 28,
    "cross": 8,
    "compact": 6,
    "revert": 8,
    "pick": 8,
    "hard_reset": 3,
}
"""How often each step is taken."""
PREVIOUS = 0.2
"""How often a merge takes the source branch's previous commit."""
STRATEGIES = {None: (), "source-wins": ("-X", "theirs"), "dest-wins": ("-X", "ours")}
BY_SHA256 = {hashlib.sha256(c).hexdigest(): c for c in CONTENTS}
BY_BLOB_ID = {hashlib.sha1(b"blob %d\0" % len(c) + c).hexdigest(): c for c in CONTENTS}

GIT_CONFIG = (
    ("merge.renames", "false"),
    ("diff.renames", "false"),
    ("merge.conflictStyle", "merge"),
    ("core.autocrlf", "false"),
    ("commit.gpgSign", "false"),
)

Tree = dict[str, bytes]


class Git:
    """A git repository with a worktree per branch. Commits get increasing dates, one second
    apart, so git orders merge bases by age as the engine does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clock = 1_700_000_000
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": str(root),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com",
            "LC_ALL": "C",
        }
        self.worktrees = {"main": root / "main"}
        self.objects: subprocess.Popen[bytes] | None = None
        """`git cat-file --batch`, started on the first read of a tree or commit id."""
        self.worktrees["main"].mkdir(parents=True)
        self.run("main", "init", "-q", "-b", "main")
        for key, value in GIT_CONFIG:
            self.run("main", "config", key, value)
        self.commit("main", "init", "--allow-empty")

    def run(self, branch: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """git in `branch`'s worktree."""
        self.clock += 1
        date = f"{self.clock} +0000"
        env = {**self.env, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        done = subprocess.run(
            ["git", *args],
            cwd=self.worktrees[branch],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and done.returncode:
            raise AssertionError(f"git {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done

    def commit(self, branch: str, message: str, *flags: str) -> None:
        self.run(branch, "commit", "-q", "--no-verify", "-m", message, *flags)

    def add_worktree(self, name: str, source: str) -> None:
        self.worktrees[name] = self.root / "worktrees" / name
        self.run("main", "worktree", "add", "-q", "-b", name, str(self.worktrees[name]), source)

    def rev(self, branch: str, rev: str = "HEAD") -> str:
        """The commit id of `rev` in `branch`'s worktree."""
        return self.read_object(self.head(branch) if rev == "HEAD" else rev)[0]

    @staticmethod
    def head(branch: str) -> str:
        """The name of `branch`'s worktree's HEAD, from any worktree."""
        return "main-worktree/HEAD" if branch == "main" else f"worktrees/{branch}/HEAD"

    def files(self, branch: str) -> Tree:
        directory = self.worktrees[branch]
        return {p.name: p.read_bytes() for p in directory.iterdir() if p.name != ".git"}

    def committed(self, branch: str) -> Tree:
        """The tree of the worktree's HEAD, read through one `git cat-file --batch` kept
        open (a process per check would be most of the test's time). It resolves the
        worktree's HEAD afresh on every request; the trees are flat, the paths top-level."""
        (_, tree), entries = self.read_object(f"{self.head(branch)}^{{tree}}"), {}
        while tree:
            mode, rest = tree.split(b" ", 1)
            name, rest = rest.split(b"\0", 1)
            assert mode == b"100644", f"{branch}'s HEAD holds {name!r} of mode {mode!r}"
            entries[name.decode()] = BY_BLOB_ID[rest[:20].hex()]
            tree = rest[20:]
        return entries

    def read_object(self, rev: str) -> tuple[str, bytes]:
        """The id and the content of the object `rev` names."""
        if self.objects is None:
            self.objects = subprocess.Popen(
                ["git", "cat-file", "--batch"],
                cwd=self.worktrees["main"],
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        assert self.objects.stdin is not None and self.objects.stdout is not None
        self.objects.stdin.write(rev.encode() + b"\n")
        self.objects.stdin.flush()
        header = self.objects.stdout.readline().split()
        assert len(header) == 3, f"git cat-file {rev}: {header!r}"
        body = self.objects.stdout.read(int(header[2]) + 1)
        return header[0].decode(), body[:-1]

    def close(self) -> None:
        if self.objects is not None:
            self.objects.communicate(timeout=60)

    def dirty(self, branch: str) -> bool:
        return bool(self.run(branch, "status", "--porcelain").stdout.strip())


@dataclass
class Run:
    repo: Repository
    git: Git
    rng: random.Random
    log: list[str] = field(default_factory=list)
    seen: Counter[str] = field(default_factory=Counter)
    """Notable steps taken: multi-base merges, and picks by kind, outcome and merge parent."""

    @property
    def branches(self) -> list[str]:
        return sorted(self.git.worktrees)

    def engine_files(self, branch: str) -> Tree:
        return {e.path: BY_SHA256[e.checksum] for e in self.repo.branch(branch).list()}

    def engine_committed(self, branch: str) -> Tree:
        return {e.path: BY_SHA256[e.checksum] for e in self.repo.ref(branch).list()}

    # --- steps: each applies one action to both and returns both outcomes ----------------

    def write(self, branch: str) -> tuple[object, object]:
        path, content = self.rng.choice(PATHS), self.rng.choice(CONTENTS)
        self.log.append(f"write {branch} {path}={content!r}")
        self.repo.branch(branch).upload(path, content)
        (self.git.worktrees[branch] / path).write_bytes(content)
        return None, None

    def delete(self, branch: str) -> tuple[object, object]:
        present = sorted(self.engine_files(branch))
        if not present:
            return self.write(branch)
        path = self.rng.choice(present)
        self.log.append(f"delete {branch} {path}")
        self.repo.branch(branch).delete(path)
        (self.git.worktrees[branch] / path).unlink()
        return None, None

    def commit(self, branch: str) -> tuple[object, object]:
        self.log.append(f"commit {branch}")
        try:
            self.repo.branch(branch).commit(f"commit {len(self.log)}")
            engine = "committed"
        except NoChanges:
            engine = "nothing to commit"
        self.git.run(branch, "add", "-A")
        if self.git.run(branch, "diff", "--cached", "--quiet", check=False).returncode:
            self.git.commit(branch, f"commit {len(self.log)}")
            return engine, "committed"
        return engine, "nothing to commit"

    def compact(self, branch: str) -> tuple[object, object]:
        """Staging compaction, which git has no counterpart of: it must change nothing any
        later step or check sees."""
        self.log.append(f"compact {branch}")
        compact(self.repo, branch)
        return None, None

    def reset(self, branch: str) -> tuple[object, object]:
        self.log.append(f"reset {branch}")
        self.repo.branch(branch).reset()
        self.git.run(branch, "reset", "-q", "--hard")
        self.git.run(branch, "clean", "-q", "-fd")
        return None, None

    def create(self, branch: str) -> tuple[object, object]:
        free = [b for b in BRANCHES if b not in self.git.worktrees]
        if not free:
            return self.commit(branch)
        name = free[0]
        self.log.append(f"create {name} from {branch}")
        self.repo.create_branch(name, source=branch)
        self.git.add_worktree(name, branch)
        return None, None

    def merge(self, into: str) -> tuple[object, object]:
        """Merge another branch, or its previous commit, mostly after committing both sides
        so there is something to merge."""
        others = [b for b in self.branches if b != into]
        if not others:
            return self.create(into)
        source = self.rng.choice(others)
        outcomes = [self.commit(b) for b in (into, source) if self.rng.random() < 0.8]
        if (
            self.rng.random() < PREVIOUS
            and len(list(self.repo.log(source, first_parent=True, limit=2))) == 2
        ):
            source += "~1"
        outcomes.append(self._merge(source, into))
        return tuple(e for e, _ in outcomes), tuple(g for _, g in outcomes)

    def cross(self, into: str) -> tuple[object, object]:
        """Merge another branch into `into`, then `into`'s commit before that merge into the
        other: the next merge between the two has two merge bases (a criss-cross)."""
        others = [b for b in self.branches if b != into]
        if not others:
            return self.create(into)
        other = self.rng.choice(others)
        outcomes = [self.commit(into), self.commit(other), self._merge(other, into)]
        if outcomes[-1][0] == "merged":
            outcomes.append(self._merge(f"{into}~1", other))
        return tuple(e for e, _ in outcomes), tuple(g for _, g in outcomes)

    def _merge(self, source: str, into: str) -> tuple[object, object]:
        strategy = self.rng.choice([None, None, "source-wins", "dest-wins"])
        self.log.append(f"merge {source} into {into} strategy={strategy}")
        return self._engine_merge(source, into, strategy), self._git_merge(source, into, strategy)

    def _engine_merge(self, source: str, into: str, strategy: str | None) -> object:
        try:
            result = self.repo.merge(source, into=into, strategy=strategy)
        except NoChanges:
            return "up to date"
        except DirtyBranch:
            return "refused: dirty"
        except MergeConflict as conflict:
            return ("conflict", sorted(conflict.paths))
        if result.fast_forward:
            return "fast-forward"
        if "," in result.commit.metadata[BASES_KEY]:
            self.seen["multi-base merge"] += 1
        return "merged"

    def _git_merge(self, source: str, into: str, strategy: str | None) -> object:
        if self.git.dirty(into):
            return "refused: dirty"
        before = self.git.rev(into)
        done = self.git.run(
            into,
            "merge",
            "-q",
            "--no-edit",
            "-s",
            "recursive",
            "-X",
            "no-renames",
            *STRATEGIES[strategy],
            source,
            check=False,
        )
        if done.returncode:
            unmerged = self.git.run(into, "diff", "--name-only", "--diff-filter=U").stdout.split()
            if not unmerged:
                raise AssertionError(f"git merge failed: {done.stdout}{done.stderr}")
            if strategy is None:
                self.git.run(into, "merge", "--abort")
                return ("conflict", sorted(unmerged))
            self._resolve(into, unmerged, "--theirs" if strategy == "source-wins" else "--ours")
            self.git.commit(into, "resolved", "--no-edit")
            return "merged"
        after = self.git.rev(into)
        if after == before:
            return "up to date"
        if after == self.git.rev(into, source):
            return "fast-forward"
        return "merged"

    def _resolve(self, branch: str, paths: list[str], side: str) -> None:
        """Take `side`'s version of each path git left unmerged (modify/delete): the file, or
        its deletion where that side deleted it."""
        stage = "3" if side == "--theirs" else "2"
        for path in paths:
            stages = self.git.run(branch, "ls-files", "-u", "--", path).stdout.split()
            if stage in stages[2::4]:
                self.git.run(branch, "checkout", side, "--", path)
                self.git.run(branch, "add", "--", path)
            else:
                self.git.run(branch, "rm", "-q", "--", path)

    def revert(self, branch: str) -> tuple[object, object]:
        """Revert one of the branch's last commits (a merge on either parent)."""
        return self._pick("revert", branch, branch)

    def pick(self, branch: str) -> tuple[object, object]:
        """Cherry-pick one of any branch's last commits (a merge on either parent)."""
        return self._pick("cherry-pick", self.rng.choice(self.branches), branch)

    def hard_reset(self, branch: str) -> tuple[object, object]:
        """Point the branch at another branch's HEAD or one of its own earlier commits."""
        source = self.rng.choice(self.branches)
        depth = len(list(self.repo.log(source, first_parent=True, limit=3)))
        target = f"{source}~{self.rng.randrange(depth)}"
        self.log.append(f"reset {branch} --hard {target}")
        self.repo.branch(branch).reset(to=target)
        self.git.run(branch, "reset", "-q", "--hard", target)
        self.git.run(branch, "clean", "-q", "-fd")
        return None, None

    def _pick(self, kind: str, source: str, into: str) -> tuple[object, object]:
        """Mostly after committing the branch, so there is something to revert or pick onto."""
        outcomes = [self.commit(into)] if self.rng.random() < 0.8 else []
        commits = list(self.repo.log(source, first_parent=True, limit=4))
        choices = [k for k, commit in enumerate(commits) if commit.parents]
        if not choices:
            return self.commit(into)
        depth = self.rng.choice(choices)
        merge = len(commits[depth].parents) > 1
        parent = self.rng.choice([1, 2]) if merge else None
        target = f"{source}~{depth}"
        self.log.append(f"{kind} {target} parent={parent} onto {into}")
        engine = self._engine_pick(kind, target, into, parent)
        self.seen[f"{kind} {engine[0] if isinstance(engine, tuple) else engine}"] += 1
        if parent:
            self.seen[f"{kind} of a merge"] += 1
            self.seen[f"a merge on parent {parent}"] += 1
        outcomes.append((engine, self._git_pick(kind, target, into, parent)))
        return tuple(e for e, _ in outcomes), tuple(g for _, g in outcomes)

    def _engine_pick(self, kind: str, target: str, into: str, parent: int | None) -> object:
        operation = self.repo.revert if kind == "revert" else self.repo.cherry_pick
        try:
            operation(into, target, parent)
        except NoChanges:
            return "nothing to commit"
        except DirtyBranch:
            return "refused: dirty"
        except MergeConflict as conflict:
            return ("conflict", sorted(conflict.paths))
        return "committed"

    def _git_pick(self, kind: str, target: str, into: str, parent: int | None) -> object:
        if self.git.dirty(into):
            return "refused: dirty"
        mainline = ("-m", str(parent)) if parent else ()
        edit = ("--no-edit",) if kind == "revert" else ()
        done = self.git.run(
            into,
            kind,
            *edit,
            "--strategy=recursive",
            "-Xno-renames",
            *mainline,
            target,
            check=False,
        )
        if not done.returncode:
            return "committed"
        unmerged = self.git.run(into, "diff", "--name-only", "--diff-filter=U").stdout.split()
        self.git.run(into, kind, "--abort", check=False)
        if self.git.dirty(into):
            raise AssertionError(f"git {kind} left changes: {done.stdout}{done.stderr}")
        if unmerged:
            return ("conflict", sorted(unmerged))
        if "nothing to commit" in done.stdout + done.stderr or "empty" in done.stderr:
            return "nothing to commit"
        raise AssertionError(f"git {kind} failed: {done.stdout}{done.stderr}")

    # --- the loop -----------------------------------------------------------------------

    def step(self) -> None:
        name = self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        engine, git = getattr(self, name)(self.rng.choice(self.branches))
        assert engine == git, self.explain(f"outcomes differ: engine {engine!r}, git {git!r}")
        for branch in self.branches:
            self.check(branch)

    def check(self, branch: str) -> None:
        files, committed = self.engine_files(branch), self.engine_committed(branch)
        assert files == self.git.files(branch), self.explain(f"{branch}'s files differ")
        assert committed == self.git.committed(branch), self.explain(f"{branch}'s HEAD differs")
        changed = bool(list(self.repo.branch(branch).uncommitted()))
        assert changed == (files != committed), self.explain(f"{branch}'s uncommitted() is wrong")

    def explain(self, what: str) -> str:
        return f"{what} after:\n  " + "\n  ".join(self.log[-15:])


SEEDS = range(6)
_SEEN: dict[int, Counter[str]] = {}
"""Notable steps per seed of the quick runs, for the coverage check."""


def play(tmp_path: Path, seed: int, steps: int) -> Counter[str]:
    """Play `steps` random steps on a fresh lake and git repository; the notable ones."""
    policy = RangePolicy(target_entries=2, max_entries=4)
    with Lake.connect("memory://", range_policy=policy) as lake:
        repo = lake.create_repository("diff", storage_namespace=f"file://{tmp_path}/lake")
        run = Run(repo, Git(tmp_path / "git"), random.Random(seed))
        try:
            for _ in range(steps):
                run.step()
        finally:
            run.git.close()
        return run.seen


QUICK = pytest.mark.xdist_group("git-differential-quick")
"""The quick runs and the coverage check on one worker, so the check reads what the runs saw
instead of playing them again."""


@QUICK
@pytest.mark.parametrize("seed", SEEDS)
def test_random_histories_agree_with_git(tmp_path: Path, seed: int) -> None:
    _SEEN[seed] = play(tmp_path, seed, 60)


@QUICK
def test_the_random_histories_include_criss_cross_merges_and_every_pick(tmp_path: Path) -> None:
    """The quick runs reach merges with several merge bases, and reverts and cherry-picks of
    every outcome, of merge commits on either parent, not only simple ones."""
    for seed in SEEDS:
        if seed not in _SEEN:
            _SEEN[seed] = play(tmp_path / str(seed), seed, 60)
    seen = sum(_SEEN.values(), Counter[str]())
    expected = {"multi-base merge", "a merge on parent 1", "a merge on parent 2"} | {
        f"{kind} {what}"
        for kind in ("revert", "cherry-pick")
        for what in ("committed", "conflict", "nothing to commit", "of a merge")
    }
    assert expected <= set(seen), f"missing {expected - set(seen)} in {dict(seen)}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 104))
def test_long_random_histories_agree_with_git(tmp_path: Path, seed: int) -> None:
    play(tmp_path, seed, 200)
