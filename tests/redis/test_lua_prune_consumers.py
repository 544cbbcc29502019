"""prune_consumers.lua: delete the group's consumers that own nothing, except the caller.

Contract: number of consumers removed | -2 the stream does not exist.
"""

from __future__ import annotations

from typing import Any

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import add_entries, consumers, keys_for, pending_ids, read_group, set_key, shard

GROUP = "billing"
CALLER = "m-new"


async def prune(scripts: Scripts, stream: str, caller: str = CALLER) -> int:
    return int(await scripts.prune_consumers(keys=[stream], args=[GROUP, caller]))


async def setup(redis: Any, scripts: Scripts, keyspace: Keyspace) -> str:
    stream = keyspace.stream(shard())
    assert await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", GROUP]) == 1
    await add_entries(redis, stream, 10)
    return stream


async def test_deletes_only_idle_consumers_other_than_the_caller(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream = await setup(redis, scripts, keyspace)
    busy = await read_group(redis, stream, GROUP, "busy", 2)
    done = await read_group(redis, stream, GROUP, "done", 2)
    await redis.xack(stream, GROUP, *done)
    await redis.xgroup_createconsumer(stream, GROUP, "never-read")
    partly = await read_group(redis, stream, GROUP, "partly", 3)
    await redis.xack(stream, GROUP, partly[0], partly[2])
    await redis.xgroup_createconsumer(stream, GROUP, CALLER)
    pending_before = await pending_ids(redis, stream, GROUP)

    assert await prune(scripts, stream) == 2

    assert await consumers(redis, stream, GROUP) == {"busy": 2, "partly": 1, CALLER: 0}
    assert await pending_ids(redis, stream, GROUP) == pending_before
    assert set(pending_before) == {*busy, partly[1]}


async def test_keeps_the_caller_with_or_without_pending(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream = await setup(redis, scripts, keyspace)
    await redis.xgroup_createconsumer(stream, GROUP, CALLER)
    assert await prune(scripts, stream) == 0
    assert await consumers(redis, stream, GROUP) == {CALLER: 0}

    await read_group(redis, stream, GROUP, CALLER, 1)
    assert await prune(scripts, stream) == 0
    assert await consumers(redis, stream, GROUP) == {CALLER: 1}


async def test_nothing_to_prune(redis: Any, scripts: Scripts, keyspace: Keyspace) -> None:
    stream = await setup(redis, scripts, keyspace)
    assert await prune(scripts, stream) == 0
    await read_group(redis, stream, GROUP, "a", 1)
    await read_group(redis, stream, GROUP, "b", 1)
    assert await prune(scripts, stream) == 0
    assert await consumers(redis, stream, GROUP) == {"a": 1, "b": 1}


async def test_after_a_takeover_only_the_new_owner_remains_with_every_entry(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream = await setup(redis, scripts, keyspace)
    _, fence, retries = keys_for(keyspace, shard(), GROUP)
    for name in ("old-a", "old-b", "old-c"):
        await read_group(redis, stream, GROUP, name, 2)
    pending = set(await pending_ids(redis, stream, GROUP))
    await redis.set(fence, f"5:{CALLER}")
    cursor = b"0-0"
    while True:
        reply = await scripts.claim(
            keys=[stream, fence, retries], args=[GROUP, CALLER, f"5:{CALLER}", cursor, 2]
        )
        assert reply[0] == 1
        cursor = reply[1]
        if cursor == b"0-0":
            break

    assert await prune(scripts, stream) == 3

    assert await consumers(redis, stream, GROUP) == {CALLER: 6}
    assert await pending_ids(redis, stream, GROUP) == dict.fromkeys(pending, CALLER)


async def test_missing_key_is_reported_and_not_created(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream = keyspace.stream(shard("gone"))
    assert await prune(scripts, stream) == -2
    assert await redis.exists(stream) == 0
