"""TestRuntime itself: a worker that crashes fails the test with the worker's error,
and the runtime still cleans up after itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from streamworks import App
from streamworks.testing import TestRuntime


async def _keys(redis_url: str, prefix: str) -> list[bytes]:
    client: Any = aioredis.from_url(redis_url)
    try:
        found: list[bytes] = []
        for pattern in (f"{prefix}:*", f"{{{prefix}:*", f"{{{prefix}}}*"):
            found += [key async for key in client.scan_iter(match=pattern)]
        return found
    finally:
        await client.aclose()


async def test_a_crashed_worker_fails_the_test_with_its_error_and_cleans_up(
    streamworks_runtime: Callable[..., TestRuntime], streamworks_redis_url: str
) -> None:
    app = App("crashing")
    app.stream("s", shards=2)

    @app.handler("s")
    async def handle(value: Any) -> None: ...

    class WorkerBug(Exception):
        pass

    async def bug() -> None:
        raise WorkerBug("a bug in the worker")

    rt = streamworks_runtime(app, workers=2)
    prefix = rt.settings.key_prefix
    reached_after = False

    async def run() -> None:
        nonlocal reached_after
        async with rt:
            await app.publish("s", {"n": 1})
            await rt.wait_idle()
            assert await _keys(streamworks_redis_url, prefix)
            # A task of the worker raises: the runtime's task group cancels the test.
            worker_tg = rt.slots[0].worker._tg
            assert worker_tg is not None
            worker_tg.start_soon(bug)
            await anyio.sleep_forever()
            reached_after = True

    with pytest.raises(BaseExceptionGroup) as raised:
        await run()
    assert not reached_after
    assert raised.value.subgroup(WorkerBug) is not None, raised.value
    assert await _keys(streamworks_redis_url, prefix) == []  # cleaned up all the same
