"""Routing of a replay (``streamworks.dlq``): tables from whoever answers
``routing(stream)`` — the coordinator's HTTP client or the coordinator service — each
answer's namespace id checked against this Redis, each table used until its lease
ends (never past it, E1), keys placed by the routing protocol."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

from redis.exceptions import RedisError

from streamworks.clock import Clock
from streamworks.exceptions import (
    BackendError,
    CoordinatorError,
    NoShardsError,
    RoutingUnavailableError,
    UnknownNameError,
)
from streamworks.protocol.control import RoutingResponse
from streamworks.protocol.routing import ROUTING_PROTOCOL, jump_hash, key_hash
from streamworks.protocol.shards import ShardId
from streamworks.redis.namespace import NamespaceCheck

__all__ = ("ReplayRouting", "RoutingAnswers", "Table")


class RoutingAnswers(Protocol):
    """Who answers routing: ``CoordinatorClient`` (HTTP) or ``CoordinatorService``."""

    async def routing(self, stream: str) -> RoutingResponse: ...


@dataclass(slots=True)
class Table:
    """One routing answer, used until its lease ends (never past it, E1)."""

    version: int
    shards: list[ShardId]
    protocol: str
    expires_at: float
    _round: itertools.count[int] = field(default_factory=itertools.count)

    def target(self, key: str | None, origin: str) -> ShardId:
        """The key's shard now; an unkeyed entry its origin while routable, else the
        next shard in turn."""
        n = len(self.shards)
        if n == 0:
            raise NoShardsError(f"the stream has 0 shards (routing v{self.version})")
        if key is None:
            for shard in self.shards:
                if str(shard) == origin:
                    return shard
            return self.shards[next(self._round) % n]
        if self.protocol != ROUTING_PROTOCOL:
            raise RoutingUnavailableError(f"unsupported routing protocol {self.protocol!r}")
        return self.shards[jump_hash(key_hash(key), n)]


class ReplayRouting:
    """Routing tables for one operation, each fetched once and its namespace checked."""

    def __init__(
        self, answers: RoutingAnswers, namespace: NamespaceCheck | None, where: str, clock: Clock
    ) -> None:
        self._answers = answers
        self._namespace = namespace
        self._where = where
        self._clock = clock
        self._tables: dict[str, Table] = {}

    async def table(self, stream: str) -> Table:
        table = self._tables.get(stream)
        if table is not None and self._clock.monotonic() < table.expires_at:
            return table
        asked = self._clock.monotonic()
        try:
            response = await self._answers.routing(stream)
        except CoordinatorError as e:
            if e.code == "NOT_FOUND":
                raise UnknownNameError(
                    f"unknown stream {stream!r} (see streamworks streams ls)"
                ) from e
            raise RoutingUnavailableError(f"no routing for stream {stream!r}: {e}") from e
        if self._namespace is not None:
            try:
                await self._namespace.verify(response.namespace_id, coordinator=self._where)
            except RedisError as e:
                raise BackendError(f"namespace check failed: {e}") from e
        table = Table(
            response.routing_version,
            [ShardId.parse(s.shard) for s in response.shards],
            response.protocol,
            asked + response.lease_ms / 1000,
        )
        self._tables[stream] = table
        return table

    def invalidate(self, stream: str) -> None:
        self._tables.pop(stream, None)
