"""A scale-in whose removed shard reports a wrong lag after a Redis < 7.4 restart
(PROTOCOL §6 step 2), through the real coordinator's drain check: the check repairs
the lag (counted in ``streamworks_drain_repairs_total``, named in the blocked reason)
and retires the shard on a later check. ``tests/redis/test_restart_repair.py``
produces the state with a real AOF reload; here it is set as the reload leaves it
(position kept, ``entries-read`` back at 0), on either server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from streamworks.protocol.shards import ShardId
from streamworks.testing import TestRuntime
from tests.resharding.helpers import draining, keys_on, probe_app, wait_for


@pytest.mark.seed("E11")
async def test_a_lag_lost_by_a_restart_is_repaired_and_the_shard_retired_later(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, probe = probe_app("g", {"s": 2}, ordering="none")
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        [key] = keys_on(1, 2)
        sent = [f"m{i}" for i in range(5)]
        for i in sent:
            await app.publish("s", {"id": i}, key=key)
        await wait_for(lambda: probe.ids() == set(sent), 10, "every message handled")
        await rt.stop_worker(0)
        stream = rt.keyspace.stream(ShardId("s", 1, 0))
        [group] = await rt.redis.xinfo_groups(stream)
        assert group["pending"] == 0 and group["lag"] == 0
        # What an AOF reload on Redis < 7.4 leaves: the position, not the read counter.
        await rt.redis.execute_command(
            "XGROUP", "SETID", stream, "g", group["last-delivered-id"], "ENTRIESREAD", 0
        )
        [group] = await rt.redis.xinfo_groups(stream)
        assert group["lag"] == 5, "precondition: lag wrong on a fully read shard"

        def repairs() -> float:
            value = service.metrics.registry.get_sample_value(
                "streamworks_drain_repairs_total", {"stream": "s"}
            )
            return value or 0.0

        await service.scale_stream("s", 1)

        async def retired() -> Any:
            info = await service.stream_info("s")
            return info if not draining(info) else None

        await wait_for(retired, 15, "the removed shard to be retired")
        assert repairs() == 1
        assert not await rt.redis.exists(stream)
        assert len(probe.handled) == len(sent)  # nothing read twice, nothing lost
