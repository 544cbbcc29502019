"""No-change heartbeats (the short road) hold at most three quarters of the replica's
Redis connections at once; the rest stay free for critical sections. Before, a burst far
above capacity took the whole pool, and a critical section queued behind it for seconds
(longer than its mutex TTL, which the compare-and-set survived only as CONFLICTs).

Deterministic: a hook in the store makes every lease renewal first block in Redis
(``BLPOP`` on a key of the test's, holding one pooled connection) until the test
releases it; the pool has 8 connections."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streamworks.coordinator.heartbeats import short_road_budget
from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.control import HeartbeatStatus
from streamworks.redis.client import create_redis
from streamworks.settings import Settings
from tests.coordinator.harness import SimMember, settle
from tests.support import wait_for

POOL = 8


async def test_the_budget_keeps_a_quarter_of_the_pool() -> None:
    assert short_road_budget(None) is None
    assert short_road_budget(1) == 1  # nothing to keep: never zero
    assert short_road_budget(POOL) == 6
    assert short_road_budget(1024) == 768


@pytest.mark.no_cluster("counts the blocked clients of one server")
async def test_a_burst_of_no_change_heartbeats_leaves_connections_for_a_join(
    settings: Settings,
) -> None:
    redis = create_redis(settings, max_connections=POOL)
    probe = create_redis(settings)  # a pool of its own
    hold = f"{settings.key_prefix}:test:hold"
    budget = short_road_budget(POOL)
    assert budget is not None
    try:
        service = CoordinatorService(redis, settings)
        await service.create_stream("orders", 4)
        member = SimMember("m1", ["orders"])
        await settle([member], service)
        renew = service.store.renew_lease

        async def held_renewal(*args: Any, **kwargs: Any) -> Any:
            await redis.blpop([hold], timeout=5)  # one pooled connection, blocked
            return await renew(*args, **kwargs)

        service.store.renew_lease = held_renewal  # type: ignore[method-assign]

        async def blocked() -> int:
            # Connections blocked in our BLPOP now (nothing else in the suite uses it;
            # INFO's blocked_clients would count other blocked readers too).
            return sum(1 for c in await probe.client_list() if c.get("cmd") == "blpop")

        burst = 3 * budget
        answers: list[HeartbeatStatus] = []

        async def no_change_heartbeat() -> None:
            # Unnumbered (as from a worker predating sequence numbers): one member's
            # numbered requests sent all at once would be refused as stale out of order.
            request = member.request().model_copy(update={"sequence": None})
            answers.append((await service.heartbeat("g", request)).status)

        async with anyio.create_task_group() as tg:
            for _ in range(burst):
                tg.start_soon(no_change_heartbeat)

            async def short_road_full() -> bool:
                return await blocked() >= budget

            await wait_for(short_road_full, 10, "the burst to block on the short road")

            newcomer = SimMember("m2", ["orders"])
            with anyio.fail_after(3):  # it queued behind the burst for good before
                joined = await newcomer.heartbeat(service, "g")
            assert joined.status is HeartbeatStatus.OK and joined.member_epoch > 0
            assert await blocked() == budget  # the short road never held more
            await probe.lpush(hold, *(["go"] * burst))
        assert len(answers) == burst  # every held heartbeat answered
    finally:
        await probe.delete(hold)
        await probe.aclose()
        await redis.aclose()
