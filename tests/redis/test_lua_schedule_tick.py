"""schedule_tick.lua: a schedule's tick state, fenced by its owner, and the three-step
publish of a tick (claim, publish with the tick's event id, done) that keeps exactly
one message per tick across owner crashes, stale owners, retries and a scale-in of
the target stream between the claim and the publish.

Contract: see the script's header. On a cluster the schedule shard and the target
shards are in different slots: every script call stays in one.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.protocol.envelope import encode_fields
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.schedule import tick_event_id

from .streams import set_key, text

pytestmark = pytest.mark.cluster

GROUP = "billing"
NAME = "hourly"
HOUR = 3_600_000
DEDUP_MS = 86_400_000


def decoded(reply: list[Any]) -> list[Any]:
    return [text(r) if isinstance(r, bytes) else r for r in reply]


class Scheduler:
    """The schedule shard of GROUP with an owner fence, and two target shards."""

    def __init__(self, redis: Any, scripts: Scripts, keyspace: Keyspace) -> None:
        self.redis, self.scripts, self.keyspace = redis, scripts, keyspace
        self.shard = keyspace.schedule_shard(1)
        self.fence = keyspace.fence(self.shard, GROUP)
        self.state = keyspace.schedule_state(self.shard, GROUP, NAME)
        self.names = keyspace.schedules(self.shard, GROUP)
        self.targets = [ShardId("reports", i, 1) for i in range(2)]

    async def create(self) -> None:
        for sid in [self.shard, *self.targets]:
            stream = self.keyspace.stream(sid)
            assert await self.scripts.shard_create(
                keys=[stream, set_key(stream)], args=["sealed", GROUP]
            )
        await self.grant(1, "m1")

    async def grant(self, epoch: int, member: str) -> str:
        stream = self.keyspace.stream(self.shard)
        reply = await self.scripts.fence(keys=[self.fence, stream], args=[epoch, member])
        assert reply[0] == 1
        return f"{epoch}:{member}"

    async def call(self, token: str, mode: str, *args: Any, offset: int = 0) -> list[Any]:
        reply = await self.scripts.schedule_tick(
            keys=[self.fence, self.state, self.names], args=[token, offset, mode, NAME, *args]
        )
        return decoded(reply)

    async def publish(self, shard: ShardId, tick: int) -> list[Any]:
        """What every attempt of a tick sends: publish_dedup with the tick's event id."""
        event = tick_event_id(GROUP, NAME, tick)
        fields = encode_fields(b"{}", NAME, event, None, tick)
        reply = await self.scripts.publish_dedup(
            keys=[self.keyspace.stream(shard), self.keyspace.dedup(shard, event)],
            args=[DEDUP_MS, *fields],
        )
        return decoded(reply)

    async def publish_tick(
        self, token: str, tick: int, routed: ShardId, *, offset: int, crash_after: str = ""
    ) -> str:
        """The owner's protocol for one tick (the reference phase 2 follows). Returns how
        it ended: 'done', 'already', 'fenced', or the step it 'crashed' after."""
        claim = await self.call(token, "claim", tick, str(routed), 0, offset=offset)
        if claim[0] == -1:
            return "fenced"
        if claim[0] == 2:
            return "already"
        if claim[0] == 0:  # an earlier tick (or this one) is pending: finish it first
            tick, shard = int(claim[1]), ShardId.parse(claim[2])
        else:
            shard = routed
        if crash_after == "claim":
            return "crashed"
        published = await self.publish(shard, tick)
        if published[0] == -1:  # that shard was retired before the tick reached it
            moved = await self.call(token, "reroute", tick, str(shard), str(routed))
            if moved[0] == 2:
                return "already"
            shard = ShardId.parse(moved[1])
            published = await self.publish(shard, tick)
        if crash_after == "publish":
            return "crashed"
        outcome = "published" if published[0] == 1 else "duplicate"
        done = await self.call(token, "done", tick, published[1], outcome, tick + HOUR)
        return "done" if done[0] == 1 else "already"

    async def entries(self, shard: ShardId) -> list[str]:
        rows = await self.redis.xrange(self.keyspace.stream(shard))
        return [text(fields[b"e"]) for _, fields in rows]

    async def all_entries(self) -> list[str]:
        return [e for s in self.targets for e in await self.entries(s)]

    async def field(self, name: str) -> str | None:
        value = await self.redis.hget(self.state, name)
        return None if value is None else text(value)


@pytest.fixture
async def sch(redis: Any, scripts: Scripts, keyspace: Keyspace) -> Scheduler:
    s = Scheduler(redis, scripts, keyspace)
    await s.create()
    return s


async def opened(sch: Scheduler, token: str = "1:m1") -> int:
    """Open the schedule; returns its initial last tick (Redis now)."""
    status, now, last, pending, shard = await sch.call(token, "open", "every 1h", "reports")
    assert (status, pending, shard) == (1, "", "")
    assert int(last) == now
    return now


def next_hour(ms: int) -> int:
    return (ms // HOUR + 1) * HOUR


# -- the script ---------------------------------------------------------------------------
async def test_open_starts_a_new_schedule_now_and_lists_it(sch: Scheduler) -> None:
    now = await opened(sch)

    assert await sch.field("spec") == "every 1h"
    assert await sch.field("stream") == "reports"
    assert {text(n) for n in await sch.redis.smembers(sch.names)} == {NAME}
    # Opening again (a restart, a new owner) keeps the state.
    status, _, last, _, _ = await sch.call("1:m1", "open", "every 1h", "reports", offset=HOUR)
    assert (status, int(last)) == (1, now)


async def test_a_tick_is_never_claimed_before_it_is_due(sch: Scheduler) -> None:
    now = await opened(sch)
    tick = now + HOUR // 2  # never reached in real time during the test

    status, at = await sch.call("1:m1", "claim", tick, "reports/0@1", 0)
    assert status == -3 and at < tick
    assert await sch.field("pending") is None
    assert (await sch.call("1:m1", "claim", tick, "reports/0@1", 0, offset=HOUR))[0] == 1
    assert await sch.field("pending") == str(tick)
    assert await sch.field("shard") == "reports/0@1"


async def test_one_tick_pending_at_a_time_and_done_once(sch: Scheduler) -> None:
    now = await opened(sch)
    t1, t2 = next_hour(now), next_hour(now) + HOUR
    off = 2 * HOUR + 1000
    assert (await sch.call("1:m1", "claim", t1, "reports/0@1", 0, offset=off))[0] == 1

    assert await sch.call("1:m1", "claim", t2, "reports/1@1", 0, offset=off) == [
        0,
        str(t1),
        "reports/0@1",
    ]
    assert (await sch.call("1:m1", "done", t2, "9-0", "published", 0))[0] == 0  # not claimed
    assert (await sch.call("1:m1", "done", t1, "1-0", "published", t2))[0] == 1
    assert await sch.call("1:m1", "done", t1, "1-0", "published", t2) == [2, str(t1)]
    assert await sch.call("1:m1", "claim", t1, "reports/0@1", 0, offset=off) == [2, str(t1)]
    assert (await sch.field("last"), await sch.field("next")) == (str(t1), str(t2))
    assert (await sch.field("published"), await sch.field("last_entry")) == ("1", "1-0")


async def test_catch_up_skips_are_counted(sch: Scheduler) -> None:
    now = await opened(sch)
    tick = next_hour(now) + 2 * HOUR  # the latest of three missed ticks
    off = 3 * HOUR + 1000
    assert (await sch.call("1:m1", "claim", tick, "reports/0@1", 2, offset=off))[0] == 1
    assert await sch.field("skipped") == "2"


async def test_reroute_is_a_compare_and_set(sch: Scheduler) -> None:
    now = await opened(sch)
    tick = next_hour(now)
    await sch.call("1:m1", "claim", tick, "reports/0@1", 0, offset=HOUR)

    assert await sch.call("1:m1", "reroute", tick, "reports/0@1", "reports/1@1") == [
        1,
        "reports/1@1",
    ]
    # A second retrier that still believed in the first shard ends on the same one.
    assert await sch.call("1:m1", "reroute", tick, "reports/0@1", "reports/0@2") == [
        0,
        "reports/1@1",
    ]
    assert await sch.field("shard") == "reports/1@1"


async def test_only_the_owner_writes(sch: Scheduler) -> None:
    now = await opened(sch)
    await sch.grant(2, "m2")  # the shard moved on to m2

    for mode, args in (
        ("open", ("every 1h", "reports")),
        ("plan", (now + HOUR,)),
        ("claim", (next_hour(now), "reports/0@1", 0)),
        ("reroute", (next_hour(now), "reports/0@1", "reports/1@1")),
        ("done", (next_hour(now), "1-0", "published", 0)),
    ):
        assert await sch.call("1:m1", mode, *args, offset=HOUR) == [-1, "2:m2"], mode
    assert await sch.field("pending") is None
    assert (await sch.call("2:m2", "plan", now + HOUR))[0] == 1
    assert await sch.field("next") == str(now + HOUR)


# -- exactly one message per tick -------------------------------------------------------
@pytest.mark.parametrize("crash_after", ["claim", "publish"])
async def test_an_owner_that_dies_mid_tick_leaves_it_to_the_next_owner_once(
    sch: Scheduler, crash_after: str
) -> None:
    now = await opened(sch)
    tick = next_hour(now)
    routed = sch.targets[0]

    ended = await sch.publish_tick("1:m1", tick, routed, offset=HOUR, crash_after=crash_after)
    assert ended == "crashed"
    token = await sch.grant(2, "m2")  # the coordinator hands the shard over
    assert await sch.publish_tick(token, tick, routed, offset=HOUR) == "done"
    # The old owner comes back and retries: fenced.
    assert await sch.publish_tick("1:m1", tick, routed, offset=HOUR) == "fenced"

    assert await sch.all_entries() == [tick_event_id(GROUP, NAME, tick)]
    assert await sch.field("last") == str(tick)
    outcome = "duplicate" if crash_after == "publish" else "published"
    assert await sch.field(outcome) == "1"


async def test_a_stale_owner_paused_after_its_claim_cannot_add_a_second_message(
    sch: Scheduler,
) -> None:
    """The stale owner's publish is not fenced (another slot), but it goes to the shard
    recorded with the claim, under the tick's event id: the dedup record there holds."""
    now = await opened(sch)
    tick = next_hour(now)
    routed = sch.targets[0]
    assert (await sch.call("1:m1", "claim", tick, str(routed), 0, offset=HOUR))[0] == 1
    # m1 pauses here. m2 takes over and publishes the tick.
    token = await sch.grant(2, "m2")
    assert await sch.publish_tick(token, tick, sch.targets[1], offset=HOUR) == "done"
    # m1 wakes up and sends the publish it was about to send.
    assert (await sch.publish(routed, tick))[0] == 0

    assert await sch.all_entries() == [tick_event_id(GROUP, NAME, tick)]


async def test_a_scale_in_between_claim_and_publish_moves_the_tick_once(
    sch: Scheduler,
) -> None:
    now = await opened(sch)
    tick = next_hour(now)
    old, new = sch.targets
    await sch.publish_tick("1:m1", tick, old, offset=HOUR, crash_after="claim")
    await sch.redis.delete(sch.keyspace.stream(old))  # retired (drained: it never got it)

    token = await sch.grant(2, "m2")
    assert await sch.publish_tick(token, tick, new, offset=HOUR) == "done"
    assert await sch.publish_tick(token, tick, new, offset=HOUR) == "already"

    assert await sch.entries(new) == [tick_event_id(GROUP, NAME, tick)]
    assert await sch.field("last_shard") == str(new)


async def test_a_retired_shard_that_took_the_tick_is_not_published_again(
    sch: Scheduler,
) -> None:
    """The tick reached the shard, then the shard was drained and retired before the
    owner recorded it: the dedup record (it outlives the shard) says so."""
    now = await opened(sch)
    tick = next_hour(now)
    old, new = sch.targets
    await sch.publish_tick("1:m1", tick, old, offset=HOUR, crash_after="publish")
    assert await sch.entries(old) == [tick_event_id(GROUP, NAME, tick)]
    await sch.redis.delete(sch.keyspace.stream(old))

    token = await sch.grant(2, "m2")
    assert await sch.publish_tick(token, tick, new, offset=HOUR) == "done"

    assert await sch.entries(new) == []
    assert await sch.field("duplicate") == "1"


async def test_every_tick_of_a_catch_up_is_published_once(sch: Scheduler) -> None:
    """Several ticks in a row, with an owner change and a crash in the middle."""
    now = await opened(sch)
    ticks = [next_hour(now) + i * HOUR for i in range(5)]
    off = 5 * HOUR + 1000
    routed = sch.targets[1]
    assert await sch.publish_tick("1:m1", ticks[0], routed, offset=off) == "done"
    assert await sch.publish_tick("1:m1", ticks[1], routed, offset=off) == "done"
    await sch.publish_tick("1:m1", ticks[2], routed, offset=off, crash_after="publish")
    token = await sch.grant(2, "m2")
    for tick in ticks[1:]:  # the new owner starts again from what it believes
        await sch.publish_tick(token, tick, routed, offset=off)
    for tick in ticks:
        assert await sch.publish_tick(token, tick, routed, offset=off) == "already"

    assert await sch.entries(routed) == [tick_event_id(GROUP, NAME, t) for t in ticks]
