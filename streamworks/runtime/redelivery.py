"""Per-group redelivery: dead letters replayed to one group only.

``streamworks dlq replay`` must not re-publish to the stream: every group on it would
handle the message again. Instead the replay (``streamworks.dlq``, shared by the CLI
and the dashboard) writes the dead letter's original entry fields (payload, key,
event id, headers, publish time, format) to the **redelivery stream of its group on
a live shard** (``Keyspace.redelivery(shard, group)``, in the shard's slot), through
the ``redeliver.lua`` script, which refuses a retired shard. The shard is chosen by
the routing: by the original key when there is one (so the replayed message joins
the key's current shard and its per-key order there), else the origin shard while it
is routable.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from streamworks.protocol.shards import ShardId
from streamworks.redis.wire import run_batch
from streamworks.runtime.reader import ReaderState, ShardReader

if TYPE_CHECKING:
    from streamworks.runtime.message import Message
    from streamworks.runtime.worker import Worker

__all__ = ("POLL_INTERVAL", "Redelivery", "RedeliveryReader")

log = logging.getLogger("streamworks.redelivery")

#: How often a worker looks for replayed dead letters on the shards it owns (s).
POLL_INTERVAL = 1.0


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
            await self.worker.clock.sleep(self.interval)
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
