"""Test helpers: waiting on conditions (never sleeping as synchronisation)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout: float = 10.0,
    message: str = "condition",
) -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await anyio.sleep(0.005)


def lease_lost(worker: Any) -> bool:
    """The worker noticed its lease ran out, and no reader still has a wait for new
    entries (with its fenced read queued behind) out on a connection."""
    return bool(worker.lease.losses >= 1 and not any(r.waiting for r in worker.readers.values()))
