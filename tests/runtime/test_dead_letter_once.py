"""Dead letters are written at most once per (group, shard, entry id), and only by the
shard's owner (issue 10, part 5). Real workers on a real Redis (static shard map, so
the test moves fences itself); crashes are held in place by an event-gated wrapper
around the dead-letter write, never by sleeps."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streamworks import App, Message, RetryPolicy
from streamworks.protocol.shards import ShardId
from streamworks.runtime.dead_letter import DeadLetters, Written
from tests.runtime.static_runtime import StaticRuntime
from tests.support import wait_for

SHARD = ShardId("orders", 0)


def failing_app(max_attempts: int, runs: list[str], on_run: Any = None) -> App:
    app = App("g")
    app.stream("orders", shards=1)

    @app.handler("orders", retry=RetryPolicy(max_attempts=max_attempts, backoff=0.001))
    async def handle(value: dict[str, int], msg: Message) -> None:
        runs.append(msg.id)
        if on_run is not None:
            await on_run(msg)
        raise RuntimeError("boom")

    return app


@pytest.mark.parametrize("crash", ["before the write", "after the write"])
async def test_a_crash_while_dead_lettering_leaves_one_entry_and_no_extra_attempt(
    streamworks_redis_url: str, monkeypatch: pytest.MonkeyPatch, crash: str
) -> None:
    runs: list[str] = []
    app = failing_app(2, runs)
    reached = anyio.Event()
    never = anyio.Event()
    crashed = False
    real_append = DeadLetters._append

    async def crashing_append(self: DeadLetters, message: Message, fields: Any) -> Written:
        # The first dead-lettering: the final failure is recorded; the worker dies
        # before the entry is written, or after it and before the ack.
        if crashed:
            return await real_append(self, message, fields)
        written = Written.FAILED
        if crash == "after the write":
            written = await real_append(self, message, fields)
        reached.set()
        await never.wait()  # cancelled by the crash
        return written

    monkeypatch.setattr(DeadLetters, "_append", crashing_append)
    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        await app.publish("orders", {"n": 1})
        with anyio.fail_after(10):
            await reached.wait()
        retry_key = rt.keyspace.retries(SHARD, "g")
        [record] = (await rt.redis.hgetall(retry_key)).values()
        assert record.startswith(b"dlq:"), "the final failure is recorded first"
        await rt.kill_worker(0)
        crashed = True
        await rt.add_worker()  # the next owner takes the entry over

        await rt.wait_idle()
        assert len(runs) == 2, "the handler ran max_attempts times, no extra attempt"
        [dead] = await rt.dead_letters("orders")
        assert dead.reason == "max_attempts" and dead.attempts == 2
        assert dead.fields["member"].decode() == rt.slots[0].worker.member_id
        assert await rt.redis.hgetall(retry_key) == {}, "the record went with the ack"


async def test_a_stale_owner_writes_no_retry_record(streamworks_redis_url: str) -> None:
    runs: list[str] = []
    readers: list[Any] = []
    holder: dict[str, StaticRuntime] = {}

    async def lose_the_shard(msg: Message) -> None:
        readers.append(msg._reader)
        rt = holder["rt"]
        await rt.redis.set(rt.keyspace.fence(SHARD, "g"), "999:someone-else")

    app = failing_app(3, runs, lose_the_shard)
    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        holder["rt"] = rt
        await app.publish("orders", {"n": 1})
        await wait_for(lambda: bool(readers) and readers[0].outstanding == 0, message="settled")
        assert runs == [runs[0]]
        assert await rt.redis.hgetall(rt.keyspace.retries(SHARD, "g")) == {}
        pending = await rt.redis.xpending(rt.keyspace.stream(SHARD), "g")
        assert pending["pending"] == 1, "left pending for the shard's owner"


async def test_a_stale_owner_writes_no_dead_letter_and_the_owner_writes_one(
    streamworks_redis_url: str,
) -> None:
    runs: list[str] = []
    readers: list[Any] = []
    holder: dict[str, StaticRuntime] = {}

    async def lose_the_shard_once(msg: Message) -> None:
        readers.append(msg._reader)
        if len(runs) == 1:
            rt = holder["rt"]
            # Another member's grant (epoch 1, as ours: the runtime's next grant, epoch
            # 2, is above it).
            await rt.redis.set(rt.keyspace.fence(SHARD, "g"), "1:someone-else")

    app = failing_app(1, runs, lose_the_shard_once)
    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        holder["rt"] = rt
        await app.publish("orders", {"n": 1})
        await wait_for(lambda: bool(readers) and readers[0].outstanding == 0, message="settled")
        assert await rt.dead_letters("orders") == [], "the stale owner wrote a dead letter"
        assert await rt.redis.hgetall(rt.keyspace.retries(SHARD, "g")) == {}

        # A real owner (a newer fence) takes the entry over and dead-letters it, once.
        await rt.kill_worker(0)
        await rt.add_worker()
        await rt.wait_idle()
        [dead] = await rt.dead_letters("orders")
        assert dead.fields["member"].decode() == rt.slots[1].worker.member_id
        assert len(runs) == 2
