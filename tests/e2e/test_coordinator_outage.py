"""The only coordinator SIGKILLed while a producer publishes (E1, at process level).

A coordinator and one worker of the instrumented app run as processes (heartbeats
every 0.2 s, a 2 s member lease, ``lease_grace`` 1 s, a 3 s routing lease); the test
process publishes one event at a time. Killing the coordinator right after the
producer refreshed its routing leaves the producer 3 s of cached routing and the
worker at most 0.78 s of work starts (``docs/configuration.md``, lease deadlines).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import anyio
import pytest

from streamworks.exceptions import RoutingUnavailableError
from streamworks.runtime.leased_routing import LeasedRouting
from tests.e2e.harness import (
    FAST_TIMERS,
    STREAM,
    Cluster,
    create_stream,
    event,
    handled_ids,
    processings,
    producer_app,
    wait_handled,
    wait_ready,
    wait_stable,
    wait_until,
)

LEASE_TTL = float(FAST_TIMERS["STREAMWORKS_LEASE_TTL"])
ROUTING_LEASE = float(FAST_TIMERS["STREAMWORKS_ROUTING_LEASE"])

pytestmark = pytest.mark.timeout(90)


@pytest.mark.seed("E1")
async def test_sigkill_of_the_only_coordinator_while_publishing(
    cluster: Cluster, redis: Any
) -> None:
    """After the SIGKILL no handler run starts later than the worker's lease (2 s) —
    although the producer goes on publishing on its cached routing for longer — and the
    producer fails closed with ``RoutingUnavailableError`` once its routing lease ran
    out, not before. A coordinator restarted on the same address brings both back:
    every event published, before or after the outage, is handled."""
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    port = coordinator.url.rsplit(":", 1)[1]
    await create_stream(cluster)
    cluster.start_worker("worker")
    async with cluster.client() as client:
        await wait_stable(client, 1)
    app = producer_app(cluster)
    published: list[tuple[str, float]] = []  # (event id, when the publish returned)
    began: list[float] = []  # when each successful publish was called

    async def publish(event_id: str) -> None:
        called = time.monotonic()
        await app.publish(STREAM, event(event_id).value, key=event(event_id).key)
        published.append((event_id, time.monotonic()))
        began.append(called)

    async with app.connect() as connection:
        routing = connection.routing
        assert isinstance(routing, LeasedRouting)
        for n in range(10):
            await publish(f"before-{n:06d}")
        await wait_handled(redis, cluster.prefix, [i for i, _ in published], timeout=20)

        # Kill it right after a routing refresh: the cached table has its whole lease.
        fetches = routing.fetches

        async def refreshed() -> bool:
            return routing.fetches > fetches

        await wait_until(refreshed, ROUTING_LEASE, "a routing refresh", interval=0.005)
        coordinator.send(signal.SIGKILL)
        killed = time.monotonic()
        await coordinator.wait_exit(10)
        expires = (await routing.routing(STREAM)).expires_at  # the cached table
        assert expires > killed + LEASE_TTL  # the producer outlasts the worker's lease

        failed_at: float | None = None
        n = 0
        while failed_at is None:
            try:
                await publish(f"during-{n:06d}")
            except RoutingUnavailableError:
                failed_at = time.monotonic()
            n += 1
            await anyio.sleep(0.02)  # pacing the producer, not synchronising
            assert time.monotonic() < expires + 5, "the producer never failed closed"
        assert failed_at >= expires  # fails closed after its routing lease, not before
        # The routing is checked when a publish is called; its write may return a
        # moment after the lease (a loaded machine), but none was called after it.
        assert all(at < expires for at in began)
        late = [i for i, at in published if at > killed + LEASE_TTL]
        assert late  # published on cached routing after the worker's lease ended

        # No run started after the worker's lease; what came later waits, unhandled.
        records = await processings(redis, cluster.prefix)
        after_lease = [p for p in records if p.entered > killed + LEASE_TTL]
        assert not after_lease, [str(p) for p in after_lease]
        assert set(late).isdisjoint(handled_ids(records))
        with pytest.raises(RoutingUnavailableError):
            await publish("refused")

        back = time.monotonic()
        restarted = cluster.start_coordinator(
            "coordinator-restarted", STREAMWORKS_COORDINATOR__PORT=port
        )
        restarted.url = coordinator.url
        await wait_ready(restarted)
        await publish("after-000000")  # the producer fetches routing again
        records = await wait_handled(redis, cluster.prefix, [i for i, _ in published], 30)
    starts = [p for p in records if p.entered > killed + LEASE_TTL]
    assert starts and all(p.entered > back for p in starts)
    print(
        f"published {len(published)} ({len(late)} after the worker's lease), producer "
        f"failed closed {failed_at - killed:.2f}s after the kill, "
        f"{len(records)} runs, {len(starts)} after the restart"
    )
