"""A worker: one member of an app's consumer group.

The worker owns the data plane of one process. Its assignment source (the
coordinator's heartbeat loop, or a static map) tells it which shards it may read and
under which grant; the worker runs one :class:`~streamworks.runtime.reader.ShardReader`
per owned shard, one dispatcher per handler, one acker and one trimmer, all in one
anyio task group, and keeps reading only while its lease is valid.

Shutdown is graceful: stop reading, let in-flight messages finish within
``shutdown_timeout``, flush acks, then leave the group so the shards move at once —
but only once every handler run has ended (async ones are cancelled after the
timeout; a sync one still running is waited for under the last lease, and one that
outlives it fail-stops the process without a leave: ``ownership.py``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from redis.exceptions import RedisError

from streamworks.clock import Clock
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.runtime import history
from streamworks.runtime.acks import Acker
from streamworks.runtime.batching import handler_runtime
from streamworks.runtime.delay_mover import DelayMetrics, read_and_move
from streamworks.runtime.execution import HandlerRuntime
from streamworks.runtime.idempotency import IdempotencyStore, RedisIdempotencyStore
from streamworks.runtime.lease import Lease
from streamworks.runtime.metrics import WorkerMetrics
from streamworks.runtime.ownership import Runs, exit_process, watch_lease
from streamworks.runtime.reader import ReaderState, ShardReader
from streamworks.runtime.redelivery import Redelivery
from streamworks.runtime.scheduler import Scheduler
from streamworks.runtime.waiter import IdleWaiter
from streamworks.settings import Settings

if TYPE_CHECKING:
    from streamworks.runtime.app_view import AppView
    from streamworks.runtime.assignment import AssignmentSource

__all__ = ("Worker", "WorkerStatistics")

log = logging.getLogger("streamworks.worker")


class WorkerStatistics(dict[str, dict[str, int]]):
    """Per-stream handler counters of a worker (``{stream: {counter: n}}``)."""


class Worker:
    """Runs an app's handlers on the shards its assignment source grants.

    Args:
        app: the app (its name is the group).
        redis: an asyncio Redis client.
        assignment: the assignment source.
        settings: settings; the app's by default.
        member_id: this member's id; a new UUID per process start by default.
        clock: the time source of its lease, retries and timers (tests advance it).
    """

    def __init__(
        self,
        app: AppView,
        redis: Any,
        assignment: AssignmentSource,
        *,
        settings: Settings | None = None,
        member_id: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.app = app
        self.group = app.name
        self.settings = settings or app.settings
        self.redis = redis
        self.scripts = Scripts(redis)
        self.keyspace = Keyspace(self.settings.key_prefix)
        self.assignment = assignment
        self.member_id = member_id or uuid.uuid4().hex
        self.clock = clock or Clock()
        self.lease = Lease(
            clock=self.clock,
            grace=self.settings.worker.lease_grace,
            drift=self.settings.worker.lease_drift,
        )
        # Every handler run, so none outlives the lease (ownership.py).
        self.runs = Runs(self.lease.valid, self.lease.held)
        #: Called when a run outlives its lease's fail-stop point; exits the process.
        self.fail_stop: Callable[[str], None] = exit_process
        self.metrics = WorkerMetrics(self)  # before the handlers: they bind histograms
        # Delayed messages moved into owned shards' streams (runtime/delay_mover.py).
        self.delays = DelayMetrics(self.group)
        self.metrics.registry.register(self.delays)
        self.acker = Acker(redis, self.group, max_batch=self.settings.worker.ack_batch)
        self.acker.flush_seconds = self.metrics.ack_flush
        # Reads and takeover rounds in flight at once (reader.py): bounds the pool.
        self.read_slots = anyio.Semaphore(self.settings.worker.read_concurrency)
        self.waiter = IdleWaiter(
            redis,
            block=self.settings.worker.block,
            idle_poll=self.settings.worker.idle_poll,
            own_waits=self.settings.worker.own_waits,
        )
        store: IdempotencyStore = app.idempotency_store or RedisIdempotencyStore(
            redis,
            self.keyspace,
            self.group,
            completed_ttl=self.settings.worker.idempotency_ttl,
        )
        self.handlers: dict[str, HandlerRuntime] = {
            stream: handler_runtime(self, spec, self.acker, store)  # per message or batch
            for stream, spec in app.handlers.items()
        }
        self.readers: dict[ShardId, ShardReader] = {}
        self.redelivery = Redelivery(self)  # dead letters replayed to this group only
        # The app's schedules, run while this member owns the schedule shard.
        self.scheduler: Scheduler | None = Scheduler(self) if app.schedules else None
        self.revoking: set[ShardId] = set()
        self.fenced: set[ShardId] = set()
        self.retired: set[ShardId] = set()
        self._tg: TaskGroup | None = None
        self._stopping = False
        self._stop_requested = anyio.Event()
        self._assignment_scope = anyio.CancelScope()
        self.stopped = anyio.Event()
        self._changed = anyio.Event()

    def __repr__(self) -> str:
        return f"Worker({self.group!r}, member={self.member_id[:8]}, shards={len(self.readers)})"

    @property
    def subscriptions(self) -> frozenset[str]:
        """The streams this member handles (and the schedule stream, with schedules)."""
        if self.scheduler is not None:
            return frozenset(self.handlers) | {self.keyspace.SCHEDULE_STREAM}
        return frozenset(self.handlers)

    # -- running ---------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`request_stop` (or cancellation); then stop gracefully."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self.acker.run)
                tg.start_soon(self.waiter.run)
                for runtime in self.handlers.values():
                    tg.start_soon(runtime.dispatcher.run)
                tg.start_soon(self._trim_loop)
                tg.start_soon(self.redelivery.run)
                tg.start_soon(self._lease_watchdog)
                await tg.start(self._run_assignment)
                task_status.started()
                await self._stop_requested.wait()
                await self._stop_gracefully()
                tg.cancel_scope.cancel()
        finally:
            self._tg = None
            self.stopped.set()

    @property
    def stopping(self) -> bool:
        """Whether a graceful stop was requested."""
        return self._stop_requested.is_set()

    async def _run_assignment(self, *, task_status: TaskStatus[None]) -> None:
        with self._assignment_scope:
            await self.assignment.run(self, task_status=task_status)

    def request_stop(self) -> None:
        """Begin a graceful stop (idempotent)."""
        self._stop_requested.set()

    async def _stop_gracefully(self) -> None:
        self._stopping = True
        timeout = self.settings.worker.shutdown_timeout
        for reader in list(self.readers.values()):
            reader.stop(ReaderState.STOPPED)
        if self.scheduler is not None:
            self.scheduler.drop(None)  # a tick cut short is finished by the next owner
        with anyio.move_on_after(timeout) as scope:
            for reader in list(self.readers.values()):
                await reader.wait_idle()
            await self.acker.flush_now()
        if scope.cancelled_caught:
            log.warning("shutdown timeout (%.1fs): in-flight work left pending", timeout)
        # Stop heartbeating before leaving, so no heartbeat races the leave (it would
        # be answered UNKNOWN_MEMBER and rejoin).
        self._assignment_scope.cancel()
        # Leave only once every run has ended: the leave frees the shards at once.
        # Async runs are cancelled; sync ones are waited for, under the lease of the
        # last heartbeat: one that outlives its fail-stop point exits the process (the
        # watchdog), without a leave, and the lease expires instead (ownership.py).
        if self.runs.count():
            self.runs.cancel()
            log.warning("shutdown: waiting for %d handler runs to end", self.runs.count())
            await self.runs.wait_ended()
            with anyio.move_on_after(timeout or 1, shield=True):
                await self.acker.flush_now()  # what the runs that ended since settled
        with anyio.move_on_after(5, shield=True):
            await self.assignment.leave(self)
        log.info("worker %s stopped", self.member_id)

    # -- assignment surface (used by assignment sources) ----------------------------------
    def owned_shards(self) -> frozenset[ShardId]:
        """Shards being read or with work in flight (reported as ``ownedShards``)."""
        if self.scheduler is not None and self.scheduler.runners:
            return frozenset(self.readers) | self.scheduler.owned()
        return frozenset(self.readers)

    def revoking_shards(self) -> frozenset[ShardId]:
        """Shards told to drain and still draining (reported as ``revokingShards``)."""
        return frozenset(self.revoking)

    def applied(self, grants: Mapping[ShardId, str]) -> Mapping[ShardId, str]:
        """The part of ``grants`` this member acts on (for the protocol history): all of
        them, or, while stopping (it applies none), those it still holds — a shard it
        released is not taken again by an answer that still lists it."""
        if not self._stopping:
            return grants
        owned = self.owned_shards()
        return {shard: token for shard, token in grants.items() if shard in owned}

    def apply_assignment(self, grants: Mapping[ShardId, str]) -> None:
        """Read exactly ``grants`` (shard -> grant token) from now on.

        New shards get a reader (takeover first); a shard whose grant token changed is
        re-read under the new token. Shards not in ``grants`` are left alone: revoking
        them is :meth:`start_drain`, losing them is :meth:`drop_shards`.
        """
        if self._stopping:
            return
        for shard, token in grants.items():
            if shard in self.retired:
                continue
            self.fenced.discard(shard)
            if self.scheduler is not None and self.scheduler.handles(shard):
                self.scheduler.grant(shard, token)
                continue
            reader = self.readers.get(shard)
            if reader is not None and reader.token == token and reader.accepting:
                continue
            if shard in self.revoking:
                continue  # still draining; it is granted again once the drain is reported
            if reader is not None:
                if reader.token != token and reader.accepting:
                    # Same shard, newer grant (e.g. after a rejoin): continue under it.
                    reader.token = token
                    reader.recovering = True
                    continue
                if not reader.accepting:
                    continue  # stopping; re-granted once its in-flight work settled
            self._start_reader(shard, token)

    def _start_reader(self, shard: ShardId, token: str) -> None:
        runtime = self.handlers.get(shard.stream)
        if runtime is None:
            log.error("granted %s but this app has no handler for %r", shard, shard.stream)
            return
        reader = ShardReader(self, shard, token, runtime)
        self.readers[shard] = reader
        assert self._tg is not None
        self._tg.start_soon(self._run_reader, reader)
        log.info("reading %s (grant %s)", shard, token)

    async def _run_reader(self, reader: ShardReader) -> None:
        try:
            # The shard's delayed messages are moved into it while it is read.
            await read_and_move(self, reader)
        finally:
            # In-flight messages of a stopped reader still finish and ack, and its
            # shard counts as ours until every run on it (even an abandoned thread)
            # has ended: only then is a drain reported.
            await reader.wait_idle()
            await self.runs.wait_ended([reader.shard_name])
            history.released(self, reader)
            if self.readers.get(reader.shard) is reader:
                del self.readers[reader.shard]
            self.revoking.discard(reader.shard)
            self._changed.set()
            self._changed = anyio.Event()

    def start_drain(self, shards: Iterable[ShardId]) -> None:
        """DRAIN: stop reading ``shards``, finish and ack in-flight work, then drop them.

        Until then they are reported in :meth:`revoking_shards`, and a revoking shard
        is never read again on this grant, whatever happens to heartbeats (E7).
        """
        for shard in shards:
            if self.scheduler is not None and self.scheduler.drain(shard):
                continue
            reader = self.readers.get(shard)
            if reader is None:
                continue
            self.revoking.add(shard)
            log.info("giving %s up (revoked: it moves to another member once drained)", shard)
            reader.stop(ReaderState.DRAINED)

    def drop_shards(self, shards: Iterable[ShardId] | None = None) -> None:
        """Stop reading ``shards`` (all when None) at once: fenced or unknown member.

        Running async handlers of those shards are cancelled, sync ones finish (their
        entries stay pending); queued messages stay pending for the next owner.
        """
        dropped = list(self.readers) if shards is None else list(shards)
        if self.scheduler is not None:
            self.scheduler.drop(None if shards is None else dropped)
        for shard in dropped:
            reader = self.readers.get(shard)
            if reader is not None:
                reader.stop(ReaderState.STOPPED)
        self.runs.cancel(None if shards is None else [str(s) for s in dropped])

    def reader_stopped(self, reader: ShardReader) -> None:
        """Called by a reader that stopped (drained, fenced, retired, ...)."""
        self.redelivery.reader_stopped(reader)
        if reader.stop_reason == ReaderState.FENCED:
            self.fenced.add(reader.shard)
        elif reader.stop_reason == ReaderState.RETIRED:
            # A shard id is never re-created (incarnations only grow): never read it
            # again, even if a heartbeat answered before its retirement lists it.
            self.retired.add(reader.shard)

    async def wait_changed(self) -> None:
        """Wait until a reader finished (a drain completed, a shard was dropped)."""
        await self._changed.wait()

    def shard_released(self) -> None:
        """A shard's work (the schedule runner's) has ended: wake :meth:`wait_changed`."""
        self._changed.set()
        self._changed = anyio.Event()

    # -- lease ---------------------------------------------------------------------------
    async def _lease_watchdog(self) -> None:
        """Enforce the lease's deadlines: stop starting work, cancel running async
        handlers, fail-stop a run that outlives the lease (``ownership.watch_lease``).
        Readers pause on their own and re-run takeover once renewed."""
        await watch_lease(self)

    # -- trimming ------------------------------------------------------------------------
    async def _trim_loop(self) -> None:
        """Ack-delete and retention: trim each shard's head below the all-groups
        low-water mark (``trim.lua``), never with XDEL (E12)."""
        interval = self.settings.worker.trim_interval
        specs = {
            name: spec
            for name, spec in self.app.streams.items()
            if spec.delete_on_ack or spec.retention
        }
        if not specs:
            return
        while True:
            await self.clock.sleep(interval)
            for reader in list(self.readers.values()):
                spec = specs.get(reader.shard.stream)
                if spec is None or not reader.acked_since_trim:
                    continue
                reader.acked_since_trim = False
                cap = ""
                if not spec.delete_on_ack and spec.retention:
                    # Entry ids are wall-clock milliseconds: older than the retention.
                    cap = f"{self.clock.time_ms() - int(spec.retention * 1000)}-0"
                try:
                    trimmed = await self.scripts.trim(
                        keys=[reader.stream_key, self.keyspace.shard_groups(reader.shard)],
                        args=[cap],
                    )
                    if int(trimmed) in (-3, -4):  # a group that must exist is missing
                        reader.acked_since_trim = True  # try again next period
                        log.debug("trim of %s refused (%d)", reader.shard, trimmed)
                except RedisError as e:
                    log.warning("trim of %s failed: %s", reader.shard, e)

    # -- statistics ----------------------------------------------------------------------
    def statistics(self) -> WorkerStatistics:
        """Handler counters per stream."""
        return WorkerStatistics(
            {stream: rt.statistics.as_dict() for stream, rt in self.handlers.items()}
        )
