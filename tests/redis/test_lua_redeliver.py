"""redeliver.lua: add a replayed dead letter to one group's redelivery stream of a
live shard.

Contract: {1, entry_id} | {-2} (the shard key does not exist).
"""

from __future__ import annotations

from typing import Any

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import groups, shard, text

GROUP = "billing"


async def test_adds_the_fields_and_creates_the_group_from_the_start(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sid = shard()
    stream, target = keyspace.stream(sid), keyspace.redelivery(sid, GROUP)
    assert (
        await scripts.shard_create(
            keys=[stream, keyspace.shard_groups(sid)], args=["sealed", GROUP]
        )
        == 1
    )
    first = await scripts.redeliver(keys=[stream, target], args=[GROUP, "v", "1", "k", "a"])
    second = await scripts.redeliver(keys=[stream, target], args=[GROUP, "v", "2"])
    assert [first[0], second[0]] == [1, 1]
    entries = await redis.xrange(target)
    assert [text(i) for i, _ in entries] == [text(first[1]), text(second[1])]
    assert entries[0][1] == {b"v": b"1", b"k": b"a"}
    # The group starts at 0: both entries are still to be read, by GROUP only.
    assert set(await groups(redis, target)) == {GROUP}
    read = await redis.xreadgroup(GROUP, "m", {target: ">"})
    assert len(read[0][1]) == 2


async def test_refuses_a_retired_shard_and_writes_nothing(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    sid = shard(index=3)
    stream, target = keyspace.stream(sid), keyspace.redelivery(sid, GROUP)
    assert await scripts.redeliver(keys=[stream, target], args=[GROUP, "v", "1"]) == [-2]
    assert not await redis.exists(target)
