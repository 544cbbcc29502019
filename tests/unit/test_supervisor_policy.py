"""The supervisor's restart and give-up policy (pure: no processes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from streamworks.cli.supervisor import (
    CrashBudget,
    child_environments,
    describe_exit,
    restart_delay,
)
from streamworks.settings import Settings, SupervisorSettings


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


def test_children_share_the_environment_when_the_worker_serves_no_http() -> None:
    envs = child_environments({"A": "1"}, Settings(), 2)
    if hasattr(Settings().worker, "http_port"):  # the worker's HTTP endpoint exists
        assert [e["STREAMWORKS_WORKER__HTTP_PORT"] for e in envs] == [
            str(Settings().worker.http_port + i) for i in range(2)
        ]
    else:
        assert envs == [{"A": "1"}, {"A": "1"}]


def test_each_child_gets_its_own_http_port() -> None:
    worker = SimpleNamespace(http_port=9400, http_host="0.0.0.0", http_enabled=True)
    envs = child_environments({"A": "1"}, cast(Any, SimpleNamespace(worker=worker)), 3)
    assert [e["STREAMWORKS_WORKER__HTTP_PORT"] for e in envs] == ["9400", "9401", "9402"]
    assert all(e["STREAMWORKS_WORKER__HTTP_HOST"] == "0.0.0.0" for e in envs)
    assert all(e["STREAMWORKS_WORKER__HTTP_ENABLED"] == "true" for e in envs)
    assert all(e["A"] == "1" for e in envs)


def test_port_zero_stays_any_free_port_for_every_child() -> None:
    worker = SimpleNamespace(http_port=0, http_host=None, http_enabled=None)
    envs = child_environments({}, cast(Any, SimpleNamespace(worker=worker)), 2)
    assert [e["STREAMWORKS_WORKER__HTTP_PORT"] for e in envs] == ["0", "0"]
