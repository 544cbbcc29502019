"""The supervisor's restart and give-up policy (pure: no processes)."""

from __future__ import annotations

from streamworks.cli.supervisor import CrashBudget, describe_exit, restart_delay
from streamworks.settings import SupervisorSettings


def test_restart_delay_doubles_up_to_the_maximum() -> None:
    s = SupervisorSettings(restart_delay=0.5, restart_delay_max=3)
    assert [restart_delay(s, n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_the_budget_is_exhausted_by_one_crash_more_than_max_within_the_window() -> None:
    budget = CrashBudget(SupervisorSettings(max_crashes=2, crash_window=10))
    assert budget.record(0.0) is False
    assert budget.record(5.0) is False
    assert budget.record(9.0) is True  # three within 10 s


def test_crashes_older_than_the_window_are_forgotten() -> None:
    budget = CrashBudget(SupervisorSettings(max_crashes=2, crash_window=10))
    for t in (0.0, 5.0, 11.0, 16.0, 22.0):  # never three within 10 s
        assert budget.record(t) is False
    assert budget.recent == 2


def test_max_crashes_zero_gives_up_at_the_first_crash() -> None:
    assert CrashBudget(SupervisorSettings(max_crashes=0)).record(0.0) is True


def test_exit_codes_and_signals_are_described() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-9) == "killed by SIGKILL"
