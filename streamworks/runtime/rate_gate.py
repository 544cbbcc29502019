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
import weakref
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from streamworks.ratelimit import RateLimit, start_waits
from streamworks.runtime.dispatcher import Processing
from streamworks.runtime.metrics import FastHistogram

if TYPE_CHECKING:
    from streamworks.runtime.execution import HandlerRuntime
    from streamworks.runtime.message import Message

__all__ = ("HORIZON", "RateGate", "ThrottleStatistics", "gated")

log = logging.getLogger("streamworks.ratelimit")

#: How far ahead a slot is reserved: messages beyond it ask again later. Short, because
#: the slots of parked messages a member loses (a shard moved on a join or a leave)
#: are not returned: the rate dips by at most this much of the member's share.
HORIZON = timedelta(milliseconds=100)
_HORIZON_MS = HORIZON / timedelta(milliseconds=1)
#: A failed ask (Redis trouble) is repeated this much later; the message waits.
_ASK_AGAIN = 0.5
#: Held messages of a bucket ask again at most this often.
_REASK_MIN = 0.025
#: A slot is used up to this late (or one interval, if longer), then a new one is asked:
#: over a short window, runs delayed together (a stalled event loop, a retry ahead of
#: them) may start at most this much of the rate above the limit.
_LATE = 0.25
#: How long a held message stays parked if the gate never wakes it (a safety net: the
#: gate wakes it much sooner).
_HELD_FOR = 60.0
#: Bounds (s) of the throttle-wait histogram.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: The flag of a message that holds a slot whose start time has come (set by the gate
#: when it parks the message, spent when the message runs).
_SLOT = "_rate_slot"
#: A message parked in the dispatcher until its slot (not queued behind its key).
_PARKED = "_rate_parked"
#: A message whose slot is asked for (or held): since when (the throttled seconds).
_ASKING = "_rate_asking"


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
    _GATES[runtime] = gate
    return gate.process


def attach(runtime: HandlerRuntime) -> None:
    """Once ``runtime`` has its dispatcher: its rate gate (if any) asks for the slots of
    messages as they are queued, not only when each reaches its turn (the turn of a
    key's next message would wait for a round trip after the previous one ran)."""
    gate = _GATES.get(runtime)
    if gate is not None:
        runtime.dispatcher.before_submit = gate.submit


_GATES: weakref.WeakKeyDictionary[HandlerRuntime, RateGate] = weakref.WeakKeyDictionary()


class _Held:
    """The messages of one bucket that got no slot within the horizon."""

    __slots__ = ("asked", "messages", "reask_at")

    def __init__(self) -> None:
        self.messages: deque[Message] = deque()
        self.reask_at = math.inf  # when to ask again for some of them
        self.asked = 0.0  # when this bucket was last asked (clock time)


class RateGate:
    """Holds each run of one handler until the group's bucket grants it a start time.

    A message without a slot is parked in the dispatcher at once (its runner is free
    for the next message) and queued here; one task sends the queued asks, one script
    call at a time for all of them, and re-times each granted message's park to its
    slot (``Dispatcher.wake``). Messages beyond the horizon are *held* and asked for
    again, as many at a time as slots can have come free since the bucket was last
    asked (at most every ``_REASK_MIN``): a backlog of thousands costs what the rate
    costs, not one ask per message per cycle.
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
        self._asking: list[Message] = []
        self._sender: asyncio.Task[None] | None = None
        self._held: dict[str, _Held] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        # Most runs one ask can be granted (the horizon's worth, plus the burst).
        self._most = math.floor((_HORIZON_MS + limit.tolerance_ms) / limit.interval_ms) + 1
        # How late a run may start on its slot: later, it asks for a new one (runs
        # bunched after a delay would exceed the limit over short windows).
        self._late = max(limit.interval_ms / 1000, _LATE)
        self.statistics = ThrottleStatistics()

    def submit(self, messages: list[Message]) -> None:
        """Messages just queued in the dispatcher: ask for their slots now."""
        now = self._clock.monotonic()
        for message in messages:
            if _will_run(message):
                message.__dict__[_ASKING] = now
                self._asking.append(message)
        self._start_sending()

    def process(self, message: Message) -> Processing:
        """The dispatcher's callback: run a message whose slot has come; park one that
        has none until the gate has one for it."""
        state = message.__dict__
        slot = state.pop(_SLOT, False)
        if not _will_run(message):  # dead letters, a revoked shard's drop: no run
            return self._inner(message)
        if slot and (
            state.pop(_PARKED, False) or self._clock.monotonic() - message.due <= self._late
        ):
            # Its slot has come: the straight line. (Parked until its slot, it became
            # ready then; late only for want of a runner, like any message.)
            return self._inner(message)
        # No slot, or one long past while it waited behind its key (a retry ahead of
        # it): a slot of its own now, or it would start together with later ones.
        now = self._clock.monotonic()
        if _ASKING not in state:  # a retry (or one whose ask was lost): a new slot
            state[_ASKING] = now
            self._asking.append(message)
            self._start_sending()
        return now + _HELD_FOR  # parked until woken (a safety net: it asks again then)

    def _start_sending(self) -> None:
        if self._asking and self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        """Send the queued asks, all of them in one script call at a time."""
        try:
            while self._asking:
                await asyncio.sleep(0)  # noqa: TID251 - a yield, not a wait: the rest of this loop step queues its asks
                asking, self._asking = self._asking, []
                await self._take(asking)
        finally:
            self._sender = None
            if self._asking:  # cancelled with asks queued: they are asked again later
                self._hold(self._bucket, self._asking, _ASK_AGAIN)
                self._asking = []

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

    async def _take(self, asking: list[Message]) -> None:
        dispatcher = self._runtime.dispatcher
        by_bucket: dict[str, list[Message]] = {}
        for message in asking:
            # One of a shard that moved while it waited asks for nothing: a slot it
            # would not use is a slot the group loses.
            if _will_run(message):
                by_bucket.setdefault(self._bucket_of(message), []).append(message)
            else:
                message.__dict__.pop(_ASKING, None)
        if not by_bucket:
            return
        limit = self._limit
        buckets = list(by_bucket)
        args: list[str | int] = [*limit.script_args(HORIZON, self._clock.offset_ms)]
        args.extend(min(self._most, len(by_bucket[b])) for b in buckets)
        self.statistics.asks += 1
        try:
            reply = await self._scripts.rate_take(keys=buckets, args=args)
        except RedisError as e:
            log.warning("rate limit of %s: asking for slots failed (%s); again soon", buckets[0], e)
            for bucket, messages in by_bucket.items():
                self._hold(bucket, messages, _ASK_AGAIN)
            return
        now = self._clock.monotonic()
        stats = self.statistics
        for j, bucket in enumerate(buckets):
            granted, base = int(reply[1 + 2 * j]), float(reply[2 + 2 * j])
            messages = by_bucket[bucket]
            for message, wait_ms in zip(messages, start_waits(granted, base, limit), strict=False):
                due = now + wait_ms / 1000
                state = message.__dict__
                waited = due - state.pop(_ASKING, now)
                stats.seconds += waited
                stats.waits.observe(waited)
                state[_SLOT] = True
                # Parked until woken: now parked until its slot. Still queued (behind its
                # lane's head, or not taken by a runner yet): the runner parks it then.
                if dispatcher.wake(message, due):
                    state[_PARKED] = True  # ready at its slot (see process)
                else:
                    message.due = due
            if granted < len(messages):
                # Held until slots come within the horizon: when the granted runs have
                # started (every member's), and not sooner than _REASK_MIN.
                free_at = base + granted * limit.interval_ms - limit.tolerance_ms - _HORIZON_MS
                self._hold(bucket, messages[granted:], max(_REASK_MIN, free_at / 1000))

    def _hold(self, bucket: str, messages: list[Message], after: float) -> None:
        now = self._clock.monotonic()
        held = self._held.setdefault(bucket, _Held())
        held.messages.extend(messages)
        held.asked = now
        held.reask_at = min(held.reask_at, now + after)
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
        """Ask again for held messages: per bucket whose time has come, as many as slots
        can have come free since it was last asked."""
        self._timer, self._timer_at = None, math.inf
        now = self._clock.monotonic()
        interval = self._limit.interval_ms / 1000
        for bucket, held in list(self._held.items()):
            if held.reask_at > now:
                self._arm(held.reask_at)
                continue
            room = min(self._most, max(1, math.ceil((now - held.asked) / interval)))
            queue = held.messages
            for _ in range(min(room, len(queue))):
                self._asking.append(queue.popleft())
            held.asked, held.reask_at = now, math.inf
            if queue:
                held.reask_at = now + _REASK_MIN
                self._arm(held.reask_at)
            else:
                del self._held[bucket]
        self._start_sending()


def _will_run(message: Message) -> bool:
    """Whether processing ``message`` would call the handler (what needs a slot)."""
    reader = message._reader
    return (
        message._error is None
        and message._dead_letter is None
        and reader is not None
        and reader.accepting
    )
