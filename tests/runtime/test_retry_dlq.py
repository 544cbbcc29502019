"""Retries with backoff, dead letters, poison entries: every message ends handled or
dead-lettered, nothing is lost."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from streamworks import App, Message, Retry, RetryPolicy, Skip
from streamworks.protocol.shards import ShardId
from streamworks.testing import TestRuntime
from tests.support import wait_for


class Order(BaseModel):
    id: str
    amount: int


async def test_failed_attempts_are_retried_with_backoff_then_succeed(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=2)
    attempts: list[tuple[int, float]] = []

    @app.handler("orders", retry=RetryPolicy(max_attempts=5, backoff=0.05, max_backoff=1))
    async def handle(order: Order, msg: Message) -> None:
        attempts.append((msg.attempt, time.monotonic()))
        if msg.attempt < 3:
            raise RuntimeError("flaky")

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", Order(id="1", amount=1), key="a")
        await rt.wait_idle()
        assert [a for a, _ in attempts] == [1, 2, 3]
        gaps = [attempts[i + 1][1] - attempts[i][1] for i in range(2)]
        # equal jitter: between half and all of 0.05 s, then of 0.1 s
        assert gaps[0] >= 0.025 and gaps[1] >= 0.05
        assert rt.handled("orders") == 1
        assert await rt.dead_letters("orders") == []
        stats = rt.statistics("orders")
        assert stats["failed"] == 2 and stats["retried"] == 2


async def test_retry_signal_uses_its_delay_and_counts_as_an_attempt(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    seen: list[float] = []

    @app.handler("orders", retry=RetryPolicy(max_attempts=2, backoff=30))
    async def handle(value: dict[str, Any]) -> None:
        seen.append(time.monotonic())
        raise Retry(delay=0.05)

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"x": 1})
        await rt.wait_idle()
        assert len(seen) == 2
        assert 0.04 <= seen[1] - seen[0] < 5  # the handler's delay, not the 30 s policy
        [dead] = await rt.dead_letters("orders")
        assert dead.reason == "max_attempts" and dead.attempts == 2


@pytest.mark.cluster
async def test_exhausted_messages_are_dead_lettered_with_their_origin(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=3)

    @app.handler("orders", retry=RetryPolicy(max_attempts=3, backoff=0.001))
    async def handle(order: Order) -> None:
        if order.amount < 0:
            raise ValueError(f"negative amount {order.amount}")

    async with streamworks_runtime(app) as rt:
        published = [
            await app.publish(
                "orders", Order(id=str(i), amount=-1 if i % 10 == 0 else i), key=str(i)
            )
            for i in range(50)
        ]
        await rt.wait_idle()
        dead = await rt.dead_letters("orders")
        assert rt.handled("orders") == 45
        assert sorted(d.origin_id for d in dead) == sorted(
            p.entry_id for i, p in enumerate(published) if i % 10 == 0
        )
        for d in dead:
            assert d.reason == "max_attempts"
            assert d.attempts == 3
            assert "ValueError: negative amount -1" in d.error
            assert Order.model_validate_json(d.payload or b"").amount == -1
            assert d.shard in {p.shard for p in published}
            assert d.fields["o.f"] == b"1"  # original fields kept verbatim


async def test_skip_acks_without_retrying(streamworks_runtime: Callable[..., TestRuntime]) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    calls = 0

    @app.handler("orders")
    async def handle(value: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        raise Skip

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"x": 1})
        await rt.wait_idle()
        assert calls == 1
        assert rt.statistics("orders")["skipped"] == 1
        assert await rt.dead_letters("orders") == []


POISON: list[tuple[str, list[Any]]] = [
    ("not json for a model", ["v", b"{not json", "t", "1", "f", "1"]),
    ("fails validation", ["v", b'{"id": 1}', "t", "1", "f", "1"]),
    ("unknown format version", ["v", b'{"id":"1","amount":1}', "t", "1", "f", "99"]),
    ("no payload field", ["t", "1", "f", "1"]),
    ("non-numeric time", ["v", b'{"id":"1","amount":1}', "t", "yesterday", "f", "1"]),
    ("headers not an object", ["v", b'{"id":"1","amount":1}', "h", b"[1]", "f", "1"]),
    ("headers invalid json", ["v", b'{"id":"1","amount":1}', "h", b"{", "f", "1"]),
    ("key not utf-8", ["v", b'{"id":"1","amount":1}', "k", b"\xff\xfe", "f", "1"]),
]


async def test_poison_entries_go_to_the_dlq_at_once_and_the_worker_keeps_going(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    handled: list[str] = []

    @app.handler("orders", retry=RetryPolicy(max_attempts=5))
    async def handle(order: Order) -> None:
        handled.append(order.id)

    async with streamworks_runtime(app) as rt:
        key = rt.keyspace.stream(ShardId("orders", 0))
        for _, fields in POISON:
            await rt.redis.execute_command("XADD", key, "*", *fields)
        await app.publish("orders", Order(id="good", amount=1))
        await rt.wait_idle()
        assert handled == ["good"]  # the handler never saw a poison entry
        dead = await rt.dead_letters("orders")
        assert len(dead) == len(POISON)
        assert {d.reason for d in dead} == {"poison"}
        assert all(d.attempts == 0 for d in dead)  # never retried
        assert rt.statistics("orders")["poison"] == len(POISON)


async def test_every_message_ends_handled_or_dead_lettered(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=4)
    done: set[str] = set()

    @app.handler("orders", retry=RetryPolicy(max_attempts=2, backoff=0.001), concurrency=32)
    async def handle(order: Order, msg: Message) -> None:
        if order.amount % 7 == 0:
            raise RuntimeError("always fails")
        if order.amount % 5 == 0 and msg.attempt == 1:
            raise RuntimeError("fails once")
        done.add(order.id)

    async with streamworks_runtime(app, workers=3) as rt:
        for i in range(0, 300, 50):
            await app.publish_many(
                "orders",
                [_record(Order(id=str(j), amount=j)) for j in range(i, i + 50)],
            )
        await rt.wait_idle(timeout=20)
        dead = {(d.shard, d.origin_id) for d in await rt.dead_letters("orders")}
        assert len(done) + len(dead) == 300
        assert len(dead) == len([j for j in range(300) if j % 7 == 0])


def _record(order: Order) -> Any:
    from streamworks import Record

    return Record(order, key=order.id)


async def test_a_retrying_message_holds_back_its_key_only(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    log: list[str] = []
    release = anyio.Event()

    @app.handler("orders", ordering="key", retry=RetryPolicy(max_attempts=50, backoff=0.01))
    async def handle(value: dict[str, str], msg: Message) -> None:
        if value["id"] == "a1" and not release.is_set():
            raise RuntimeError("not yet")
        log.append(value["id"])

    async with streamworks_runtime(app) as rt:
        for key, ident in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")]:
            await app.publish("orders", {"id": ident}, key=key)
        await wait_for(lambda: log == ["b1", "b2"], message="key b to pass key a")
        assert "a2" not in log  # held back behind the retrying a1
        release.set()
        await rt.wait_idle()
        assert log == ["b1", "b2", "a1", "a2"]


@pytest.mark.seed("E22")
async def test_attempts_survive_a_worker_crash_mid_retry(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    seen: list[tuple[str, int]] = []

    @app.handler("orders", retry=RetryPolicy(max_attempts=3, backoff=0.3, jitter=False))
    async def handle(value: dict[str, Any], msg: Message) -> None:
        seen.append((msg.id, msg.attempt))
        raise RuntimeError("boom")

    async with streamworks_runtime(app, workers=2) as rt:
        first = rt.workers[0] if rt.workers[0].owned_shards() else rt.workers[1]
        index = [s.worker for s in rt.slots].index(first)
        await app.publish("orders", {"x": 1})
        key = rt.keyspace.retries(ShardId("orders", 0), app.name)
        await wait_for(lambda: rt.redis.hlen(key), message="a persisted retry record")
        crashed_at = time.monotonic()
        await rt.kill_worker(index)  # crash while the message waits for its retry
        await rt.wait_idle(timeout=10)
        [dead] = await rt.dead_letters("orders")
        # attempt 1 on the crashed worker, 2 and 3 on the survivor: the count carried over
        assert [a for _, a in seen] == [1, 2, 3]
        assert dead.attempts == 3
        assert time.monotonic() - crashed_at >= 0.25  # the inherited backoff was honoured
        assert await rt.redis.hlen(key) == 0  # retry records are removed with the ack


async def test_a_poison_storm_leaves_one_marker_key_per_dead_letter_stream(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """Dead-lettered at most once takes a marker per entry; they live in one sorted
    set per dead-letter stream (dropped after MARKER_TTL), not a key per dead letter
    (7 days each: a storm of a million poison messages left a million keys)."""
    app = App("g")
    app.stream("orders", shards=4)

    @app.handler("orders", retry=RetryPolicy(max_attempts=1))
    async def handle(value: dict[str, Any]) -> None:
        raise RuntimeError("poison")

    async with streamworks_runtime(app, workers=2) as rt:
        for n in range(40):
            await app.publish("orders", {"n": n}, key=str(n))

        async def all_dead() -> bool:
            return len(await rt.dead_letters("orders")) == 40

        await wait_for(all_dead, 15, "40 dead letters")
        pattern = rt.keyspace.dead_letter_marker_pattern()
        keys = [k async for k in rt.redis.scan_iter(match=pattern, count=1000)]
        assert keys == [rt.keyspace.dead_letter_markers("g", "orders").encode()]
        assert await rt.redis.zcard(keys[0]) == 40
