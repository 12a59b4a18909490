"""`engine/background.py`: threads started on first use, and a forked child that does not wait
on its parent's."""

from __future__ import annotations

import multiprocessing as mp
import threading

from branchwater.engine.background import Background


def _in_child(background: Background, answer: mp.Queue) -> None:
    done, running = background.wait(timeout=10)
    answer.put(("inherited", len(done), len(running)))
    answer.put(("ran", background.submit(threading.get_ident).result(timeout=10)))
    background.shutdown()
    answer.put(("shut down", None))


def test_a_forked_child_runs_its_own_threads_and_waits_for_none_of_its_parents_work() -> None:
    background = Background(1, "bw-test")
    parent_thread = background.submit(threading.get_ident).result(timeout=10)
    release = threading.Event()
    background.submit(release.wait)
    context = mp.get_context("fork")
    answer = context.Queue()
    child = context.Process(target=_in_child, args=(background, answer))
    child.start()
    try:
        assert answer.get(timeout=30) == ("inherited", 0, 0)
        kind, child_thread = answer.get(timeout=30)
        assert kind == "ran" and child_thread != parent_thread
        assert answer.get(timeout=30) == ("shut down", None)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
        release.set()
        background.shutdown()
    assert child.exitcode == 0


def test_threads_start_on_first_use_and_stop_at_shutdown_until_the_next_submit() -> None:
    def ours() -> set[int]:
        return {t.ident or 0 for t in threading.enumerate() if t.name.startswith("bw-test-2")}

    background = Background(2, "bw-test-2")
    assert not ours()
    background.submit(int).result(timeout=10)
    assert ours()
    background.shutdown()
    assert not ours()
    assert background.submit(int, "7").result(timeout=10) == 7
    background.shutdown()
