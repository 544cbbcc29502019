"""A group's first join on a stream with thousands of shards fits in the mutex TTL.

Its consumer group is created on every shard inside the heartbeat's critical
section; the per-shard scripts are pipelined, so the join costs a few round trips,
not one per shard (at 10,000 shards that took seconds, longer than the mutex TTL).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.control import HeartbeatStatus
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.settings import Settings
from tests.coordinator.harness import SimMember

SHARDS = 2_000


class RoundTrips(Redis):
    """The real client (sharing another's pool) counting round trips: each command
    sent alone and each pipeline executed counts one."""

    def __init__(self, real: Redis) -> None:
        super().__init__(connection_pool=real.connection_pool)
        self.round_trips = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return await super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return _CountedPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint, self
        )


class _CountedPipeline(Pipeline):
    def __init__(self, pool: Any, callbacks: Any, transaction: bool, hint: Any, owner: Any):
        super().__init__(pool, callbacks, transaction, hint)
        self._owner = owner

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        self._owner.round_trips += 1
        return await super().execute(raise_on_error)


@pytest.mark.no_cluster("counts the round trips of a single-node client (a Redis subclass)")
async def test_first_join_on_2000_shards_takes_a_few_round_trips(settings: Settings) -> None:
    real = create_redis(settings)
    counting = RoundTrips(real)
    try:
        service = CoordinatorService(counting, settings)
        await service.create_stream("wide", SHARDS)
        member = SimMember("m", ["wide"])
        counting.round_trips = 0
        started = time.monotonic()
        answer = await member.heartbeat(service, "g")
        elapsed = time.monotonic() - started
        assert answer.status is HeartbeatStatus.OK
        assert len(answer.assigned) == SHARDS
        # Consumer groups on 2,000 shards, owner fences for 2,000 grants: a handful of
        # pipelines (1,000 scripts each), not a round trip per shard.
        assert counting.round_trips < 40, counting.round_trips
        assert elapsed < settings.coordinator.mutex_ttl, elapsed
        groups = await real.xinfo_groups(service.keyspace.stream(ShardId("wide", SHARDS - 1, 0)))
        assert [g["name"] for g in groups] == [b"g"]
    finally:
        await real.aclose()
