"""The Redis servers of a chaos run, as a mixin of :class:`~tests.chaos.harness.ChaosRun`.

Without ``--replica``: one server (AOF, ``appendfsync always``); every process but the
coordinators reaches it through a proxy of its own, and the chaos app's records go to
it too (its ``_START`` script reads the owner fence and appends the record in one
step).

With ``--replica``: a primary+replica pair (:class:`~tests.chaos.failover.RedisPair`)
and *every* client behind a proxy that a failover repoints (the coordinators', the
harness's, the CLI's too); producers publish durably and workers write dead letters
durably (``min_replicas=1``); the records go to a third server that no fault touches,
so that the writes a failover loses are never the checker's evidence.

Both: the server binary is :func:`~streamworks.testing.embedded.find_server_binary`'s
(``STREAMWORKS_REDIS_SERVER`` picks another, e.g. a Redis 7.0 ``redis-server``);
``--acl`` users live in an ACL file per server (``ACL SAVE``), so restarts keep them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamworks.redis.client import create_redis
from streamworks.settings import Settings
from streamworks.testing.embedded import EmbeddedRedis
from tests.chaos.failover import RedisPair
from tests.chaos.proxy import ProxyHub

__all__ = ("Servers",)


def _client(url: str) -> Any:
    """The harness's own clients retry a command once its pooled connection turns out
    broken (a failover's proxies reset every connection): the harness observes, it is
    not under test."""
    client = create_redis(Settings(redis_url=url, key_prefix="chaos"))
    client.connection_pool.connection_kwargs.update(
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 5),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    client.retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), 5)
    client.retry.update_supported_errors([RedisConnectionError, RedisTimeoutError])
    return client


class Servers:
    """``_servers()`` at the start, ``_stop_servers()`` at the end (see the module)."""

    hub: ProxyHub
    pair: RedisPair | None
    say: Callable[[str], None]

    redis_server: EmbeddedRedis  # the single server (no --replica)
    log_server: EmbeddedRedis | None = None
    front_url = ""  # "Redis" for the CLI and the process defaults
    coordinator_redis = ""  # the coordinators' URL (before credentials)
    binary = ""
    redis: Any  # the harness's own client (default user), through a front
    log_redis: Any  # where the chaos app's records are

    def _acl_options(self, acl: bool) -> Callable[[str], dict[str, str]]:
        def options(base: str) -> dict[str, str]:
            if not acl:
                return {}
            aclfile = Path(f"{base}.acl")
            aclfile.touch()
            return {"aclfile": str(aclfile)}

        return options

    async def _servers(self, workdir: Path, *, replica: bool, acl: bool) -> None:
        options = self._acl_options(acl)
        if not replica:
            self.redis_server = EmbeddedRedis(appendonly=True, extra=options(f"{workdir}/users"))
            await anyio.to_thread.run_sync(self.redis_server.start)
            self.binary = self.redis_server.binary
            self.front_url = self.coordinator_redis = self.redis_server.url
            self.redis = self.log_redis = _client(self.front_url)
            return
        self.pair = RedisPair(self.hub, workdir, options, self.say)
        await anyio.to_thread.run_sync(self.pair.start)
        self.binary = self.pair.primary.binary
        await self.pair.attach_replica()
        self.log_server = EmbeddedRedis()
        await anyio.to_thread.run_sync(self.log_server.start)
        self.front_url = f"redis://127.0.0.1:{await self.pair.front('cli.redis')}/0"
        self.coordinator_redis = (
            f"redis://127.0.0.1:{await self.pair.front('coordinators.redis')}/0"
        )
        self.redis = _client(f"redis://127.0.0.1:{await self.pair.front('harness.redis')}/0")
        self.log_redis = _client(self.log_server.url)

    def _topology(self) -> str:
        if self.pair is None:
            return ", one server (AOF)"
        p, r = self.pair.primary.port, self.pair.replica.port
        return f", primary :{p} + replica :{r} (AOF both), records on a third server"

    async def _redis_front(self, name: str) -> int:
        """A proxy named ``name`` to "Redis" (whichever server is the primary); its port."""
        if self.pair is not None:
            return await self.pair.front(name)
        return (await self.hub.add(name, self.redis_server.port)).port

    def _admins(self) -> list[Any]:
        """Default-user clients, one per data server, straight to it (close them)."""
        servers = self.pair.servers if self.pair is not None else [self.redis_server]
        return [_client(server.url) for server in servers]

    def _min_replicas(self) -> int:
        return 1 if self.pair is not None else 0

    def _pair_env(self) -> dict[str, str]:
        if self.pair is None or self.log_server is None:
            return {}
        return {"CHAOS_MIN_REPLICAS": "1", "CHAOS_LOG_REDIS_URL": self.log_server.url}

    async def _restart_primary(self, down: float) -> None:
        if self.pair is not None:
            await self.pair.restart_primary(down)
            return
        await anyio.to_thread.run_sync(self.redis_server.kill)
        await anyio.sleep(down)
        await anyio.to_thread.run_sync(self.redis_server.start, 60.0)

    async def _stop_servers(self) -> None:
        for client in {
            id(c): c for c in (getattr(self, "redis", None), getattr(self, "log_redis", None)) if c
        }.values():
            try:
                with anyio.move_on_after(5, shield=True):
                    await client.aclose()
            except Exception:
                pass
        if self.pair is not None:
            self.pair.stop()
        elif hasattr(self, "redis_server"):
            self.redis_server.stop()
        if self.log_server is not None:
            self.log_server.stop()
