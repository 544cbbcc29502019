"""A Redis failover to a *lagging* replica under the control plane (issue 18, finding 4).

Replication to the replica of the node that holds the control plane is paused (it
stays connected, acknowledging nothing: a TCP proxy holding every byte between the
pair, or ``SIGSTOP`` on a cluster replica), control-plane writes are made on the
master (a member joins, the group rebalances, leases renew), the master is
``SIGKILL``ed and the stale replica promoted. The coordinator waits for its replicas
(``WAIT``) before it answers, so each of those writes was either replicated or never
acknowledged to anyone. Asserted over every answer a member got, before, during and
after the failover:

* no two owners: no shard is held (per the members' last answers) by two members;
* no token decrease: per shard, the fence tokens answered never go down, for any
  member and across members;
* nothing acknowledged lost: what members were answered before the pause is what the
  promoted node records (their grants, their owner fences), and the members the
  promoted node knows heartbeat first after it, several times (the worst order: a
  grant answered and then lost would be granted again before its holder hears).

Once on a single primary+replica pair (``REPLICAOF``, promoted with ``REPLICAOF NO
ONE``, the coordinator restarted against it: a non-cluster deployment's failover), once
on the local cluster (the control slot's master killed, its replica elected by the
cluster, the same coordinator carrying on).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import redis as sync_redis
from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode

from streamworks.coordinator.service import CoordinatorService
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import HeartbeatStatus
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import CoordinatorSettings, Settings
from streamworks.testing.cluster import LocalCluster
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import fast_settings
from tests.chaos.proxy import ProxyHub
from tests.coordinator.harness import SimMember, serve_api
from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)

SHARDS = [f"orders/{i}@0" for i in range(4)]


def control_settings(redis_url: str, prefix: str, replicas: int | None = None) -> Settings:
    """Leases long enough that no member's runs end during the test (so the members'
    views are the owners), WAIT for ``replicas`` (default: every replica in sync), a
    short WAIT timeout."""
    base = fast_settings(Settings(redis_url=redis_url, key_prefix=prefix), lease_ttl=30.0)
    coordinator = CoordinatorSettings(
        **{
            **base.coordinator.model_dump(),
            "replica_wait": replicas,
            "replica_wait_timeout": 0.3,
            "replica_max_lag": 60.0,  # the stopped replica stays "in sync" for the test
            "replica_check_interval": 0.2,
        }
    )
    return base.model_copy(update={"coordinator": coordinator})


@dataclass
class Ledger:
    """Every answer the members acted on, checked as it comes."""

    members: list[SimMember]
    tokens: dict[str, int] = field(default_factory=dict)  # shard -> highest answered
    acked: int = 0
    refused: list[str] = field(default_factory=list)

    def check(self, member: SimMember) -> None:
        owners: dict[str, str] = {}
        for m in self.members:
            for shard in m.owned:
                assert shard not in owners, f"{shard} owned by {owners[shard]} and {m.member_id}"
                owners[shard] = m.member_id
        for grant in member.last.assigned:
            assert grant.epoch >= self.tokens.get(grant.shard, 0), (
                f"{grant.shard}: token {grant.epoch} after {self.tokens[grant.shard]}"
            )
            self.tokens[grant.shard] = grant.epoch

    async def beat(self, client: CoordinatorClient, member: SimMember) -> bool:
        """One heartbeat; True when answered (and applied), False when refused. An
        answer that grants or renews (OK) counts in ``acked``; a refusal (FENCED,
        UNKNOWN_MEMBER, SYNC_METADATA) only takes from the member."""
        try:
            response = await client.heartbeat("g", member.request())
        except CoordinatorError as e:
            self.refused.append(e.code)
            return False
        member.apply(response)
        if response.status is HeartbeatStatus.OK:
            self.acked += 1
        self.check(member)
        return True

    async def settle(self, client: CoordinatorClient, timeout: float = 20) -> None:
        async def settled() -> bool:
            for m in self.members:
                await self.beat(client, m)
            owned = sorted(s for m in self.members for s in m.owned)
            return owned == SHARDS and all(
                m.last.status is HeartbeatStatus.OK and not m.last.pending and not m.last.revoke
                for m in self.members
            )

        await wait_for(settled, timeout=timeout, message="the members to settle")


async def recorded(redis: Any, keyspace: Keyspace) -> dict[str, Any]:
    """What Redis holds of the grants: the owner fences, and the members' records."""
    out: dict[str, Any] = {}
    for shard in SHARDS:
        value = await redis.get(keyspace.fence(ShardId.parse(shard), "g"))
        out[shard] = value.decode() if value else None
    for name in ("m:m1", "m:m2"):
        out[name] = await redis.hget(keyspace.group_meta("g"), name)
    return out


async def pause_and_write(ledger: Ledger, client: CoordinatorClient, newcomer: SimMember) -> None:
    """With replication paused: a newcomer joins and everyone heartbeats. The writes
    land on the master; none may be answered."""
    before = ledger.acked
    for _ in range(3):
        await ledger.beat(client, newcomer)
        for m in ledger.members:
            if m is not newcomer:
                await ledger.beat(client, m)
    assert ledger.acked == before, "a grant or a lease was answered without its replica"
    assert "NOT_REPLICATED" in ledger.refused


async def after_failover(
    ledger: Ledger, client: CoordinatorClient, *, first: list[SimMember], timeout: float = 20
) -> None:
    """The members the promoted node knows heartbeat first, several times (the worst
    order: had the newcomer been answered grants that were then lost, they would be
    granted again before it hears of it), then everyone until the group settles."""
    for _ in range(5):
        for member in first:
            await ledger.beat(client, member)
    await ledger.settle(client, timeout=timeout)
    assert all(m.owned for m in ledger.members)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@contextlib.asynccontextmanager
async def coordinator(settings: Settings) -> AsyncIterator[tuple[CoordinatorService, str]]:
    redis = create_redis(settings)
    try:
        service = CoordinatorService(redis, settings)
        async with serve_api(service) as url:
            yield service, url
    finally:
        await redis.aclose()


def wait_replica_online(primary: int, timeout: float = 30.0) -> None:
    """Until the primary lists an online replica (blocking: run it in a thread)."""
    deadline = time.monotonic() + timeout
    with sync_redis.Redis(port=primary) as client:
        while time.monotonic() < deadline:
            info = client.info("replication")
            if any(
                isinstance(v, dict) and v.get("state") == "online"
                for k, v in info.items()
                if k.startswith("slave")
            ):
                return
            time.sleep(0.02)  # polling a server's state, not test synchronisation
    raise TimeoutError("the replica never came online")


@pytest.mark.no_cluster("its own primary and replica (two single servers)")
async def test_single_node_pair_failover_to_a_lagging_replica() -> None:
    """The replica replicates through a TCP proxy; pausing the proxy (every byte held)
    leaves the replica connected and "in sync" by the primary's count, acknowledging
    nothing. Writes made then are on the primary only; the primary is killed, the proxy
    drops what it held, and the stale replica is promoted (``REPLICAOF NO ONE``): those
    writes are gone, deterministically. None was answered."""
    primary = EmbeddedRedis().start()
    replica = EmbeddedRedis().start()
    hub = ProxyHub()
    try:
        link = await hub.add("replication", primary.port)
        with sync_redis.Redis(port=replica.port) as r:
            r.execute_command("REPLICAOF", "127.0.0.1", link.port)
        await anyio.to_thread.run_sync(wait_replica_online, primary.port)
        prefix = f"t{uuid.uuid4().hex[:10]}"
        keyspace = Keyspace(prefix)
        m1, m2, m3 = (SimMember(f"m{i}", ["orders"]) for i in (1, 2, 3))
        ledger = Ledger([m1, m2])
        async with coordinator(control_settings(primary.url, prefix)) as (service, url):
            assert await service.store.waits.required("") == 1  # the replica counts
            await service.create_stream("orders", 4)
            async with CoordinatorClient([url], timeout=5) as client:
                await ledger.settle(client)
                # Replicated: the next write's WAIT covers everything before it.
                await service.store.commit_stream(*await service.store.load_stream("orders"))
                acknowledged = await recorded(service.redis, keyspace)
                ledger.members = [m1, m2, m3]
                await hub.delay("replication", 600_000)  # replication paused
                await pause_and_write(ledger, client, m3)
                # The writes are on the primary (m3 joined there), none answered.
                assert await service.redis.hexists(keyspace.group_meta("g"), "m:m3")
                primary.kill()
                await hub.cut("replication", 600)  # what it held is lost with the link
        with sync_redis.Redis(port=replica.port) as r:
            r.execute_command("REPLICAOF", "NO", "ONE")  # the failover
        async with coordinator(control_settings(replica.url, prefix)) as (service, url):
            # Nothing acknowledged was lost; the unacknowledged join was.
            assert await recorded(service.redis, keyspace) == acknowledged
            assert not await service.redis.hexists(keyspace.group_meta("g"), "m:m3")
            async with CoordinatorClient([url], timeout=5) as client:
                await after_failover(ledger, client, first=[m1, m2])
    finally:
        hub.close()
        primary.stop()
        replica.stop()


async def test_cluster_failover_of_the_control_node_to_a_lagging_replica(
    local_cluster: LocalCluster,
) -> None:
    """The control slot's replica is stopped and its link cut (``CLIENT KILL TYPE
    replica``: nothing written from then on reaches it); the coordinator is set to wait
    for one replica on every node (``coordinator.replica_wait = 1``), so the writes made
    then are refused, not answered. The master is killed and the stale replica elected;
    the old master restarts as its replica (writes need one again) and the group goes
    on from what was acknowledged."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    keyspace = Keyspace(prefix)
    settings = control_settings(local_cluster.url, prefix, replicas=1)
    master = local_cluster.master_for_key(keyspace.group_meta("g"))
    [replica] = [n.port for n in local_cluster.replicas_of(master) if n.alive]
    pid = local_cluster._servers[replica].pid
    assert pid is not None
    m1, m2, m3 = (SimMember(f"m{i}", ["orders"]) for i in (1, 2, 3))
    ledger = Ledger([m1, m2])
    check = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in local_cluster.ports])
    try:
        async with coordinator(settings) as (service, url):
            await service.create_stream("orders", 4)
            async with CoordinatorClient([url], timeout=5) as client:
                await ledger.settle(client)
                acknowledged = await recorded(check, keyspace)
                ledger.members = [m1, m2, m3]
                with stopped(pid):
                    with local_cluster.client(master) as node:
                        node.execute_command("CLIENT", "KILL", "TYPE", "replica")
                    await pause_and_write(ledger, client, m3)
                    assert await service.redis.hexists(keyspace.group_meta("g"), "m:m3")
                    local_cluster.kill_node(master)
                # The cluster elects the replica that was cut off: the writes made
                # since are gone with the master.
                await anyio.to_thread.run_sync(local_cluster.wait_healthy, 60)
                assert local_cluster.master_for_key(keyspace.group_meta("g")) == replica
                await service.redis.nodes_manager.initialize()
                await check.nodes_manager.initialize()
                assert await recorded(check, keyspace) == acknowledged
                assert not await check.hexists(keyspace.group_meta("g"), "m:m3")
                # Without a replica the promoted node's writes are refused (one is
                # required): the old master comes back as its replica, and the group
                # goes on.
                await anyio.to_thread.run_sync(local_cluster.restart_node, master, 60)
                await after_failover(ledger, client, first=[m1, m2], timeout=60)
    finally:
        for pattern in keyspace.namespace_patterns():
            for key in [k async for k in check.scan_iter(match=pattern, count=1000)]:
                await check.delete(key)
        await check.aclose()
