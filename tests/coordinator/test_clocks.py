"""Clocks (issue 18, finding 6): a step of the Redis clock holds grants and expiries
on a real coordinator; a member resumed after a host suspend stops its runs.

A real clock step cannot be made on a shared Redis server: it is injected where the
coordinator reads Redis ``TIME`` (``Store.time_skew_ms``, added to every ``TIME`` the
store and its scripts read, unlike the test clock's offset, which moves both sides).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streamworks import App
from streamworks.clock import Clock
from streamworks.protocol.control import HeartbeatStatus
from streamworks.settings import Settings
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import SimMember, open_service, settle
from tests.runtime.static_runtime import StaticRuntime
from tests.support import wait_for


@pytest.mark.parametrize("step_s", [30.0, -30.0])
async def test_a_redis_clock_step_holds_grants_and_expiries_until_it_settles(
    settings: Settings, step_s: float
) -> None:
    """A forward step would make every lease look expired (members expired, shards
    granted to others while their owners still run them); a backward one would let
    time-made fence tokens fall below earlier ones. Either way: detected, counted,
    nothing expired and nothing granted until it settled (a lease TTL of local time,
    and Redis time past what was read before a backward step)."""
    clock = Clock()
    configured = fast_settings(settings, lease_ttl=2.0)
    async with open_service(configured, clock=clock) as service:
        await service.create_stream("orders", 4)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        await settle([m1, m2], service)
        before = {m.member_id: sorted(m.assigned) for m in (await service.group_info("g")).members}

        service.store.time_skew_ms = int(step_s * 1000)  # the Redis clock steps
        await service.tick_group("g")  # reads TIME: the step is seen
        assert service.metrics.clock_steps._value.get() == 1
        assert service.state.holding_grants()
        # The stepped clock says m2's lease ran out (or, backwards, nothing did): the
        # loop expires nobody while it holds.
        await service.tick_group("g")
        info = await service.group_info("g")
        assert {m.member_id: sorted(m.assigned) for m in info.members} == before
        # A newcomer is a member (its lease renewed) but is granted nothing, although
        # m2 leaves and frees its shards.
        await service.heartbeat("g", m2.request().model_copy(update={"member_epoch": -1}))
        m3 = SimMember("m3", ["orders"])
        for _ in range(3):
            await m1.heartbeat(service, "g")
            r = await m3.heartbeat(service, "g")
            assert r.status is HeartbeatStatus.OK and r.assigned == [] and r.pending
        assert service.state.holding_grants()
        # Settled (a lease TTL of local time; a step back also needs Redis time to pass
        # what was read before it: the skew is taken back, as after a failover to a
        # node whose clock catches up).
        if step_s < 0:
            service.store.time_skew_ms = 0  # (itself a step forward: the hold goes on)

        async def settled() -> bool:
            await service.tick_group("g")  # the loop keeps reading TIME
            return not service.state.holding_grants()

        await wait_for(settled, timeout=2 * configured.lease_ttl + 5, message="the settling")
        await settle([m1, m3], service)
        assert (await service.group_info("g")).state == "STABLE"
        assert service.metrics.clock_hold._value.get() == 0


async def test_without_a_step_no_hold(settings: Settings) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream("orders", 2)
        m1 = SimMember("m1", ["orders"])
        await settle([m1], service)
        for _ in range(20):
            await m1.heartbeat(service, "g")
            await service.tick_group("g")
        assert service.metrics.clock_steps._value.get() == 0
        assert not service.state.holding_grants()


async def test_a_worker_resumed_after_a_host_suspend_cancels_its_runs_at_once(
    streamworks_redis_url: str,
) -> None:
    """The lease runs on a clock that counts suspend (``clock.py``), and the watchdog
    looks at it at least every second, although its own waits run on the event loop's
    clock, which stood still while the host slept. A suspend is simulated by moving the
    worker's clock without waking anything (``Clock.advance`` would wake the waits)."""
    app = App("g")
    app.stream("orders", shards=1)
    started = anyio.Event()
    cancelled = anyio.Event()

    @app.handler("orders")
    async def handle(value: dict[str, Any]) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    async with StaticRuntime(app, workers=1, redis_url=streamworks_redis_url) as rt:
        [worker] = rt.workers
        worker.lease.renew(worker.clock.monotonic() + 60)
        await app.publish("orders", {"n": 1})
        with anyio.fail_after(10):
            await started.wait()
        await anyio.wait_all_tasks_blocked()
        worker.clock.offset += 120  # the host slept for two minutes; nothing woke up
        with anyio.fail_after(3):  # within the watchdog's recheck, not the lease's 60 s
            await cancelled.wait()
        assert worker.lease.losses == 1
