"""Per-group redelivery: dead letters replayed to one group only.

``streamworks dlq replay`` must not re-publish to the stream: every group on it would
handle the message again. Instead :func:`redeliver` writes the dead letter's original
entry fields (payload, key, event id, headers, publish time, format) to the
**redelivery stream of its group on a live shard**
(``Keyspace.redelivery(shard, group)``, in the shard's slot), through the
``redeliver.lua`` script, which refuses a retired shard. The shard is chosen by the
producer's routing: by the original key when there is one (so the replayed message
joins the key's current shard and its per-key order there), else the origin shard
while it is routable, else the sticky round-robin.

On the worker side, :class:`Redelivery` (one per worker) looks, every
:data:`POLL_INTERVAL`, which of the shards it owns have a redelivery stream (one
``EXISTS`` per owned shard, in one round trip), and drains each one with a
:class:`RedeliveryReader`: a takeover round (entries a previous owner left pending),
then fenced reads (``read.lua`` with the *shard's* owner fence, so only the current
owner of the shard reads it), handing the messages to the same handler dispatcher —
same handler, same per-key lanes, same retries and dead-lettering. An acked entry is
removed from the redelivery stream (``XACK`` and ``XDEL`` in the ack flush: no other
group reads it). Its in-flight messages count as the shard reader's, so a drain of
the shard (revocation, shutdown) also waits for them, and a stopped shard reader
stops its redelivery reader.

Once everything in it was handled (no entry, nothing pending, nothing of it in flight
here), the owner removes the redelivery stream (``redelivery_done.lua``, fenced, in the
shard's slot: a replay that comes first keeps it, one that comes after creates it
again) and stops reading it: an empty redelivery stream is not polled forever.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from redis.exceptions import RedisError

from streamworks.exceptions import BackendError, ShardRetiredError
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.redis.wire import run_batch
from streamworks.runtime.reader import ReaderState, ShardReader
from streamworks.runtime.routing import RoutingSource, RoutingTable

if TYPE_CHECKING:
    from streamworks.runtime.message import Message
    from streamworks.runtime.worker import Worker

__all__ = (
    "POLL_INTERVAL",
    "Redelivered",
    "Redelivery",
    "RedeliveryReader",
    "original_key",
    "redeliver",
    "target_shard",
)

log = logging.getLogger("streamworks.redelivery")

#: How often a worker looks for replayed dead letters on the shards it owns (s).
POLL_INTERVAL = 1.0

#: Entry fields of the original message kept in a dead letter (as ``o.<name>``).
ORIGINAL_FIELDS = (b"v", b"k", b"e", b"h", b"t", b"f")


# -- writing (the CLI side) -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Redelivered:
    """Where a dead letter was replayed to."""

    group: str
    stream: str
    shard: str
    entry_id: str
    routing_version: int


def original_key(dead_letter: Mapping[bytes, bytes]) -> str | None:
    """The original key; ValueError when the entry would be poison again (a key or
    event id that is not UTF-8, headers that are not a JSON object of strings)."""
    raw_key = dead_letter.get(b"o.k")
    key = raw_key.decode() if raw_key is not None else None  # UnicodeDecodeError: ValueError
    event_id = dead_letter.get(b"o.e")
    if event_id is not None:
        event_id.decode()
    raw_headers = dead_letter.get(b"o.h")
    if raw_headers is not None:
        headers = orjson.loads(raw_headers)  # orjson.JSONDecodeError is a ValueError
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValueError("headers are not an object of strings")
    return key


def target_shard(table: RoutingTable, key: str | None, origin: str) -> ShardId:
    """Where a replayed dead letter goes: the key's shard under ``table`` (keyed
    messages keep their per-key order with what is published now), else its origin
    shard while routable, else the sticky round-robin."""
    if key is None and any(str(r.shard) == origin for r in table.shards):
        return ShardId.parse(origin)
    return table.route(key).shard


async def redeliver(
    redis: Any,
    scripts: Scripts,
    keyspace: Keyspace,
    routing: RoutingSource,
    group: str,
    stream: str,
    dead_letter: Mapping[bytes, bytes],
    *,
    max_reroutes: int = 5,
) -> Redelivered:
    """Replay one dead-letter entry (its raw fields) of ``group``'s dead-letter stream
    for ``stream`` to ``group`` only.

    Raises:
        ValueError: the entry carries no original payload (nothing to replay), or its
            origin is unreadable.
        ShardRetiredError: routing kept pointing at retired shards.
        BackendError: Redis failed.
        RoutingUnavailableError / NoShardsError: from the routing source.
    """
    fields: list[bytes] = []
    for name in ORIGINAL_FIELDS:
        value = dead_letter.get(b"o." + name)
        if value is not None:
            fields += [name, value]
    if b"o.v" not in dead_letter:
        raise ValueError("no original payload")
    origin = dead_letter.get(b"shard", b"").decode()
    key = original_key(dead_letter)
    # Where it came from, for whoever looks at the message (ignored by the decoder).
    fields += [b"r.origin", f"{origin} {dead_letter.get(b'entry_id', b'').decode()}".encode()]
    for _ in range(max_reroutes):
        table = await routing.routing(stream)
        shard = target_shard(table, key, origin)
        try:
            reply = await scripts.redeliver(
                keys=[keyspace.stream(shard), keyspace.redelivery(shard, group)],
                args=[group, *fields],
            )
        except RedisError as e:
            raise BackendError(f"redelivery to {shard} failed: {e}") from e
        if reply[0] == 1:
            entry = reply[1]
            entry_id = entry.decode() if isinstance(entry, bytes) else str(entry)
            return Redelivered(group, stream, str(shard), entry_id, table.version)
        routing.invalidate(stream, table.version)  # retired since the table was issued
    raise ShardRetiredError(
        f"stream {stream!r}: routing still pointed at retired shards after {max_reroutes} refreshes"
    )


# -- reading (the worker side) ----------------------------------------------------------
class RedeliveryReader(ShardReader):
    """Reads the group's redelivery stream of one owned shard, under the shard
    reader's grant; its messages count as the shard reader's outstanding work."""

    deletes_acked = True  # the ack flush removes acked entries (no other group reads it)

    def __init__(self, parent: ShardReader) -> None:
        super().__init__(parent.worker, parent.shard, parent.token, parent.runtime)
        keyspace = parent.worker.keyspace
        self.parent = parent
        self.stream_key = keyspace.redelivery(parent.shard, parent.group)
        self.retry_key = keyspace.redelivery_retries(parent.shard, parent.group)
        self.removed = False  # the stream was empty and removed: nothing left to read

    def __repr__(self) -> str:
        return f"RedeliveryReader({self.shard_name}, token={self.token!r})"

    async def drain_once(self) -> None:
        """Take over what a previous owner left pending, then read new entries until
        there are none or the shard's read-ahead room is used up."""
        parent = self.parent
        scripts = self.worker.scripts
        while self.accepting and parent.accepting and self.worker.lease.valid():
            self.token = parent.token  # follows a re-grant of the shard
            room = min(self._batch, parent._limit - parent.outstanding)
            if room <= 0:
                return  # the shard reader's work first; the next poll continues
            if self.recovering:
                reply = await scripts.claim(
                    keys=[self.stream_key, parent.fence_key, self.retry_key],
                    args=[self.group, self.consumer, self.token, self._cursor, room],
                )
                if reply[0] != 1:
                    return  # no stream, or fenced (the shard reader finds out too)
                cursor = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
                self._deliver(reply[2], reply[3])
                self._cursor = cursor
                if cursor == "0-0":
                    self.recovering = False
                    await scripts.prune_consumers(
                        keys=[self.stream_key], args=[self.group, self.consumer]
                    )
                continue
            reply = await scripts.call(
                "read",
                [self.stream_key, parent.fence_key],
                [self.group, self.consumer, self.token, room],
            )
            if reply[0] == 0 and self.outstanding == 0:
                await self._remove_if_done()
            if reply[0] != 1:
                return  # nothing new, no stream, or fenced
            self._deliver(reply[1], None)

    async def _remove_if_done(self) -> None:
        """Nothing new, nothing of it in flight here: remove the stream if nothing is
        left in it either (checked in the script, with the fence)."""
        done = await self.worker.scripts.redelivery_done(
            keys=[self.stream_key, self.parent.fence_key, self.retry_key],
            args=[self.group, self.token],
        )
        if int(done) == 1:
            self.removed = True
            log.info(
                "replayed dead letters on %s all handled: redelivery stream removed",
                self.shard_name,
                extra={"group": self.group},
            )

    def _deliver(self, entries: list[Any], records: list[Any] | None) -> None:
        before = self.outstanding
        super()._deliver(entries, records)
        added = self.outstanding - before
        if added:
            self.parent.outstanding += added
            self.parent._idle.clear()

    def settle(self, message: Message) -> None:
        super().settle(message)
        self._settle_parent(1)

    def settle_many(self, messages: Sequence[Message]) -> None:
        super().settle_many(messages)
        self._settle_parent(len(messages))

    def _settle_parent(self, n: int) -> None:
        parent = self.parent
        parent.outstanding -= n
        parent._after_settle()

    def _stop(self, reason: str) -> None:
        # Not the shard reader's _stop: the worker's bookkeeping of fenced and retired
        # shards follows the shard reader alone.
        if self.stop_reason is None:
            self.stop_reason = reason
        self.accepting = False
        self.runtime.dispatcher.discard(lambda m: m._reader is not self)


class Redelivery:
    """A worker's redelivery: finds and drains the redelivery streams of its shards."""

    def __init__(self, worker: Worker, *, interval: float = POLL_INTERVAL) -> None:
        self.worker = worker
        self.interval = interval
        self.readers: dict[ShardId, RedeliveryReader] = {}

    async def run(self) -> None:
        """Poll forever; cancel to stop."""
        while True:
            await anyio.sleep(self.interval)
            try:
                await self.poll()
            except (RedisError, OSError) as e:
                log.warning("redelivery poll failed: %s", e, extra={"group": self.worker.group})
                for reader in self.readers.values():
                    reader.recovering = True  # a lost reply may have delivered entries

    async def poll(self) -> None:
        """One pass: drain every owned shard's redelivery stream that exists."""
        worker = self.worker
        if not worker.lease.valid():
            return
        parents = [r for r in worker.readers.values() if r.accepting]
        if not parents:
            return
        keyspace = worker.keyspace
        replies = await run_batch(
            worker.redis, [["EXISTS", keyspace.redelivery(r.shard, r.group)] for r in parents]
        )
        for parent, exists in zip(parents, replies, strict=True):
            if isinstance(exists, Exception):
                raise exists
            if not exists:
                continue
            reader = self.readers.get(parent.shard)
            if reader is None or reader.parent is not parent:
                if reader is not None:
                    reader.stop(ReaderState.STOPPED)
                reader = self.readers[parent.shard] = RedeliveryReader(parent)
            await reader.drain_once()
            if reader.removed:
                del self.readers[parent.shard]

    def reader_stopped(self, parent: ShardReader) -> None:
        """The shard reader stopped: so does its redelivery reader (queued messages stay
        pending in the redelivery stream for the shard's next owner)."""
        reader = self.readers.get(parent.shard)
        if reader is not None and reader.parent is parent:
            del self.readers[parent.shard]
            reader.stop(parent.stop_reason or ReaderState.STOPPED)
