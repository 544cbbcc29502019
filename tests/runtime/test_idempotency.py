"""Explicit idempotency hooks (E23): duplicates skipped, claims released on failure."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import BaseModel

from streamworks import App, Context, Message, RetryPolicy
from streamworks.testing import TestRuntime


class Order(BaseModel):
    id: str


class MemoryStore:
    """An application-provided store (e.g. backed by the app's database)."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.calls: list[str] = []

    async def claim(self, key: str, ttl: float, holder: str) -> bool:
        self.calls.append(f"claim {key}")
        if key in self.state and self.state[key] != f"pending {holder}":
            return False
        self.state[key] = f"pending {holder}"
        return True

    async def complete(self, key: str) -> None:
        self.calls.append(f"complete {key}")
        self.state[key] = "done"

    async def release(self, key: str) -> None:
        self.calls.append(f"release {key}")
        if self.state.get(key, "").startswith("pending"):
            del self.state[key]

    async def is_completed(self, key: str) -> bool:
        return self.state.get(key) == "done"


@pytest.mark.cluster
@pytest.mark.seed("E23")
async def test_a_completed_key_is_acked_as_a_duplicate_without_calling_the_handler(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=2)
    charged: list[tuple[str, str | None]] = []

    @app.handler("orders", idempotency_key=lambda order, ctx: order.id)
    async def charge(order: Order, ctx: Context) -> None:
        charged.append((order.id, ctx.idempotency_key))

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", Order(id="o-1"), key="a")
        await rt.wait_idle()
        await app.publish("orders", Order(id="o-1"), key="b")  # a redelivery/duplicate
        await app.publish("orders", Order(id="o-2"), key="a")
        await rt.wait_idle()
        assert charged == [("o-1", "o-1"), ("o-2", "o-2")]
        stats = rt.statistics("orders")
        assert stats["duplicates"] == 1 and stats["handled"] == 2
        stored = await rt.redis.get(rt.keyspace.idempotency("g", "o-1"))
        assert stored == b"done"


@pytest.mark.seed("E23")
async def test_a_failed_attempt_releases_its_claim_so_the_retry_can_run(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    store = MemoryStore()
    app = App("g", idempotency_store=store)
    app.stream("orders", shards=1)
    attempts: list[int] = []

    @app.handler(
        "orders",
        retry=RetryPolicy(max_attempts=3, backoff=0.001),
        idempotency_key=lambda order, ctx: f"charge:{order.id}",
    )
    async def charge(order: Order, msg: Message) -> None:
        attempts.append(msg.attempt)
        if msg.attempt == 1:
            raise RuntimeError("payment gateway timeout")

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", Order(id="o-9"))
        await rt.wait_idle()
        assert attempts == [1, 2]
        assert store.calls == [
            "claim charge:o-9",
            "release charge:o-9",
            "claim charge:o-9",
            "complete charge:o-9",
        ]
        assert rt.statistics("orders")["duplicates"] == 0


async def test_a_key_claimed_elsewhere_waits_instead_of_being_dropped(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    store = MemoryStore()
    store.state["k"] = "pending orders/9@0/1-0"  # another message holds it right now
    app = App("g", idempotency_store=store)
    app.stream("orders", shards=1)
    ran: list[str] = []

    @app.handler("orders", idempotency_key=lambda value, ctx: "k")
    async def handle(value: dict[str, str]) -> None:
        ran.append(value["x"])

    async with streamworks_runtime(app) as rt:
        await app.publish("orders", {"x": "1"})
        [worker] = rt.workers
        reader = next(iter(worker.readers.values()))

        from tests.support import wait_for

        await wait_for(lambda: store.calls.count("claim k") >= 1, message="a claim attempt")
        assert ran == [] and reader.outstanding == 1  # held, not acked, not lost
        del store.state["k"]  # the other member gave up its claim
        await rt.wait_idle(timeout=10)
        assert ran == ["1"]


@pytest.mark.seed("E23")
async def test_a_claim_left_by_a_crashed_member_is_taken_over_by_the_same_message(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    calls: list[str] = []
    import anyio

    hang = anyio.Event()

    @app.handler("orders", idempotency_key=lambda order, ctx: order.id)
    async def charge(order: Order, ctx: Context) -> None:
        calls.append(ctx.member_id)
        if len(calls) == 1:
            await hang.wait()  # crashes while holding the claim

    async with streamworks_runtime(app, workers=2) as rt:
        owner = next(i for i, w in enumerate(rt.workers) if w.owned_shards())
        await app.publish("orders", Order(id="o-1"))
        from tests.support import wait_for

        await wait_for(lambda: len(calls) == 1, message="the first attempt")
        await rt.kill_worker(owner)
        await rt.wait_idle(timeout=5)  # not blocked for the claim's TTL
        assert len(calls) == 2 and calls[0] != calls[1]
        assert rt.statistics("orders")["duplicates"] == 0
