"""The event loop's cost per pass does not grow with idle groups and streams.

A pass reads every group's and stream's revision and earliest lease in one pipeline;
groups where nothing can be due are skipped without another command. Skipping never
delays a timer: a lease that ran out, a deadline that came or a commit elsewhere make
the next pass look at the group again.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from streamworks.clock import Clock
from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.control import HeartbeatStatus
from streamworks.redis.client import create_redis
from streamworks.settings import Settings
from tests.coordinator.harness import RecordingRedis, SimMember, settle


@pytest.mark.no_cluster("counts the commands of a single-node client (a Redis subclass)")
async def test_a_pass_over_idle_groups_costs_a_constant_number_of_commands(
    settings: Settings,
) -> None:
    real = create_redis(settings)
    recording = RecordingRedis(real)
    try:
        service = CoordinatorService(recording, settings, clock=Clock())
        for s in range(3):
            await service.create_stream(f"s{s}", 2)
        for g in range(12):
            await settle([SimMember(f"m{g}", [f"s{g % 3}"])], service, f"g{g}")
        await service.loop.tick_all()  # the first pass looks at every group
        recording.commands.clear()
        await service.loop.tick_all()
        counts = Counter(c[0] for c in recording.commands)
        # The registries, one pipeline of revisions and earliest leases, and the time.
        assert counts == {
            "SMEMBERS": 2,
            "HMGET": 12 + 3,
            "ZRANGE": 12,
            "TIME": 1,
        }, counts
    finally:
        await real.aclose()


async def test_skipping_idle_groups_never_delays_an_expiry(settings: Settings) -> None:
    clock = Clock()
    redis: Any = create_redis(settings)
    try:
        service = CoordinatorService(redis, settings, clock=clock)
        await service.create_stream("orders", 4)
        alive, silent = SimMember("alive", ["orders"]), SimMember("silent", ["orders"])
        await settle([alive, silent], service)
        await service.loop.tick_all()
        await service.loop.tick_all()  # idle now
        assert "g" in service.loop._idle
        clock.advance(settings.lease_ttl - 0.5)
        await alive.heartbeat(service, "g")
        await service.loop.tick_all()  # nothing ran out yet
        group = await service.group_info("g")
        assert {m.member_id for m in group.members if m.state != "EXPIRED"} == {"alive", "silent"}
        clock.advance(1.0)  # silent's lease ran out; alive's has not
        await service.loop.tick_all()
        group = await service.group_info("g")
        states = {m.member_id: m.state for m in group.members}
        assert states["silent"] == "EXPIRED" and states["alive"] != "EXPIRED"
        answer = await alive.heartbeat(service, "g")
        assert answer.status is HeartbeatStatus.OK
    finally:
        await redis.aclose()


async def test_a_commit_by_another_replica_makes_the_group_due_again(settings: Settings) -> None:
    """The idle record is tied to the group's revision: after another replica's
    commit, the next pass loads the group (incrementally) and decides again."""
    a_redis: Any = create_redis(settings)
    b_redis: Any = create_redis(settings)
    try:
        a = CoordinatorService(a_redis, settings, replica="a")
        b = CoordinatorService(b_redis, settings, replica="b")
        await a.create_stream("orders", 2)
        first = SimMember("first", ["orders"])
        await settle([first], a)
        await b.loop.tick_all()
        idle_rev = b.loop._idle["g"][0]
        await settle([first], a)  # no change: the revision stays
        await b.loop.tick_all()
        assert b.loop._idle["g"][0] == idle_rev
        await settle([first, SimMember("second", ["orders"])], a)  # commits by replica a
        await b.loop.tick_all()
        cached = b.store.cached_group("g")
        assert cached is not None and cached[0] != idle_rev
        assert b.loop._idle["g"][0] == cached[0]
        assert set(cached[1].members) == {"first", "second"}
    finally:
        await a_redis.aclose()
        await b_redis.aclose()
