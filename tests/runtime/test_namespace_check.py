"""Namespace identity in one process: a new grant and a routing fetch re-check the
namespace id in the member's own Redis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from streamworks import App
from streamworks.exceptions import NamespaceMismatchError
from streamworks.testing import TestRuntime


def app_of(shards: int) -> App:
    app = App("ns")
    app.stream("orders", shards=shards)

    @app.handler("orders")
    async def handle(order: dict[str, Any]) -> None:
        pass

    return app


async def test_the_coordinator_returns_the_id_its_redis_holds(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    async with streamworks_runtime(app_of(1)) as rt:
        assert rt.service is not None
        stored = await rt.redis.get(rt.keyspace.namespace())
        assert stored is not None and stored.decode() == rt.service.state.namespace_id
        assert (await rt.service.routing("orders")).namespace_id == rt.service.state.namespace_id


async def test_a_new_grant_is_checked_again(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """The id changes under a running worker (as if it had been moved to another
    namespace); the next new shard it is granted makes it refuse."""

    async def scenario() -> None:
        async with streamworks_runtime(app_of(1)) as rt:
            worker = rt.workers[0]
            assert len(worker.readers) == 1
            await rt.redis.set(rt.keyspace.namespace(), "another-namespace")
            await rt.scale("orders", 2, wait=False)
            # The worker raises in the runtime's task group, which cancels this wait
            # and raises the error on exit (a timeout here would fail the test).
            with anyio.fail_after(10):
                await worker.stopped.wait()

    with pytest.raises(BaseExceptionGroup) as caught:
        await scenario()
    mismatch = caught.value.subgroup(NamespaceMismatchError)
    assert mismatch is not None, caught.value
    assert "holds namespace another-namespace" in str(_leaf(mismatch))


async def test_a_routing_fetch_is_checked(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    async with streamworks_runtime(app_of(1), workers=0) as rt:
        app = rt.app
        await app.publish("orders", {"n": 1})  # the right namespace publishes
        await rt.redis.delete(rt.keyspace.namespace())
        assert rt.connection is not None
        rt.connection.routing.invalidate("orders", 2**31)
        with pytest.raises(NamespaceMismatchError, match="holds no namespace id"):
            await app.publish("orders", {"n": 2})


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
