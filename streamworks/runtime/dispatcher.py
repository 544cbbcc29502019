"""Ordering lanes: run messages with the handler's ordering and concurrency.

Every message belongs to a *lane* chosen by the ordering mode:

* ``shard`` — one lane per shard: strictly one message at a time per shard;
* ``key`` — one lane per partition key: in order per key, keys in parallel;
  unkeyed messages run independently;
* ``none`` — no lanes: every message runs independently.

Only the *head* of a lane is ever runnable: it sits in the ready queue, runs, or
waits in a timer; the lane's later messages queue behind it (``_busy``) and the
runner that settles a head goes straight on with the next message of the same lane.
A lane therefore costs nothing until a second message of the same key arrives while
the first is still in flight, and a handler that never suspends runs a whole batch
without a single task switch. A fixed set of ``concurrency`` runner tasks serves the
ready queue; a runner that takes work while more is ready wakes one more, so
parallelism grows exactly as far as handlers actually suspend.

A message that must wait (a retry backoff, a retry record inherited from a crashed
member) *parks*: it stays the head of its lane, later messages of that key wait
behind it (a retrying message holds back its shard/key, and only those:
docs/handlers.md#ordering-and-concurrency), and a timer puts it back in the ready
queue when it is due. Due times are on the worker's :class:`~streamworks.clock.Clock`;
when the clock is advanced (``TestRuntime.advance``) every parked message is re-timed,
so one whose due time has passed runs at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TYPE_CHECKING

import anyio

from streamworks.clock import Clock
from streamworks.runtime.handler import Ordering

if TYPE_CHECKING:
    from streamworks.runtime.message import Message

__all__ = ("Dispatcher", "Outcome", "Processing", "settled")

log = logging.getLogger("streamworks.dispatcher")

#: What processing a message tells the dispatcher: None when the message is settled
#: (acked, dead-lettered or dropped), or the time at which to run it again (on the
#: worker's ``Clock.monotonic()``).
Outcome = float | None
#: What the processing callback returns: the outcome when it could settle the message
#: without awaiting (a handler that never suspends: the consume hot path), else an
#: awaitable of it, which the runner awaits with the message counted as running.
Processing = Outcome | Awaitable[Outcome]


async def settled(outcome: Processing) -> Outcome:
    """``outcome``, awaited if it is still to come."""
    if outcome is None or isinstance(outcome, float):
        return outcome
    return await outcome


class Dispatcher:
    """Runs one handler's messages with its ordering mode and concurrency limit."""

    def __init__(
        self,
        ordering: Ordering,
        concurrency: int,
        process: Callable[[Message], Processing],
        drop: Callable[[Message], None],
        clock: Clock | None = None,
    ) -> None:
        """
        Args:
            ordering: the handler's ordering mode.
            concurrency: runner tasks, i.e. messages in flight at once.
            process: runs one message and returns its outcome, or an awaitable of it.
            drop: called for a queued message that is discarded without running
                (its shard was revoked or the lease was lost); it stays pending in Redis.
            clock: the clock due times are on (the worker's).
        """
        self._ordering = ordering
        self._concurrency = concurrency
        self._process = process
        self._drop = drop
        self._clock = clock or Clock()
        self._ready: deque[Message] = deque()
        # lane key -> messages queued behind the lane's head (None: head only).
        self._busy: dict[Hashable, deque[Message] | None] = {}
        self._idle: deque[asyncio.Future[None]] = deque()
        self._parked: dict[Message, asyncio.TimerHandle] = {}
        self._running_now: set[Message] = set()
        self._quiet: list[asyncio.Future[None]] = []
        self._waking = 0  # runners woken that have not resumed yet

    @property
    def running(self) -> int:
        """Messages whose handler is running now."""
        return len(self._running_now)

    @property
    def parked(self) -> int:
        """Messages waiting for their due time (a retry backoff)."""
        return len(self._parked)

    def _lane(self, message: Message) -> Hashable | None:
        ordering = self._ordering
        if ordering == "key":
            return message.key  # None: unkeyed, runs independently
        if ordering == "shard":
            return message.shard
        return None

    # -- feeding -------------------------------------------------------------------
    #: Sees each batch of messages as it is queued (a rate limit asks for their slots
    #: then: ``rate_gate.py``); None without one.
    before_submit: Callable[[list[Message]], None] | None = None

    def submit(self, messages: Iterable[Message]) -> None:
        """Queue messages; they run in order within their lane."""
        if self.before_submit is not None:
            messages = list(messages)
            self.before_submit(messages)
        ready = self._ready
        if self._ordering == "none":
            ready.extend(messages)
        else:
            busy = self._busy
            # The lane key read inline (the consume hot path: no call per message).
            by_key = self._ordering == "key"
            for message in messages:
                key = message.key if by_key else message.shard
                if key is None:
                    ready.append(message)
                elif key not in busy:
                    busy[key] = None  # this message is the lane's head
                    ready.append(message)
                else:
                    queue = busy[key]
                    if queue is None:
                        queue = busy[key] = deque()
                    queue.append(message)
        self._wake()

    def _wake(self) -> None:
        idle = self._idle
        while idle and self._ready:
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._waking += 1
                return

    def _next_of(self, message: Message) -> Message | None:
        """The next message of ``message``'s lane (which stays busy), or None (the lane
        is released)."""
        key = self._lane(message)
        if key is None:
            return None
        queue = self._busy.get(key)
        if queue:
            return queue.popleft()
        self._busy.pop(key, None)
        return None

    def _park(self, message: Message, due: float) -> None:
        def fire() -> None:
            if self._parked.pop(message, None) is not None:
                self._ready.append(message)
                self._wake()

        delay = max(0.0, due - self._clock.monotonic())
        self._parked[message] = asyncio.get_running_loop().call_later(delay, fire)

    def _retime(self) -> None:
        """The clock was advanced: parked messages that are due now run now, the others
        wait for what is left of their time."""
        if not self._parked:
            return
        now = self._clock.monotonic()
        for message, handle in list(self._parked.items()):
            handle.cancel()
            del self._parked[message]
            if message.due <= now:
                self._ready.append(message)
            else:
                self._park(message, message.due)
        self._wake()

    def wake(self, message: Message, due: float = 0.0) -> bool:
        """Re-time a parked message: run it at ``due`` (now if it has passed). The rate
        gate (``rate_gate.py``) parks messages until it has a slot for them. False: it
        is not parked (it was dropped meanwhile)."""
        handle = self._parked.pop(message, None)
        if handle is None:
            return False
        handle.cancel()
        message.due = due
        if due > self._clock.monotonic():
            self._park(message, due)
        else:
            self._ready.append(message)
            self._wake()
        return True

    # -- discarding ------------------------------------------------------------------
    def discard(self, keep: Callable[[Message], bool]) -> int:
        """Drop every queued or parked message for which ``keep`` is false.

        Running messages are not touched: they finish and settle as usual. Dropped
        messages stay pending in Redis for whoever owns their shard next. Returns how
        many were dropped.
        """
        dropped = 0
        for queue in list(self._busy.values()):
            if queue:
                kept = [m for m in queue if keep(m)]
                for message in queue:
                    if not keep(message):
                        self._drop(message)
                        dropped += 1
                queue.clear()
                queue.extend(kept)
        heads = [m for m in self._ready if not keep(m)]
        if heads:
            self._ready = deque(m for m in self._ready if keep(m))
        for message, handle in list(self._parked.items()):
            if not keep(message):
                handle.cancel()
                del self._parked[message]
                heads.append(message)
        for head in heads:
            self._drop(head)
            dropped += 1
            successor = self._next_of(head)
            if successor is not None:
                self._ready.append(successor)  # survived the filter above: kept
        self._wake()
        return dropped

    # -- running ---------------------------------------------------------------------
    async def run(self) -> None:
        """Run the runners until cancelled. (Handlers are stopped one by one, through
        their runs' cancel scopes (``ownership.Runs``), never by cancelling runners:
        a lane is released by the runner that ran its head.)"""
        stop_retiming = self._clock.on_advance(self._retime)
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(self._concurrency):
                    tg.start_soon(self._runner)
        finally:
            stop_retiming()
            for handle in self._parked.values():
                handle.cancel()
            self._parked.clear()

    async def wait_quiet(self) -> None:
        """Wait until no handler is running."""
        while self._running_now:
            waiter = asyncio.get_running_loop().create_future()
            self._quiet.append(waiter)
            await waiter

    def _signal_quiet(self) -> None:
        if not self._running_now and self._quiet:
            for waiter in self._quiet:
                if not waiter.done():
                    waiter.set_result(None)
            self._quiet.clear()

    async def _runner(self) -> None:
        loop = asyncio.get_running_loop()
        process = self._process
        running = self._running_now
        busy = self._busy
        ordering = self._ordering
        by_key = ordering == "key"
        unordered = ordering == "none"
        while True:
            ready = self._ready
            if not ready:
                waiter = loop.create_future()
                self._idle.append(waiter)
                try:
                    await waiter
                finally:
                    if waiter.done() and not waiter.cancelled():
                        self._waking -= 1
                continue
            message: Message | None = ready.popleft()
            if ready and not self._waking:
                self._wake()
            while message is not None:
                if message.due and message.due > self._clock.monotonic():
                    self._park(message, message.due)
                    break
                try:
                    due = process(message)
                    if due is not None and not isinstance(due, float):
                        # It has to await: running from here on (what ``running``,
                        # ``wait_quiet`` and a cancellation see). One settled without
                        # awaiting was never seen running by another task: no bookkeeping.
                        running.add(message)
                        try:
                            due = await due
                        finally:
                            running.discard(message)
                            if self._quiet and not running:
                                self._signal_quiet()
                except Exception:
                    # A bug in the processing path (the handler's own failures are
                    # settled by ``process``): keep the message, log, try again later.
                    log.exception("processing %r failed; retrying it in 1 s", message)
                    due = self._clock.monotonic() + 1.0
                if due is not None:
                    message.due = due
                    self._park(message, due)
                    break
                # The next message of the lane: _next_of, inlined (once per message).
                if unordered:
                    break
                lane = message.key if by_key else message.shard
                if lane is None:
                    break
                # One dict operation when nothing queued behind it (the usual case).
                queue = busy.pop(lane, None)
                if queue:
                    message = queue.popleft()
                    busy[lane] = queue  # the lane stays busy with its new head
                else:
                    message = None
