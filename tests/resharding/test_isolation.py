"""One stream's trouble does not hold up another stream's migration, in-process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from streamworks.protocol.shards import ShardId
from streamworks.testing import TestRuntime
from tests.resharding.helpers import draining, keys_on, phase, probe_app, wait_for


@pytest.mark.seed("E21")
async def test_a_stream_with_lost_metadata_does_not_stall_other_migrations(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """Stream ``a-lost`` is registered but its metadata was deleted (the coordinator
    fails closed on it, E21, until an operator re-initialises it). Stream ``b`` sorts
    after it; its 2 -> 1 scale-in still completes: every replica's loop checks each
    stream on its own."""
    app, probe = probe_app("g", {"b": 2})
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        await service.create_stream("a-lost", 1)
        await rt.redis.delete(rt.keyspace.stream_meta("a-lost"))
        for n in range(10):
            await app.publish("b", {"id": f"m{n}"}, key=keys_on(1, 2)[0])
        await service.scale_stream("b", 1)

        async def complete() -> Any:
            info = await service.stream_info("b")
            return info if not draining(info) and phase(info) == "NONE" else None

        await wait_for(complete, 10, "b's scale-in to complete")
        assert not await rt.redis.exists(rt.keyspace.stream(ShardId("b", 1, 0)))
    assert len(probe.ids()) == 10
