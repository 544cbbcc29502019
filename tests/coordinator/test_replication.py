"""Control-plane writes that wait for replicas (issue 18, finding 4a): how many, and
what it costs where there are none. The failovers themselves are in
``tests/cluster/test_control_plane_failover.py``."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import pytest
import redis as sync_redis

from streamworks.coordinator.replication import NotReplicated, ReplicaWaits, in_sync_replicas
from streamworks.coordinator.service import CoordinatorService
from streamworks.redis.client import create_redis
from streamworks.redis.scripts import Scripts
from streamworks.settings import Settings
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import RecordingRedis, SimMember, settle
from tests.support import wait_for


async def test_replicas_in_sync_are_the_online_ones_acknowledging_within_the_lag() -> None:
    info: dict[str, Any] = {
        "role": "master",
        "connected_slaves": 4,
        "slave0": {"ip": "10.0.0.1", "port": 6379, "state": "online", "offset": 9, "lag": 0},
        "slave1": {"ip": "10.0.0.2", "port": 6379, "state": "online", "offset": 9, "lag": 7},
        "slave2": {"ip": "10.0.0.3", "port": 6379, "state": "wait_bgsave", "lag": 0},
        "replica3": {"ip": "10.0.0.4", "port": 6379, "state": "online", "lag": 1},
        "slave_repl_offset": 5,
        "slave_read_only": 1,
    }
    assert in_sync_replicas(info, max_lag=5.0) == 2
    assert in_sync_replicas(info, max_lag=10.0) == 3
    assert in_sync_replicas({"role": "master", "connected_slaves": 0}, max_lag=5.0) == 0


@pytest.mark.no_cluster("counts the commands of a single-node client (a Redis subclass)")
async def test_without_replicas_no_wait_is_sent_and_replicas_are_counted_rarely(
    settings: Settings,
) -> None:
    """The cost on a server with no replica: not one WAIT, one INFO per check interval."""
    real = create_redis(settings)
    recording = RecordingRedis(real)
    try:
        service = CoordinatorService(recording, fast_settings(settings))
        await service.create_stream("orders", 2)
        members = [SimMember(f"m{i}", ["orders"]) for i in range(3)]
        started = time.monotonic()
        await settle(members, service)
        for _ in range(50):  # the short road: lease renewals
            for m in members:
                await m.heartbeat(service, "g")
        elapsed = time.monotonic() - started
        counts = Counter(c[0] for c in recording.commands)
        assert counts["WAIT"] == 0
        interval = settings.coordinator.replica_check_interval
        assert counts["INFO"] <= elapsed / interval + 2
    finally:
        await real.aclose()


async def test_a_replica_counts_while_in_sync_and_a_write_it_does_not_acknowledge_fails() -> None:
    primary = EmbeddedRedis().start()
    replica = EmbeddedRedis().start()
    redis = create_redis(Settings(redis_url=primary.url))
    try:
        waits = ReplicaWaits(redis, Scripts(redis), timeout=0.2, check_interval=0.05)
        assert await waits.required("") == 0
        with sync_redis.Redis(port=replica.port) as r:
            r.execute_command("REPLICAOF", "127.0.0.1", primary.port)

        async def counted() -> bool:
            return await waits.required("") == 1

        await wait_for(counted, timeout=30, message="the replica to be counted once online")
        log = waits.log()
        await waits.run("mutex_release", ["k"], ["t"], log)
        log.check("a write")  # acknowledged by the replica
        assert replica.pid is not None
        os.kill(replica.pid, signal.SIGSTOP)  # connected, acknowledging nothing
        try:
            log = waits.log()
            await redis.set("k", "t")
            await waits.run("mutex_release", ["k"], ["t"], log)  # a write, then WAIT
            with pytest.raises(NotReplicated, match="acknowledged by 0 replica"):
                log.check("a write")
        finally:
            os.kill(replica.pid, signal.SIGCONT)
    finally:
        await redis.aclose()
        primary.stop()
        replica.stop()
