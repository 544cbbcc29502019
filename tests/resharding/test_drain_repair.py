"""A scale-in whose removed shard reports a wrong lag after a Redis < 7.4 restart
(docs/protocol.md#migrations,
the drain check), through the real coordinator's drain check: the check repairs
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

        def repairs() -> float:
            value = service.metrics.registry.get_sample_value(
                "streamworks_drain_repairs_total", {"stream": "s"}
            )
            return value or 0.0

        # Removed first: the event loop's repair of ACTIVE shards (lag_repair.py) would
        # otherwise mend the lag broken below before the drain check sees it (it did,
        # once, on a loaded machine). Broken inside the stream's critical section, so
        # the drain check (which takes it, and waits for the 2 s routing fence anyway)
        # cannot look in between.
        await service.scale_stream("s", 1)
        async with service.discipline.critical(rt.keyspace.stream_mutex("s")):
            # What an AOF reload on Redis < 7.4 leaves: the position, not the read counter.
            await rt.redis.execute_command(
                "XGROUP", "SETID", stream, "g", group["last-delivered-id"], "ENTRIESREAD", 0
            )
            [group] = await rt.redis.xinfo_groups(stream)
            assert group["lag"] == 5, "precondition: lag wrong on a fully read shard"
        assert repairs() == 0

        async def retired() -> Any:
            info = await service.stream_info("s")
            return info if not draining(info) else None

        await wait_for(retired, 15, "the removed shard to be retired")
        assert repairs() == 1
        assert not await rt.redis.exists(stream)
        assert len(probe.handled) == len(sent)  # nothing read twice, nothing lost


async def test_the_event_loop_repairs_the_lag_of_an_active_shard(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """A shard that stays ACTIVE, read to the end, whose lag a Redis < 7.4 restart broke:
    the coordinator's event loop makes it exact again (``lag_repair.py``), counted; the
    group's position is untouched and nothing is read again. (The repair runs only on
    servers that lose the counter; it is switched on here, so that the test runs on any.)"""
    app, probe = probe_app("g", {"s": 2}, ordering="none")
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        service.resharder.lag_repair.needed = True
        [key] = keys_on(1, 2)
        sent = [f"m{i}" for i in range(5)]
        for i in sent:
            await app.publish("s", {"id": i}, key=key)
        await wait_for(lambda: probe.ids() == set(sent), 10, "every message handled")
        stream = rt.keyspace.stream(ShardId("s", 1, 0))
        [group] = await rt.redis.xinfo_groups(stream)
        assert group["pending"] == 0 and group["lag"] == 0
        position = group["last-delivered-id"]
        # What the reload leaves, and the lag it shows, in one transaction (the loop's
        # pass may run at any moment).
        async with rt.redis.pipeline(transaction=True) as pipe:
            pipe.execute_command("XGROUP", "SETID", stream, "g", position, "ENTRIESREAD", 0)
            pipe.xinfo_groups(stream)
            _, [broken] = await pipe.execute()
        assert broken["lag"] == 5, "precondition: lag wrong on a fully read shard"

        async def lag_of_shard_1() -> Any:
            info = await service.status()
            [s] = [s for s in info.streams if s.name == "s"]
            [shard] = [x for x in s.shards if x.shard == "s/1@0"]
            return shard.groups[0].lag

        async def repaired() -> bool:
            return await lag_of_shard_1() == 0

        await wait_for(repaired, 15, "the loop to repair the active shard's lag")
        value = service.metrics.registry.get_sample_value(
            "streamworks_drain_repairs_total", {"stream": "s"}
        )
        assert value == 1
        [group] = await rt.redis.xinfo_groups(stream)
        assert group["last-delivered-id"] == position and group["pending"] == 0
        assert len(probe.handled) == len(sent)
