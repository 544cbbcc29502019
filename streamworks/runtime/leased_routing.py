"""Producer routing leased from the coordinator (E1, E15, E16).

Producers never heartbeat. Each stream's routing is fetched from the coordinator and
cached for the lease the coordinator grants; a background refresh renews it before
it runs out. A table whose lease expired without a successful refresh is never used:
publishing fails closed with :class:`RoutingUnavailableError`. When a publish hits a
retired shard the table is invalidated and fetched again.
"""

from __future__ import annotations

import logging

import anyio
from redis.exceptions import RedisError

from streamworks.clock import Clock
from streamworks.exceptions import (
    CoordinatorError,
    NamespaceMismatchError,
    PublishError,
    RoutingUnavailableError,
)
from streamworks.protocol.shards import ShardId
from streamworks.protocol.transport import CoordinatorTransport
from streamworks.redis.namespace import NamespaceCheck, where
from streamworks.runtime.routing import RoutingTable, ShardRoute

__all__ = ("LeasedRouting",)

log = logging.getLogger("streamworks.routing")


class LeasedRouting:
    """A :class:`~streamworks.runtime.routing.RoutingSource` backed by the coordinator.

    Args:
        client: the transport to the coordinator (HTTP or in-process).
        refresh_at: fraction of the lease after which a background refresh starts.
        namespace: checks every fetched table's namespace id against this process's
            Redis (``redis/namespace.py``); a mismatch raises ``NamespaceMismatchError``.
    """

    def __init__(
        self,
        client: CoordinatorTransport,
        *,
        refresh_at: float = 0.5,
        clock: Clock | None = None,
        namespace: NamespaceCheck | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.clock = clock or Clock()
        self._tables: dict[str, RoutingTable] = {}
        self._refresh_due: dict[str, float] = {}
        self._added = anyio.Event()
        self._locks: dict[str, anyio.Lock] = {}
        self._refresh_at = refresh_at
        self.fetches = 0

    async def routing(self, stream: str) -> RoutingTable:
        table = self._tables.get(stream)
        if table is not None and table.valid(self.clock.monotonic()):
            return table
        return await self._fetch(stream)

    async def run(self) -> None:
        """Refresh every cached stream's routing before its lease runs out (run this
        in the connection's task group)."""
        while True:
            now = self.clock.monotonic()
            due = [s for s, t in self._refresh_due.items() if t <= now]
            for stream in due:
                try:
                    await self._fetch(stream, force=True)
                except PublishError as e:
                    # Keep the cached table while it is valid; retry soon.
                    log.warning("routing refresh of %r failed: %s", stream, e)
                    self._refresh_due[stream] = self.clock.monotonic() + 1.0
                except NamespaceMismatchError as e:
                    # Never publish on it again: the next publish fetches and raises.
                    log.error("%s", e)
                    self._tables.pop(stream, None)
                    self._refresh_due.pop(stream, None)
            upcoming = min(self._refresh_due.values(), default=now + 1.0)
            with self.clock.move_on_after(max(0.01, min(1.0, upcoming - self.clock.monotonic()))):
                await self._added.wait()
            self._added = anyio.Event()

    def invalidate(self, stream: str, version: int) -> None:
        table = self._tables.get(stream)
        if table is not None and table.version <= version:
            del self._tables[stream]

    async def _fetch(self, stream: str, *, force: bool = False) -> RoutingTable:
        lock = self._locks.setdefault(stream, anyio.Lock())
        async with lock:
            table = self._tables.get(stream)
            if not force and table is not None and table.valid(self.clock.monotonic()):
                return table  # someone else fetched while we waited
            asked = self.clock.monotonic()
            try:
                response = await self.client.routing(stream)
            except CoordinatorError as e:
                raise RoutingUnavailableError(
                    f"no valid routing for stream {stream!r} (lease expired or never fetched): {e}"
                ) from e
            if self.namespace is not None:
                await self._check(response.namespace_id)
            self.fetches += 1
            lease = response.lease_ms / 1000
            table = RoutingTable(
                stream,
                response.routing_version,
                [ShardRoute(ShardId.parse(s.shard), s.key) for s in response.shards],
                protocol=response.protocol,
                # The lease counts from when we asked, not when the answer arrived.
                expires_at=asked + lease,
            )
            self._tables[stream] = table
            self._refresh_due[stream] = asked + lease * self._refresh_at
            self._added.set()
            return table

    async def _check(self, namespace_id: str | None) -> None:
        assert self.namespace is not None
        try:
            await self.namespace.verify(namespace_id, coordinator=where(self.client))
        except RedisError as e:
            raise RoutingUnavailableError(f"namespace check failed: {e}") from e
