"""The newcomer's path: ``make demo`` (``python -m examples.orders.demo``).

It runs last among the end-to-end tests (see ``conftest.py``): an embedded Redis, a
coordinator and three workers as processes, 20,000 orders, one worker SIGKILLed
halfway, and every order accounted for at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import REPO, spawn


@pytest.mark.seed("E8")
@pytest.mark.timeout(150)
async def test_demo_runs_to_ok_within_two_minutes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMWORKS_")}
    env |= {"PYTHONPATH": str(REPO), "COLUMNS": "120"}
    demo = spawn("demo", ["-m", "examples.orders.demo"], env, tmp_path)
    try:
        code = await demo.wait_exit(120)
    finally:
        # Whatever happened, nothing the demo started outlives the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)
        demo.popen.wait()
    output = demo.output()
    assert code == 0, output[-4000:]
    assert "OK: nothing lost" in output
    assert "failover after" in output
