"""A handler's group-wide rate limit in the runtime: each run waits for its slot.

``@app.handler(..., rate_limit="200/s")`` puts a :class:`RateGate` in front of the
handler's processing (between the dispatcher and :class:`HandlerRuntime`). A message
that reaches its turn without a slot asks the group's bucket for one
(``redis/lua/rate_take.lua``, GCRA, shared by every member) and *parks* until the slot's
start time: the dispatcher's park, the one retries use, so the message stays pending in
Redis under this member's lease, keeps the head of its lane (later messages of its key
wait behind it: order kept), and is never failed or dead-lettered for the limit. When
the park ends the message runs, spending its slot; a retry asks for a new one.

The asks of every message that reaches its turn in one step of the event loop go to
Redis as **one** script call (a group commit, like the acker's), one bucket per
rate-limit key, all in one slot. A slot is granted only within ``HORIZON`` of now; a
message beyond it parks without a slot and asks again when the granted ones have
started. A lease lost while messages are parked drops them like any queued message
(they stay pending for the next owner): their slots are not returned, so the rate can
fall below the limit, never above it (``streamworks/ratelimit.py``).

Without a rate limit no gate exists: the per-message path is the same as before.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from streamworks.ratelimit import RateLimit, start_waits
from streamworks.runtime.dispatcher import Outcome, Processing, settled
from streamworks.runtime.metrics import FastHistogram

if TYPE_CHECKING:
    from streamworks.runtime.execution import HandlerRuntime
    from streamworks.runtime.message import Message

__all__ = ("HORIZON", "RateGate", "ThrottleStatistics", "gated")

log = logging.getLogger("streamworks.ratelimit")

#: How far ahead a slot is reserved: messages beyond it ask again later. Short, because
#: the slots of parked messages a member loses (a shard moved on a join or a leave)
#: are not returned: the rate dips by at most this much of the member's share.
HORIZON = timedelta(milliseconds=250)
_HORIZON_MS = HORIZON / timedelta(milliseconds=1)
#: A failed ask (Redis trouble) is repeated this much later; the message waits.
_ASK_AGAIN = 0.5
#: Held messages of a bucket ask again at most this often.
_REASK_MIN = 0.025
#: How long a held message stays parked if the gate never wakes it (a safety net: the
#: gate wakes it much sooner).
_HELD_FOR = 60.0
#: Bounds (s) of the throttle-wait histogram.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: The flag of a message that holds a slot whose start time has come (set by the gate
#: when it parks the message, spent when the message runs).
_SLOT = "_rate_slot"


class ThrottleStatistics:
    """What a handler's rate limit made messages wait (``streamworks_throttled_*``)."""

    __slots__ = ("asks", "seconds", "waits")

    def __init__(self) -> None:
        self.seconds = 0.0  # total time messages were held for their slot
        self.asks = 0  # rate_take calls
        self.waits = FastHistogram(WAIT_BUCKETS)  # per message held


def gated(
    runtime: HandlerRuntime, process: Callable[[Message], Processing]
) -> Callable[..., Processing]:
    """``process``, behind the handler's rate limit if it has one (else as it is)."""
    spec = runtime.spec
    if spec.rate_limit is None:
        return process
    gate = RateGate(runtime, spec.rate_limit, spec.rate_limit_key, process)
    runtime.worker.metrics.throttles[spec.stream] = gate.statistics
    return gate.process


class _Held:
    """The messages of one bucket that got no slot: parked until the gate wakes them."""

    __slots__ = ("asked", "messages", "reask_at")

    def __init__(self) -> None:
        self.messages: deque[Message] = deque()
        self.reask_at = math.inf  # when to wake some of them to ask again
        self.asked = 0.0  # when this bucket was last asked (clock time)


class RateGate:
    """Holds each run of one handler until the group's bucket grants it a start time.

    A message that gets no slot within the horizon is *held*: parked in the dispatcher
    until the gate wakes it to ask again. Only as many are woken as slots can have come
    free for the bucket since it was last asked (at most every ``_REASK_MIN``): a
    backlog of thousands costs the gate what the rate costs, not one ask per message
    per cycle.
    """

    def __init__(
        self,
        runtime: HandlerRuntime,
        limit: RateLimit,
        key_of: Callable[[Message], str | None] | None,
        process: Callable[[Message], Processing],
    ) -> None:
        worker = runtime.worker
        self._runtime = runtime
        self._inner = process
        self._limit = limit
        self._key_of = key_of
        self._scripts = worker.scripts
        self._clock = worker.clock
        self._bucket = worker.keyspace.rate_bucket(worker.group, runtime.spec.stream)
        self._keyspace, self._group = worker.keyspace, worker.group
        self._stream = runtime.spec.stream
        self._asking: list[tuple[Message, asyncio.Future[float | None]]] = []
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None  # the next call's sender
        self._held: dict[str, _Held] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        # Most runs one ask can be granted (the horizon's worth, plus the burst).
        self._most = math.floor((_HORIZON_MS + limit.tolerance_ms) / limit.interval_ms) + 1
        self.statistics = ThrottleStatistics()

    def process(self, message: Message) -> Processing:
        """The dispatcher's callback: run a message whose slot has come, else ask."""
        if message.__dict__.pop(_SLOT, False) or not _will_run(message):
            # Its slot has come (or it will not run the handler at all: dead letters,
            # a revoked shard's drop): the straight line, unchanged.
            return self._inner(message)
        return self._ask(message)

    async def _ask(self, message: Message) -> Outcome:
        future: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._asking.append((message, future))
        if not self._flushing:
            await self._flush()
        wait = await future
        if wait is None:  # held (no slot within the horizon), or Redis trouble
            return message.due
        if wait <= 0:
            return await settled(self._inner(message))
        message.__dict__[_SLOT] = True
        return self._clock.monotonic() + wait

    async def _flush(self) -> None:
        """Send every ask queued meanwhile as one script call. The asks that queue while
        it is in flight go in the next call, sent by a task of its own: the caller's own
        message runs as soon as its reply is in, not after the others' asks."""
        self._flushing = True
        asking: list[tuple[Message, asyncio.Future[float | None]]] = []
        try:
            await asyncio.sleep(0)  # the other runners of this loop step queue theirs
            asking, self._asking = self._asking, []
            await self._take(asking)
        finally:
            for message, future in asking:  # cancelled or failed: ask again later
                if not future.done():
                    message.due = self._clock.monotonic() + _ASK_AGAIN
                    future.set_result(None)
            self._flushing = False
            if self._asking:
                self._flusher = asyncio.get_running_loop().create_task(self._flush())

    def _bucket_of(self, message: Message) -> str:
        if self._key_of is None:
            return self._bucket
        try:
            key = self._key_of(message)
        except Exception as e:  # a bug in rate_limit_key: the shared bucket
            log.warning("rate_limit_key failed on %s: %s", message.id, e)
            key = None
        if key is None:
            return self._bucket
        return self._keyspace.rate_key_bucket(self._group, self._stream, str(key))

    async def _take(self, asking: list[tuple[Message, asyncio.Future[float | None]]]) -> None:
        by_bucket: dict[str, list[tuple[Message, asyncio.Future[float | None]]]] = {}
        for item in asking:
            by_bucket.setdefault(self._bucket_of(item[0]), []).append(item)
        limit = self._limit
        buckets = list(by_bucket)
        args: list[str | int] = [*limit.script_args(HORIZON, self._clock.offset_ms)]
        args.extend(min(self._most, len(by_bucket[b])) for b in buckets)
        self.statistics.asks += 1
        try:
            reply = await self._scripts.rate_take(keys=buckets, args=args)
        except RedisError as e:
            log.warning("rate limit of %s: asking for slots failed (%s); again soon", buckets[0], e)
            return  # the caller parks them to ask again
        now = self._clock.monotonic()
        stats = self.statistics
        for j, bucket in enumerate(buckets):
            granted, base = int(reply[1 + 2 * j]), float(reply[2 + 2 * j])
            items = by_bucket[bucket]
            for (_, future), wait_ms in zip(items, start_waits(granted, base, limit), strict=False):
                wait = wait_ms / 1000
                stats.seconds += wait
                stats.waits.observe(wait)
                future.set_result(wait)
            if granted < len(items):
                # Held until slots come within the horizon: when the granted runs
                # have started (every member's), and not sooner than _REASK_MIN.
                free_at = base + granted * limit.interval_ms - limit.tolerance_ms - _HORIZON_MS
                held = self._held.setdefault(bucket, _Held())
                held.asked = now
                held.reask_at = min(held.reask_at, now + max(_REASK_MIN, free_at / 1000))
                for message, future in items[granted:]:
                    message.due = now + _HELD_FOR
                    held.messages.append(message)
                    future.set_result(None)
                self._arm(held.reask_at)

    def _arm(self, at: float) -> None:
        if at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        delay = max(0.0, at - self._clock.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._reask)

    def _reask(self) -> None:
        """Wake held messages to ask again: per bucket whose time has come, as many as
        slots can have come free since it was last asked (each wakes a held message's
        park in the dispatcher: it asks when it reaches a runner)."""
        self._timer, self._timer_at = None, math.inf
        now = self._clock.monotonic()
        interval = self._limit.interval_ms / 1000
        dispatcher = self._runtime.dispatcher
        for bucket, held in list(self._held.items()):
            if held.reask_at > now:
                self._arm(held.reask_at)
                continue
            room = min(self._most, max(1, math.ceil((now - held.asked) / interval)))
            woken = 0
            queue = held.messages
            while queue and woken < room:
                message = queue.popleft()
                held_since = message.due - _HELD_FOR
                # Not parked any more: dropped (its shard moved, the lease ended).
                if dispatcher.wake(message):
                    self.statistics.seconds += max(0.0, now - held_since)
                    woken += 1
            held.asked = now
            held.reask_at = math.inf
            if queue:
                held.reask_at = now + _REASK_MIN
                self._arm(held.reask_at)
            else:
                del self._held[bucket]


def _will_run(message: Message) -> bool:
    """Whether processing ``message`` would call the handler (what needs a slot)."""
    reader = message._reader
    return (
        message._error is None
        and message._dead_letter is None
        and reader is not None
        and reader.accepting
    )
