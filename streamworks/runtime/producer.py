"""Publishing: route, encode, ``XADD NOMKSTREAM``, and re-route when a shard is gone.

The path of one message: :meth:`Producer.publish` asks the routing source for a valid
table (fails closed when the routing lease expired, E1), picks the shard (jump hash
or sticky round-robin), encodes the entry and sends one ``XADD … NOMKSTREAM``. A nil
reply means the shard key was retired by a scale-in: the table is invalidated, fresh
routing fetched, and the message re-routed, a bounded number of times (E16). With an
event id and a dedup window, the add goes through ``publish_dedup.lua`` instead,
which skips an event id this shard already took (E18).

:meth:`Producer.publish_many` does the same for a batch in one pipeline per round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from redis.exceptions import RedisError

from streamworks.clock import Clock
from streamworks.exceptions import BackendError, ShardRetiredError
from streamworks.protocol.codec import Codec
from streamworks.protocol.envelope import MAX_PAYLOAD, encode_fields
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.redis.wire import run_batch
from streamworks.runtime.metrics import PublishMetrics
from streamworks.runtime.routing import RoutingSource, RoutingTable, ShardRoute

__all__ = ("Producer", "Published", "Record")


@dataclass(frozen=True, slots=True)
class Record:
    """One message for :meth:`Producer.publish_many`."""

    value: Any
    key: str | None = None
    event_id: str | None = None
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Published:
    """Where a message was written.

    Attributes:
        stream: the logical stream.
        shard: the shard id (``"orders/3@0"``).
        entry_id: the Redis entry id.
        routing_version: the routing version used.
        duplicate: True when shard-level dedup found the event id already written
            (``entry_id`` is then the earlier entry's id).
    """

    stream: str
    shard: str
    entry_id: str
    routing_version: int
    duplicate: bool = False


class Producer:
    """Publishes to sharded streams through a routing source."""

    def __init__(
        self,
        redis: Any,
        scripts: Scripts,
        keyspace: Keyspace,
        routing: RoutingSource,
        codec: Codec,
        *,
        max_reroutes: int = 5,
        sticky_batch: int = 100,
        dedup_windows: Mapping[str, float] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._redis = redis
        self._scripts = scripts
        self._keyspace = keyspace
        self.routing = routing
        self._codec = codec
        self._clock = clock or Clock()  # stamps published_at (wall clock)
        self._max_reroutes = max_reroutes
        self._sticky_batch = sticky_batch
        # stream -> dedup window (ms) for shard-level idempotent publish by event id.
        self._dedup_ms = {k: int(v * 1000) for k, v in (dedup_windows or {}).items() if v}
        self.statistics = ProducerStatistics()
        self.metrics = PublishMetrics()  # collected by the worker's /metrics

    def _fields(self, record: Record, now: str | None = None) -> list[bytes | str]:
        # Refuse here what the consumers would have to dead-letter as poison.
        if record.key is not None and type(record.key) is not str:
            raise TypeError(f"key must be a str, not {type(record.key).__name__}")
        if record.event_id is not None and type(record.event_id) is not str:
            raise TypeError(f"event_id must be a str, not {type(record.event_id).__name__}")
        if record.headers and not all(
            type(k) is str and type(v) is str for k, v in record.headers.items()
        ):
            raise TypeError("headers must map str to str")
        payload = self._codec.encode(record.value)
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
        headers = dict(record.headers) if record.headers else None
        published_at = now if now is not None else str(self._clock.time_ms())
        return encode_fields(payload, record.key, record.event_id, headers, published_at)

    async def publish(self, stream: str, record: Record) -> Published:
        """Publish one message; see the module docstring for the path it takes."""
        fields = self._fields(record)
        started = perf_counter()
        for _ in range(self._max_reroutes):
            table = await self.routing.routing(stream)
            route = table.route(record.key, self._sticky_batch)
            try:
                result = await self._add(stream, route, record.event_id, fields)
            except RedisError as e:
                raise BackendError(f"publish to {route.shard} failed: {e}") from e
            if result is not None:
                entry_id, duplicate = result
                self.statistics.published += 1
                self.metrics.observe(stream, 1, perf_counter() - started)
                return Published(stream, str(route.shard), entry_id, table.version, duplicate)
            self._retired(stream, table)
        raise ShardRetiredError(
            f"stream {stream!r}: routing still pointed at retired shards after "
            f"{self._max_reroutes} refreshes"
        )

    async def publish_many(self, stream: str, records: Sequence[Record]) -> list[Published]:
        """Publish a batch in one round trip; results are in the order of ``records``."""
        now = str(self._clock.time_ms())
        encoded = [self._fields(r, now) for r in records]
        results: list[Published | None] = [None] * len(records)
        todo = list(range(len(records)))
        dedup = self._dedup_ms.get(stream)
        started = perf_counter()
        for _ in range(self._max_reroutes):
            table = await self.routing.routing(stream)
            routes = [table.route(records[i].key, self._sticky_batch) for i in todo]
            try:
                if dedup and any(records[i].event_id is not None for i in todo):
                    replies = await self._pipeline(stream, todo, routes, records, encoded)
                else:
                    replies = await run_batch(
                        self._redis,
                        [
                            ["XADD", route.key, "NOMKSTREAM", "*", *encoded[i]]
                            for i, route in zip(todo, routes, strict=True)
                        ],
                    )
            except (RedisError, OSError) as e:
                raise BackendError(f"publish_many to {stream!r} failed: {e}") from e
            retry: list[int] = []
            for i, route, reply in zip(todo, routes, replies, strict=True):
                if isinstance(reply, Exception):
                    raise BackendError(f"publish to {route.shard} failed: {reply}")
                parsed = self._parse_add(reply, records[i].event_id)
                if parsed is None:
                    retry.append(i)
                else:
                    results[i] = Published(
                        stream, str(route.shard), parsed[0], table.version, parsed[1]
                    )
            self.statistics.published += len(todo) - len(retry)
            if not retry:
                self.metrics.observe(stream, len(records), perf_counter() - started)
                return [r for r in results if r is not None]
            self._retired(stream, table)
            todo = retry
        raise ShardRetiredError(
            f"stream {stream!r}: {len(todo)} messages still routed to retired shards after "
            f"{self._max_reroutes} refreshes"
        )

    async def _pipeline(
        self,
        stream: str,
        todo: list[int],
        routes: list[ShardRoute],
        records: Sequence[Record],
        encoded: list[list[bytes | str]],
    ) -> list[Any]:
        """The batch through redis-py's pipeline (needed for the dedup script)."""
        # As a context manager: a pipeline whose execute failed half-way (its script
        # check, a cut connection) is reset and its connection released either way.
        async with self._redis.pipeline(transaction=False) as pipe:
            for i, route in zip(todo, routes, strict=True):
                await self._queue_add(pipe, stream, route, records[i].event_id, encoded[i])
            return list(await pipe.execute(raise_on_error=False))

    def _retired(self, stream: str, table: RoutingTable) -> None:
        # E16: the key was retired after this table was issued; nothing was written.
        self.statistics.reroutes += 1
        self.routing.invalidate(stream, table.version)

    async def _add(
        self, stream: str, route: ShardRoute, event_id: str | None, fields: list[bytes | str]
    ) -> tuple[str, bool] | None:
        window = self._dedup_ms.get(stream) if event_id is not None else None
        if window:
            assert event_id is not None
            reply = await self._scripts.publish_dedup(
                keys=[route.key, self._keyspace.dedup(route.shard, event_id)],
                args=[window, *fields],
            )
        else:
            [reply] = await run_batch(
                self._redis, [["XADD", route.key, "NOMKSTREAM", "*", *fields]]
            )
            if isinstance(reply, Exception):
                raise reply
        return self._parse_add(reply, event_id)

    async def _queue_add(
        self,
        pipe: Any,
        stream: str,
        route: ShardRoute,
        event_id: str | None,
        fields: list[bytes | str],
    ) -> None:
        window = self._dedup_ms.get(stream) if event_id is not None else None
        if window:
            assert event_id is not None
            await self._scripts.publish_dedup(
                keys=[route.key, self._keyspace.dedup(route.shard, event_id)],
                args=[window, *fields],
                client=pipe,
            )
        else:
            pipe.execute_command("XADD", route.key, "NOMKSTREAM", "*", *fields)

    def _parse_add(self, reply: Any, event_id: str | None) -> tuple[str, bool] | None:
        """``(entry id, duplicate)``, or None when the shard key no longer exists."""
        if reply is None:
            return None
        if isinstance(reply, list):  # publish_dedup.lua
            status = reply[0]
            if status == -1:
                return None
            entry = reply[1]
            entry_id = entry.decode() if isinstance(entry, bytes) else str(entry)
            if status == 0:
                self.statistics.duplicates += 1
            return entry_id, status == 0
        return (reply.decode() if isinstance(reply, bytes) else str(reply)), False


@dataclass(slots=True)
class ProducerStatistics:
    """Counters of one producer."""

    published: int = 0
    duplicates: int = 0
    reroutes: int = 0
