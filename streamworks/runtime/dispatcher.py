"""Ordering lanes: run messages with the handler's ordering and concurrency.

Every message belongs to a *lane* chosen by the ordering mode:

* ``shard`` — one lane per shard: strictly one message at a time per shard;
* ``key`` — one lane per partition key: in order per key, keys in parallel;
  unkeyed messages run independently;
* ``none`` — no lanes: every message runs independently.

A fixed set of ``concurrency`` runner tasks takes ready lanes (and independent
messages) from one queue. A runner runs a lane's messages one after another until
the lane is empty, so a handler that never suspends costs no task switch at all,
and the number of tasks never grows with traffic. A message that must wait (a retry
backoff, a retry record inherited from a crashed member) *parks* its lane: the lane
keeps its place for the key, later messages of that key queue behind it (SPEC §5:
a retrying message holds back its shard/key), and a timer puts the lane back in the
ready queue when it is due. The runner meanwhile moves on to other lanes.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TYPE_CHECKING

import anyio

from streamworks.runtime.handler import Ordering

if TYPE_CHECKING:
    from streamworks.runtime.message import Message

__all__ = ("Dispatcher",)

#: What processing a message tells the dispatcher: None when the message is settled
#: (acked, dead-lettered or dropped), or the monotonic time at which it must run again.
Outcome = float | None


class _Lane:
    __slots__ = ("dead", "key", "queue")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.queue: deque[Message] = deque()
        self.dead = False


class Dispatcher:
    """Runs one handler's messages with its ordering mode and concurrency limit."""

    def __init__(
        self,
        ordering: Ordering,
        concurrency: int,
        process: Callable[[Message], Awaitable[Outcome]],
        drop: Callable[[Message], None],
    ) -> None:
        """
        Args:
            ordering: the handler's ordering mode.
            concurrency: runner tasks, i.e. messages in flight at once.
            process: runs one message and returns its outcome.
            drop: called for a queued message that is discarded without running
                (its shard was revoked or the lease was lost); it stays pending in Redis.
        """
        self._ordering = ordering
        self._concurrency = concurrency
        self._process = process
        self._drop = drop
        self._ready: deque[_Lane | Message] = deque()
        self._lanes: dict[Hashable, _Lane] = {}
        self._idle: deque[asyncio.Future[None]] = deque()
        self._timers: set[asyncio.TimerHandle] = set()
        self._parked: set[Message] = set()  # independent messages waiting in a timer
        self._scope: anyio.CancelScope | None = None
        self._quiet: list[asyncio.Future[None]] = []  # wait_quiet() callers
        self._waking = 0  # runners woken that have not resumed yet
        self._running = 0

    # -- feeding -------------------------------------------------------------------
    def _lane_key(self, message: Message) -> Hashable | None:
        if self._ordering == "key":
            return message.key  # None: unkeyed, runs independently
        if self._ordering == "shard":
            return message.shard
        return None

    def submit(self, messages: Iterable[Message]) -> None:
        """Queue messages; they run in order within their lane."""
        ready = self._ready
        lanes = self._lanes
        ordered = self._ordering != "none"
        for message in messages:
            key = self._lane_key(message) if ordered else None
            if key is None:
                ready.append(message)
                continue
            lane = lanes.get(key)
            if lane is None:
                lane = lanes[key] = _Lane(key)
                lane.queue.append(message)
                ready.append(lane)
            else:
                lane.queue.append(message)  # the lane is already queued, running or parked
        self._wake()

    def _wake(self) -> None:
        # Wake one idle runner. A runner that takes work while more is ready wakes the
        # next one (see _runner), so parallelism grows only as fast as handlers
        # actually suspend: a handler that never suspends costs no wake-ups at all.
        idle = self._idle
        while idle:
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._waking += 1
                return

    def _schedule(self, item: _Lane | Message, due: float) -> None:
        """Park ``item`` until the monotonic time ``due``."""
        if not isinstance(item, _Lane):
            self._parked.add(item)
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(handle)
            if isinstance(item, _Lane):
                if item.dead:
                    return
            elif item not in self._parked:
                return  # dropped while parked
            else:
                self._parked.discard(item)
            self._ready.append(item)
            self._wake()

        delay = max(0.0, due - time.monotonic())
        handle = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(handle)

    # -- discarding ------------------------------------------------------------------
    def discard(self, keep: Callable[[Message], bool]) -> int:
        """Drop every queued or parked message for which ``keep`` is false.

        Running messages are not touched: they finish and settle as usual. Dropped
        messages stay pending in Redis for whoever owns their shard next. Returns how
        many were dropped.
        """
        dropped = 0
        kept_ready = [m for m in self._ready if isinstance(m, _Lane) or keep(m)]
        for item in self._ready:
            if not isinstance(item, _Lane) and not keep(item):
                self._drop(item)
                dropped += 1
        self._ready.clear()
        self._ready.extend(kept_ready)
        for message in [m for m in self._parked if not keep(m)]:
            self._parked.discard(message)
            self._drop(message)
            dropped += 1
        for key, lane in list(self._lanes.items()):
            kept: list[Message] = []
            for message in lane.queue:
                if message.due == _RUNNING or keep(message):
                    kept.append(message)
                else:
                    self._drop(message)
                    dropped += 1
            lane.queue.clear()
            lane.queue.extend(kept)
            if not kept:
                lane.dead = True
                del self._lanes[key]
        return dropped

    # -- running ---------------------------------------------------------------------
    async def run(self) -> None:
        """Run the runners until cancelled."""
        try:
            while True:
                with anyio.CancelScope() as scope:
                    self._scope = scope
                    async with anyio.create_task_group() as tg:
                        for _ in range(self._concurrency):
                            tg.start_soon(self._runner)
                self._scope = None
                self._after_cancel()
        finally:
            for handle in self._timers:
                handle.cancel()
            self._timers.clear()

    @property
    def running(self) -> int:
        """Messages whose handler is running now."""
        return self._running

    def _started(self) -> None:
        self._running += 1

    def _finished(self) -> None:
        self._running -= 1
        if not self._running and self._quiet:
            for waiter in self._quiet:
                if not waiter.done():
                    waiter.set_result(None)
            self._quiet.clear()

    async def wait_quiet(self) -> None:
        """Wait until no handler is running."""
        while self._running:
            waiter = asyncio.get_running_loop().create_future()
            self._quiet.append(waiter)
            await waiter

    def cancel_running(self) -> None:
        """Cancel the handlers running now (their messages stay pending in Redis);
        runners restart at once for whatever is still queued."""
        if self._scope is not None:
            self._scope.cancel()

    def _after_cancel(self) -> None:
        # The cancelled runners' waiters are gone with them.
        self._idle.clear()
        self._waking = 0
        # Lanes whose head was running lost their runner: the head was settled by
        # the processing callback; put the rest of each lane back in line.
        for key, lane in list(self._lanes.items()):
            if lane.queue and lane.queue[0].due == _RUNNING:
                lane.queue.popleft()
                if lane.queue:
                    self._ready.append(lane)
                else:
                    lane.dead = True
                    del self._lanes[key]

    async def _runner(self) -> None:
        ready = self._ready
        loop = asyncio.get_running_loop()
        while True:
            if not ready:
                waiter = loop.create_future()
                self._idle.append(waiter)
                try:
                    await waiter
                finally:
                    if waiter.done() and not waiter.cancelled():
                        self._waking -= 1
                continue
            item = ready.popleft()
            if ready and not self._waking:
                self._wake()
            if isinstance(item, _Lane):
                await self._run_lane(item)
            else:
                await self._run_one(item)

    async def _run_one(self, message: Message) -> None:
        if message.due > time.monotonic():
            self._schedule(message, message.due)
            return
        self._started()
        try:
            due = await self._process(message)
        finally:
            self._finished()
        if due is not None:
            message.due = due
            self._schedule(message, due)

    async def _run_lane(self, lane: _Lane) -> None:
        if lane.dead:
            return  # emptied by discard() while it waited in the ready queue
        queue = lane.queue
        while True:
            if not queue:
                lane.dead = True
                del self._lanes[lane.key]
                return
            message = queue[0]
            if message.due > time.monotonic():
                self._schedule(lane, message.due)  # park: the lane keeps its key
                return
            message.due = _RUNNING
            self._started()
            try:
                due = await self._process(message)
            finally:
                self._finished()
            if due is not None:
                message.due = due
                self._schedule(lane, due)
                return
            message.due = 0.0
            queue.popleft()


#: ``Message.due`` while a runner executes the message (never a real time).
_RUNNING = -1.0
