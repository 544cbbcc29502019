"""Publishing: route, encode, ``XADD NOMKSTREAM``, and re-route when a shard is gone.

The path of one message: :meth:`Producer.publish` asks the routing source for a valid
table (fails closed when the routing lease expired, E1), picks the shard (jump hash
or sticky round-robin), encodes the entry and sends one ``XADD … NOMKSTREAM``. A nil
reply means the shard key was retired by a scale-in: the table is invalidated, fresh
routing fetched, and the message re-routed, a bounded number of times (E16). With an
event id and a dedup window, the add goes through ``publish_dedup.lua`` instead,
which skips an event id this shard already took (E18).

A record with ``delay=``/``at=`` goes through ``delay_add.lua`` instead: stored in its
shard's slot until due (or added at once when already due), with the same dedup record
and the same re-route on a retired shard (``runtime/delayed_publish.py``).

:meth:`Producer.publish_many` does the same for a batch in one pipeline per round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from time import perf_counter
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from streamworks.clock import Clock
from streamworks.delay import Due, due_from
from streamworks.exceptions import BackendError, PublishNotDurableError, ShardRetiredError
from streamworks.protocol.codec import Codec
from streamworks.protocol.envelope import MAX_PAYLOAD, encode_fields
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.redis.wire import Arg, run_batch, run_batch_wait
from streamworks.runtime.delayed_publish import delay_add_command, parse_delay_add
from streamworks.runtime.metrics import PublishMetrics
from streamworks.runtime.routing import RoutingSource, RoutingTable, ShardRoute

__all__ = ("Producer", "Published", "Record")


@dataclass(frozen=True, slots=True)
class Record:
    """One message for :meth:`Producer.publish_many`.

    ``delay`` (a timedelta or seconds) or ``at`` (a timezone-aware datetime) make it a
    delayed message: it enters the stream when due (docs/delays.md)."""

    value: Any
    key: str | None = None
    event_id: str | None = None
    headers: Mapping[str, str] | None = None
    delay: timedelta | float | None = None
    at: datetime | None = None

    def due(self) -> Due | None:
        """When it is due (None: an ordinary publish); raises ConfigurationError on a
        bad ``delay``/``at`` (``streamworks.delay.due_from``)."""
        if self.delay is None and self.at is None:
            return None
        return due_from(self.delay, self.at)


@dataclass(frozen=True, slots=True)
class Published:
    """Where a message was written.

    Attributes:
        stream: the logical stream.
        shard: the shard id (``"orders/3@0"``).
        entry_id: the Redis entry id.
        routing_version: the routing version used.
        duplicate: True when shard-level dedup found the event id already written
            (``entry_id`` is then the earlier entry's id, or None when that one is
            still delayed: ``delay_id`` names it).
        delay_id: a delayed message stored until due: its id in the shard's delayed
            set (``entry_id`` is then None: it gets one when it enters the stream).
        due_ms: a delayed message's due time, ms since the epoch on the Redis clock
            (also set when it was due at once and went straight into the stream).
    """

    stream: str
    shard: str
    entry_id: str | None
    routing_version: int
    duplicate: bool = False
    delay_id: str | None = None
    due_ms: int | None = None

    @property
    def delayed(self) -> bool:
        """Whether the message waits in its shard's delayed set (not in the stream yet)."""
        return self.delay_id is not None


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
        durability: Mapping[str, tuple[int, float]] | None = None,
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
        # stream -> (min replicas, replica timeout s): durable publishing by default.
        self._durability = dict(durability or {})
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

    async def publish(
        self,
        stream: str,
        record: Record,
        *,
        min_replicas: int | None = None,
        replica_timeout: float | None = None,
    ) -> Published:
        """Publish one message; see the module docstring for the path it takes.

        Args:
            min_replicas: replicas that must have the entry before this returns
                (``WAIT``); the stream's default (``app.stream(min_replicas=...)``) when
                None.
            replica_timeout: how long (s) to wait for them; the stream's default when None.

        Raises:
            PublishNotDurableError: the entry was written but fewer replicas than
                ``min_replicas`` acknowledged it in time.
        """
        [published] = await self.publish_many(
            stream, [record], min_replicas=min_replicas, replica_timeout=replica_timeout
        )
        return published

    async def publish_many(
        self,
        stream: str,
        records: Sequence[Record],
        *,
        min_replicas: int | None = None,
        replica_timeout: float | None = None,
    ) -> list[Published]:
        """Publish a batch in one round trip (one write per Redis node); results are in
        the order of ``records``. ``min_replicas``/``replica_timeout`` as in
        :meth:`publish`, for every record of the batch."""
        if not records:
            return []
        now = str(self._clock.time_ms())
        encoded = [self._fields(r, now) for r in records]
        dues = [r.due() for r in records]
        wait = self._wait(stream, min_replicas, replica_timeout)
        results: list[Published | None] = [None] * len(records)
        weak: list[tuple[Published, Any]] = []
        todo = list(range(len(records)))
        started = perf_counter()
        for _ in range(self._max_reroutes):
            table = await self.routing.routing(stream)
            routes = [table.route(records[i].key, self._sticky_batch) for i in todo]
            commands = [
                self._command(stream, route, records[i].event_id, encoded[i], dues[i])
                for i, route in zip(todo, routes, strict=True)
            ]
            try:
                replies, waited = await self._send(commands, wait)
            except (RedisError, OSError) as e:
                where = routes[0].shard if len(routes) == 1 else repr(stream)
                raise BackendError(f"publish to {where} failed: {e}") from e
            retry: list[int] = []
            for n, (i, route, reply) in enumerate(zip(todo, routes, replies, strict=True)):
                if isinstance(reply, Exception):
                    raise BackendError(f"publish to {route.shard} failed: {reply}")
                if dues[i] is None:
                    parsed = self._parse_add(reply, records[i].event_id)
                    if parsed is None:
                        retry.append(i)
                        continue
                    entry_id, delay_id = _waiting(parsed[0])
                    published = Published(
                        stream, str(route.shard), entry_id, table.version, parsed[1], delay_id
                    )
                else:
                    delayed = parse_delay_add(reply, stream, str(route.shard), table.version)
                    if delayed is None:
                        retry.append(i)
                        continue
                    published = delayed
                    self.statistics.duplicates += delayed.duplicate
                results[i] = published
                if wait is not None and not _enough(waited[n], wait[0]):
                    weak.append((published, waited[n]))
            self.statistics.published += len(todo) - len(retry)
            if not retry:
                done = [r for r in results if r is not None]
                self.metrics.observe(stream, len(records), perf_counter() - started)
                if weak:
                    self.statistics.not_durable += len(weak)
                    raise _not_durable(stream, done, weak, wait)
                return done
            self._retired(stream, table)
            todo = retry
        raise ShardRetiredError(
            f"stream {stream!r}: {len(todo)} messages still routed to retired shards after "
            f"{self._max_reroutes} refreshes"
        )

    def _wait(
        self, stream: str, min_replicas: int | None, replica_timeout: float | None
    ) -> tuple[int, int] | None:
        """``(replicas, timeout ms)`` for a ``WAIT`` after the writes, or None."""
        default = self._durability.get(stream, (0, 1.0))
        replicas = default[0] if min_replicas is None else min_replicas
        timeout = default[1] if replica_timeout is None else replica_timeout
        if type(replicas) is not int or replicas < 0:
            raise ValueError(f"min_replicas must be an int >= 0, not {replicas!r}")
        if timeout <= 0:
            raise ValueError(f"replica_timeout must be positive, not {timeout!r}")
        if replicas == 0:
            return None
        return replicas, max(1, int(timeout * 1000))

    def _command(
        self,
        stream: str,
        route: ShardRoute,
        event_id: str | None,
        fields: list[bytes | str],
        due: Due | None = None,
    ) -> list[Arg]:
        window = self._dedup_ms.get(stream) if event_id is not None else None
        if due is not None:
            return delay_add_command(
                self._scripts, self._keyspace, route, event_id, window, due,
                self._clock.offset_ms, fields,
            )  # fmt: skip
        if window:
            assert event_id is not None
            sha = self._scripts.publish_dedup.sha
            dedup = self._keyspace.dedup(route.shard, event_id)
            return ["EVALSHA", sha, 2, route.key, dedup, window, *fields]
        return ["XADD", route.key, "NOMKSTREAM", "*", *fields]

    async def _send(
        self, commands: list[list[Arg]], wait: tuple[int, int] | None
    ) -> tuple[list[Any], list[Any]]:
        """Run the batch; a ``NOSCRIPT`` (a restarted or promoted node: scripts are not
        replicated) did not run, so the script is loaded and those commands sent again."""
        if wait is None:
            replies = await run_batch(self._redis, commands)
            waited: list[Any] = [None] * len(commands)
        else:
            replies, waited = await run_batch_wait(self._redis, commands, *wait)
        missing = [n for n, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            # Each script a refused command names (publish_dedup, delay_add).
            for script in (self._scripts.publish_dedup, self._scripts.delay_add):
                if any(commands[n][1] == script.sha for n in missing):
                    await self._redis.script_load(script.script)
            again = [commands[n] for n in missing]
            if wait is None:
                more, more_waited = await run_batch(self._redis, again), [None] * len(again)
            else:
                more, more_waited = await run_batch_wait(self._redis, again, *wait)
            for n, reply, w in zip(missing, more, more_waited, strict=True):
                replies[n], waited[n] = reply, w
        return replies, waited

    def _retired(self, stream: str, table: RoutingTable) -> None:
        # E16: the key was retired after this table was issued; nothing was written.
        self.statistics.reroutes += 1
        self.routing.invalidate(stream, table.version)

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
    not_durable: int = 0  # written, but fewer replicas than asked acknowledged in time


def _waiting(entry_id: str) -> tuple[str | None, str | None]:
    """``(entry id, delay id)`` of a dedup record's value: ``delayed:<id>`` while the
    event's earlier publish still waits in the delayed set (``delay_add.lua``)."""
    if entry_id.startswith("delayed:"):
        return None, entry_id.removeprefix("delayed:")
    return entry_id, None


def _enough(waited: Any, replicas: int) -> bool:
    return type(waited) is int and waited >= replicas


def _not_durable(
    stream: str,
    published: list[Published],
    weak: list[tuple[Published, Any]],
    wait: tuple[int, int] | None,
) -> PublishNotDurableError:
    assert wait is not None
    got = weak[0][1]
    detail = str(got) if isinstance(got, Exception) else f"{got} replica(s)"
    return PublishNotDurableError(
        f"stream {stream!r}: {len(weak)} of {len(published)} entries written but "
        f"acknowledged by {detail} within {wait[1]} ms, not the {wait[0]} asked for "
        f"(first: {weak[0][0].shard} {weak[0][0].entry_id})",
        published=published,
        not_durable=[p for p, _ in weak],
    )
