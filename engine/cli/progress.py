"""Progress of long work on stderr, kept apart from the results on stdout."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

PROGRESS_DELAY = 1.0
"""Seconds long work runs before its progress shows: quick commands stay quiet."""


class Progress:
    """Long work on stderr as git shows it: one line rewritten in place, then ", done.".

    Results go to stdout, so progress never mixes into them or into `--json`. By default it
    shows only where stderr is a terminal; `--progress` / `--no-progress` decide otherwise.
    As a context manager it ends an open line: with ", done." after success, bare after a
    failure, so the error line starts on a line of its own.
    """

    def __init__(self, enabled: bool, delay: float = 0.0) -> None:
        self.enabled = enabled
        self.delay = delay
        """Work that ends sooner shows nothing, as with git's delayed progress."""
        self._line = ""

    def update(self, title: str, count: int | None = None) -> None:
        if not self.enabled:
            return
        line = title if count is None else f"{title}: {count:,}"
        sys.stderr.write("\r" + line.ljust(len(self._line)))
        sys.stderr.flush()
        self._line = line

    def counter(self, title: str) -> Callable[[int], None]:
        """A `progress` callback for the engine that shows `title: n` once `delay` passed."""
        started = time.monotonic()

        def report(count: int) -> None:
            if time.monotonic() - started >= self.delay:
                self.update(title, count)

        return report

    def done(self) -> None:
        self._end(", done.\n")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._end("\n" if exc_type else ", done.\n")

    def _end(self, tail: str) -> None:
        if self._line:
            sys.stderr.write(tail)
            sys.stderr.flush()
            self._line = ""
