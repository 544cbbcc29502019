"""A schedules-only app for the end-to-end tests: a tick every second to ``ticks``.

Run as ``streamworks worker tests.e2e.apps.scheduled:app``. It does not consume the
stream: the test reads the entries back from Redis. ``catch_up="all"``, so every
tick since the schedule started must be in the stream exactly once, whatever
happened to the workers.

A deterministic pause point for killing an owner mid-tick (``E2E_PAUSE_DIR``): the
first process whose schedule runner reaches step ``<step>`` (``claim`` or
``publish``, see ``streamworks.runtime.ticks.PAUSE``) while the file
``<dir>/arm-<step>`` exists removes it, writes ``<dir>/paused-<step>`` (its pid and
the tick) and waits for ever, shielded, for the test's SIGKILL. Every other process
and every other tick passes.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import anyio

from streamworks import App, Tick
from streamworks.runtime import ticks

GROUP = os.environ.get("E2E_GROUP", "e2e-schedules")
STREAM = "ticks"
SHARDS = 3

app = App(GROUP)
app.stream(STREAM, shards=SHARDS)


@app.schedule("every-second", stream=STREAM, every=timedelta(seconds=1), catch_up="all")
def every_second(tick: Tick) -> None:
    return None  # the Tick itself


async def _pause(step: str, schedule: str, tick: int) -> None:
    folder = os.environ.get("E2E_PAUSE_DIR")
    if not folder:
        return
    try:
        (Path(folder) / f"arm-{step}").unlink()  # only one process wins
    except FileNotFoundError:
        return
    (Path(folder) / f"paused-{step}").write_text(f"{os.getpid()} {tick}")
    with anyio.CancelScope(shield=True):
        await anyio.sleep_forever()


ticks.PAUSE = _pause
