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


async def test_done_removes_an_emptied_stream_only_and_a_later_replay_recreates_it(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """redelivery_done.lua: {1} removed | {0} kept (an entry or one pending) | {-1}
    fenced | {-2} no stream. It and redeliver.lua are single scripts in the shard's
    slot, so a replay is never lost between them: before, it keeps the stream; after,
    it creates it again, from the beginning."""
    sid = shard(index=5)
    stream, target = keyspace.stream(sid), keyspace.redelivery(sid, GROUP)
    fence, retries = keyspace.fence(sid, GROUP), keyspace.redelivery_retries(sid, GROUP)
    await scripts.shard_create(keys=[stream, keyspace.shard_groups(sid)], args=["sealed", GROUP])
    await redis.set(fence, "4:m")

    async def done(token: str = "4:m") -> int:
        return int(
            await scripts.redelivery_done(keys=[target, fence, retries], args=[GROUP, token])
        )

    assert await done() == -2
    [_, entry] = await scripts.redeliver(keys=[stream, target], args=[GROUP, "v", "1"])
    assert await done() == 0  # an entry not read yet
    await redis.xreadgroup(GROUP, "m", {target: ">"})
    await redis.hset(retries, entry, "1:0")
    await redis.xdel(target, entry)
    assert await done() == 0  # deleted, but still pending: not acked yet
    await redis.xack(target, GROUP, entry)
    assert await done("5:other") == -1  # only the owner
    assert await redis.exists(target) == 1
    assert await done() == 1
    assert await redis.exists(target, retries) == 0
    # A replay after the removal: the stream and its group come back, from the start.
    [ok, again] = await scripts.redeliver(keys=[stream, target], args=[GROUP, "v", "2"])
    assert ok == 1
    read = await redis.xreadgroup(GROUP, "m", {target: ">"})
    assert [text(i) for i, _ in read[0][1]] == [text(again)]
