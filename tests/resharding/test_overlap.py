"""A scale-out requested while a scale-in still drains (E13), in-process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from streamworks.protocol.shards import ShardId
from streamworks.testing import TestRuntime
from tests.resharding.helpers import (
    blocked,
    draining,
    fence_of,
    keys_on,
    phase,
    probe_app,
    retired,
    wait_for,
)


@pytest.mark.seed("E13")
async def test_scale_out_during_a_draining_scale_in(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """4 -> 2 while the handlers of shards 2 and 3 are held back (their entries stay
    pending past the routing fence), then 2 -> 5 at once: the new shards 2..4 get a new
    incarnation, so their keys never collide with the draining 2@0 and 3@0, and they
    are created with the group's consumer group before routing points at them. The old
    entries stay where they are; once the handlers are released the draining shards are
    retired, the scale-out layout stays, and every message was handled on the shard it
    was published to."""
    app, probe = probe_app("g", {"o": 4}, concurrency=16)
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        gates = {f"o/{i}@0": anyio.Event() for i in (2, 3)}
        probe.gates.update(gates)
        sent: dict[str, str] = {}
        for i in range(4):
            for n, key in enumerate(keys_on(i, 4, n=5)):
                p = await app.publish("o", {"id": f"old-{i}-{n}"}, key=key)
                sent[f"old-{i}-{n}"] = p.shard
        first = await service.scale_stream("o", 2)
        assert draining(first) == ["o/2@0", "o/3@0"]

        async def still_draining() -> Any:
            info = await service.stream_info("o")
            reasons = blocked(info)
            if phase(info) == "DRAINING" and all("pending" in reasons.get(s, "") for s in gates):
                return info
            return None

        await wait_for(still_draining, 10, "the drain check to find 2@0 and 3@0 pending")
        second = await service.scale_stream("o", 5)
        assert second.shard_count == 5
        routing = await service.routing("o")
        assert [s.shard for s in routing.shards] == ["o/0@0", "o/1@0", "o/2@1", "o/3@1", "o/4@1"]
        assert draining(second) == ["o/2@0", "o/3@0"]
        assert second.migration is not None and first.migration is not None
        assert fence_of(second) >= fence_of(first)
        old = {s: rt.keyspace.stream(ShardId.parse(s)) for s in ("o/2@0", "o/3@0")}
        new = {s.shard: s.key for s in routing.shards[2:]}
        assert len(set(old.values()) | set(new.values())) == 5  # no key shared
        assert await rt.redis.exists(*old.values(), *new.values()) == 5
        for key in new.values():
            [group] = await rt.redis.xinfo_groups(key)
            assert (group["name"], group["pending"], group["lag"]) == (b"g", 0, 0)
        for key in old.values():
            assert await rt.redis.xlen(key) == 5  # still there, never moved

        # The app's producer picks the new routing up within its routing lease.
        assert rt.connection is not None
        source = rt.connection.routing

        async def refreshed() -> bool:
            return (await source.routing("o")).shard_count == 5

        await wait_for(refreshed, 5, "the producer to refresh its routing", interval=0.05)
        for i in range(5):
            for n, key in enumerate(keys_on(i, 5, n=5)):
                p = await app.publish("o", {"id": f"new-{i}-{n}"}, key=key)
                sent[f"new-{i}-{n}"] = p.shard
        assert {s for i, s in sent.items() if i.startswith("new-")} == set(routing_ids(routing))
        assert draining(await service.stream_info("o")) == ["o/2@0", "o/3@0"]
        for gate in gates.values():
            gate.set()

        async def complete() -> Any:
            info = await service.stream_info("o")
            done = not draining(info) and phase(info) == "NONE" and probe.ids() == set(sent)
            return info if done else None

        info = await wait_for(complete, 15, "the scale-in to complete and everything handled")
        assert [s.shard for s in info.shards] == ["o/0@0", "o/1@0", "o/2@1", "o/3@1", "o/4@1"]
        assert info.migration is not None
        assert retired(info) == ["o/2@0", "o/3@0"]
        assert await rt.redis.exists(*old.values()) == 0
        assert await rt.redis.exists(*new.values()) == 3
    assert probe.shard_of() == sent
    assert len(probe.handled) == len(sent)


def routing_ids(routing: Any) -> list[str]:
    return [s.shard for s in routing.shards]
