"""Running a batch handler: one run per batch, then each item settled on its own.

:class:`BatchRuntime` is a :class:`HandlerRuntime` whose dispatcher forms batches
(``batch_dispatcher.py``). Per batch:

1. before the run, per item, the straight line's first steps (``execution.py``): an
   item revoked or out of lease is dropped (it stays pending), a recorded final
   failure or a poison entry is dead-lettered, a taken-over item's run is counted;
   an item that does not decode is dead-lettered (never in the list); an item whose
   idempotency key is completed is acked as a duplicate and left out. An item that
   must wait (its key is claimed elsewhere) holds back the later items of its lane;
2. one run of the handler, under a run of every shard in the batch (``Runs``): a shard
   revoked meanwhile cancels the batch; its items are dropped (pending for the next
   owner), the others released (run again, no attempt counted);
3. the outcomes (:func:`streamworks.batch.settle_batch`): an item before its lane's
   first failure is acked (its idempotency key completed), a failed item is retried or
   dead-lettered alone by the handler's retry policy (its own retry record), an item
   after its lane's failure is released. Raising fails every item.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

import anyio
from redis.exceptions import RedisError

from streamworks.batch import ItemOutcome, settle_batch
from streamworks.exceptions import ConfigurationError, DecodeError, Retry, Skip
from streamworks.runtime.batch_context import BatchContext
from streamworks.runtime.batch_dispatcher import RELEASED, BatchDispatcher, ItemResult
from streamworks.runtime.execution import _CLAIMED, _RUN, HandlerRuntime, log
from streamworks.runtime.failures import cancelled_from_outside, describe
from streamworks.runtime.handler import HandlerSpec, discard_awaitable
from streamworks.runtime.message import Context, Message
from streamworks.runtime.ownership import RunCancelled
from streamworks.runtime.rate_gate import attach

if TYPE_CHECKING:
    from streamworks.runtime.acks import Acker
    from streamworks.runtime.idempotency import IdempotencyStore
    from streamworks.runtime.worker import Worker

__all__ = ("BatchRuntime", "handler_runtime")


def handler_runtime(
    worker: Worker, spec: HandlerSpec, acker: Acker, idempotency: IdempotencyStore | None
) -> HandlerRuntime:
    """The runtime of one handler: per message, or per batch (``batch=``)."""
    if spec.batch is None:
        runtime = HandlerRuntime(worker, spec, acker, idempotency)
        attach(runtime)  # its rate limit, if any
        return runtime
    return BatchRuntime(worker, spec, acker, idempotency)


class BatchRuntime(HandlerRuntime):
    """One batch handler's execution inside a worker."""

    def __init__(
        self,
        worker: Worker,
        spec: HandlerSpec,
        acker: Acker,
        idempotency: IdempotencyStore | None,
    ) -> None:
        if spec.batch is None:  # pragma: no cover - handler_runtime picks the class
            raise ConfigurationError(f"{spec.name} has no batch=")
        if spec.rate_limit is not None:
            raise ConfigurationError(
                f"handler {spec.name}: rate_limit= with batch= is not supported yet"
            )
        super().__init__(worker, spec, acker, idempotency)
        self.dispatcher: BatchDispatcher = BatchDispatcher(  # type: ignore[assignment]
            spec.ordering,
            spec.batch,
            spec.concurrency,
            self.process_batch,
            self._dropped,
            worker.clock,
        )
        worker.metrics.batches[spec.stream] = self.dispatcher.statistics

    def _lane(self, message: Message) -> Any:
        ordering = self.spec.ordering
        return message.key if ordering == "key" else message.shard if ordering == "shard" else None

    async def process_batch(self, batch: list[Message]) -> list[ItemResult]:
        """Run one batch and settle each item; per item: None (settled), a due time
        (run again then: a retry), or RELEASED (run again after its lane's failure)."""
        results: list[ItemResult] = [None] * len(batch)
        held: set[Any] = set()  # lanes an item of which waits: their later items too
        run: list[int] = []
        values: list[Any] = []
        keys: list[str | None] = []
        for i, message in enumerate(batch):
            lane = self._lane(message)
            if lane is not None and lane in held:
                results[i] = RELEASED
                self.dispatcher.statistics.items["released"] += 1
                continue
            result, value, key = await self._prepare(message)
            if result is not _RUN:
                results[i] = result  # type: ignore[call-overload]
                if result is not None and lane is not None:
                    held.add(lane)
                continue
            run.append(i)
            values.append(value)
            keys.append(key)
        if run:
            outcomes = await self._run_batch([batch[i] for i in run], values, keys)
            for i, outcome in zip(run, outcomes, strict=True):
                results[i] = outcome
        return results

    async def _prepare(self, message: Message) -> tuple[object, Any, str | None]:
        """The steps before the run for one item: ``_RUN`` with its value and key, or
        the item's result when one of them settled it (or made it wait)."""
        before = await self._before_run(message)
        if before is not _RUN:
            return before, None, None
        value: Any = message
        if self.plan.decode is not None:
            try:
                value = self.plan.decode(message.payload)
            except DecodeError as e:
                return await self._dead_letter(message, "poison", str(e)), None, None
        key: str | None = None
        if self.spec.idempotency_key is not None:
            context = Context(self.app, message, self._logger, self.worker.member_id)
            try:
                raw = self.spec.idempotency_key(value, context)
            except Exception as e:
                failed = f"idempotency_key failed: {describe(e)}"
                return await self._dead_letter(message, "poison", failed), None, None
            key = None if raw is None else str(raw)
            if key is not None:
                claimed = await self._claim(message, key)
                if claimed is not _CLAIMED:
                    return claimed, None, None  # a duplicate (acked), or wait
        return _RUN, value, key

    async def _run_batch(
        self, messages: list[Message], values: list[Any], keys: list[str | None]
    ) -> list[ItemResult]:
        context = BatchContext(self.app, messages, keys, self._logger, self.worker.member_id)
        shards = sorted({m.shard for m in messages})
        error: tuple[str, float | None, BaseException | None] | None = None
        started = perf_counter()
        try:
            try:
                await self._call_batch(values, context, shards)
            finally:
                self._duration.observe(perf_counter() - started)
        except RunCancelled:
            return await self._cancelled(messages, keys)
        except Skip:
            self.statistics.skipped += len(messages)
        except Retry as signal:
            error = (signal.reason, signal.delay, None)
        except BaseException as e:
            if cancelled_from_outside(e):
                for message in messages:
                    self._dropped(message)  # a hard stop: the entries stay pending
                raise
            error = (describe(e), None, e)
        failed = context.failed
        outcomes = settle_batch(
            [self._lane(m) for m in messages], list(failed), batch_failed=error is not None
        )
        stats = self.dispatcher.statistics.items
        results: list[ItemResult] = []
        for i, (message, key, outcome) in enumerate(zip(messages, keys, outcomes, strict=True)):
            stats[outcome.value] += 1
            if outcome is ItemOutcome.ACK:
                await self._complete(key)
                self.statistics.handled += 1
                self.acker.ack(message)
                results.append(None)
                continue
            await self._release(key)
            if outcome is ItemOutcome.RELEASED:
                results.append(RELEASED)
            elif error is not None:
                results.append(await self._failed(message, error[0], error[1], error[2]))
            else:
                item = failed[i]
                results.append(await self._failed(message, item.error, item.delay, item.exception))
        return results

    async def _cancelled(self, messages: list[Message], keys: list[str | None]) -> list[ItemResult]:
        """The batch was cancelled (a shard revoked, the lease ended): items of shards
        no longer ours are dropped, the others run again (no attempt counted)."""
        results: list[ItemResult] = []
        held = self._lease.valid()
        for message, key in zip(messages, keys, strict=True):
            await self._release(key)
            reader = message._reader
            if held and reader is not None and reader.accepting:
                results.append(RELEASED)
            else:
                self._dropped(message)
                results.append(None)
        return results

    async def _complete(self, key: str | None) -> None:
        if key is None or self.idempotency is None:
            return
        try:
            await self.idempotency.complete(key)
        except RedisError as e:
            log.warning("idempotency complete(%s) failed: %s", key, e)

    async def _call_batch(
        self, values: list[Any], context: BatchContext, shards: Sequence[str]
    ) -> None:
        fn = self.spec.fn
        args = [values, context] if self.plan.wants_context else [values]
        timeout = self.spec.timeout
        limit = anyio.fail_after(timeout) if timeout is not None else contextlib.nullcontext()
        with contextlib.ExitStack() as runs:
            for shard in shards:  # a run of each shard: revoking any one cancels the batch
                runs.enter_context(self._runs.run(shard, cancellable=self.plan.is_async))
            try:
                with limit:
                    if self.plan.is_async:
                        result = await fn(*args)
                    else:
                        call: Callable[[], Any] = functools.partial(fn, *args)
                        for shard in shards:
                            call = self._runs.in_thread(shard, call)
                        result = await anyio.to_thread.run_sync(
                            call, abandon_on_cancel=timeout is not None
                        )
            except TimeoutError as e:
                if timeout is not None and not str(e):
                    raise TimeoutError(f"the batch did not finish within {timeout}s") from None
                raise
        if result is not None and inspect.isawaitable(result):
            discard_awaitable(result)
            raise TypeError("the batch handler returned an awaitable it did not await")
