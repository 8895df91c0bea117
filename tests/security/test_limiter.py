"""FailureLimiter: failures per address in a sliding window, with an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkaesque.security import FailureLimiter
from kafkaesque.security._limiter import MAX_ADDRESSES


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_blocks_after_limit_failures_until_the_oldest_leaves_the_window() -> None:
    clock = Clock()
    limiter = FailureLimiter(3, 60.0, clock=clock)
    for _ in range(2):
        limiter.failed("10.0.0.1")
        clock.now += 10
    assert limiter.blocked("10.0.0.1") == 0.0
    limiter.failed("10.0.0.1")  # the third, at 1020
    assert limiter.blocked("10.0.0.1") == pytest.approx(40.0)  # the first (1000) leaves at 1060
    assert limiter.blocked("10.0.0.2") == 0.0  # per address
    clock.now = 1059.0
    assert limiter.blocked("10.0.0.1") == pytest.approx(1.0)
    clock.now = 1060.0
    assert limiter.blocked("10.0.0.1") == 0.0
    limiter.failed("10.0.0.1")  # 1010, 1020, 1060: blocked until 1070
    assert limiter.blocked("10.0.0.1") == pytest.approx(10.0)


def test_success_clears() -> None:
    limiter = FailureLimiter(2, 60.0, clock=Clock())
    limiter.failed("a")
    limiter.failed("a")
    assert limiter.blocked("a") > 0
    limiter.succeeded("a")
    assert limiter.blocked("a") == 0.0
    assert len(limiter) == 0
    limiter.succeeded("never-seen")


def test_old_failures_are_forgotten() -> None:
    clock = Clock()
    limiter = FailureLimiter(2, 5.0, clock=clock)
    limiter.failed("a")
    clock.now += 5.0
    limiter.failed("a")
    assert limiter.blocked("a") == 0.0  # the first left the window
    clock.now += 5.0
    assert limiter.blocked("a") == 0.0
    assert len(limiter) == 0  # an address with no recent failure is not kept


def test_memory_is_bounded() -> None:
    clock = Clock()
    limiter = FailureLimiter(1, 60.0, clock=clock)
    for n in range(MAX_ADDRESSES + 50):
        limiter.failed(f"10.{n}")
    assert len(limiter) == MAX_ADDRESSES
    assert limiter.blocked("10.0") == 0.0  # the least recent were forgotten
    assert limiter.blocked(f"10.{MAX_ADDRESSES + 49}") > 0


def test_limit_zero_turns_it_off_and_negatives_are_refused() -> None:
    limiter = FailureLimiter(0, 60.0, clock=Clock())
    for _ in range(100):
        limiter.failed("a")
    assert limiter.blocked("a") == 0.0
    with pytest.raises(ValueError):
        FailureLimiter(-1, 60.0)


@given(
    limit=st.integers(1, 5),
    steps=st.lists(
        st.tuples(st.sampled_from(["fail", "ok", "wait"]), st.floats(0, 30)), max_size=40
    ),
)
def test_never_more_than_limit_failures_in_a_window(
    limit: int, steps: list[tuple[str, float]]
) -> None:
    """A client that only tries when not blocked gets at most `limit` failures per window."""
    clock = Clock()
    window = 60.0
    limiter = FailureLimiter(limit, window, clock=clock)
    attempts: list[float] = []
    for action, dt in steps:
        clock.now += dt
        if action == "wait":
            continue
        wait = limiter.blocked("x")
        assert wait >= 0.0
        if wait > 0:
            continue
        if action == "fail":
            limiter.failed("x")
            attempts.append(clock.now)
            assert sum(1 for t in attempts if t > clock.now - window) <= limit
        else:
            limiter.succeeded("x")
            attempts.clear()
