"""The supervisor: worker processes kept across histories (a fresh interpreter costs
seconds, a history a fraction of one), each fed one task per history. A worker a failpoint
killed is started again, by slot, with the same task: it resumes from its log, retrying the
operation it died in. Workers fork from a server that imported the engine, the KV drivers
and the S3 store once (`tests.helpers.servers.forked_context`), so a restart costs a fork,
not an interpreter's start and seconds of imports."""

from __future__ import annotations

import os
import queue
import signal
import time
from dataclasses import dataclass
from typing import Any

from tests.helpers.servers import forked_context
from tests.history.operations import Task, serve

JOIN_TIMEOUT = 10.0


@dataclass
class Slot:
    process: Any
    tasks: Any


class Workers:
    """Up to `size` worker processes; `run` gives a history's tasks to the first ones."""

    def __init__(self, size: int) -> None:
        self.ctx = forked_context()
        self.done: Any = self.ctx.Queue()
        self.slots: list[Slot] = [self._start(i) for i in range(size)]

    def _start(self, index: int) -> Slot:
        tasks = self.ctx.Queue()
        process = self.ctx.Process(target=serve, args=(index, tasks, self.done), daemon=True)
        process.start()
        return Slot(process, tasks)

    def run(self, tasks: list[Task], timeout: float) -> int:
        """Run the tasks, one per slot, until all finished; returns how many workers were
        killed (and started again). A task that raised fails the history."""
        assert len(tasks) <= len(self.slots), "more workers than the pool holds"
        for index, task in enumerate(tasks):
            self.slots[index].tasks.put(task)
        pending = set(range(len(tasks)))
        restarts = 0
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"workers {sorted(pending)} never finished"
            try:
                index, error = self.done.get(timeout=0.05)
            except queue.Empty:
                pass
            else:
                assert error is None, f"worker {index} failed: {error}"
                pending.discard(index)
                continue
            for index in sorted(pending):
                slot = self.slots[index]
                if not slot.process.is_alive():
                    assert slot.process.exitcode == -signal.SIGKILL, (
                        f"worker {index} died with {slot.process.exitcode}"
                    )
                    restarts += 1
                    self.slots[index] = self._start(index)
                    self.slots[index].tasks.put(tasks[index])
        return restarts

    def close(self) -> None:
        for slot in self.slots:
            if slot.process.is_alive():
                slot.tasks.put(None)
        for slot in self.slots:
            slot.process.join(JOIN_TIMEOUT)
            if slot.process.is_alive() and slot.process.pid is not None:
                os.kill(slot.process.pid, signal.SIGKILL)
                slot.process.join(JOIN_TIMEOUT)
