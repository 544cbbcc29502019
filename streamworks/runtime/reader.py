"""Reading one owned shard: takeover, fenced reads, waiting, draining.

A :class:`ShardReader` exists while its member owns (or still drains) a shard. It
runs in two phases:

1. **takeover** — claim the group's pending entries on the shard (previous owners'
   and its own) with the fenced ``claim.lua``, looping on the ``XAUTOCLAIM``
   cursor, and hand them to the dispatcher first, each with the retry record that
   carries its attempt count across crashes; then prune consumers that own nothing.
2. **live** — fenced reads of new entries (the gate transaction: ``read_gate.lua``,
   ``XREADGROUP``, ``read_ungate.lua`` in one ``MULTI``; ``read.lua`` only while a
   Cluster slot migration refuses it); when there are none, the worker's
   idle waiter (``runtime/waiter.py``) waits for more with a plain ``XREAD`` from the
   last entry id, shared by every idle shard on a Redis node (``BLOCK`` is not allowed
   inside scripts on Redis <= 7.2, and a wait that does not read cannot steal entries
   from a newer owner).

Every read is checked against the shard's owner fence in the same step, so a member
that lost the shard (e.g. paused past its lease) cannot pull entries into its pending
list. Reads happen only while the local lease is valid, and a reply that arrives
after the lease expired is not processed: its entries stay pending and the reader
re-runs the takeover phase before reading again. Any connection error does the same,
since a lost reply may have delivered entries nobody will process otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
from redis.exceptions import NoPermissionError, RedisError, ResponseError, TryAgainError

from streamworks.protocol.shards import ShardId
from streamworks.redis.scripts import ReadStatus
from streamworks.redis.wire import Arg, TransactionNotAtomic
from streamworks.runtime import history
from streamworks.runtime.dead_letter import parse_final
from streamworks.runtime.message import Message, messages_from_entries

if TYPE_CHECKING:
    from streamworks.runtime.execution import HandlerRuntime
    from streamworks.runtime.worker import Worker

__all__ = ("ReaderState", "ShardReader", "read_error_reason")

log = logging.getLogger("streamworks.reader")

#: While a slot migration refuses the fenced read's transaction, how often (s) it is
#: tried again instead of the one-script read.
MIGRATION_RECHECK = 1.0


class ReaderState:
    """Why a reader stopped reading (``ShardReader.stop_reason``)."""

    DRAINED = "drained"  # revoked; finished in-flight work
    FENCED = "fenced"  # the owner fence names another grant
    RETIRED = "retired"  # the shard key no longer exists
    NO_GROUP = "no-group"  # the consumer group is missing on the shard
    STOPPED = "stopped"  # shutdown or lease loss


class ShardReader:
    """Reads one shard for one group and feeds its handler's dispatcher."""

    #: Acked entries are also deleted (``XDEL``): only for a group's private redelivery
    #: stream (``runtime/redelivery.py``); shard entries are trimmed, never deleted (E12).
    deletes_acked = False

    def __init__(self, worker: Worker, shard: ShardId, token: str, runtime: HandlerRuntime):
        keyspace = worker.keyspace
        self.worker = worker
        self.shard = shard
        self.shard_name = str(shard)
        self.token = token
        self.runtime = runtime
        self.group = worker.group
        self.consumer = worker.member_id
        self.stream_key = keyspace.stream(shard)
        self.fence_key = keyspace.fence(shard, self.group)
        self.hold_key = keyspace.read_hold(shard)
        self.retry_key = keyspace.retries(shard, self.group)
        self.accepting = True  # False once draining/stopped: queued messages are dropped
        self.stop_reason: str | None = None
        self.outstanding = 0  # messages handed to the dispatcher and not yet settled
        self.held: set[bytes] = set()  # their ids (a takeover pass skips them)
        self.recovering = True  # run the takeover phase before the next live read
        self.acked_since_trim = False
        self._limit = worker.settings.worker.read_batch * worker.settings.worker.read_ahead
        self._batch = worker.settings.worker.read_batch
        self._block_ms = int(worker.settings.worker.block * 1000)
        self._idle_after: bytes | None = None  # last entry id when a read found nothing
        self._wait_scope: anyio.CancelScope | None = None  # a wait for new entries
        self._cursor = "0-0"
        self._turn = asyncio.Event()
        self._turn.set()
        self._idle = asyncio.Event()  # set while outstanding == 0
        self._idle.set()
        self._scope: anyio.CancelScope | None = None
        self._errors = 0
        self._batch_sizes = worker.metrics.batch_histogram(shard.stream)
        self._migrating_until = 0.0  # clock.monotonic(): read with read.lua until then

    def __repr__(self) -> str:
        return f"ShardReader({self.shard_name}, token={self.token!r})"

    # -- the read loop ---------------------------------------------------------------
    async def run(self) -> None:
        """Read until the reader is stopped, fenced, or its shard is gone."""
        with anyio.CancelScope() as scope:
            self._scope = scope
            while self.accepting:
                await self._wait_turn()
                if not self.accepting:
                    break
                try:
                    if self.recovering:
                        await self._claim_round()
                    else:
                        await self._read_round()
                    self._errors = 0
                except (RedisError, OSError) as e:
                    await self._backoff(e)
        self._scope = None

    async def _wait_turn(self) -> None:
        lease = self.worker.lease
        while self.accepting:
            if not lease.valid():
                await lease.wait_valid()
                self.recovering = True  # entries may have been left pending meanwhile
                continue
            if self.outstanding >= self._limit:
                self._turn.clear()
                await self._turn.wait()
                continue
            return

    async def _backoff(self, error: BaseException) -> None:
        self._errors += 1
        if not isinstance(error, TryAgainError):  # refused before running: took nothing
            self.recovering = True
        delay = min(2.0, 0.05 * 2 ** min(self._errors, 6))
        if isinstance(error, ResponseError) and "NOGROUP" in str(error):
            self._stop(ReaderState.NO_GROUP)
            log.error("consumer group missing on %s; stopped reading it", self.shard_name)
            return
        reason = read_error_reason(error)
        self.worker.metrics.count_read_error(self.shard.stream, reason)
        if reason == "tryagain":
            # A Redis Cluster migration has split the shard's keys between two nodes
            # (docs/cluster.md): expected while it lasts; counted, not a warning.
            log.info(
                "read of %s waits for a slot migration; again in %.2fs", self.shard_name, delay
            )
        elif reason in ("denied", "not_atomic"):
            # Never a passing fault: the Redis user lacks a permission the fenced read
            # needs, and a read may have run unchecked (its entries are claimed, fenced,
            # by the takeover round that follows). Loud, every time.
            log.error(
                "read of %s refused by Redis (%s): the Redis user needs the worker ACL "
                "(`streamworks admin acl worker`); retrying in %.2fs",
                self.shard_name,
                error,
                delay,
            )
        else:
            log.warning("read of %s failed (%s); retrying in %.2fs", self.shard_name, error, delay)
        await self.worker.clock.sleep(delay)

    async def _read_round(self) -> None:
        keys: list[Arg] = [self.stream_key, self.fence_key, self.hold_key]
        # Never more than the read-ahead room left: bounded memory per shard.
        count = min(self._batch, self._limit - self.outstanding)
        idle_after, self._idle_after = self._idle_after, None
        reply: tuple[int, Any] | None = None
        if idle_after is not None:
            # Nothing new at the last read: wait for an entry after the last one. The
            # wait reads nothing (a plain XREAD, no group), so it cannot take entries
            # from anyone; the fenced read does, under a valid lease
            # (docs/protocol.md#fences-and-tokens): the wait ends before the lease does,
            # and a lease lost meanwhile (fenced, shortened) interrupts it
            # (interrupt_wait).
            left = self.worker.lease.remaining() - 0.05
            timeout = min(self._block_ms / 1000, left)
            if timeout <= 0:
                self._idle_after = idle_after  # the lease ends first: _wait_turn waits
                with self.worker.clock.move_on_at(self.worker.lease.deadline):
                    await self.worker.lease.wait_changed()
                return
            waiter = self.worker.waiter
            if waiter.take_own_wait():
                try:
                    reply = await self._wait_and_read(idle_after, int(timeout * 1000), keys, count)
                finally:
                    waiter.release_own_wait()
                if reply is None:  # interrupted: the queued read may have run, so claim
                    self._idle_after = idle_after
                    self.recovering = True
                    return
                self._handle_read(reply)
                return
            # Every own wait is taken: the worker's shared waiter (runtime/waiter.py, one
            # connection per node for all other idle shards) wakes this reader.
            try:
                with anyio.CancelScope() as self._wait_scope:
                    await waiter.wait(self.stream_key, idle_after, timeout)
                interrupted = self._wait_scope.cancel_called
            finally:
                self._wait_scope = None
            if interrupted:  # the lease was lost: _wait_turn waits for it
                self._idle_after = idle_after
                return
        # At most read_concurrency reads of the worker at once: its pool (one per node
        # on a cluster) then holds that many connections, not one per shard.
        async with self.worker.read_slots:
            reply = await self._fenced_read(keys, count)
        self._handle_read(reply)

    async def _fenced_read(
        self, keys: list[Arg], count: int, after: list[Arg] | None = None
    ) -> tuple[int, Any]:
        """The fenced read; while a Redis Cluster migration moves the shard's slot (the
        transaction gets ``TRYAGAIN`` throughout: its hold key never exists), the
        same check as one script on the two keys that do (``Scripts.plain_read``),
        trying the transaction again every :data:`MIGRATION_RECHECK` seconds."""
        scripts = self.worker.scripts
        clock = self.worker.clock
        if clock.monotonic() < self._migrating_until:
            return await scripts.plain_read(
                keys, self.group, self.consumer, self.token, count, after=after
            )
        try:
            reply = await scripts.fenced_read(
                keys, self.group, self.consumer, self.token, count, after=after, tryagain=1
            )
        except TryAgainError:
            self.worker.metrics.count_read_error(self.shard.stream, "tryagain")
            if not self._migrating_until:
                log.info(
                    "%s: a slot migration refuses the fenced read; one script reads",
                    self.shard_name,
                )
            self._migrating_until = clock.monotonic() + MIGRATION_RECHECK
            # Nothing ran (refused before EXEC): the wait, if any, returned already.
            return await scripts.plain_read(keys, self.group, self.consumer, self.token, count)
        if self._migrating_until:
            self._migrating_until = 0.0
            log.info("%s: the slot migration is over; fenced reads as usual", self.shard_name)
        return reply

    async def _wait_and_read(
        self, idle_after: bytes, block_ms: int, keys: list[Arg], count: int
    ) -> tuple[int, Any] | None:
        """An own wait: ``XREAD BLOCK`` on this shard alone with the fenced read sent
        right behind it on the same (pooled) connection, so Redis runs the read the
        moment the wait returns, with no round trip between (the lowest latency; one
        connection held while idle, hence the worker's ``own_waits`` bound). None when
        interrupted (a read left queued behind a dropped connection never runs)."""
        wait: list[Arg] = [
            "XREAD", "BLOCK", max(1, block_ms), "COUNT", 1, "STREAMS", self.stream_key, idle_after,
        ]  # fmt: skip
        try:
            with anyio.CancelScope() as self._wait_scope:
                return await self._fenced_read(keys, count, after=wait)
        finally:
            self._wait_scope = None
        return None

    def _handle_read(self, reply: tuple[int, Any]) -> None:
        status, value = reply
        if status == ReadStatus.ENTRIES:
            self._deliver(value, None)
        elif status == ReadStatus.IDLE:
            self._idle_after = value
        elif status == ReadStatus.UNCHECKED:
            # The gate failed and the read ran unchecked (logged by the script call):
            # what it took is claimed, fenced, next round.
            self.worker.metrics.count_read_error(self.shard.stream, read_error_reason(value))
            self.recovering = True
        else:
            self._refused(status, [status, value])

    async def _claim_round(self) -> None:
        async with self.worker.read_slots:
            await self._claim_batch()

    async def _claim_batch(self) -> None:
        reply = await self.worker.scripts.claim(
            keys=[self.stream_key, self.fence_key, self.retry_key],
            args=[self.group, self.consumer, self.token, self._cursor, self._batch],
        )
        status = reply[0]
        if status != 1:
            self._refused(status, reply)
            return
        cursor = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        self._deliver(reply[2], reply[3])
        if cursor == "0-0":
            self._cursor = "0-0"
            self.recovering = False
            await self.worker.scripts.prune_consumers(
                keys=[self.stream_key], args=[self.group, self.consumer]
            )
        else:
            self._cursor = cursor

    def _refused(self, status: int, reply: list[Any]) -> None:
        if status == -1:
            current = reply[1].decode() if len(reply) > 1 and reply[1] else ""
            log.warning(
                "fenced out of %s: fence is %r, our grant is %r",
                self.shard_name,
                current,
                self.token,
            )
            self._stop(ReaderState.FENCED)
        elif status == -2:
            log.info("shard %s no longer exists (retired)", self.shard_name)
            self._stop(ReaderState.RETIRED)
        else:  # pragma: no cover - scripts return only the statuses above
            raise RuntimeError(f"unexpected read status {status!r}")

    # -- handing entries to the dispatcher ------------------------------------------------
    def _deliver(self, entries: list[Any], records: list[Any] | None) -> None:
        """Hand entries to the dispatcher: new ones from a live read (``records`` is
        None), or claimed ones from a takeover round, with their retry records."""
        if not entries:
            return
        self._batch_sizes.observe(len(entries))
        if (
            not self.worker.lease.valid()
            or not self.accepting
            or (records is None and self.recovering)
        ):
            # Arrived after the lease expired (or we were told to stop): not processed;
            # the entries stay pending and the next takeover round claims them. So are
            # new entries read while a takeover round is due (drop_queued, ack_failed):
            # delivered now, they would run before the older entries it hands back.
            self.recovering = True
            return
        stream = self.shard.stream
        shard = self.shard_name
        make = Message._from_entry
        held = self.held
        if records is None:
            # XREADGROUP ">" never hands out an entry twice: no duplicate check. One
            # call for the batch (the consume hot path), not one per entry.
            messages = messages_from_entries(entries, stream, shard, self)
        else:
            messages = []
            clock = self.worker.clock
            now_ms, now = clock.time_ms(), clock.monotonic()
            for (rid, fields), record in zip(entries, records, strict=True):
                if rid in held:
                    continue  # already ours, in flight or waiting for a retry
                message = make(rid, stream, shard, self, fields)
                message._claimed = True
                if record:
                    _apply_retry_record(message, record, now_ms, now)
                messages.append(message)
        if messages:
            history.delivered(self, len(messages))
            held.update([m._rid for m in messages])
            self.outstanding += len(messages)
            self._idle.clear()
            self.runtime.dispatcher.submit(messages)

    # -- settling ------------------------------------------------------------------------
    def settle(self, message: Message) -> None:
        """``message`` is done with here (acked, dead-lettered or dropped)."""
        self.held.discard(message._rid)
        self.outstanding -= 1
        self._after_settle()

    def settle_many(self, messages: Sequence[Message]) -> None:
        """:meth:`settle` for a batch (one set operation, not one call per message)."""
        self.held.difference_update([m._rid for m in messages])
        self.outstanding -= len(messages)
        self.acked_since_trim = True
        self._after_settle()

    def _after_settle(self) -> None:
        if self.outstanding < self._limit:
            self._turn.set()
        if self.outstanding == 0:
            self._idle.set()

    def drop_queued(self) -> None:
        """A message reached its run after the lease ran out (or its shard was revoked):
        every other queued message of this shard is dropped too, and stays pending.

        A lease renewed a moment later (the same grant) would otherwise start the
        messages queued behind the dropped one while it waits for the takeover round,
        which hands it back *behind* them: its key's order broken within one grant (the
        chaos checker found it). The takeover round hands them all back in entry order.
        """
        self.recovering = True
        if self.accepting:  # a stopped reader's queue is already discarded (_stop)
            self.runtime.dispatcher.discard(lambda m: m._reader is not self)

    def ack_failed(self) -> None:
        """An ack flush failed: the entries stay pending, so claim them again."""
        self.recovering = True

    # -- stopping ------------------------------------------------------------------------
    def _stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.accepting = False
        self._turn.set()
        if self._scope is not None:
            self._scope.cancel()
        # Queued messages of this shard are dropped; running ones finish.
        self.runtime.dispatcher.discard(lambda m: m._reader is not self)
        self.worker.reader_stopped(self)

    @property
    def waiting(self) -> bool:
        """Whether the reader is waiting for new entries (in the idle waiter)."""
        return self._wait_scope is not None

    def interrupt_wait(self) -> None:
        """Cut a wait for new entries short (the lease was lost): the reader then waits
        for the lease before its next fenced read."""
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    def stop(self, reason: str = ReaderState.STOPPED) -> None:
        """Stop reading; queued messages are dropped (they stay pending in Redis)."""
        if self.accepting:
            self._stop(reason)

    async def wait_idle(self) -> None:
        """Wait until every message handed out has settled (handled and acked)."""
        await self._idle.wait()


#: How servers word an ACL refusal (NOPERM; inside a script: Valkey, then Redis 7 for a
#: command and for a key).
_DENIED = ("NOPERM", "ACL failure in script", "can't run this command", "can't access")


def read_error_reason(error: BaseException) -> str:
    """The ``reason`` label of ``streamworks_read_errors_total`` for a failed read."""
    if isinstance(error, TransactionNotAtomic):
        return "not_atomic"
    if isinstance(error, NoPermissionError) or any(m in str(error) for m in _DENIED):
        return "denied"  # (an ACL refusal inside a script is a plain script error)
    if isinstance(error, TryAgainError):
        return "tryagain"
    if isinstance(error, ResponseError):
        return "refused"
    return "connection"


def _apply_retry_record(message: Message, record: bytes, now_ms: int, now: float) -> None:
    """Restore failures and due time left by an earlier attempt (maybe another member).

    ``now_ms`` is the clock's wall time (the record's due time is wall time, shared by
    every member), ``now`` its monotonic time (what the dispatcher's parks are on)."""
    final = parse_final(record)
    if final is not None:
        # A recorded final failure (dead_letter.py): the handler is not run again.
        message._dead_letter = final
        message._retry_record = True
        return
    try:
        failures, due_ms = record.split(b":", 1)
        message._failures = int(failures)
        wait = (int(due_ms) - now_ms) / 1000
    except ValueError:
        return
    message._retry_record = True
    if wait > 0:
        message.due = now + wait
