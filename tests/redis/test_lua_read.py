"""read.lua: fenced XREADGROUP of new entries on one shard.

Contract: {1, entries} | {0, last_entry_id} | {-1, current_fence} | {-2}.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from tests.support import wait_for

from .streams import (
    add_entries,
    consumers,
    groups,
    keys_for,
    pending_ids,
    set_key,
    shard,
    text,
    xread_blocked,
)

GROUP = "billing"
MEMBER = "m-1"
TOKEN = "7:m-1"

pytestmark = pytest.mark.cluster  # also on a Redis Cluster (make test)


async def fenced_shard(
    redis: Any, scripts: Scripts, keyspace: Keyspace, *, fence: str | None = TOKEN
) -> tuple[str, str]:
    """A shard with GROUP created, and its fence set to ``fence`` (absent if None)."""
    stream, fence_key, _ = keys_for(keyspace, shard(), GROUP)
    assert await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", GROUP]) == 1
    if fence is not None:
        await redis.set(fence_key, fence)
    return stream, fence_key


async def read(
    scripts: Scripts,
    stream: str,
    fence_key: str,
    *,
    token: str = TOKEN,
    count: int = 10,
    consumer: str = MEMBER,
) -> list[Any]:
    return await scripts.read(keys=[stream, fence_key], args=[GROUP, consumer, token, count])


async def test_returns_new_entries_and_advances_group(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream, fence_key = await fenced_shard(redis, scripts, keyspace)
    ids = await add_entries(redis, stream, 5)

    status, entries = await read(scripts, stream, fence_key, count=3)

    assert status == 1
    assert [text(e[0]) for e in entries] == ids[:3]
    assert [e[1] for e in entries] == [[b"n", b"1"], [b"n", b"2"], [b"n", b"3"]]
    g = (await groups(redis, stream))[GROUP]
    assert g["last-delivered-id"] == ids[2]
    assert g["pending"] == 3
    assert g["lag"] == 2
    assert await pending_ids(redis, stream, GROUP) == dict.fromkeys(ids[:3], MEMBER)

    status, entries = await read(scripts, stream, fence_key, count=3)
    assert status == 1
    assert [text(e[0]) for e in entries] == ids[3:]
    assert (await groups(redis, stream))[GROUP]["last-delivered-id"] == ids[4]


async def test_nothing_new_returns_the_last_entry_id(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream, fence_key = await fenced_shard(redis, scripts, keyspace)
    ids = await add_entries(redis, stream, 3)
    status, _ = await read(scripts, stream, fence_key)
    assert status == 1
    before = await groups(redis, stream)

    reply = await read(scripts, stream, fence_key)

    assert reply == [0, ids[-1].encode()]
    ((last_id, _),) = await redis.xrevrange(stream, "+", "-", count=1)
    assert reply[1] == last_id
    assert await groups(redis, stream) == before


async def test_nothing_new_after_every_entry_was_trimmed_returns_zero_id(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream, fence_key = await fenced_shard(redis, scripts, keyspace)
    ids = await add_entries(redis, stream, 3)
    assert (await read(scripts, stream, fence_key))[0] == 1
    await redis.xack(stream, GROUP, *ids)
    assert await redis.xtrim(stream, minid="4-0") == 3

    assert await read(scripts, stream, fence_key) == [0, b"0-0"]


async def test_nothing_new_on_an_empty_stream_returns_zero_id(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream, fence_key = await fenced_shard(redis, scripts, keyspace)

    assert await read(scripts, stream, fence_key) == [0, b"0-0"]
    g = (await groups(redis, stream))[GROUP]
    assert (g["pending"], g["last-delivered-id"], g["lag"]) == (0, "0-0", 0)


@pytest.mark.parametrize(
    ("current", "token"),
    [
        pytest.param("8:m-2", TOKEN, id="newer-owner"),
        pytest.param("7:m-2", TOKEN, id="same-epoch-other-member"),
        pytest.param("6:m-1", TOKEN, id="older-token-in-fence"),
        pytest.param(None, TOKEN, id="fence-missing"),
    ],
)
async def test_refuses_when_fenced_and_delivers_nothing(
    redis: Any, scripts: Scripts, keyspace: Keyspace, current: str | None, token: str
) -> None:
    stream, fence_key = await fenced_shard(redis, scripts, keyspace, fence=current)
    await add_entries(redis, stream, 3)
    before = await groups(redis, stream)

    reply = await read(scripts, stream, fence_key, token=token)

    assert reply == [-1, (current or "").encode()]
    assert await groups(redis, stream) == before
    g = (await groups(redis, stream))[GROUP]
    assert (g["pending"], g["last-delivered-id"], g["lag"]) == (0, "0-0", 3)
    assert await pending_ids(redis, stream, GROUP) == {}
    # Not even an empty consumer was created for the refused caller.
    assert await consumers(redis, stream, GROUP) == {}
    assert await redis.get(fence_key) == (current.encode() if current else None)


async def test_fenced_after_the_owner_moved_on_keeps_earlier_deliveries_intact(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream, fence_key = await fenced_shard(redis, scripts, keyspace)
    ids = await add_entries(redis, stream, 4)
    assert (await read(scripts, stream, fence_key, count=2))[0] == 1
    await redis.set(fence_key, "8:m-2")

    assert await read(scripts, stream, fence_key) == [-1, b"8:m-2"]

    g = (await groups(redis, stream))[GROUP]
    assert g["last-delivered-id"] == ids[1]
    assert await pending_ids(redis, stream, GROUP) == dict.fromkeys(ids[:2], MEMBER)
    # The new owner then gets the rest, and only the rest.
    reply = await read(scripts, stream, fence_key, token="8:m-2", consumer="m-2")
    assert reply[0] == 1
    assert [text(e[0]) for e in reply[1]] == ids[2:]


async def test_missing_key_is_reported_and_not_created(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream, fence_key, _ = keys_for(keyspace, shard(), GROUP)
    await redis.set(fence_key, TOKEN)

    assert await read(scripts, stream, fence_key) == [-2]
    assert await redis.exists(stream) == 0


async def test_retired_key_is_not_resurrected(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    stream, fence_key = await fenced_shard(redis, scripts, keyspace)
    await add_entries(redis, stream, 2)
    await redis.delete(stream)

    assert await read(scripts, stream, fence_key) == [-2]
    assert await redis.exists(stream) == 0


async def test_the_hot_path_call_matches_the_script_object_and_reloads_on_noscript(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """``Scripts.call`` (hand-packed EVALSHA, used by the reader) answers exactly what
    redis-py's script object answers, and loads the script again after the server's
    script cache was flushed (a restarted or failed-over server)."""
    stream, fence_key = await fenced_shard(redis, scripts, keyspace)
    ids = await add_entries(redis, stream, 4)
    first = await scripts.call("read", [stream, fence_key], [GROUP, MEMBER, TOKEN, 2])
    assert first[0] == 1 and [text(e[0]) for e in first[1]] == ids[:2]
    await redis.script_flush()
    second = await scripts.call("read", [stream, fence_key], [GROUP, MEMBER, TOKEN, 2])
    assert second[0] == 1 and [text(e[0]) for e in second[1]] == ids[2:]
    assert await scripts.call("read", [stream, fence_key], [GROUP, MEMBER, TOKEN, 2]) == [
        0,
        ids[3].encode(),
    ]
    assert await scripts.call("read", [stream, fence_key], [GROUP, MEMBER, "8:x", 2]) == [
        -1,
        TOKEN.encode(),
    ]


async def test_the_read_queued_behind_a_blocking_wait_runs_when_the_wait_returns(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """``Scripts.call_after``: the fenced read sent behind ``XREAD BLOCK`` on the same
    connection runs as soon as an entry arrives (one reply for both), checks the fence
    at that moment, and survives a flushed script cache (NOSCRIPT: load, read again)."""
    stream, fence_key = await fenced_shard(redis, scripts, keyspace)
    [first] = await add_entries(redis, stream, 1)
    keys: list[Any] = [stream, fence_key]
    assert (await scripts.call("read", keys, [GROUP, MEMBER, TOKEN, 10]))[0] == 1

    async def wait_and_read(token: str) -> list[Any]:
        wait = ["XREAD", "BLOCK", 5000, "COUNT", 1, "STREAMS", stream, first]
        result: list[Any] = await scripts.call_after(wait, "read", keys, [GROUP, MEMBER, token, 10])
        return result

    async with anyio.create_task_group() as tg:
        replies: list[list[Any]] = []

        async def waiter() -> None:
            replies.append(await wait_and_read(TOKEN))

        tg.start_soon(waiter)

        await wait_for(
            lambda: xread_blocked(redis, stream), message="the XREAD to block"
        )  # (the read is queued)
        assert replies == []
        [second] = await add_entries(redis, stream, 1, start=2)
    [[status, entries]] = replies
    assert status == 1 and [text(e[0]) for e in entries] == [second]

    await redis.script_flush()
    [third] = await add_entries(redis, stream, 1, start=3)
    status, entries = await wait_and_read(TOKEN)
    assert status == 1 and [text(e[0]) for e in entries] == [third]
    # A replaced grant: the wait returns, the read behind it is refused.
    await add_entries(redis, stream, 1, start=4)
    assert (await wait_and_read("8:m-2"))[0] == -1
