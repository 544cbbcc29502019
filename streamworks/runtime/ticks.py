"""Publishing one schedule's ticks, exactly one message per tick (docs/schedules.md).

A :class:`TickPublisher` runs one schedule for the member that owns its group's
schedule shard (``sw-schedules/0``, ``runtime/scheduler.py``), under that shard's
grant token. A tick goes through the three atomic steps of ``schedule_tick.lua`` and
``publish_dedup.lua`` (docs/design/scheduling.md §3):

1. **claim** (fenced): the tick becomes pending together with the target shard the
   current routing gives the schedule's key; refused before the tick is due on the
   Redis clock, or while another tick is pending, or for a tick already done;
2. **publish** to *that recorded shard*, with the tick's event id
   (``sw-tick:<group>:<schedule>:<tick ms>``): any number of attempts by any owner
   leave one entry there (the shard's dedup record); a shard retired before the tick
   reached it is replaced once, compare-and-set (``reroute``);
3. **done** (fenced): the tick becomes the last one.

A member that dies between two steps leaves the tick pending with its shard; the next
owner finishes it there, and its publish is a duplicate if the first one got through.
Every step is fenced or idempotent, so it needs no lock of its own: the shard's owner
fence is the only one.

:data:`PAUSE` is a test hook: ``await PAUSE(step, schedule, tick_ms)`` after the claim
and after the publish, so a test can SIGKILL a worker process at that very point.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from streamworks.exceptions import ShardRetiredError
from streamworks.protocol.envelope import MAX_PAYLOAD, encode_fields
from streamworks.protocol.shards import ShardId
from streamworks.redis.wire import run_batch_wait
from streamworks.runtime.ownership import RunCancelled
from streamworks.runtime.schedule_spec import ScheduleSpec, Tick
from streamworks.schedule import tick_event_id

if TYPE_CHECKING:
    from streamworks.runtime.scheduler import ScheduleShard

__all__ = ("PAUSE", "Fenced", "ScheduleCounters", "TickPublisher")

log = logging.getLogger("streamworks.schedules")

#: Test hook (``None`` in production): awaited after each step of a tick.
PAUSE: Callable[[str, str, int], Awaitable[None]] | None = None

#: How many times one tick is rerouted before the attempt gives up (and is retried).
MAX_REROUTES = 5


class Fenced(Exception):
    """The schedule shard's owner fence names another grant: stop running schedules."""


class NotDurable(Exception):
    """The tick's entry was not acknowledged by enough replicas in time."""


@dataclass(slots=True)
class ScheduleCounters:
    """What one worker did for one schedule (its metrics; ``status`` reads Redis)."""

    published: int = 0
    duplicate: int = 0
    skipped: int = 0
    failed: int = 0
    last_tick_ms: int | None = None
    next_tick_ms: int | None = None
    lateness: list[float] = field(default_factory=list)  # seconds, since the last scrape


class TickPublisher:
    """The tick protocol of one schedule on one grant of the schedule shard."""

    def __init__(self, owner: ScheduleShard, spec: ScheduleSpec, counters: ScheduleCounters):
        worker = owner.worker
        keyspace = worker.keyspace
        self.owner = owner
        self.worker = worker
        self.spec = spec
        self.counters = counters
        self.keys = [
            keyspace.fence(owner.shard, worker.group),
            keyspace.schedule_state(owner.shard, worker.group, spec.name),
            keyspace.schedules(owner.shard, worker.group),
        ]
        self.window_ms = int(worker.settings.producer.schedule_dedup_window * 1000)
        target = worker.app.streams[spec.stream]
        self.durability = (
            (target.min_replicas, max(1, int(target.replica_timeout * 1000)))
            if target.min_replicas
            else None
        )
        self._planned: int | None = None

    # -- one round ---------------------------------------------------------------------
    async def round(self) -> float:
        """Look at the schedule's state, publish what is due; the monotonic clock time
        at which to look again.

        Raises:
            Fenced: the grant was superseded.
            RunCancelled: the lease ran out.
        """
        clock = self.worker.clock
        # Read before Redis reads its clock: an advance in between wakes us early (one
        # more look), never late.
        at = clock.monotonic()
        reply = await self._call("open", self.spec.schedule.describe(), self.spec.stream)
        now, last = int(reply[1]), int(reply[2])
        pending, shard = _text(reply[3]), _text(reply[4])
        if pending:  # an earlier attempt (maybe another member's) left it half done
            await self._finish(int(pending), ShardId.parse(shard), 0)
            return at
        due = self.spec.schedule.due(last, now)
        for i, tick in enumerate(due.publish):
            before = clock.monotonic()
            wait = await self._tick(tick, due.skipped if i == 0 else 0)
            if wait is not None:
                return before + wait
        if due.publish:
            return at  # look again: more to catch up, or the next tick to plan
        upcoming = self.spec.schedule.next_tick(max(last, now))
        if upcoming != self._planned:
            await self._call("plan", upcoming)
            self._planned = upcoming
        self.counters.next_tick_ms = upcoming
        if self.counters.last_tick_ms is None:
            self.counters.last_tick_ms = last
        return at + (upcoming - now) / 1000

    async def _tick(self, tick: int, skipped: int) -> float | None:
        """Claim and publish ``tick``; seconds to wait when it is not due yet."""
        routed = await self._route()
        reply = await self._call("claim", tick, str(routed), skipped)
        status = int(reply[0])
        if status == -3:  # not due on the Redis clock (this host's clock is ahead)
            return max(0.001, (tick - int(reply[1])) / 1000)
        if status == 2:
            return None  # done already (by an earlier owner)
        if status == 0:  # another tick is pending: finish it first
            await self._finish(int(_text(reply[1])), ShardId.parse(_text(reply[2])), 0)
            return 0.0
        self.counters.skipped += skipped
        await _pause("claim", self.spec.name, tick)
        await self._finish(tick, routed, skipped)
        return None

    async def _finish(self, tick: int, shard: ShardId, skipped: int) -> None:
        """Publish the claimed ``tick`` to ``shard`` (rerouted if it was retired before
        the tick reached it) and record it done."""
        fields = await self._fields(tick, skipped)
        for _ in range(MAX_REROUTES):
            if not self.worker.lease.valid():
                # Checked right before the publish: a member past its lease publishes
                # nothing (a stale one's publish would still be a duplicate, E18 bound).
                raise RunCancelled(f"{self.owner.shard_name}: the lease ran out")
            reply = await self._publish(shard, tick, fields)
            if int(reply[0]) != -1:
                break
            routed = await self._route(refresh=True)
            moved = await self._call("reroute", tick, str(shard), str(routed))
            if int(moved[0]) == 2:
                return  # another attempt finished it meanwhile
            shard = ShardId.parse(_text(moved[1]))
        else:
            raise ShardRetiredError(
                f"schedule {self.spec.name!r}: tick {tick} still routed to retired shards"
            )
        entry = _text(reply[1])
        outcome = "published" if int(reply[0]) == 1 else "duplicate"
        await _pause("publish", self.spec.name, tick)
        upcoming = self.spec.schedule.next_tick(tick)
        done = await self._call("done", tick, entry, outcome, upcoming)
        if int(done[0]) != 1:
            return  # recorded by another attempt, or no longer pending: nothing counted
        now = int(done[1])
        counters = self.counters
        if outcome == "published":
            counters.published += 1
            counters.lateness.append(max(0.0, (now - tick) / 1000))
        else:
            counters.duplicate += 1
        counters.last_tick_ms = tick
        counters.next_tick_ms = upcoming
        self._planned = upcoming
        log.info(
            "schedule %s: tick %s %s to %s (%s)",
            self.spec.name,
            Tick.of(self.spec.name, tick).at.isoformat(),
            outcome,
            shard,
            entry,
        )

    # -- the message ---------------------------------------------------------------------
    async def _fields(self, tick_ms: int, skipped: int) -> list[bytes | str]:
        spec = self.spec
        tick = Tick.of(spec.name, tick_ms, skipped)
        value: Any = None
        if spec.fn is not None:
            args = (tick,) if spec.wants_tick else ()
            try:
                if spec.is_async:
                    value = await spec.fn(*args)
                else:
                    value = await anyio.to_thread.run_sync(spec.fn, *args)
            except Exception:
                self.counters.failed += 1
                raise
        payload = self.worker.app.codec.encode(tick if value is None else value)
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"schedule {spec.name!r}: a {len(payload)}-byte message")
        event = tick_event_id(self.worker.group, spec.name, tick_ms)
        headers = dict(spec.headers) if spec.headers else None
        return encode_fields(payload, spec.key, event, headers, self.worker.clock.time_ms())

    # -- Redis ---------------------------------------------------------------------------
    async def _call(self, mode: str, *args: Any) -> list[Any]:
        reply: list[Any] = await self.worker.scripts.schedule_tick(
            keys=self.keys,
            args=[self.owner.token, self.worker.clock.offset_ms, mode, self.spec.name, *args],
        )
        if int(reply[0]) == -1:
            raise Fenced(f"fence of {self.owner.shard_name} is {_text(reply[1])!r}")
        return reply

    async def _route(self, *, refresh: bool = False) -> ShardId:
        routing = self.worker.app.connection.routing
        table = await routing.routing(self.spec.stream)
        if refresh:
            routing.invalidate(self.spec.stream, table.version)
            table = await routing.routing(self.spec.stream)
        return table.route(self.spec.key).shard

    async def _publish(self, shard: ShardId, tick: int, fields: list[bytes | str]) -> list[Any]:
        worker = self.worker
        event = tick_event_id(worker.group, self.spec.name, tick)
        keys = [worker.keyspace.stream(shard), worker.keyspace.dedup(shard, event)]
        if self.durability is None:
            reply: list[Any] = await worker.scripts.publish_dedup(
                keys=keys, args=[self.window_ms, *fields]
            )
            return reply
        # Durable target: the entry (or, for a duplicate, the dedup record rewritten
        # behind it) must reach the replicas before the tick is recorded done.
        sha = worker.scripts.publish_dedup.sha
        await worker.redis.script_load(worker.scripts.publish_dedup.script)
        command = ["EVALSHA", sha, 2, *keys, self.window_ms, *fields]
        replies, waited = await run_batch_wait(worker.redis, [command], *self.durability)
        if isinstance(replies[0], Exception):
            raise replies[0]
        reply = replies[0]
        if int(reply[0]) != -1 and not (type(waited[0]) is int and waited[0] >= self.durability[0]):
            raise NotDurable(f"tick {tick} of {self.spec.name!r}: {waited[0]!r} replicas")
        return list(reply)


async def _pause(step: str, schedule: str, tick: int) -> None:
    if PAUSE is not None:
        await PAUSE(step, schedule, tick)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
