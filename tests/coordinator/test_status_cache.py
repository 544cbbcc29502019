"""The status answers are built once per group revision (``coordinator/status.py``):
a commit must show at once, and so must a lease renewal, which moves no revision."""

from __future__ import annotations

from typing import Any

from streamworks.clock import Clock
from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.control import GroupInfo
from streamworks.redis.client import create_redis
from streamworks.settings import Settings
from tests.coordinator.harness import SimMember, settle


def leases(info: GroupInfo) -> dict[str, int | None]:
    return {m.member_id: m.lease_expires_in_ms for m in info.members}


async def test_status_follows_commits_and_renewals(settings: Settings) -> None:
    clock = Clock()
    redis: Any = create_redis(settings)
    ttl_ms = int(settings.lease_ttl * 1000)
    try:
        service = CoordinatorService(redis, settings, clock=clock)
        await service.create_stream("orders", 4)
        a, b = SimMember("a", ["orders"]), SimMember("b", ["orders"])
        await settle([a, b], service)
        rev = (await service.store.load_group("g")).rev
        first = await service.group_info("g")
        again = await service.group_info("g")  # the same revision: from the cache
        strip = {"members": {"__all__": {"lease_expires_in_ms"}}}
        assert again.model_dump(exclude=strip) == first.model_dump(exclude=strip)

        # Time passes; a's renewal (the short road) moves its lease and no revision.
        clock.advance(3.0)
        before = leases(await service.group_info("g"))
        assert all(v is not None and v <= ttl_ms - 2900 for v in before.values()), before
        await a.heartbeat(service, "g")
        assert (await service.store.load_group("g")).rev == rev
        renewed = leases(await service.group_info("g"))
        assert renewed["a"] is not None and renewed["a"] >= ttl_ms - 1000, renewed
        assert renewed["b"] is not None and renewed["b"] <= ttl_ms - 2900, renewed

        # A commit (c joins) moves the revision: both answers show it at once.
        c = SimMember("c", ["orders"])
        await c.heartbeat(service, "g")
        assert (await service.store.load_group("g")).rev != rev
        joined = await service.group_info("g")
        assert {m.member_id for m in joined.members} == {"a", "b", "c"}
        assert joined.group_epoch > first.group_epoch
        [group] = (await service.status()).groups
        assert {m.member_id for m in group.members} == {"a", "b", "c"}
        assert group.group_epoch == joined.group_epoch
        await settle([a, b, c], service)
        settled = {m.member_id: m.assigned for m in (await service.group_info("g")).members}
        assert settled["c"], settled  # the hand-off to c shows, not the 2-member layout
        assert sum(len(shards) for shards in settled.values()) == 4, settled
    finally:
        await redis.aclose()
