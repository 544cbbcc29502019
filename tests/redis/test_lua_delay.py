"""delay_add.lua and delay_move.lua: delayed messages wait in their shard's slot and
enter the stream, moved by a shard owner under its fence, once and in order.

Contract (delay_add): {1, entry id, due} due already | {2, delay id, due} stored |
{0, previous} duplicate | {-1} the shard key is gone.
Contract (delay_move): {1, moved, remaining, next due, now, oldest due moved} |
{-1, fence} fenced | {-2} the shard key is gone.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.protocol.envelope import decode_fields, encode_fields
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import set_key, shard, text

pytestmark = pytest.mark.cluster

WINDOW_MS = 60_000
HOUR = 3_600_000


async def redis_now(redis: Any) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Delayed:
    """One shard with two groups (each with an owner fence) and its delayed keys."""

    def __init__(self, redis: Any, scripts: Scripts, keyspace: Keyspace, sid: ShardId) -> None:
        self.redis, self.scripts, self.keyspace, self.sid = redis, scripts, keyspace, sid
        self.stream = keyspace.stream(sid)
        self.zset = keyspace.delayed(sid)
        self.entries = keyspace.delayed_entries(sid)
        self.counter = keyspace.delayed_counter(sid)
        self.wake = keyspace.delayed_wake(sid)
        self.fences = {g: keyspace.fence(sid, g) for g in ("billing", "audit")}

    async def create(self) -> None:
        created = await self.scripts.shard_create(
            keys=[self.stream, set_key(self.stream)], args=["sealed", "billing", "audit"]
        )
        assert created == 1
        for n, (group, fence) in enumerate(self.fences.items(), start=1):
            assert (await self.scripts.fence(keys=[fence, self.stream], args=[n, f"m-{group}"]))[
                0
            ] == 1

    def token(self, group: str) -> str:
        return f"{1 if group == 'billing' else 2}:m-{group}"

    async def add(
        self,
        kind: str,
        ms: int,
        *fields: Any,
        event_id: str | None = None,
        offset: int = 0,
        window: int = WINDOW_MS,
    ) -> list[Any]:
        keys = [self.stream, self.zset, self.entries, self.counter, self.wake]
        if event_id is not None:
            keys.append(self.keyspace.dedup(self.sid, event_id))
        reply = await self.scripts.delay_add(keys=keys, args=[kind, ms, offset, window, *fields])
        return [text(r) if isinstance(r, bytes) else r for r in reply]

    async def move(self, group: str = "billing", *, offset: int = 0, most: int = 100) -> list[Any]:
        reply = await self.scripts.delay_move(
            keys=[self.stream, self.fences[group], self.zset, self.entries],
            args=[self.token(group), offset, most],
        )
        return [text(r) if isinstance(r, bytes) else r for r in reply]

    async def stream_fields(self) -> list[dict[str, bytes]]:
        return [
            {text(k): v for k, v in fields.items()}
            for _, fields in await self.redis.xrange(self.stream)
        ]

    async def waiting(self) -> list[str]:
        return [text(m) for m in await self.redis.zrange(self.zset, 0, -1)]


@pytest.fixture
async def sh(redis: Any, scripts: Scripts, keyspace: Keyspace) -> Delayed:
    d = Delayed(redis, scripts, keyspace, shard())
    await d.create()
    return d


def entry(payload: bytes, key: str | None = None, event_id: str | None = None) -> list[Any]:
    return list(encode_fields(payload, key, event_id, None, 1_000))


# -- delay_add ----------------------------------------------------------------------------
async def test_a_delayed_message_waits_beside_the_stream_until_due(redis: Any, sh: Delayed) -> None:
    before = await redis_now(redis)
    status, delay_id, due = await sh.add("in", HOUR, *entry(b"v1", "k"))
    after = await redis_now(redis)

    assert status == 2
    # Due on the Redis clock: Redis TIME at the add plus the delay.
    assert before + HOUR <= due <= after + HOUR
    assert await redis.xlen(sh.stream) == 0
    assert await sh.waiting() == [delay_id]
    assert int(await redis.zscore(sh.zset, delay_id)) == due
    assert await redis.hexists(sh.entries, delay_id)


async def test_at_is_an_absolute_instant(redis: Any, sh: Delayed) -> None:
    at = await redis_now(redis) + HOUR
    assert (await sh.add("at", at, *entry(b"v")))[::2] == [2, at]


@pytest.mark.parametrize("kind", ["in", "at"])
async def test_a_message_already_due_enters_the_stream_at_once(
    redis: Any, sh: Delayed, kind: str
) -> None:
    ms = 0 if kind == "in" else await redis_now(redis) - HOUR  # a past at=
    status, entry_id, due = await sh.add(kind, ms, *entry(b"now", "k"))

    assert status == 1
    assert [text(i) for i, _ in await redis.xrange(sh.stream)] == [entry_id]
    [fields] = await sh.stream_fields()
    assert fields["v"] == b"now"
    assert int(fields["d"]) == due
    assert await sh.waiting() == []


async def test_a_retired_shard_takes_no_delayed_message(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    gone = Delayed(redis, scripts, keyspace, shard(index=7))  # never created: retired

    assert await gone.add("in", HOUR, *entry(b"v"), event_id="ev-1") == [-1]
    assert await gone.add("in", 0, *entry(b"v")) == [-1]
    for key in (
        gone.stream,
        gone.zset,
        gone.entries,
        gone.counter,
        gone.wake,
        keyspace.dedup(gone.sid, "ev-1"),
    ):
        assert await redis.exists(key) == 0, key


async def test_an_event_id_is_delayed_once(redis: Any, sh: Delayed, keyspace: Keyspace) -> None:
    before = await redis_now(redis)
    status, delay_id, _ = await sh.add("in", HOUR, *entry(b"v", event_id="ev-1"), event_id="ev-1")
    assert status == 2

    assert await sh.add("in", HOUR, *entry(b"v", event_id="ev-1"), event_id="ev-1") == [
        0,
        f"delayed:{delay_id}",
    ]
    assert await sh.add("in", 0, *entry(b"v", event_id="ev-1"), event_id="ev-1") == [
        0,
        f"delayed:{delay_id}",
    ]
    assert await sh.waiting() == [delay_id]
    assert await redis.xlen(sh.stream) == 0
    # The record outlives the wait: it lasts until due plus the dedup window.
    ttl = await redis.pttl(keyspace.dedup(sh.sid, "ev-1"))
    assert HOUR + WINDOW_MS - (await redis_now(redis) - before) - 1000 <= ttl <= HOUR + WINDOW_MS


async def test_delayed_and_immediate_publishes_share_the_dedup_record(
    sh: Delayed, scripts: Scripts, keyspace: Keyspace
) -> None:
    _, first, _ = await sh.add("in", 0, *entry(b"v"), event_id="ev-2")
    assert await sh.add("in", HOUR, *entry(b"v"), event_id="ev-2") == [0, first]
    dup = await scripts.publish_dedup(
        keys=[sh.stream, keyspace.dedup(sh.sid, "ev-3")], args=[WINDOW_MS, *entry(b"v")]
    )
    assert dup[0] == 1
    assert (await sh.add("in", HOUR, *entry(b"v"), event_id="ev-3"))[0] == 0
    assert await sh.waiting() == []


async def test_a_new_earliest_message_wakes_the_owner(redis: Any, sh: Delayed) -> None:
    async def wakes() -> list[int]:
        return [int(f[b"due"]) for _, f in await redis.xrange(sh.wake)]

    _, _, due1 = await sh.add("in", 2 * HOUR, *entry(b"v"))
    assert await wakes() == [due1]
    await sh.add("in", 3 * HOUR, *entry(b"v"))  # later than the head: no wake-up
    assert await wakes() == [due1]
    _, _, due3 = await sh.add("in", HOUR, *entry(b"v"))  # the new head
    assert await wakes() == [due3]  # MAXLEN 1: one entry, the latest
    assert (await redis.xinfo_stream(sh.wake))["entries-added"] == 2


# -- delay_move ---------------------------------------------------------------------------
async def test_nothing_moves_before_it_is_due(redis: Any, sh: Delayed) -> None:
    _, _, due = await sh.add("in", HOUR, *entry(b"v"))

    status, moved, remaining, next_due, now, oldest = await sh.move()

    assert (status, moved, remaining, next_due, oldest) == (1, 0, 1, due, -1)
    assert now < due
    assert await redis.xlen(sh.stream) == 0


async def test_due_messages_enter_the_stream_in_due_order_then_publish_order(
    redis: Any, sh: Delayed
) -> None:
    base = await redis_now(redis) + HOUR
    # Published out of due order; two share a due time (publish order decides).
    for payload, at in ((b"c", base + 20), (b"a1", base), (b"b", base + 10), (b"a2", base)):
        assert (await sh.add("at", at, *entry(payload, "k")))[0] == 2
    later = (await sh.add("at", base + 10 * HOUR, *entry(b"later")))[1]

    status, moved, remaining, next_due, now, oldest = await sh.move(offset=HOUR + 1000)

    assert (status, moved, remaining, next_due, oldest) == (1, 4, 1, base + 10 * HOUR, base)
    assert now >= base + 20
    assert [f["v"] for f in await sh.stream_fields()] == [b"a1", b"a2", b"b", b"c"]
    assert [int(f["d"]) for f in await sh.stream_fields()] == [base, base, base + 10, base + 20]
    assert await sh.waiting() == [later]
    assert await redis.hlen(sh.entries) == 1  # no second copy left behind


async def test_a_moved_entry_is_the_entry_that_was_published(sh: Delayed) -> None:
    payload = bytes(range(256)) + b"\x00\xff" * 100  # binary, with NULs
    headers = {"trace": "t-1"}
    fields = list(encode_fields(payload, "key-1", "ev-9", headers, 1_234))
    await sh.add("in", 5_000, *fields)

    assert (await sh.move(offset=6_000))[1] == 1

    [(_, raw)] = await sh.redis.xrange(sh.stream)
    flat = [x for kv in raw.items() for x in kv]
    envelope = decode_fields(flat)
    assert (envelope.payload, envelope.key, envelope.event_id) == (payload, "key-1", "ev-9")
    assert dict(envelope.headers) == headers
    assert envelope.published_at == 1_234


async def test_a_move_takes_at_most_the_count_asked(redis: Any, sh: Delayed) -> None:
    for n in range(5):
        await sh.add("in", 1_000, *entry(str(n).encode()))

    assert (await sh.move(offset=2_000, most=2))[1:3] == [2, 3]
    assert (await sh.move(offset=2_000, most=2))[1:3] == [2, 1]
    assert (await sh.move(offset=2_000, most=2))[1:4] == [1, 0, -1]
    assert [f["v"] for f in await sh.stream_fields()] == [b"0", b"1", b"2", b"3", b"4"]


async def test_only_an_owner_moves_them(redis: Any, sh: Delayed) -> None:
    await sh.add("in", 1_000, *entry(b"v"))
    stale = await sh.scripts.delay_move(
        keys=[sh.stream, sh.fences["billing"], sh.zset, sh.entries],
        args=["0:m-old-owner", 2_000, 100],
    )

    assert [stale[0], text(stale[1])] == [-1, sh.token("billing")]
    assert await redis.xlen(sh.stream) == 0
    assert len(await sh.waiting()) == 1


async def test_each_message_moves_once_whichever_groups_owner_moves_it(
    redis: Any, sh: Delayed
) -> None:
    for n in range(3):
        await sh.add("in", 1_000, *entry(str(n).encode()))

    assert (await sh.move("audit", offset=2_000))[1] == 3
    assert (await sh.move("billing", offset=2_000))[1] == 0
    assert await redis.xlen(sh.stream) == 3


async def test_a_retired_shard_moves_nothing(redis: Any, sh: Delayed) -> None:
    await sh.add("in", 1_000, *entry(b"v"))
    await redis.delete(sh.stream)

    assert await sh.move(offset=2_000) == [-2]
    assert await redis.exists(sh.stream) == 0


async def test_an_undecodable_entry_is_moved_as_poison_not_dropped(redis: Any, sh: Delayed) -> None:
    _, delay_id, _ = await sh.add("in", 1_000, *entry(b"v"))
    await redis.hset(sh.entries, delay_id, b"\xc1not msgpack")  # corrupted by hand

    assert (await sh.move(offset=2_000))[1] == 1
    [fields] = await sh.stream_fields()
    assert fields == {"delayed-undecodable": b"\xc1not msgpack"}
    assert await sh.waiting() == []


async def test_many_messages_of_one_due_time_keep_their_publish_order(
    redis: Any, sh: Delayed
) -> None:
    at = await redis_now(redis) + HOUR
    for n in range(20):  # ids past one hex digit: they must still sort as published
        await sh.add("at", at, *entry(str(n).encode()))

    assert (await sh.move(offset=HOUR + 1000))[1] == 20
    assert [f["v"] for f in await sh.stream_fields()] == [str(n).encode() for n in range(20)]
