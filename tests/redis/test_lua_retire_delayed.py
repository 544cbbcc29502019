"""retire.lua with a shard's delayed set among the keys that must be empty: a delayed
message is a drain blocker, named in the reason, until it has entered the stream and
been handled; then the shard retires and its delayed keys go with it.

Contract: {2} already gone | {1} drained (and retired when asked) | {0, reasons}.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.protocol.envelope import encode_fields
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import read_group, set_key, shard, text

pytestmark = pytest.mark.cluster

GROUP = "billing"
HOUR = 3_600_000


class Draining:
    def __init__(self, redis: Any, scripts: Scripts, keyspace: Keyspace) -> None:
        self.redis, self.scripts = redis, scripts
        self.sid = shard(index=3)
        self.stream = keyspace.stream(self.sid)
        self.groups = keyspace.shard_groups(self.sid)
        self.fence = keyspace.fence(self.sid, GROUP)
        self.redelivery = keyspace.redelivery(self.sid, GROUP)
        self.delayed = keyspace.delayed(self.sid)
        self.entries = keyspace.delayed_entries(self.sid)
        self.counter = keyspace.delayed_counter(self.sid)
        self.wake = keyspace.delayed_wake(self.sid)

    async def create(self) -> None:
        keys = [self.stream, set_key(self.stream)]
        assert await self.scripts.shard_create(keys=keys, args=["sealed", GROUP]) == 1
        assert (await self.scripts.fence(keys=[self.fence, self.stream], args=[1, "m"]))[0] == 1

    async def add(self, delay_ms: int) -> list[Any]:
        fields = encode_fields(b"v", "k", None, None, 1)
        return list(
            await self.scripts.delay_add(
                keys=[self.stream, self.delayed, self.entries, self.counter, self.wake],
                args=["in", delay_ms, 0, 0, *fields],
            )
        )

    async def move(self, offset: int) -> int:
        reply = await self.scripts.delay_move(
            keys=[self.stream, self.fence, self.delayed, self.entries], args=["1:m", offset, 100]
        )
        return int(reply[1])

    async def retire(self, mode: str = "retire", *, with_delayed: bool = True) -> list[Any]:
        # Phase 2's drain_check: the delayed set joins the keys that must be empty, its
        # entries and counter the keys deleted with the shard.
        blockers = [self.redelivery, self.delayed] if with_delayed else [self.redelivery]
        extra = [self.fence, self.entries, self.counter, self.wake]
        reply = await self.scripts.retire(
            keys=[self.stream, self.groups, *blockers, *extra], args=[mode, len(blockers), GROUP]
        )
        return [text(r) if isinstance(r, bytes) else r for r in reply]


@pytest.fixture
async def sh(redis: Any, scripts: Scripts, keyspace: Keyspace) -> Draining:
    d = Draining(redis, scripts, keyspace)
    await d.create()
    return d


async def test_a_delayed_message_blocks_retirement_and_is_named(redis: Any, sh: Draining) -> None:
    _, _, due = await sh.add(HOUR)

    status, reason = await sh.retire()

    assert status == 0
    assert f"{sh.delayed} holds 1 delayed message(s) not in the stream yet" in reason
    assert f"next due at {due} ms" in reason
    assert await redis.exists(sh.stream, sh.delayed, sh.entries) == 3


async def test_the_check_counts_every_delayed_message(sh: Draining) -> None:
    for _ in range(3):
        await sh.add(HOUR)
    status, reason = await sh.retire("check")
    assert status == 0
    assert "holds 3 delayed message(s)" in reason


async def test_once_moved_and_handled_the_shard_retires_with_its_delayed_keys(
    redis: Any, sh: Draining
) -> None:
    await sh.add(1_000)
    assert (await sh.retire())[0] == 0

    assert await sh.move(offset=2_000) == 1
    # In the stream now, not handled yet: still not drained (the group's lag).
    status, reason = await sh.retire()
    assert status == 0
    assert "delayed" not in reason

    ids = await read_group(redis, sh.stream, GROUP, "m", 10)
    await redis.xack(sh.stream, GROUP, *ids)
    assert await sh.retire() == [1]
    for key in (sh.stream, sh.delayed, sh.entries, sh.counter, sh.wake, sh.fence):
        assert await redis.exists(key) == 0, key
    # A stale producer's delayed publish now fails like XADD NOMKSTREAM.
    assert await sh.add(HOUR) == [-1]
    assert await redis.exists(sh.delayed, sh.counter, sh.wake) == 0


async def test_an_empty_delayed_set_does_not_block(redis: Any, sh: Draining) -> None:
    # Never used (no key at all): the drained shard retires as before.
    assert await sh.retire() == [1]
    assert await redis.exists(sh.stream) == 0


async def test_without_the_delayed_set_in_its_keys_the_script_cannot_see_it(
    redis: Any, sh: Draining
) -> None:
    """Why phase 2 must pass it: today's caller (redelivery streams only) would retire a
    shard that still holds a delayed message, and delete nothing of it (an orphan)."""
    await sh.add(HOUR)
    status = (await sh.retire("check", with_delayed=False))[0]
    assert status == 1
