"""A primary+replica pair behind TCP proxies, and a failover after replication lag.

With ``--replica`` a chaos run's Redis is two servers started here on free ports of
127.0.0.1: a primary and a replica of it (``REPLICAOF``). The replica replicates
through a proxy of the :class:`~tests.chaos.proxy.ProxyHub` (the *link*), so the
harness can hold every byte of the replication stream: the replica stays connected
and, by the primary's count, in sync, but acknowledges nothing — a lagging replica.

Every process reaches "Redis" through a proxy of its own (the workers', the
producers', the coordinators', the harness's): that is how the components find the
new primary after a failover, as behind a virtual IP or an HAProxy that Sentinel
repoints. :meth:`RedisPair.failover_after_lag`:

1. wait until the replica is online (the coordinator's ``replica_wait = auto`` counts
   it, so every control-plane write waits for it);
2. hold the link for ``lag`` seconds (below ``coordinator.replica_max_lag``: the
   replica stays among those waited for, the assumption under which docs/cluster.md
   promises that no answered control-plane write is lost) while the run goes on;
3. ``SIGKILL`` the primary, drop what the link held (the writes of the lag are gone);
4. promote the stale replica (``REPLICAOF NO ONE``), repoint every proxy at it and
   reset their connections (clients reconnect to the new primary);
5. start the old primary again (its AOF: it comes back with the writes the new
   primary never had) and make it a replica of the new one (a full resync discards
   them), through a new link.

The roles swap at each failover. Published entries survive because the producers
publish durably (``min_replicas=1``: a publish is acknowledged once the replica has
it) and the workers write dead letters the same way; acks, retry records and dedup
records lost with the lag turn into duplicate deliveries, as documented.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio
import redis as sync_redis

from streamworks.testing.embedded import EmbeddedRedis
from tests.chaos.proxy import ProxyHub

__all__ = ("RedisPair",)


def _online_replica(port: int) -> bool:
    with sync_redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2) as client:
        info = client.info("replication")
    return any(
        isinstance(v, dict) and v.get("state") == "online"
        for k, v in info.items()
        if k.startswith("slave")
    )


def _offset(port: int, field: str) -> int:
    with sync_redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2) as client:
        return int(client.info("replication").get(field, 0))


def _command(port: int, *args: str) -> object:
    with sync_redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=2) as client:
        return client.execute_command(*args)


class RedisPair:
    """Two servers, one the primary and one its replica (see the module docstring)."""

    def __init__(
        self,
        hub: ProxyHub,
        workdir: Path,
        extra: Callable[[str], dict[str, str]],
        say: Callable[[str], None],
    ) -> None:
        self.hub = hub
        self.say = say
        self.servers = [
            EmbeddedRedis(appendonly=True, extra=extra(f"{workdir}/redis-{n}")) for n in ("a", "b")
        ]
        self.primary, self.replica = self.servers
        self.fronts: list[str] = []  # proxies that must reach the primary
        self.links = 0
        self.failovers = 0
        self.lost_bytes = 0  # replication stream the promoted replicas never had
        self.lossy_failovers = 0  # failovers whose promoted replica missed writes

    # -- setup ------------------------------------------------------------------------
    def start(self) -> None:
        for server in self.servers:
            server.start()

    async def attach_replica(self) -> None:
        """Make ``self.replica`` replicate ``self.primary`` through a new link proxy and
        wait until the primary lists it online."""
        self.links += 1
        link = f"replication.{self.links}"
        proxy = await self.hub.add(link, self.primary.port)
        await anyio.to_thread.run_sync(
            _command, self.replica.port, "REPLICAOF", "127.0.0.1", str(proxy.port)
        )
        await self.wait_online(60)

    async def wait_online(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if await anyio.to_thread.run_sync(_online_replica, self.primary.port):
                    return
            except (sync_redis.RedisError, OSError):
                pass  # the primary restarting: ask again
            if time.monotonic() > deadline:
                raise TimeoutError(f"no online replica of :{self.primary.port} in {timeout}s")
            await anyio.sleep(0.1)  # polling a server's state, with a deadline

    @property
    def link(self) -> str:
        return f"replication.{self.links}"

    async def front(self, name: str) -> int:
        """A proxy named ``name`` in front of whichever server is the primary; its port."""
        proxy = await self.hub.add(name, self.primary.port)
        self.fronts.append(name)
        return proxy.port

    # -- the fault --------------------------------------------------------------------
    async def failover_after_lag(self, lag: float, down: float) -> dict[str, float]:
        """The steps of the module docstring; what happened, for the report."""
        await self.wait_online(60)
        began = time.monotonic()
        await self.hub.delay(self.link, 600_000)  # every byte held: a lagging replica
        await anyio.sleep(lag)
        old, new = self.primary, self.replica
        # What the replica misses: the primary's replication offset beyond the
        # replica's (the lag's writes, and the primary's pings to its replica).
        ahead = await anyio.to_thread.run_sync(_offset, old.port, "master_repl_offset")
        await anyio.to_thread.run_sync(old.kill)
        had = await anyio.to_thread.run_sync(_offset, new.port, "slave_repl_offset")
        lost = max(0, ahead - had)
        self.lost_bytes += lost
        self.lossy_failovers += lost > 0
        killed = time.monotonic()
        held = await self.hub.cut(self.link, 3600)  # the lag's writes die with the link
        await anyio.to_thread.run_sync(_command, new.port, "REPLICAOF", "NO", "ONE")
        self.primary, self.replica = new, old
        await self.hub.retarget(self.fronts, new.port)
        promoted = time.monotonic()
        self.failovers += 1
        self.say(
            f"failover: :{old.port} killed after {lag:.2f}s of held replication "
            f"({lost} bytes of it lost, {held} link connection(s) dropped), "
            f":{new.port} promoted in {promoted - killed:.2f}s; every proxy repointed"
        )
        await anyio.sleep(down)
        await anyio.to_thread.run_sync(old.start, 60.0)
        await self.attach_replica()
        return {"began": began, "killed": killed, "promoted": promoted, "lost_bytes": lost}

    async def restart_primary(self, down: float) -> None:
        """SIGKILL the primary and start it again on its port and AOF (a crash and a
        restart without failover); the replica reconnects by itself."""
        await anyio.to_thread.run_sync(self.primary.kill)
        await anyio.sleep(down)
        await anyio.to_thread.run_sync(self.primary.start, 60.0)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
