"""Delayed messages end to end in a TestRuntime (real Redis, real coordinator):
``delay=``/``at=`` on every publishing path, never delivered early, delivered when the
clock is advanced or real time passes, dedup by event id, their place in their key's
order, and a scale-in that waits for them (docs/delays.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from streamworks import App, Message
from streamworks.exceptions import ConfigurationError
from streamworks.protocol.routing import jump_hash, key_hash
from streamworks.protocol.shards import ShardId
from streamworks.runtime.producer import Record
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.support import wait_for

HOUR = 3600.0


def reminder_app(
    seen: list[tuple[Any, Message]], *, shards: int = 1, dedup: float | None = None
) -> App:
    app = App("g")
    app.stream("reminders", shards=shards, dedup_window=dedup)

    @app.handler("reminders")
    async def handle(value: Any, msg: Message) -> None:
        seen.append((value, msg))

    return app


def long_lease() -> Any:
    return fast_settings(lease_ttl=4 * HOUR)  # an advance below keeps the lease


async def test_a_delayed_message_waits_and_an_advance_makes_it_due(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen: list[tuple[Any, Message]] = []
    app = reminder_app(seen)
    async with streamworks_runtime(app, settings=long_lease()) as rt:
        [worker] = rt.workers
        published = await app.publish("reminders", {"n": 1}, key="u", delay=timedelta(hours=1))
        assert published.delayed and published.entry_id is None
        assert published.delay_id == "0000000000000001"
        assert published.due_ms is not None
        assert abs(published.due_ms - (rt.clock.time_ms() + HOUR * 1000)) < 5_000
        shard = ShardId.parse(published.shard)
        assert await rt.redis.zcard(rt.keyspace.delayed(shard)) == 1

        await rt.advance(HOUR - 60)  # a minute early: still waiting
        await anyio.sleep(0.5)
        assert seen == []
        assert await rt.redis.xlen(rt.keyspace.stream(shard)) == 0

        started = time.monotonic()
        await rt.advance(61)
        await wait_for(lambda: len(seen) == 1, 5, "the delayed message to be handled")
        assert time.monotonic() - started < 5
        value, msg = seen[0]
        assert value == {"n": 1} and msg.key == "u"
        assert msg.due_at == published.due_ms
        assert await rt.redis.zcard(rt.keyspace.delayed(shard)) == 0
        assert worker.delays.moved_total == {"reminders": 1}
        assert worker.lease.losses == 0
        metrics = await rt.worker_metrics()
        assert 'streamworks_delayed_moved_total{group="g",stream="reminders"} 1.0' in metrics
        assert (
            'streamworks_delayed_move_lateness_seconds_count{group="g",stream="reminders"} 1.0'
            in (metrics)
        )


async def test_real_time_delivers_it_when_due_and_never_before(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen: list[tuple[Any, Message]] = []
    handled_ms: list[int] = []
    app = App("g")
    app.stream("reminders", shards=2)

    @app.handler("reminders")
    async def handle(value: Any, msg: Message) -> None:
        handled_ms.append(int(time.time() * 1000))
        seen.append((value, msg))

    async with streamworks_runtime(app) as rt:
        results = [
            await app.publish("reminders", i, key=f"k{i}", delay=0.3 + i * 0.05) for i in range(6)
        ]
        assert all(r.delayed for r in results)
        await wait_for(lambda: len(seen) == 6, 10, "six delayed messages")
        for (value, msg), at in zip(seen, handled_ms, strict=True):
            assert msg.due_at == results[value].due_ms
            assert at >= msg.due_at, f"message {value} handled {msg.due_at - at} ms early"
        await rt.wait_idle()


async def test_at_in_the_past_or_delay_zero_goes_straight_into_the_stream(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen: list[tuple[Any, Message]] = []
    app = reminder_app(seen)
    async with streamworks_runtime(app) as rt:
        past = datetime.now(UTC) - timedelta(minutes=5)
        late = await app.publish("reminders", ["late"], at=past)
        now = await app.publish("reminders", ["now"], delay=0)
        for p in (late, now):
            assert p.entry_id is not None and p.delay_id is None and p.due_ms is not None
        await wait_for(lambda: len(seen) == 2, 5, "both")
        assert seen[0][1].due_at == late.due_ms
        assert await rt.redis.zcard(rt.keyspace.delayed(ShardId("reminders", 0))) == 0


async def test_publish_many_producer_routes_and_sync_publisher_take_delays(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen: list[tuple[Any, Message]] = []
    app = reminder_app(seen)

    @app.producer("reminders", key=lambda v: v["user"])
    def remind(user: str) -> dict[str, str]:
        return {"user": user}

    async with streamworks_runtime(app, settings=long_lease()) as rt:
        many = await app.publish_many(
            "reminders",
            [
                Record(["a"], delay=timedelta(minutes=10)),
                Record(["b"], at=datetime.now(UTC) + timedelta(minutes=20)),
            ],
        )
        routed = await remind("u-1", delay=timedelta(minutes=30))
        synced = await anyio.to_thread.run_sync(
            lambda: app.publish_sync("reminders", ["c"])  # no delay: at once
        )
        assert [p.delayed for p in (*many, routed)] == [True, True, True]
        assert synced.entry_id is not None
        synced_later = await anyio.to_thread.run_sync(
            lambda: app.publish_sync("reminders", ["e"], delay=timedelta(minutes=5))
        )
        assert synced_later.delayed
        await wait_for(lambda: len(seen) == 1, 5, "the immediate one")
        await rt.advance(31 * 60)
        await wait_for(lambda: len(seen) == 5, 5, "the delayed ones")
        assert [v for v, _ in seen] == [["c"], ["e"], ["a"], ["b"], {"user": "u-1"}]


async def test_bad_delays_are_refused_before_anything_is_sent(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen: list[tuple[Any, Message]] = []
    app = reminder_app(seen)
    ran: list[int] = []

    @app.producer("reminders")
    def make(n: int) -> int:
        ran.append(n)
        return n

    with pytest.raises(ConfigurationError, match="parameter named 'delay'"):

        @app.producer("reminders")
        def clash(delay: int) -> int:
            return delay

    async with streamworks_runtime(app) as rt:
        with pytest.raises(ConfigurationError, match="timezone-aware"):
            await app.publish("reminders", 1, at=datetime(2030, 1, 1))
        with pytest.raises(ConfigurationError, match="negative"):
            await app.publish("reminders", 1, delay=-1)
        with pytest.raises(ConfigurationError, match="not both"):
            await app.publish("reminders", 1, delay=1, at=datetime.now(UTC))
        with pytest.raises(ConfigurationError, match="366 days"):
            await app.publish("reminders", 1, delay=timedelta(days=400))
        with pytest.raises(ConfigurationError, match="negative"):
            await make(1, delay=timedelta(seconds=-5))
        assert ran == []  # refused before the function ran
        shard = ShardId("reminders", 0)
        assert await rt.redis.zcard(rt.keyspace.delayed(shard)) == 0
        assert await rt.redis.xlen(rt.keyspace.stream(shard)) == 0


@pytest.mark.seed("E18")
async def test_dedup_by_event_id_covers_delayed_and_immediate_publishes(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen: list[tuple[Any, Message]] = []
    app = reminder_app(seen, dedup=HOUR)
    async with streamworks_runtime(app, settings=long_lease()) as rt:
        first = await app.publish("reminders", 1, event_id="e-1", delay=60)
        again = await app.publish("reminders", 1, event_id="e-1", delay=60)
        assert first.delayed and not first.duplicate
        assert again.duplicate and again.delay_id == first.delay_id and again.entry_id is None
        shard = ShardId.parse(first.shard)
        assert await rt.redis.zcard(rt.keyspace.delayed(shard)) == 1
        waiting = await app.publish("reminders", 1, event_id="e-1")  # at once, while it waits
        assert waiting.duplicate and waiting.delay_id == first.delay_id
        assert waiting.entry_id is None
        await rt.advance(61)
        await wait_for(lambda: len(seen) == 1, 5, "the delayed one")
        at_once = await app.publish("reminders", 1, event_id="e-1")
        assert at_once.duplicate
        await anyio.sleep(0.3)
        await rt.wait_idle()
        assert len(seen) == 1


async def test_a_delayed_message_takes_its_place_in_its_key_order_when_due(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """Published first but due later: it comes after what its key got meanwhile; two
    delayed messages due in the same millisecond keep their publish order."""
    seen: list[tuple[Any, Message]] = []
    app = reminder_app(seen)
    async with streamworks_runtime(app, settings=long_lease()) as rt:
        at = datetime.now(UTC) + timedelta(minutes=5)
        for i in range(20):
            await app.publish("reminders", [f"d{i}"], key="k", at=at)
        await app.publish("reminders", ["now"], key="k")
        await wait_for(lambda: len(seen) == 1, 5, "the immediate one")
        await rt.advance(6 * 60)
        await wait_for(lambda: len(seen) == 21, 5, "the delayed ones")
        assert [v for v, _ in seen] == [["now"], *([f"d{i}"] for i in range(20))]


async def test_a_delayed_message_on_a_scaled_in_shard_blocks_it_then_is_handled_once(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """The removed shard is not retired while it holds a delayed message (status names
    it); when due it enters that shard, is handled there exactly once, and the shard
    retires with its delayed keys."""
    seen: list[tuple[Any, Message]] = []
    app = reminder_app(seen, shards=2)
    key = next(k for k in (f"user{i}" for i in range(100)) if jump_hash(key_hash(k), 2) == 1)
    async with streamworks_runtime(app, settings=fast_settings(routing_lease=1.0)) as rt:
        published = await app.publish("reminders", ["later"], key=key, delay=30)
        removed = ShardId.parse(published.shard)
        assert removed.index == 1
        await rt.scale("reminders", 1, wait=False)
        assert rt.service is not None
        service = rt.service

        async def blocked() -> bool:
            info = await service.stream_info("reminders")
            return "delayed message(s) not in the stream yet" in str(
                (info.migration or {}).get("blocked", "")
            )

        await wait_for(blocked, 20, "the delayed message to block the retirement")
        status = await service.status()
        [stream] = [s for s in status.streams if s.name == "reminders"]
        [shard] = [s for s in stream.shards if s.shard == str(removed)]
        assert shard.state == "DRAINING" and shard.delayed == 1
        assert shard.delayed_next_due_ms == published.due_ms
        assert seen == []

        await rt.advance(31)
        await wait_for(lambda: len(seen) == 1, 20, "the delayed message")
        assert seen[0][1].shard == str(removed)

        async def retired() -> bool:
            info = await service.stream_info("reminders")
            return not any(s.state == "DRAINING" for s in info.shards)

        await wait_for(retired, 20, "the shard to retire")
        for name in ("stream", "delayed", "delayed_entries", "delayed_counter", "delayed_wake"):
            assert not await rt.redis.exists(getattr(rt.keyspace, name)(removed)), name
        await anyio.sleep(0.3)
        assert len(seen) == 1


async def test_a_publish_that_becomes_the_earliest_wakes_the_mover(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """The mover sleeps towards an hour-away message (and a 60 s safety poll); a
    message due in 0.3 s is written to the shard's wake stream and moved when due,
    not at the next poll."""
    seen: list[tuple[Any, Message]] = []
    app = reminder_app(seen)
    settings = fast_settings()
    settings = settings.model_copy(
        update={"worker": settings.worker.model_copy(update={"delay_poll": 60.0})}
    )
    async with streamworks_runtime(app, settings=settings) as rt:
        await app.publish("reminders", ["later"], delay=HOUR)
        await rt.wait_assigned()
        [worker] = rt.workers
        # The mover waits (its wake key in the shared waiter; the reader waits alone).
        await wait_for(lambda: worker.waiter.statistics()["waiting"] == 1, 5, "the mover asleep")
        assert seen == []
        soon = await app.publish("reminders", ["soon"], delay=0.3)
        await wait_for(lambda: len(seen) == 1, 20, "the earlier message, well before the poll")
        assert seen[0][0] == ["soon"]
        assert soon.due_ms is not None
        assert time.time() * 1000 - soon.due_ms < 3_000
