"""Batched, pipelined acknowledgements.

Handlers finish one message at a time; acks leave in batches. :meth:`Acker.ack` only
appends to a buffer. One flusher task sends everything buffered in one pipeline
(one ``XACK`` per shard, plus an ``HDEL`` of retry records for messages that had
failed before), and while that pipeline is in flight new acks collect for the next
one — group commit, so batches grow exactly as large as the load requires and an
idle worker acks a single message at once.

A message is *settled* with its reader only after its ack is confirmed, so a drain
that waits for its reader to have nothing outstanding also waits for the acks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from streamworks.protocol.history import now
from streamworks.redis.wire import run_batch
from streamworks.runtime import history

if TYPE_CHECKING:
    from streamworks.runtime.message import Message
    from streamworks.runtime.metrics import FastHistogram
    from streamworks.runtime.reader import ShardReader

__all__ = ("Acker",)

log = logging.getLogger("streamworks.acks")


class Acker:
    """Acks messages of one group, batched per flush."""

    def __init__(self, redis: Any, group: str, *, max_batch: int = 1000) -> None:
        self._redis = redis
        self._group = group
        self._max_batch = max_batch
        self._buffer: dict[ShardReader, list[Message]] = {}
        self._retried: dict[ShardReader, list[bytes]] = {}
        self._wakeup: asyncio.Future[None] | None = None
        self.acked = 0
        self.flush_seconds: FastHistogram | None = None  # the worker's metrics

    def ack(self, message: Message) -> None:
        """Queue ``message`` for acknowledgement (after its handler succeeded)."""
        reader = message._reader
        batch = self._buffer.get(reader)  # type: ignore[arg-type]
        if batch is None:
            self._buffer[reader] = [message]  # type: ignore[index]
        else:
            batch.append(message)
        if message._retry_record:
            # The retry record and the run counter of a taken-over message (execution.py).
            assert reader is not None
            self._retried.setdefault(reader, []).extend((message._rid, message._rid + b":runs"))
        wakeup = self._wakeup
        if wakeup is not None:
            # Woken once per flush, not looked at again per message (the hot path).
            self._wakeup = None
            if not wakeup.done():
                wakeup.set_result(None)

    async def run(self) -> None:
        """Flush forever; cancel to stop (call :meth:`flush_now` first to lose nothing)."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._buffer:
                wakeup = self._wakeup = loop.create_future()
                try:
                    await wakeup
                finally:
                    self._wakeup = None
            await self.flush_now()

    async def flush_now(self) -> None:
        """Send everything buffered now and settle it with its readers."""
        while self._buffer:
            batch, self._buffer = self._buffer, {}
            retried_by_reader, self._retried = self._retried, {}
            group = self._group
            commands: list[list[bytes | str]] = []
            for reader, messages in batch.items():
                for i in range(0, len(messages), self._max_batch):
                    chunk = messages[i : i + self._max_batch]
                    commands.append(["XACK", reader.stream_key, group, *[m._rid for m in chunk]])
                    if reader.deletes_acked:
                        commands.append(["XDEL", reader.stream_key, *[m._rid for m in chunk]])
                retried = retried_by_reader.get(reader)
                if retried:
                    commands.append(["HDEL", reader.retry_key, *retried])
            failed = False
            sent = now()  # None unless a history is recorded
            started = time.perf_counter()
            try:
                replies = await run_batch(self._redis, commands)
                if self.flush_seconds is not None:
                    self.flush_seconds.observe(time.perf_counter() - started)
                errors = [r for r in replies if isinstance(r, Exception)]
                if errors:
                    raise errors[0]
                history.acked(batch, sent)
            except (RedisError, OSError) as e:
                # The entries stay pending; their readers re-claim them (a duplicate
                # delivery, never a loss).
                failed = True
                log.warning("ack flush failed: %s", e, extra={"group": group})
            for reader, messages in batch.items():
                if failed:
                    reader.ack_failed()
                else:
                    self.acked += len(messages)
                reader.settle_many(messages)
