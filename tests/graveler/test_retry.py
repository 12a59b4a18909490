"""The one retry loop (`RetryPolicy`), the one wording of running out of it, and the
settings of the graveler's waits refused when no clock could follow them."""

from __future__ import annotations

import math

import pytest

from branchwater.engine import Lake
from branchwater.engine.errors import InvalidArgument, MergeRaceLost, TooManyTries, too_many_tries
from branchwater.engine.graveler import graveler as graveler_module
from branchwater.engine.graveler.graveler import RetryPolicy


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The pauses `RetryPolicy` takes, recorded instead of slept."""
    taken: list[float] = []
    monkeypatch.setattr(graveler_module.time, "sleep", taken.append)
    return taken


def test_yields_attempt_numbers_and_is_bounded(sleeps: list[float]) -> None:
    assert list(RetryPolicy(attempts=4)) == [1, 2, 3, 4]
    assert list(RetryPolicy(attempts=0)) == []


def test_sleeps_between_attempts_only(sleeps: list[float]) -> None:
    seen: list[tuple[int, int]] = []
    for attempt in RetryPolicy(attempts=3):
        seen.append((attempt, len(sleeps)))
    assert seen == [(1, 0), (2, 1), (3, 2)], "no pause before the first attempt"
    assert len(sleeps) == 2, "no pause after the last attempt"


def test_a_loop_that_succeeds_stops_sleeping(sleeps: list[float]) -> None:
    for attempt in RetryPolicy(attempts=10):
        if attempt == 2:
            break
    assert len(sleeps) == 1


def test_backoff_is_jittered_and_doubles_up_to_the_cap(sleeps: list[float]) -> None:
    policy = RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.1)
    for _ in range(50):
        list(policy)
    bounds = [min(0.1, 0.01 * 2**lost) for lost in range(11)]
    rounds = [sleeps[i : i + 11] for i in range(0, len(sleeps), 11)]
    for row in rounds:
        assert all(0 <= pause <= bound for pause, bound in zip(row, bounds, strict=True))
    assert len({round(pause, 9) for pause in sleeps}) > 1, "pauses are random"
    assert max(row[-1] for row in rounds) > 0.01, "the bound grew past the base delay"


def test_zero_base_delay_never_pauses(sleeps: list[float]) -> None:
    list(RetryPolicy(attempts=5, base_delay=0))
    assert sleeps == [0, 0, 0, 0]


def test_too_many_tries_has_one_wording() -> None:
    error = too_many_tries("commit on branch 'main' of 'sales'", 7)
    assert isinstance(error, TooManyTries)
    assert str(error) == (
        "commit on branch 'main' of 'sales' gave up after 7 attempts: the branch kept changing "
        "under it; retry later"
    )


def test_a_lost_merge_words_it_the_same_way_and_carries_its_hint() -> None:
    error = MergeRaceLost("merge of 'f' into 'main' of 'sales'", 3, "mr@c")
    plain = too_many_tries("merge of 'f' into 'main' of 'sales'", 3, "ADVICE")
    assert isinstance(error, TooManyTries)
    assert error.hint == "mr@c"
    assert str(error) == str(plain).replace(
        "ADVICE", "retry with hint='mr@c' to reuse this merge's work"
    )


@pytest.mark.parametrize(
    "setting",
    [
        {"attempts": -1},
        {"attempts": 2.5},
        {"attempts": True},
        {"base_delay": math.nan},
        {"max_delay": -0.1},
        {"commit_wait": math.inf},
    ],
)
def test_a_policy_it_could_not_follow_is_refused(setting: dict[str, object]) -> None:
    """A NaN pause would reach `time.sleep` as a `ValueError` at the first lost race."""
    with pytest.raises(InvalidArgument, match=f"RetryPolicy.{next(iter(setting))} must be"):
        RetryPolicy(**setting)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [math.nan, -1.0, math.inf, "1"])
def test_a_branch_cache_lifetime_that_is_not_a_finite_time_is_refused(ttl: object) -> None:
    """Under a NaN lifetime no cached branch record would ever expire."""
    with pytest.raises(InvalidArgument, match="branch_cache_ttl must be a finite number"):
        Lake.connect("memory://", branch_cache_ttl=ttl)  # type: ignore[arg-type]
