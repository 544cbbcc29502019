"""Exclusive processing on the member's side: no run outlives ownership.

See docs/guarantees.md#exclusive-processing.

A *run* is one call of a handler on one message, from its start to its end: for an
``async def`` handler the awaited call, for a plain ``def`` handler the worker
thread's call (which may go on after the awaiting task gave up on it, e.g. after a
handler timeout). :class:`Runs` counts the runs of one worker per shard and can
cancel the async ones.

:func:`watch_lease` enforces the lease's deadlines (``deadlines.py``): when the
start-work deadline passes, queued work is dropped (it stays pending in Redis); at the
cancel point the running async handlers are cancelled; at the fail-stop point, a run
still going (a sync handler, an async one that ignores cancellation) makes the
process exit with :data:`FAIL_STOP_EXIT_CODE` — logged at CRITICAL and counted
first. The fail-stop point is still before the earliest time the coordinator may
expire the member, so the run has ended (with its process) before anyone else may be
granted its shard.

The same machinery serves FENCED / UNKNOWN_MEMBER (the lease is expired at once: the
membership cancels the dropped shards' async runs and rejoins only after
:meth:`Runs.wait_ended`) and a graceful stop (the leave is sent only once every run
has ended).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import sys
import threading
import types
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Coroutine, Generator, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

if TYPE_CHECKING:
    from streamworks.runtime.lease import Lease
    from streamworks.runtime.worker import Worker

__all__ = (
    "FAIL_STOP_EXIT_CODE",
    "FirstSteps",
    "RunCancelled",
    "Runs",
    "exit_process",
    "watch_lease",
)

log = logging.getLogger("streamworks.worker")

T = TypeVar("T")

#: The exit code of a worker that stopped itself because a handler run outlived the
#: lease it was started under (EX_TEMPFAIL: a supervisor restarts it).
FAIL_STOP_EXIT_CODE = 75

#: How long async runs cancelled past the fail-stop point (after a pause) get to
#: unwind before the fail-stop (seconds).
UNWIND = 0.25

#: The watchdog looks at the lease at least this often (seconds): its waits run on the
#: event loop's clock, which stops while the host is suspended, the lease's deadlines on
#: one that does not (``clock.py``); after a resume it acts within this.
RECHECK = 1.0


class RunCancelled(Exception):
    """A run was cancelled (or refused to start) because its shard's ownership ended:
    its message stays pending in Redis for the shard's next owner."""


class Runs:
    """The handler runs of one worker, by shard name.

    Args:
        may_start: whether a new run may start now (the lease's start-work deadline
            has not passed); checked as each run begins, after any awaiting the
            processing path did since it last looked.
        may_settle: whether a run that ends now may still settle its message (the
            lease has not expired: e.g. a run of a process paused past its lease by
            SIGSTOP does not ack; the shard's next owner runs the message again).
    """

    def __init__(
        self,
        may_start: Callable[[], bool] = lambda: True,
        may_settle: Callable[[], bool] = lambda: True,
    ) -> None:
        self._may_start = may_start
        self._may_settle = may_settle
        self._scopes: dict[str, set[anyio.CancelScope]] = {}
        self._uncancellable: set[anyio.CancelScope] = set()  # awaiting a sync run
        self._threads: Counter[str] = Counter()
        self._lock = threading.Lock()  # guards _threads (threads end runs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._waiting = 0

    def count(self, shards: Collection[str] | None = None) -> int:
        """Runs going on now (of ``shards``, or all)."""
        with self._lock:
            threads = dict(self._threads)
        names = (set(self._scopes) | set(threads)) if shards is None else shards
        total = 0
        for name in names:
            scopes = self._scopes.get(name, ())
            awaiting_sync = sum(1 for scope in scopes if scope in self._uncancellable)
            # A sync run is its awaiting task and its thread: count it once, and count
            # the threads whose task stopped waiting (abandoned after a timeout) too.
            total += len(scopes) - awaiting_sync + max(awaiting_sync, threads.get(name, 0))
        return total

    def run(self, shard: str, *, cancellable: bool = True) -> AbstractContextManager[None]:
        """Around one handler call in the event loop (``cancellable``: an async
        handler; a sync one runs in a thread that cannot be stopped, so cancelling
        its awaiting task would only lose its outcome).

        Raises:
            RunCancelled: the run may not start (the lease ran out meanwhile), or it
                was cancelled through :meth:`cancel` (and returned or failed after
                that), or it ended after the lease expired: its outcome is not this
                member's to settle.
        """
        return self._run(shard, cancellable=cancellable, check_start=True)

    @contextlib.contextmanager
    def _run(self, shard: str, *, cancellable: bool, check_start: bool) -> Iterator[None]:
        if check_start and not self._may_start():
            raise RunCancelled(f"{shard}: the lease ran out before the run started")
        self._loop = asyncio.get_running_loop()
        scope = anyio.CancelScope()
        scopes = self._scopes.setdefault(shard, set())
        scopes.add(scope)
        if not cancellable:
            self._uncancellable.add(scope)
        try:
            with scope:
                yield
        except Exception as e:
            if scope.cancel_called:
                raise RunCancelled(f"{shard}: cancelled, ownership ended") from e
            raise
        finally:
            scopes.discard(scope)
            self._uncancellable.discard(scope)
            if not scopes and self._scopes.get(shard) is scopes:
                del self._scopes[shard]
            self._notify()
        if scope.cancel_called:
            # The handler returned although it was cancelled (it swallowed the
            # cancellation): whatever it did, the entry is no longer ours to ack.
            raise RunCancelled(f"{shard}: cancelled, ownership ended")
        if not self._may_settle():
            raise RunCancelled(f"{shard}: the run ended after the lease expired")

    async def run_coroutine(
        self, shard: str, coro: Coroutine[Any, Any, T], *, check_start: bool = True
    ) -> T:
        """Await ``coro`` (an async handler's call) as one run of ``shard``: the same
        contract as ``with self.run(shard): await coro``, for less.

        The coroutine's first step runs at once, in this task. One that finishes there
        (a handler that never suspends, the consume hot path) cannot have been
        cancelled or observed by anyone: no other task ran meanwhile, so it needs no
        cancel scope and no bookkeeping, only the start and settle checks. One that
        suspends goes on inside :meth:`run` (a cancel scope, counted, cancellable)
        from the point where it suspended.

        ``check_start=False``: the caller checked ``may_start`` itself and has not
        awaited anything since (the hot path's one clock read instead of two).

        Raises:
            RunCancelled: as :meth:`run`.
        """
        if check_start and not self._may_start():
            coro.close()
            raise RunCancelled(f"{shard}: the lease ran out before the run started")
        try:
            first = coro.send(None)
        except StopIteration as stop:
            if not self._may_settle():
                raise RunCancelled(f"{shard}: the run ended after the lease expired") from None
            return stop.value  # type: ignore[no-any-return]
        # (An exception from the first step is the handler's own failure, as in run().)
        with self._run(shard, cancellable=True, check_start=False):
            return await _resume(coro, first)

    async def run_rest(self, shard: str, rest: Awaitable[T]) -> T:
        """The rest of an async handler's run whose first step the caller ran itself and
        which suspended there (``FirstSteps.take``): from there on, exactly what
        :meth:`run_coroutine` does with a coroutine that suspends.

        Raises:
            RunCancelled: as :meth:`run`.
        """
        with self._run(shard, cancellable=True, check_start=False):
            return await rest

    def in_thread(self, shard: str, fn: Callable[[], T]) -> Callable[[], T]:
        """``fn`` wrapped so the run counts while the worker thread runs it, even if
        the awaiting task stops waiting (a handler timeout abandons the thread)."""

        def call() -> T:
            with self._lock:
                self._threads[shard] += 1
            try:
                return fn()
            finally:
                with self._lock:
                    self._threads[shard] -= 1
                    if self._threads[shard] <= 0:
                        del self._threads[shard]
                self._notify_threadsafe()

        return call

    def cancel(self, shards: Collection[str] | None = None) -> int:
        """Cancel the async runs of ``shards`` (or all); returns how many. Sync runs
        cannot be cancelled: they are waited for (or fail-stopped)."""
        names = list(self._scopes) if shards is None else [s for s in shards if s in self._scopes]
        cancelled = 0
        for name in names:
            for scope in list(self._scopes.get(name, ())):
                if not scope.cancel_called and scope not in self._uncancellable:
                    scope.cancel()
                    cancelled += 1
        return cancelled

    async def wait_ended(self, shards: Collection[str] | None = None) -> None:
        """Wait until no run of ``shards`` (or none at all) is going on."""
        while self.count(shards):
            await self.wait_changed()

    async def wait_changed(self) -> None:
        """Wait until a run ends."""
        self._waiting += 1
        try:
            await self._changed.wait()
        finally:
            self._waiting -= 1

    def _notify(self) -> None:
        if self._waiting:  # the hot path (a run ends, nobody waits) costs nothing
            self._changed.set()
            self._changed = asyncio.Event()

    def _notify_threadsafe(self) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(self._notify)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], first: Any) -> Generator[Any, Any, T]:
    """The rest of ``coro``, whose first step already ran and yielded ``first`` (what
    it awaits: a future, or None to let the loop run once): the awaiting task waits on
    ``first``, an exception thrown in meanwhile (a cancellation) goes into ``coro``,
    and then ``yield from`` delegates the remaining steps as a plain ``await`` would."""
    while True:
        try:
            yield first
        except BaseException as exc:
            try:
                first = coro.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            continue
        return (yield from coro.__await__())


class _Returned:
    """What a driver yields when its coroutine returned (the value inside)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = None


@types.coroutine
def _drive(returned: _Returned) -> Generator[Any, Any, None]:
    """Run coroutine after coroutine sent in: each one's steps are delegated with
    ``yield from`` (what it yields goes to the sender, as a suspension), and its return
    value comes back as ``returned``, yielded, ready for the next coroutine."""
    coro = yield
    while True:
        returned.value = yield from coro
        coro = yield returned


class FirstSteps:
    """Runs the first steps of coroutines (async handlers' calls) one after another,
    on one long-lived driver generator.

    ``coro.send(None)`` reports a coroutine that returns by raising StopIteration;
    raising and catching one per message cost about 0.12 µs of a consume hot path of
    ~1.4 µs. Through the driver's ``yield from`` the value comes back without one.
    :meth:`step` runs the first step; a coroutine that suspended there (it yielded
    something other than :attr:`returned`) keeps the driver, whose rest :meth:`take`
    hands over, and the next coroutine gets a new driver.
    """

    __slots__ = ("_driver", "returned", "step")

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self.returned = _Returned()
        driver: Generator[Any, Any, None] = _drive(self.returned)
        driver.send(None)
        self._driver = driver
        #: ``step(coro)``: run ``coro`` until it returns (then :attr:`returned` is
        #: returned, its value in ``returned.value``) or suspends (then what it yielded
        #: is returned: call :meth:`take`). What ``coro`` raises is raised (then call
        #: :meth:`recover`).
        self.step: Callable[[Coroutine[Any, Any, Any]], Any] = driver.send

    def take(self, first: Any) -> Awaitable[Any]:
        """The rest of the coroutine that suspended in :meth:`step` yielding ``first``,
        to be awaited (by ``Runs.run_rest``); the next step runs on a new driver."""
        driver, returned = self._driver, self.returned
        self._start()
        return _rest(driver, first, returned)

    def recover(self) -> None:
        """After :meth:`step` raised: the driver ended with its coroutine, so start a
        new one (a raise before the coroutine ran leaves the driver as it was)."""
        if inspect.getgeneratorstate(self._driver) == inspect.GEN_CLOSED:
            self._start()


@types.coroutine
def _rest(
    driver: Generator[Any, Any, None], first: Any, returned: _Returned
) -> Generator[Any, Any, Any]:
    """The remaining steps of a driven coroutine that suspended yielding ``first``: as
    :func:`_resume`, through its driver (a cancellation thrown in goes to the
    coroutine), until the driver yields ``returned``."""
    step = first
    while True:
        try:
            sent = yield step
        except BaseException as exc:
            step = driver.throw(exc)
        else:
            step = driver.send(sent)
        if step is returned:
            value = returned.value
            returned.value = None
            return value


def exit_process(reason: str) -> None:
    """The production fail-stop: flush the logs and exit at once (no cleanup: a
    cleanup could block on the very run that must end)."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(FAIL_STOP_EXIT_CODE)


async def watch_lease(worker: Worker) -> None:
    """Enforce ``worker.lease``'s deadlines for ever (see the module docstring)."""
    lease = worker.lease
    runs = worker.runs
    clock = worker.clock
    paused = False
    stopped: object = None  # the deadlines a fail-stop was carried out for
    cancelled_at: float | None = None  # when runs were first cancelled on this lease
    while True:
        deadlines = lease.deadlines
        now = clock.monotonic()
        if now < deadlines.start_until:
            paused = False
            cancelled_at = None
            await _wait(lease, None, deadlines.start_until - now)
            continue
        if not paused:
            paused = True
            if worker.readers or runs.count():
                lease.losses += 1
                log.warning(
                    "assignment lease expired: pausing %d shards, %d runs going",
                    len(worker.readers),
                    runs.count(),
                )
            for reader in worker.readers.values():
                reader.interrupt_wait()
            for runtime in worker.handlers.values():
                runtime.dispatcher.discard(lambda m: False)
        if now < deadlines.cancel_at:
            await _wait(lease, None, deadlines.cancel_at - now)
            continue
        if runs.count():
            cancelled = runs.cancel()
            if cancelled:
                log.warning("lease ending: cancelled %d running handlers", cancelled)
                cancelled_at = now if cancelled_at is None else cancelled_at
        if now < deadlines.fail_stop_at:
            await _wait(lease, runs if runs.count() else None, deadlines.fail_stop_at - now)
            continue
        if cancelled_at is not None and now < cancelled_at + UNWIND and runs.count():
            # Cancelled only just now, past the fail-stop point (the process was paused
            # across its deadlines): async runs end at their next await; give them that
            # moment rather than exit. A run that cannot be cancelled still fail-stops.
            await _wait(lease, runs, cancelled_at + UNWIND - now)
            continue
        going = runs.count()
        if going and stopped is not deadlines:
            stopped = deadlines
            fail_stop(worker, going)
            # Only reached with a fail-stop hook that does not exit (tests).
        await _wait(lease, runs if going else None, None)


def fail_stop(worker: Worker, going: int) -> None:
    """Count, log and carry out a fail-stop (``worker.fail_stop``)."""
    lease = worker.lease
    lease.fail_stops += 1
    reason = (
        f"{going} handler runs still going at the lease's fail-stop point "
        f"(monotonic {worker.clock.monotonic():.3f}, the coordinator may expire this "
        f"member at {lease.deadlines.expires_at:.3f}): exiting with code "
        f"{FAIL_STOP_EXIT_CODE} so they end before anyone else may own their shards"
    )
    log.critical("worker %s fail-stop: %s", worker.member_id, reason)
    worker.fail_stop(reason)


async def _wait(lease: Lease, runs: Runs | None, timeout: float | None) -> None:
    """Until the lease changes, a run ends (with ``runs``), or ``timeout`` passes (at
    most :data:`RECHECK`)."""
    with anyio.move_on_after(RECHECK if timeout is None else min(timeout, RECHECK)):
        async with anyio.create_task_group() as tg:

            async def lease_changed() -> None:
                await lease.wait_changed()
                tg.cancel_scope.cancel()

            async def run_ended() -> None:
                assert runs is not None
                await runs.wait_changed()
                tg.cancel_scope.cancel()

            tg.start_soon(lease_changed)
            if runs is not None:
                tg.start_soon(run_ended)
