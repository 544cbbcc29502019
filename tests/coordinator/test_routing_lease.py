"""Leases that keep clients safe while the coordinator is away: a worker's assignment
lease and a producer's routing lease (E1), and routing pulled once per lease (E15)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from streamworks import App, Record
from streamworks.clock import Clock
from streamworks.exceptions import RoutingUnavailableError
from streamworks.runtime.connection import Connection, open_connection
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import CutTransport
from tests.support import lease_lost, wait_for


def orders_app(name: str = "g", shards: int = 2) -> tuple[App, list[int]]:
    app = App(name)
    app.stream("orders", shards=shards)
    handled: list[int] = []

    @app.handler("orders", ordering="none")
    async def handle(value: dict[str, int]) -> None:
        handled.append(value["n"])

    return app, handled


async def positions(rt: TestRuntime) -> tuple[int, int]:
    """Summed (lag, pending) of group ``g`` over the shards of ``orders``."""
    lag = pending = 0
    for key in await rt.shard_keys("orders"):
        [info] = await rt.redis.xinfo_groups(key)
        lag += info["lag"]
        pending += info["pending"]
    return lag, pending


async def _drained(rt: TestRuntime) -> bool:
    return await positions(rt) == (0, 0)


@contextlib.asynccontextmanager
async def producer(rt: TestRuntime, link: CutTransport, clock: Clock) -> AsyncIterator[Connection]:
    """A separate producer process: its own routing cache, through ``link``, on ``clock``."""
    app = App("producer")
    app.stream("orders", shards=2)
    async with open_connection(
        app, rt.settings, redis=rt.redis, coordinator=link, clock=clock, ensure_streams=False
    ) as connection:
        yield connection


async def publish(connection: Connection, n: int) -> Any:
    return await connection.producer.publish("orders", Record({"n": n}))


async def total_length(rt: TestRuntime) -> int:
    return sum([await rt.redis.xlen(k) for k in await rt.shard_keys("orders")])


@pytest.mark.seed("E1")
async def test_a_worker_cut_off_from_the_coordinator_reads_only_until_its_lease_ends(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, handled = orders_app()
    settings = fast_settings(lease_ttl=5.0)
    async with streamworks_runtime(app, workers=0, settings=settings) as rt:
        local = rt.coordinator
        link = CutTransport(local)
        rt.coordinator = link
        worker = await rt.add_worker()
        rt.coordinator = local
        for n in range(5):
            await app.publish("orders", {"n": n})
        await wait_for(lambda: len(handled) == 5, message="the first messages")

        link.cut = True
        # While its lease is valid the worker keeps processing its shards.
        for n in range(5, 10):
            await app.publish("orders", {"n": n})
        await wait_for(lambda: len(handled) == 10, message="processing under a valid lease")
        assert worker.lease.valid()

        # Its lease ends (time moves past it): it stops reading.
        rt.clock.advance(rt.settings.lease_ttl)
        assert not worker.lease.valid()
        worker.lease.recheck()  # the watchdog sleeps on real time: show it the jump
        await wait_for(lambda: lease_lost(worker), message="the lease loss")
        for n in range(10, 15):
            await app.publish("orders", {"n": n})
        attempts = len(link.sent_while_cut())
        await wait_for(lambda: len(link.sent_while_cut()) >= attempts + 5, message="time to pass")
        assert len(handled) == 10
        assert await positions(rt) == (5, 0)  # lag grows, nothing pulled into the PEL

        # The coordinator comes back: the worker rejoins and resumes.
        link.cut = False
        await wait_for(lambda: len(handled) == 15, message="processing to resume")
        assert sorted(handled) == list(range(15))
        # The acks follow the handlers in the acker's next group commit.
        await wait_for(lambda: _drained(rt), message="the acks of the resumed messages")
        assert await positions(rt) == (0, 0)


@pytest.mark.seed("E1")
async def test_cached_routing_is_used_while_leased_then_publishing_fails_closed(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, _ = orders_app()
    # A long lease, so that only the test's clock brings a refresh or the expiry.
    settings = fast_settings(routing_lease=60.0)
    async with streamworks_runtime(app, workers=0, settings=settings) as rt:
        link = CutTransport(rt.coordinator)
        clock = Clock()
        lease = rt.settings.routing_lease
        async with producer(rt, link, clock) as connection:
            await publish(connection, 0)
            assert link.routing_calls == 1
            link.cut = True  # the coordinator is gone
            for n in range(1, 11):
                await publish(connection, n)  # cached routing, still leased
            assert link.routing_calls == 1
            assert await total_length(rt) == 11

            clock.advance(lease + 0.01)  # the lease ran out without a refresh
            with pytest.raises(RoutingUnavailableError) as refused:
                await publish(connection, 11)
            assert refused.value.retryable
            with pytest.raises(RoutingUnavailableError):
                await connection.producer.publish_many(
                    "orders", [Record({"n": 12}), Record({"n": 13})]
                )
            assert await total_length(rt) == 11  # nothing written on expired routing

            link.cut = False  # back: routing is fetched again and publishing works
            published = await publish(connection, 14)
            assert published.routing_version == 1
            assert await total_length(rt) == 12
            assert link.heartbeats == []  # producers never heartbeat


@pytest.mark.seed("E15")
async def test_producers_fetch_routing_once_per_lease_and_refresh_it_in_the_background(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, _ = orders_app()
    # A long lease, so that only the test's clock brings a refresh or the expiry.
    settings = fast_settings(routing_lease=60.0)
    async with streamworks_runtime(app, workers=0, settings=settings) as rt:
        link = CutTransport(rt.coordinator)
        clock = Clock()
        lease = rt.settings.routing_lease
        async with producer(rt, link, clock) as connection:
            for n in range(50):
                await publish(connection, n)
            await connection.producer.publish_many(
                "orders", [Record({"n": n}) for n in range(50, 100)]
            )
            assert link.routing_calls == 1  # one fetch for 100 messages
            assert link.heartbeats == []
            first = await connection.routing.routing("orders")
            assert first.expires_at <= clock.monotonic() + lease

            # Past half the lease a background refresh renews it before it runs out.
            clock.advance(lease * 0.6)

            async def refreshed() -> bool:
                table = await connection.routing.routing("orders")
                return table.expires_at > first.expires_at

            await wait_for(refreshed, message="the background refresh")
            assert link.routing_calls == 2  # by the background task, not by a publish
            clock.advance(lease * 0.6)  # the first lease would have run out by now
            await publish(connection, 100)  # no RoutingUnavailableError: still leased
            assert link.routing_calls >= 2
            assert await total_length(rt) == 101
