"""The benchmarks' machine probes (``bench/_broker_procs.py``)."""

from __future__ import annotations

from bench._broker_procs import StealWindow


def test_steal_is_the_hypervisors_share_of_all_cpu_time_in_the_window() -> None:
    # user, nice, system, idle, iowait, irq, softirq, steal
    samples = iter([[100, 0, 10, 500, 0, 0, 0, 40], [160, 0, 20, 590, 0, 0, 0, 70]])
    window = StealWindow(lambda: next(samples))
    assert window.percent() == 100 * 30 / 190  # 30 stolen of 60 + 10 + 90 + 30 ticks


def test_a_quiet_machine_says_so_and_a_contended_one_warns() -> None:
    quiet = iter([[0] * 8, [100, 0, 0, 100, 0, 0, 0, 0]])
    assert "(quiet)" in str(StealWindow(lambda: next(quiet)))
    busy = iter([[0] * 8, [80, 0, 0, 100, 0, 0, 0, 20]])
    assert "unreliable" in str(StealWindow(lambda: next(busy)))


def test_the_real_machine_can_be_read() -> None:
    assert 0 <= StealWindow().percent() <= 100
