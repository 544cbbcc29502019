"""``Scripts.fenced_read``: ``read_gate.lua`` + ``XREADGROUP`` + ``read_ungate.lua`` in
one ``MULTI``/``EXEC`` — the consume hot path's read (docs/protocol.md#fences-and-tokens:
a member whose ownership was taken away cannot pull new entries, even paused past its
lease).

Contract: ``(ENTRIES, entries)`` | ``(IDLE, last_entry_id)`` | ``(FENCED, current
fence)`` | ``(RETIRED, None)`` | ``(UNCHECKED, the gate's error)``; ``NOGROUP`` raises.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from redis.exceptions import ResponseError

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import ReadStatus, Scripts
from tests.support import wait_for

from .streams import (
    add_entries,
    consumers,
    groups,
    pending_ids,
    set_key,
    shard,
    text,
    true_lag,
    xread_blocked,
)

GROUP = "billing"
MEMBER = "m-1"
TOKEN = "7:m-1"

pytestmark = pytest.mark.cluster  # also on a Redis Cluster (make test)


async def fenced_shard(redis: Any, scripts: Scripts, keyspace: Keyspace) -> list[Any]:
    """A shard with GROUP created and fenced for TOKEN: its ``fenced_read`` keys."""
    sid = shard()
    stream = keyspace.stream(sid)
    assert await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", GROUP]) == 1
    await redis.set(keyspace.fence(sid, GROUP), TOKEN)
    return [stream, keyspace.fence(sid, GROUP), keyspace.read_hold(sid)]


async def read(scripts: Scripts, keys: list[Any], *, token: str = TOKEN, count: int = 10) -> Any:
    return await scripts.fenced_read(keys, GROUP, MEMBER, token, count)


async def test_the_owner_reads_new_entries_and_then_waits_after_the_last(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys = await fenced_shard(redis, scripts, keyspace)
    stream = keys[0]
    assert await read(scripts, keys) == (ReadStatus.IDLE, b"0-0")  # empty stream
    ids = await add_entries(redis, stream, 5)

    status, entries = await read(scripts, keys, count=3)
    assert status == ReadStatus.ENTRIES
    assert [text(e[0]) for e in entries] == ids[:3]
    assert [e[1] for e in entries] == [[b"n", b"1"], [b"n", b"2"], [b"n", b"3"]]
    status, entries = await read(scripts, keys)
    assert [text(e[0]) for e in entries] == ids[3:]
    assert await read(scripts, keys) == (ReadStatus.IDLE, ids[-1].encode())
    assert set(await pending_ids(redis, stream, GROUP)) == set(ids)
    assert (await groups(redis, stream))[GROUP]["lag"] == 0


async def test_a_member_whose_grant_was_replaced_takes_nothing_and_the_stream_stays_whole(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys = await fenced_shard(redis, scripts, keyspace)
    stream, fence, hold = keys
    await redis.xgroup_create(stream, "other-group", id="0")
    ids = await add_entries(redis, stream, 4)
    before = await groups(redis, stream)
    await redis.set(fence, "8:m-2")  # a newer grant

    assert await read(scripts, keys) == (ReadStatus.FENCED, b"8:m-2")

    # Nothing pulled: no pending entry, no consumer created, the group's position and
    # lag untouched; the stream is back under its own name with every group, and the
    # hold key is gone.
    assert await pending_ids(redis, stream, GROUP) == {}
    assert await consumers(redis, stream, GROUP) == {}
    assert await groups(redis, stream) == before
    assert await true_lag(redis, stream, GROUP) == 4
    assert await redis.exists(hold) == 0
    assert [text(i) for i, _ in await redis.xrange(stream)] == ids
    # The new owner reads them all.
    status, entries = await read(scripts, keys, token="8:m-2")
    assert status == ReadStatus.ENTRIES and [text(e[0]) for e in entries] == ids


async def test_no_fence_at_all_refuses_too(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys = await fenced_shard(redis, scripts, keyspace)
    await add_entries(redis, keys[0], 2)
    await redis.delete(keys[1])
    assert await read(scripts, keys) == (ReadStatus.FENCED, b"")
    assert await pending_ids(redis, keys[0], GROUP) == {}
    assert await redis.exists(keys[0]) == 1


async def test_a_retired_shard_is_reported_and_never_recreated(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys = await fenced_shard(redis, scripts, keyspace)
    await redis.delete(keys[0])
    assert await read(scripts, keys) == (ReadStatus.RETIRED, None)
    assert await redis.exists(keys[0]) == 0
    assert await redis.exists(keys[2]) == 0


async def test_a_missing_consumer_group_raises_nogroup(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys = await fenced_shard(redis, scripts, keyspace)
    await redis.xgroup_destroy(keys[0], GROUP)
    with pytest.raises(ResponseError, match="NOGROUP"):
        await read(scripts, keys)


async def test_a_gate_that_fails_leaves_the_read_unchecked_for_a_takeover_round(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """The gate fails (here: the fence key holds the wrong type) after the transaction
    was queued, so the read ran: the caller is told not to process it (UNCHECKED); its
    entries stay pending, for the fenced claim."""
    keys = await fenced_shard(redis, scripts, keyspace)
    [only] = await add_entries(redis, keys[0], 1)
    await redis.delete(keys[1])
    await redis.hset(keys[1], "not", "a fence")
    status, error = await read(scripts, keys)
    assert status == ReadStatus.UNCHECKED and isinstance(error, ResponseError)
    assert await pending_ids(redis, keys[0], GROUP) == {only: MEMBER}


async def test_a_stream_left_on_the_hold_key_is_moved_back_by_the_next_read(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """A transaction is all or nothing, so the hold key never outlives one; if it ever
    did (a server fault between the two scripts), the next gate moves it back rather
    than report the shard retired."""
    keys = await fenced_shard(redis, scripts, keyspace)
    ids = await add_entries(redis, keys[0], 2)
    await redis.rename(keys[0], keys[2])
    status, entries = await read(scripts, keys)
    assert status == ReadStatus.ENTRIES and [text(e[0]) for e in entries] == ids
    assert await redis.exists(keys[2]) == 0


async def test_the_read_queued_behind_a_blocking_wait_is_gated_when_the_wait_returns(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """``after=XREAD BLOCK``: the transaction sent behind the wait on the same
    connection runs when an entry arrives, and its gate checks the fence at that
    moment: a grant replaced while the member waited takes nothing."""
    keys = await fenced_shard(redis, scripts, keyspace)
    stream = keys[0]
    [first] = await add_entries(redis, stream, 1)
    assert (await read(scripts, keys))[0] == ReadStatus.ENTRIES
    replies: list[Any] = []

    async def wait_and_read() -> None:
        wait = ["XREAD", "BLOCK", 5000, "COUNT", 1, "STREAMS", stream, first]
        replies.append(await scripts.fenced_read(keys, GROUP, MEMBER, TOKEN, 10, after=wait))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_and_read)
        await wait_for(lambda: xread_blocked(redis, stream), message="the XREAD to block")
        await redis.set(keys[1], "9:m-3")  # the grant moves on while the member waits
        await add_entries(redis, stream, 1, start=2)
    assert replies == [(ReadStatus.FENCED, b"9:m-3")]
    assert set(await pending_ids(redis, stream, GROUP)) == {first}
    assert await redis.exists(stream) == 1
