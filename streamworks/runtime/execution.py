"""Running one message through its handler, and what follows: ack, retry or DLQ.

:meth:`HandlerRuntime.process` is the straight line every message takes once the
dispatcher gives it a turn:

1. ownership — a message whose shard was revoked, or whose lease ran out while it
   was queued, is not started: it stays pending for the shard's owner;
2. poison check — an entry that could not be parsed, or whose payload does not
   decode/validate into the handler's parameter type, goes to the dead-letter stream
   at once, never retried;
3. attempts — a message taken over from another member counts the runs that member
   started and never finished, so a message that kills every worker that runs it is
   dead-lettered (``crashed``) instead of looping forever;
4. idempotency — with ``idempotency_key=``, a key already completed means a
   duplicate: ack without calling the handler (E23);
5. the handler — async in place, sync in a worker thread, inside the app's
   middleware if it has any (``runtime/chain.py``); ``Skip`` acks;
   ``Retry``, any exception (even ``SystemExit`` or a ``CancelledError`` the handler
   raised itself) and timeouts count as failed attempts — a handler cannot take the
   worker down;
6. settle — success: queue the ack (batched, see ``acks.py``); failure: persist the
   attempt count and due time in the shard's retry record, then retry after the
   backoff; attempts exhausted: dead-letter, then ack.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import types
from bisect import bisect_left
from collections.abc import Awaitable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import anyio
from redis.exceptions import RedisError

from streamworks.clock import boottime
from streamworks.exceptions import DecodeError, Retry, Skip
from streamworks.runtime.chain import HandlingChain
from streamworks.runtime.dead_letter import (
    DeadLetters,
    Written,
    fenced_count_run,
    fenced_retry_record,
    original_fields,
)
from streamworks.runtime.dispatcher import Dispatcher, Outcome, Processing, settled
from streamworks.runtime.failures import (
    TracebackLog,
    cancelled_from_outside,
    clip,
    describe,
    traceback_text,
)
from streamworks.runtime.handler import (
    HandlerSpec,
    bind_arguments,
    discard_awaitable,
    invoker,
    passes_payload,
)
from streamworks.runtime.message import Context, Message
from streamworks.runtime.metrics import HandlerStatistics
from streamworks.runtime.ownership import FirstSteps, RunCancelled
from streamworks.runtime.rate_gate import gated

if TYPE_CHECKING:
    from streamworks.runtime.acks import Acker
    from streamworks.runtime.app_view import AppView
    from streamworks.runtime.idempotency import IdempotencyStore
    from streamworks.runtime.worker import Worker

__all__ = ("HandlerRuntime",)

log = logging.getLogger("streamworks.handler")

#: Delay before re-trying a message whose DLQ write or idempotency check could not
#: be done (Redis trouble); not counted as an attempt.
_INFRA_RETRY = 1.0
#: Longest backoff honoured, whatever a handler asks for.
_MAX_DELAY = 86_400.0
#: Dead-letter error texts are cut to this many characters.
_MAX_ERROR = 4_000


class HandlerRuntime:
    """One handler's execution inside a worker."""

    def __init__(
        self,
        worker: Worker,
        spec: HandlerSpec,
        acker: Acker,
        idempotency: IdempotencyStore | None,
    ) -> None:
        self.worker = worker
        self.app: AppView = worker.app
        self.spec = spec
        self.plan = spec.plan
        self.acker = acker
        self.idempotency = idempotency
        self.statistics = HandlerStatistics()
        stream_spec = worker.app.streams.get(spec.stream)
        self._letters = DeadLetters(
            worker.scripts,
            worker.keyspace,
            worker.group,
            spec.stream,
            min_replicas=stream_spec.min_replicas if stream_spec else 0,
            replica_timeout=stream_spec.replica_timeout if stream_spec else 1.0,
        )
        self.dead_letter_key = self._letters.key
        # The app's middleware around this handler (None without any: the plain path).
        self._middleware = HandlingChain.build(self.app.handling_hooks, self._call)
        simple = (
            self._middleware is None
            and self.plan.is_async
            and spec.timeout is None
            and spec.idempotency_key is None
            and not self.plan.wants_context
        )
        self._invoke = invoker(spec.fn, self.plan.order)
        self._first_steps = FirstSteps()  # the hot path's handler coroutines' first steps
        # The hot path's shortcuts (see _process_simple): the payload bytes as they
        # are, and the handler called directly when it takes just the value.
        self._decode = None if passes_payload(self.plan.decode) else self.plan.decode
        self._value_only = self.plan.order == ("value",)
        self._fn = spec.fn
        self._clock = worker.clock
        self.dispatcher = Dispatcher(
            spec.ordering,
            spec.concurrency,
            gated(self, self._process_simple if simple else self.process),  # rate_limit=
            self._dropped,
            worker.clock,
        )
        self._limiter = anyio.CapacityLimiter(spec.concurrency)
        self._claim_ttl = worker.settings.worker.idempotency_claim_ttl
        self._lease = worker.lease
        self._duration = worker.metrics.handler_histogram(spec.stream)
        self._tracebacks = TracebackLog(
            worker.group, spec.name, worker.settings.worker.traceback_interval
        )
        self._runs = worker.runs
        self._logger = logging.LoggerAdapter(
            logging.getLogger(worker.group), {"group": worker.group, "stream": spec.stream}
        )

    def _log_fields(self, message: Message) -> dict[str, str]:
        """Structured fields of a log line about ``message`` (``--log-format json``)."""
        return {
            "group": self.worker.group,
            "stream": message.stream,
            "shard": message.shard,
            "entry_id": message.id,
            "member": self.worker.member_id,
        }

    def _dropped(self, message: Message, lapsed: bool = False) -> None:
        reader = message._reader
        if reader is not None:
            reader.recovering = True  # it stays pending: the next takeover round has it
            reader.settle(message)
            if lapsed:  # at its run: what is queued behind it must wait for it (key order)
                reader.drop_queued()

    # -- the straight line ---------------------------------------------------------------
    def _process_simple(self, message: Message) -> Processing:
        """:meth:`process` for the common handler: ``async def``, no timeout, no
        idempotency key, no Context — the same steps with nothing optional, run as far
        as they go without awaiting.

        A handler that finishes without suspending (the consume hot path) is run, timed
        and settled right here: no coroutine of the runtime's own around it, one clock
        read before and one after. Whatever has to await (a taken-over message's run
        count, a dead letter, a retry record, a handler that suspends) is returned as
        the awaitable that carries on from there; the dispatcher awaits it.
        """
        if message._claimed or message._dead_letter is not None or message._error is not None:
            return self._process_rare(message)
        reader = message._reader
        assert reader is not None
        lease = self._lease
        clock = lease.clock
        # lease.valid() inlined: one clock read per side of the run, each serving both
        # the lease check and the duration (both boottime); the offset is re-read
        # after the run, so a clock advanced meanwhile is seen.
        now = _monotonic()
        if not reader.accepting or now + clock.offset >= lease.deadlines.start_until:
            # Revoked, or the lease ran out while it was queued (e.g. the process was
            # paused): never start it; it stays pending for the shard's owner.
            self._dropped(message, lapsed=True)
            return None
        decode = self._decode
        value: Any = message.payload  # payload: bytes (or no value: then unused)
        if decode is not None:
            try:
                value = decode(value)
            except DecodeError as e:
                return self._dead_letter(message, "poison", str(e))
            started = _perf_counter()  # the run is timed from after the decoding
        else:
            started = now
        try:
            call = self._fn(value) if self._value_only else self._invoke(value, message)
            if type(call) is not types.CoroutineType:
                # An async callable returning another kind of awaitable.
                return self._finish_simple(message, call, started, suspended=False)
            # The coroutine's first step, in this task: one that finishes there cannot
            # have been cancelled or observed by anyone (no other task ran meanwhile),
            # so it needs no cancel scope (ownership.py, Runs.run_coroutine).
            steps = self._first_steps
            step = steps.step(call)
            if step is not steps.returned:  # it suspended: a counted run from here on
                return self._finish_simple(message, steps.take(step), started, suspended=True)
            result = step.value
            if result is not None:
                step.value = None  # not kept alive by the driver
        except BaseException as e:
            self._first_steps.recover()
            self._duration.observe(_perf_counter() - started)
            return self._handler_raised(message, e)
        ended = _perf_counter()
        # FastHistogram.observe, inlined (once per message); a run within the first
        # bucket (most) needs no bisect.
        histogram = self._duration
        elapsed = ended - started
        bounds = histogram.bounds
        histogram.counts[0 if elapsed <= bounds[0] else bisect_left(bounds, elapsed)] += 1
        histogram.sum += elapsed
        if result is not None and inspect.isawaitable(result):
            discard_awaitable(result)
            try:
                raise TypeError("the handler returned an awaitable it did not await")
            except TypeError as e:
                return self._handler_raised(message, e)
        # lease.held(), inlined: a run that ended after the lease expired (the process
        # was paused) is not this member's to settle (ownership.py).
        if ended + clock.offset >= lease.deadlines.expires_at:
            self._dropped(message)  # it stays pending for the next owner
            return None
        self.statistics.handled += 1
        self.acker.ack(message)
        return None

    async def _process_rare(self, message: Message) -> Outcome:
        """:meth:`_process_simple` for a message with a history: taken over from a
        pending list (its run is counted first), or already known to be dead."""
        before = await self._before_run(message)
        if before is not _RUN:
            return before  # type: ignore[return-value]
        # Nothing of the above is left to do: the straight line from its start.
        return await settled(self._process_simple(message))

    async def _before_run(self, message: Message) -> Outcome | object:
        """What comes before a run: a message revoked (or whose lease ran out) while
        queued is dropped, one whose final failure is recorded or that is poison is
        dead-lettered, a taken-over one has its run counted. The outcome when that
        settled it, else ``_RUN``."""
        reader = message._reader
        assert reader is not None
        if not reader.accepting or not self._lease.valid():
            self._dropped(message, lapsed=True)  # revoked/lease lost while queued
            return None
        if message._dead_letter is not None:  # its final failure is recorded: finish it
            return await self._settle_dead_letter(message, await self._letters.resume(message))
        if message._error is not None:
            return await self._dead_letter(message, "poison", message._error)
        if message._claimed and await self._count_run(message):
            return None  # dead-lettered: it kept killing its workers
        return _RUN

    async def _finish_simple(
        self, message: Message, rest: Awaitable[Any], started: float, *, suspended: bool
    ) -> Outcome:
        """The rest of a simple run: a counted, cancellable run from here on (``Runs``),
        then settled. ``rest``: the remaining steps of a handler coroutine that
        ``suspended`` in its first step (``FirstSteps.take``), or the awaitable an async
        callable returned (not started yet)."""
        try:
            try:
                if suspended:
                    result = await self._runs.run_rest(message.shard, rest)
                else:
                    with self._runs.run(message.shard):
                        result = await rest
            finally:
                self._duration.observe(_perf_counter() - started)
            if result is not None and inspect.isawaitable(result):
                discard_awaitable(result)
                raise TypeError("the handler returned an awaitable it did not await")
        except BaseException as e:
            return await settled(self._handler_raised(message, e))
        self.statistics.handled += 1
        self.acker.ack(message)
        return None

    def _handler_raised(self, message: Message, error: BaseException) -> Processing:
        """Settle a simple run that raised ``error``: Skip acks, ownership lost drops,
        anything else is a failed attempt (returned: the awaitable that records it)."""
        if isinstance(error, RunCancelled):
            self._dropped(message)  # ownership ended: it stays pending for the next owner
            return None
        if isinstance(error, Skip):
            self.statistics.skipped += 1
            self.statistics.handled += 1
            self.acker.ack(message)
            return None
        if isinstance(error, Retry):
            return self._failed(message, error.reason, error.delay)
        if cancelled_from_outside(error):
            self._dropped(message)  # a hard stop: the entry stays pending
            raise error
        return self._failed(message, describe(error), None, error)

    async def process(self, message: Message) -> Outcome:
        """Run ``message`` and settle it; return a due time to run it again, or None."""
        before = await self._before_run(message)
        if before is not _RUN:
            return before  # type: ignore[return-value]
        plan = self.plan
        value: Any = None
        if plan.decode is not None:
            try:
                value = plan.decode(message.payload)
            except DecodeError as e:
                return await self._dead_letter(message, "poison", str(e))
        context: Context | None = None
        if plan.wants_context or self.spec.idempotency_key is not None or self._middleware:
            context = Context(self.app, message, self._logger, self.worker.member_id)
        idem_key: str | None = None
        if self.spec.idempotency_key is not None:
            assert context is not None
            try:
                raw_key = self.spec.idempotency_key(value, context)
                idem_key = None if raw_key is None else str(raw_key)
            except Exception as e:
                return await self._dead_letter(
                    message, "poison", f"idempotency_key failed: {describe(e)}"
                )
            if idem_key is not None:
                context.idempotency_key = idem_key
                outcome = await self._claim(message, idem_key)
                if outcome is not _CLAIMED:
                    return outcome  # type: ignore[return-value]
        try:
            started = _perf_counter()
            try:
                with self._runs.run(message.shard, cancellable=self.plan.is_async):
                    if self._middleware is None:
                        await self._call(value, message, context)
                    else:
                        assert context is not None
                        await self._middleware.run(context, value)
            finally:
                self._duration.observe(_perf_counter() - started)
        except RunCancelled:
            await self._release(idem_key)
            self._dropped(message)  # ownership ended: it stays pending for the next owner
            return None
        except Skip:
            self.statistics.skipped += 1
        except Retry as signal:
            await self._release(idem_key)
            return await self._failed(message, signal.reason, signal.delay)
        except BaseException as e:
            if cancelled_from_outside(e):
                self._dropped(message)  # a hard stop: the entry stays pending
                raise
            await self._release(idem_key)
            return await self._failed(message, describe(e), None, e)
        if idem_key is not None and self.idempotency is not None:
            try:
                await self.idempotency.complete(idem_key)
            except RedisError as e:
                log.warning("idempotency complete(%s) failed: %s", idem_key, e)
        self.statistics.handled += 1
        self.acker.ack(message)
        return None

    async def _call(self, value: Any, message: Message, context: Context | None) -> None:
        plan = self.plan
        fn = self.spec.fn
        if plan.order == ("value",):
            args: list[Any] = [value]
        else:
            args = bind_arguments(plan, value, message, context)
        timeout = self.spec.timeout  # real time, not the worker's clock: the handler's work
        try:
            if plan.is_async:
                with anyio.fail_after(timeout) if timeout is not None else nullcontext():
                    result = await fn(*args)
                if result is not None and inspect.isawaitable(result):
                    discard_awaitable(result)
                    raise TypeError("the handler returned an awaitable it did not await")
                return
            # Counted as a run while the thread runs it, even once abandoned.
            call = self._runs.in_thread(message.shard, functools.partial(fn, *args))
            with anyio.fail_after(timeout) if timeout is not None else nullcontext():
                # A thread cannot be cancelled: after a timeout it is abandoned (it may
                # still finish later) and the attempt counts as failed.
                result = await anyio.to_thread.run_sync(
                    call, limiter=self._limiter, abandon_on_cancel=timeout is not None
                )
                if result is not None and inspect.isawaitable(result):
                    await result  # a plain function returning a coroutine, e.g. a lambda
        except TimeoutError as e:
            if timeout is not None and not str(e):
                raise TimeoutError(f"the handler did not finish within {timeout}s") from None
            raise

    async def _count_run(self, message: Message) -> bool:
        """Count a run of a message taken over from another member (persisted before it
        starts): runs that never finished are attempts too. True when the message must
        not run again (it has been dead-lettered as ``crashed``)."""
        reader = message._reader
        assert reader is not None
        message._claimed = False
        try:
            counted = await fenced_count_run(self.worker.scripts, reader, message._rid + b":runs")
        except RedisError as e:
            log.warning("could not count the run of %s: %s", message.id, e)
            return False
        if counted is None:  # the shard has another owner now: not ours to run
            self._dropped(message)
            return True
        runs = counted
        message._retry_record = True
        # The first delivery's run may or may not have started, so it is not counted:
        # a message that kills its worker every time gets max_attempts runs after it.
        if runs > message._failures + 1:
            message._failures = runs - 1
        if message._failures >= self.spec.retry.max_attempts:
            self.statistics.crashed += 1
            await self._dead_letter(
                message,
                "crashed",
                f"started {runs} times on taken-over deliveries without finishing "
                "(the worker running it died each time)",
            )
            return True
        return False

    # -- idempotency -------------------------------------------------------------------
    async def _claim(self, message: Message, key: str) -> object:
        store = self.idempotency
        assert store is not None
        try:
            holder = f"{message.shard}/{message.id}"
            if await store.claim(key, self._claim_ttl, holder):
                return _CLAIMED
            if await store.is_completed(key):
                self.statistics.duplicates += 1
                self.acker.ack(message)
                return None
        except RedisError as e:
            log.warning("idempotency claim(%s) failed: %s", key, e)
        # Claimed by someone else and not completed (or the store failed): try later,
        # without counting an attempt.
        return self._clock.monotonic() + _INFRA_RETRY

    async def _release(self, key: str | None) -> None:
        if key is None or self.idempotency is None:
            return
        try:
            await self.idempotency.release(key)
        except RedisError as e:
            log.warning("idempotency release(%s) failed: %s", key, e)

    # -- failure paths -------------------------------------------------------------------
    async def _failed(
        self,
        message: Message,
        error: str,
        delay: float | None,
        exception: BaseException | None = None,
    ) -> Outcome:
        stats = self.statistics
        stats.failed += 1
        failures = message._failures + 1
        message._failures = failures
        policy = self.spec.retry
        logged = exception is not None and self._tracebacks.failed(message, exception, failures)
        if exception is not None and not isinstance(exception, Exception):
            log.error(
                "handler of %s raised %s (not an Exception) on %s %s: counted as a failed "
                "attempt; the worker carries on",
                message.stream,
                type(exception).__name__,
                message.shard,
                message.id,
            )
        if failures >= policy.max_attempts:
            return await self._dead_letter(message, "max_attempts", error, exception)
        if delay is not None and math.isinf(delay):
            # Retry(delay=inf) would park the message for ever: a handler bug, so the
            # policy's backoff applies and the log says why.
            log.warning("Retry(delay=%r) on %s: the policy's backoff applies", delay, message.id)
            delay = None
        wait = policy.delay(failures) if delay is None else delay
        wait = 0.0 if math.isnan(wait) or wait < 0 else wait  # NaN and negative: now
        wait = min(wait, _MAX_DELAY)
        # The record holds wall-clock time: another member may take the message over.
        due_ms = self._clock.time_ms() + int(wait * 1000)
        reader = message._reader
        assert reader is not None
        try:
            # Persisted so the attempt count and backoff survive this member's crash;
            # only by the shard's owner (fenced).
            record = f"{failures}:{due_ms}"
            if not await fenced_retry_record(self.worker.scripts, reader, message._rid, record):
                self._dropped(message)  # the shard has another owner now
                return None
            message._retry_record = True
        except RedisError as e:
            log.warning("could not persist retry record of %s: %s", message.id, e)
        stats.retried += 1
        log.info(
            "%s %s failed (attempt %d/%d): %s; retry in %.2fs%s",
            message.shard,
            message.id,
            failures,
            policy.max_attempts,
            clip(error, 500),
            wait,
            " (traceback suppressed)" if exception is not None and not logged else "",
            extra=self._log_fields(message),
        )
        return self._clock.monotonic() + wait

    async def _dead_letter(
        self, message: Message, reason: str, error: str, exception: BaseException | None = None
    ) -> Outcome:
        """Write the message to the group's dead-letter stream, then ack it (with the
        traceback of ``exception``, the last attempt's, when there is one)."""
        reader = message._reader
        assert reader is not None
        fields = original_fields(message._entry_fields())
        text = error[:_MAX_ERROR]  # a hard cap on the entry's size
        fields.update(
            {
                "reason": reason,
                # Lone surrogates (e.g. file names decoded with surrogateescape) cannot
                # be UTF-8 encoded: keep them visible as escapes.
                "error": text.encode("utf-8", "backslashreplace"),
                "attempts": str(message._failures),
                "stream": message.stream,
                "shard": message.shard,
                "entry_id": message.id,
                "group": self.worker.group,
                "member": self.worker.member_id,
                "failed_at": str(self._clock.time_ms()),
            }
        )
        if exception is not None:
            fields["traceback"] = traceback_text(exception)  # at most 8 KB (failures.py)
        return await self._settle_dead_letter(message, await self._letters.write(message, fields))

    async def _settle_dead_letter(self, message: Message, written: Written) -> Outcome:
        """Ack a dead-lettered message (``dead_letter.py`` wrote its entry, now or
        before); drop one whose shard moved on; try again after Redis trouble."""
        if written is Written.FENCED:
            self._dropped(message)  # the next owner dead-letters it (or has)
            return None
        if written is Written.FAILED:
            return self._clock.monotonic() + _INFRA_RETRY
        recorded = message._dead_letter or {}
        reason = recorded.get("reason", "")
        if written is Written.NOW:
            self.statistics.dead_lettered += 1
            if reason == "poison":
                self.statistics.poison += 1
            log.warning(
                "dead-lettered %s %s (%s): %s",
                message.shard,
                message.id,
                reason,
                clip(recorded.get("error", ""), 200),
                extra=self._log_fields(message),
            )
            if self._middleware is not None:
                await self._middleware.dead_lettered(message, reason, recorded.get("error", ""))
        self.acker.ack(message)
        return None


_CLAIMED = object()
#: :meth:`HandlerRuntime._before_run`: nothing settled the message, run it.
_RUN = object()
# The worker's clock is this plus its offset (clock.py), read inline on the hot path:
# boottime, as the lease's deadlines are (time.monotonic() stops while the host is
# suspended: a lease check on it would start runs after the lease ran out).
_monotonic = boottime
# Durations for the metrics are real elapsed time, not the worker's (movable) clock:
# boottime too, so one reading per side of a run times it and checks its lease.
_perf_counter = boottime
