"""claim.lua: fenced takeover of a group's pending entries with their retry records.

Contract: {1, next_cursor, entries, retry_records} | {-1, current_fence} | {-2}.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import add_entries, groups, keys_for, pending_ids, read_group, set_key, shard, text

GROUP = "billing"
NEW_OWNER = "m-new"
TOKEN = "9:m-new"

pytestmark = pytest.mark.cluster  # also on a Redis Cluster (make test)


async def shard_with_pending(
    redis: Any, keyspace: Keyspace, scripts: Scripts, deliveries: dict[str, int]
) -> tuple[tuple[str, str, str], dict[str, str]]:
    """A fenced shard whose group has pending entries: ``deliveries`` maps consumer
    name -> how many entries it read (in that order). Returns keys and {id: consumer}."""
    keys = keys_for(keyspace, shard(), GROUP)
    stream, fence_key, _ = keys
    assert await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", GROUP]) == 1
    await add_entries(redis, stream, sum(deliveries.values()) + 2)  # 2 never delivered
    for consumer, n in deliveries.items():
        assert len(await read_group(redis, stream, GROUP, consumer, n)) == n
    await redis.set(fence_key, TOKEN)
    pending = await pending_ids(redis, stream, GROUP)
    assert len(pending) == sum(deliveries.values())
    return keys, pending


async def claim(
    scripts: Scripts,
    keys: tuple[str, str, str],
    cursor: str = "0-0",
    count: int = 100,
    token: str = TOKEN,
) -> list[Any]:
    return await scripts.claim(keys=list(keys), args=[GROUP, NEW_OWNER, token, cursor, count])


async def claim_all(scripts: Scripts, keys: tuple[str, str, str], count: int) -> list[list[Any]]:
    """Loop on the cursor until '0-0'; every reply, in order."""
    replies: list[list[Any]] = []
    cursor = "0-0"
    while True:
        reply = await claim(scripts, keys, cursor, count)
        assert reply[0] == 1, reply
        replies.append(reply)
        cursor = text(reply[1])
        if cursor == "0-0":
            return replies
        assert len(replies) < 100, "the cursor never came back to 0-0"


async def test_claims_other_consumers_pending_entries(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys, pending = await shard_with_pending(redis, keyspace, scripts, {"old-a": 2, "old-b": 1})
    stream = keys[0]

    status, cursor, entries, records = await claim(scripts, keys)

    assert (status, cursor) == (1, b"0-0")
    assert [text(e[0]) for e in entries] == sorted(pending, key=lambda i: int(i.split("-")[0]))
    assert [e[1] for e in entries] == [[b"n", b"1"], [b"n", b"2"], [b"n", b"3"]]
    assert records == [b"", b"", b""]
    assert await pending_ids(redis, stream, GROUP) == dict.fromkeys(pending, NEW_OWNER)
    # Claiming does not deliver anything new: the group's position is unchanged.
    g = (await groups(redis, stream))[GROUP]
    assert (g["last-delivered-id"], g["lag"], g["pending"]) == ("3-0", 2, 3)


async def test_cursor_loop_with_small_count_covers_every_pending_entry_once(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys, pending = await shard_with_pending(
        redis, keyspace, scripts, {"old-a": 3, NEW_OWNER: 2, "old-b": 4}
    )
    # Out-of-order acks leave holes in the pending list.
    await redis.xack(keys[0], GROUP, "2-0", "6-0")
    del pending["2-0"], pending["6-0"]

    replies = await claim_all(scripts, keys, count=2)

    assert len(replies) > 1
    seen = collections.Counter(text(e[0]) for r in replies for e in r[2])
    assert seen == collections.Counter(pending.keys())
    assert all(n == 1 for n in seen.values())
    assert all(len(r[2]) <= 2 and len(r[3]) == len(r[2]) for r in replies)
    assert await pending_ids(redis, keys[0], GROUP) == dict.fromkeys(pending, NEW_OWNER)


async def test_returns_each_entrys_retry_record(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys, _ = await shard_with_pending(redis, keyspace, scripts, {"old-a": 4})
    retries = keys[2]
    await redis.hset(retries, mapping={"2-0": "3:1700000000000", "4-0": "1:1700000005000"})

    replies = await claim_all(scripts, keys, count=3)

    got = {text(e[0]): rec for r in replies for e, rec in zip(r[2], r[3], strict=True)}
    assert got == {
        "1-0": b"",
        "2-0": b"3:1700000000000",
        "3-0": b"",
        "4-0": b"1:1700000005000",
    }
    # Records of live entries are kept: the new owner resumes the backoff from them.
    assert await redis.hgetall(retries) == {b"2-0": b"3:1700000000000", b"4-0": b"1:1700000005000"}


@pytest.mark.parametrize(
    "current",
    [
        pytest.param("10:m-other", id="newer-owner"),
        pytest.param("9:m-other", id="same-epoch-other-member"),
        pytest.param(None, id="fence-missing"),
    ],
)
async def test_refuses_when_fenced_and_moves_nothing(
    redis: Any, scripts: Scripts, keyspace: Keyspace, current: str | None
) -> None:
    keys, pending = await shard_with_pending(redis, keyspace, scripts, {"old-a": 3})
    stream, fence_key, retries = keys
    await redis.hset(retries, "1-0", "2:1")
    if current is None:
        await redis.delete(fence_key)
    else:
        await redis.set(fence_key, current)

    reply = await claim(scripts, keys)

    assert reply == [-1, (current or "").encode()]
    assert await pending_ids(redis, stream, GROUP) == pending
    assert all(owner == "old-a" for owner in pending.values())
    assert await redis.hgetall(retries) == {b"1-0": b"2:1"}


async def test_missing_key_is_reported_and_not_created(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    keys = keys_for(keyspace, shard(), GROUP)
    await redis.set(keys[1], TOKEN)

    assert await claim(scripts, keys) == [-2]
    assert await redis.exists(keys[0]) == 0


async def test_deleted_pending_entry_is_dropped_with_its_retry_record(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """XAUTOCLAIM (7.0+) drops ids deleted from the stream from the PEL and reports
    them; their retry records must go too, or they leak forever."""
    keys, _ = await shard_with_pending(redis, keyspace, scripts, {"old-a": 5})
    stream, _, retries = keys
    await redis.hset(retries, mapping={"2-0": "1:10", "4-0": "2:20", "5-0": "1:30"})
    assert await redis.xdel(stream, "2-0", "4-0") == 2

    replies = await claim_all(scripts, keys, count=2)

    claimed = [text(e[0]) for r in replies for e in r[2]]
    assert claimed == ["1-0", "3-0", "5-0"]
    records = [rec for r in replies for rec in r[3]]
    assert records == [b"", b"", b"1:30"]
    assert await redis.hgetall(retries) == {b"5-0": b"1:30"}
    assert await pending_ids(redis, stream, GROUP) == dict.fromkeys(claimed, NEW_OWNER)
