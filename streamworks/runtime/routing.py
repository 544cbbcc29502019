"""Producer routing: which shard a message goes to.

A :class:`RoutingTable` is one version of a stream's routing: its routable (ACTIVE)
shards in index order, the routing protocol, and until when it may be used (the
routing lease, E15). Keys are placed with **jump consistent hashing** over the
xxHash64 of the key (protocol ``jump-xxh64-v1``, ``streamworks.protocol.routing``,
shared with dead-letter replay), so the same protocol, shard count and key always
give the same shard (E17). Unkeyed messages use a sticky round-robin: a run of
messages goes to one shard before the next shard is used, which keeps pipelines
dense without favouring any shard.

Routing comes from a :class:`RoutingSource`: a fixed layout (:class:`StaticRoutingSource`)
or the coordinator's leased routing (``streamworks.runtime.leased_routing``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from streamworks.exceptions import NoShardsError, RoutingUnavailableError
from streamworks.protocol.routing import ROUTING_PROTOCOL, jump_hash, key_hash
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

__all__ = (
    "ROUTING_PROTOCOL",
    "RoutingSource",
    "RoutingTable",
    "ShardRoute",
    "StaticRoutingSource",
    "jump_hash",
    "key_hash",
)


@dataclass(frozen=True, slots=True)
class ShardRoute:
    """A routable shard and its stream key."""

    shard: ShardId
    key: str


@dataclass(slots=True)
class RoutingTable:
    """One version of a stream's routing.

    Attributes:
        stream: the stream name.
        version: routing version; grows on every layout change.
        shards: routable shards in index order (empty when the stream has 0 shards).
        protocol: the routing protocol name.
        expires_at: the time (on the routing source's ``Clock.monotonic()``) after which
            the table must not be used.
    """

    stream: str
    version: int
    shards: Sequence[ShardRoute]
    protocol: str = ROUTING_PROTOCOL
    expires_at: float = float("inf")
    _rr: itertools.count[int] = field(default_factory=itertools.count, repr=False)
    _sticky: int = field(default=-1, repr=False)

    @property
    def shard_count(self) -> int:
        return len(self.shards)

    def valid(self, now: float) -> bool:
        """Whether the table may still be used at ``now`` (the source's clock)."""
        return now < self.expires_at

    def route(self, key: str | bytes | None, sticky_batch: int = 100) -> ShardRoute:
        """The shard for ``key``; unkeyed messages follow the sticky round-robin.

        Raises:
            NoShardsError: the stream has zero shards (E14).
        """
        n = len(self.shards)
        if n == 0:
            raise NoShardsError(f"stream {self.stream!r} has 0 shards (routing v{self.version})")
        if key is None:
            if next(self._rr) % sticky_batch == 0:
                # Move on to the next shard; the first run starts at a random shard so
                # that many producers do not all begin on shard 0.
                start = random.randrange(n) if self._sticky < 0 else self._sticky + 1
                self._sticky = start % n
            return self.shards[self._sticky % n]
        if self.protocol != ROUTING_PROTOCOL:
            raise RoutingUnavailableError(f"unsupported routing protocol {self.protocol!r}")
        return self.shards[jump_hash(key_hash(key), n)]


class RoutingSource(Protocol):
    """Where a producer gets routing tables from."""

    async def routing(self, stream: str) -> RoutingTable:
        """A valid (unexpired) table for ``stream``.

        Raises:
            RoutingUnavailableError: no valid routing can be had (fail closed, E1).
            NoShardsError / other PublishError: the stream cannot be published to.
        """
        ...

    def invalidate(self, stream: str, version: int) -> None:
        """Forget ``version`` of the stream's routing (a publish hit a retired shard)."""
        ...


class StaticRoutingSource:
    """A fixed layout: ``{stream: shard count}``, incarnation 0, never expiring.

    For tests and for deployments that provision shards by hand. Production apps use
    the coordinator's leased routing.
    """

    def __init__(self, keyspace: Keyspace, layout: dict[str, int | Sequence[ShardId]]) -> None:
        self._keyspace = keyspace
        self._tables: dict[str, RoutingTable] = {}
        for stream, shards in layout.items():
            ids = [ShardId(stream, i) for i in range(shards)] if isinstance(shards, int) else shards
            self.set(stream, ids, version=1)

    def set(self, stream: str, shards: Sequence[ShardId], *, version: int) -> None:
        routes = [ShardRoute(s, self._keyspace.stream(s)) for s in shards]
        self._tables[stream] = RoutingTable(stream, version, routes)

    async def routing(self, stream: str) -> RoutingTable:
        try:
            return self._tables[stream]
        except KeyError:
            raise RoutingUnavailableError(f"no routing for stream {stream!r}") from None

    def invalidate(self, stream: str, version: int) -> None:
        # A fixed layout has nothing to refresh from.
        return None
