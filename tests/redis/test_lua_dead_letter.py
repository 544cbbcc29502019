"""dead_letter.lua and retry_record.lua: dead letters at most once, retry records only
by the owner.

Contracts: dead_letter.lua {1, id} written now | {0, id} written before;
retry_record.lua {1, value} | {-1, current_fence}.
"""

from __future__ import annotations

from typing import Any

from redis.crc import key_slot

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import keys_for, shard

GROUP = "billing"
TOKEN = "7:m-1"
TTL_MS = 60_000


def marker_and_dlq(keyspace: Keyspace, entry_id: str = "1-0") -> tuple[str, str]:
    return (
        keyspace.dead_letter_marker(GROUP, "orders", keyspace.stream(shard()), entry_id),
        keyspace.dead_letters(GROUP, "orders"),
    )


async def test_the_marker_shares_the_dead_letter_streams_slot(keyspace: Keyspace) -> None:
    marker, dlq = marker_and_dlq(keyspace)
    assert key_slot(marker.encode()) == key_slot(dlq.encode())
    assert key_slot(marker.encode()) != key_slot(keyspace.stream(shard()).encode())


async def test_a_dead_letter_is_written_once_per_entry(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    marker, dlq = marker_and_dlq(keyspace)
    first = await scripts.dead_letter(keys=[marker, dlq], args=[TTL_MS, "reason", "x", "n", "1"])
    again = await scripts.dead_letter(keys=[marker, dlq], args=[TTL_MS, "reason", "x", "n", "2"])
    assert first[0] == 1 and again == [0, first[1]]
    entries = await redis.xrange(dlq)
    assert [(i, f) for i, f in entries] == [(first[1], {b"reason": b"x", b"n": b"1"})]
    assert await redis.get(marker) == first[1]
    assert 0 < await redis.pttl(marker) <= TTL_MS
    # Another entry of the shard has its own marker.
    other, _ = marker_and_dlq(keyspace, "2-0")
    assert (await scripts.dead_letter(keys=[other, dlq], args=[TTL_MS, "n", "3"]))[0] == 1
    assert await redis.xlen(dlq) == 2


async def test_a_retry_record_is_written_only_under_the_callers_fence(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    _, fence, retries = keys_for(keyspace, shard(), GROUP)
    await redis.set(fence, TOKEN)
    keys = [fence, retries]
    assert await scripts.retry_record(keys=keys, args=[TOKEN, "set", "1-0", "1:5"]) == [1, 1]
    assert await scripts.retry_record(keys=keys, args=[TOKEN, "incr", "1-0:runs", 1]) == [1, 1]
    assert await scripts.retry_record(keys=keys, args=[TOKEN, "incr", "1-0:runs", 1]) == [1, 2]
    assert await redis.hgetall(retries) == {b"1-0": b"1:5", b"1-0:runs": b"2"}

    await redis.set(fence, "8:m-2")  # the shard moved on
    stale = [
        await scripts.retry_record(keys=keys, args=[TOKEN, "set", "1-0", "dlq:{}"]),
        await scripts.retry_record(keys=keys, args=[TOKEN, "incr", "1-0:runs", 1]),
    ]
    assert stale == [[-1, b"8:m-2"], [-1, b"8:m-2"]]
    await redis.delete(fence)  # retired: no fence at all
    assert await scripts.retry_record(keys=keys, args=[TOKEN, "set", "2-0", "1:5"]) == [-1, b""]
    assert await redis.hgetall(retries) == {b"1-0": b"1:5", b"1-0:runs": b"2"}
