"""Handler failures that must be failed attempts like any other, and that crashed the
worker before the bad-input suite found them (regression tests). Each scenario runs
in a child process (``crash_scenarios.py``) on the test Redis with a real coordinator
and worker; the expectation is the one every other failure meets: the runtime
survives, the bad message is retried then dead-lettered with a readable error, and
the good message published after it is handled.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.badinput import crash_scenarios
from tests.badinput.support import REPO, child_env

BUGS: dict[str, str] = {}  # scenario -> the product bug that makes it fail (none left)


@pytest.fixture(scope="module")
def outcomes(streamworks_redis_url: str) -> dict[str, dict[str, Any]]:
    """Run every scenario once, in child processes: one for all of them, and a new one
    for those left whenever a scenario hangs (the child reports it and exits)."""
    results: dict[str, dict[str, Any]] = {}
    left = list(crash_scenarios.SCENARIOS)
    while left:
        done = subprocess.run(
            [sys.executable, "-m", "tests.badinput.crash_scenarios", streamworks_redis_url, *left],
            env=child_env({}),
            cwd=REPO,
            capture_output=True,
            timeout=240,
            check=False,
        )
        for line in done.stdout.decode().splitlines():
            result = json.loads(line)
            results[result["name"]] = result
        progress = [name for name in left if name in results]
        assert progress, done.stderr.decode()[-3000:]
        left = [name for name in left if name not in results]
    return results


@pytest.mark.timeout(300)  # the first one also runs the module's child processes
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=[pytest.mark.xfail(strict=True, reason=f"product bug: {BUGS[name]}")]
            if name in BUGS
            else [],
        )
        for name in crash_scenarios.SCENARIOS
    ],
)
def test_the_worker_survives_and_the_message_ends_in_the_dead_letters(
    name: str, outcomes: dict[str, dict[str, Any]]
) -> None:
    result = outcomes[name]
    assert result["survived"] and result["raised"] is None, result
    assert result["idle"], result
    if name == "publish_sync in a sync handler":
        assert result["dead"] == [] and result["statistics"]["failed"] == 0
        outs = sorted(h for h in result["handled"] if h.startswith("out:"))
        assert outs == sorted(f"out:{m}:{i}" for m in ("bad", "good") for i in range(10))
        return
    [[reason, attempts, error]] = result["dead"]
    assert (reason, attempts) == ("max_attempts", 2)
    assert error  # something readable about the failure
    assert result["handled"] == ["good"]
