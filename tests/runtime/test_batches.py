"""Batch handlers end to end against a real Redis: lists of typed payloads with one
context, all acked after the handler returns, single items failed alone or the whole
batch, per-key order across batches, idempotency per item, and nothing lost when a
member crashes or loses shards mid-batch."""

from __future__ import annotations

import collections
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from streamworks import (
    App,
    Batch,
    BatchContext,
    ConfigurationError,
    Message,
    Record,
    RetryPolicy,
)
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.support import wait_for

pytestmark = pytest.mark.timeout(120)


class Event(BaseModel):
    key: str
    seq: int


def _events(n: int, keys: int) -> list[Record]:
    return [Record(Event(key=f"k{i % keys}", seq=i), key=f"k{i % keys}") for i in range(n)]


async def test_a_batch_handler_gets_lists_of_typed_payloads_and_acks_them_all(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("events", shards=4)
    batches: list[list[Event]] = []

    @app.handler("events", batch=Batch(max_size=50, max_wait=timedelta(milliseconds=50)))
    async def write(events: list[Event], ctx: BatchContext) -> None:
        assert all(isinstance(e, Event) for e in events)
        assert [m.key for m in ctx.messages] == [e.key for e in events]
        batches.append(events)

    async with streamworks_runtime(app, workers=1) as rt:
        await app.publish_many("events", _events(400, keys=40))
        await rt.wait_idle(timeout=20)
        metrics = await rt.worker_metrics(0)
        stats = rt.statistics("events")
    seen = [e.seq for batch in batches for e in batch]
    assert sorted(seen) == list(range(400))  # each once
    assert max(len(b) for b in batches) == 50  # never above max_size...
    assert len(batches) < 400 / 5  # ...and really batched
    assert stats["handled"] == 400 and stats["failed"] == 0
    for key in range(40):  # per-key order
        mine = [s for s in seen if s % 40 == key]
        assert mine == sorted(mine)
    assert 'streamworks_batch_size_count{group="g",stream="events"}' in metrics
    assert 'streamworks_batch_items_total{group="g",outcome="ack",stream="events"} 400.0' in metrics


async def test_a_batch_waits_max_wait_for_more_then_starts_with_what_is_ready(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("events", shards=1)
    sizes: list[int] = []

    @app.handler("events", batch=Batch(max_size=100, max_wait=timedelta(seconds=5)))
    async def write(events: list[Event]) -> None:
        sizes.append(len(events))

    # (Leases longer than max_wait: an advance past a lease ends it, as a pause would.)
    async with streamworks_runtime(app, settings=fast_settings(lease_ttl=20.0)) as rt:
        await app.publish_many("events", _events(3, keys=3))
        worker = rt.workers[0]
        dispatcher = worker.handlers["events"].dispatcher
        await wait_for(lambda: dispatcher._ready(1e18, 100)[0] == 3)
        assert sizes == []  # waiting for more (5 s of max_wait)
        await rt.advance(5.1)  # the worker's clock: max_wait has passed
        await wait_for(lambda: sizes == [3])
        await rt.wait_idle()


async def test_failing_one_item_retries_it_alone_and_holds_back_only_its_key(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("events", shards=2)
    done: dict[str, list[int]] = collections.defaultdict(list)
    runs: collections.Counter[int] = collections.Counter()

    @app.handler(
        "events",
        batch=Batch(max_size=40, max_wait=timedelta(milliseconds=20)),
        retry=RetryPolicy(max_attempts=3, backoff=0.01, max_backoff=0.02),
    )
    async def write(events: list[Event], ctx: BatchContext) -> None:
        failed_keys: set[str] = set()
        for i, e in enumerate(events):
            if e.key in failed_keys:
                continue  # after its key's failed item: it runs again after that one
            runs[e.seq] += 1
            if e.seq == 5 and ctx.messages[i].attempt < 2:
                ctx.fail(i, ValueError("constraint"))  # once: then it goes through
                failed_keys.add(e.key)
            elif e.seq == 7:
                ctx.fail(i, "always")  # dead-lettered after 3 attempts
                failed_keys.add(e.key)
            else:
                done[e.key].append(e.seq)

    async with streamworks_runtime(app) as rt:
        await app.publish_many("events", _events(40, keys=4))
        await rt.wait_idle(timeout=20)
        letters = await rt.dead_letters("events")
        stats = rt.statistics("events")
    assert [(d.reason, d.attempts) for d in letters] == [("max_attempts", 3)]
    assert "always" in letters[0].error
    assert runs[7] == 3 and runs[5] == 2
    # Per-key order of what was done, across batches and the retry of 5 (key k1);
    # key k3 (7's) lost 7 only, and the items after 7 ran after it failed for good.
    assert done["k1"] == list(range(1, 40, 4))
    assert done["k3"] == [s for s in range(3, 40, 4) if s != 7]
    assert done["k0"] == list(range(0, 40, 4)) and done["k2"] == list(range(2, 40, 4))
    # Items after a failure were released (run again), not failed: 2 + 3 attempts.
    assert stats["failed"] == 1 + 3 and stats["dead_lettered"] == 1


async def test_raising_fails_the_whole_batch(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("events", shards=1)
    attempts: list[list[tuple[int, int]]] = []

    @app.handler(
        "events",
        batch=Batch(max_size=10, max_wait=timedelta(milliseconds=20)),
        retry=RetryPolicy(max_attempts=5, backoff=0.01, max_backoff=0.02),
    )
    async def write(events: list[Message]) -> None:
        attempts.append([(m.attempt, len(m.payload)) for m in events])
        if len(attempts) == 1:
            raise RuntimeError("database down")

    async with streamworks_runtime(app) as rt:
        await app.publish_many("events", [Record({"n": i}, key="k") for i in range(5)])
        await wait_for(lambda: bool(attempts))
        await rt.wait_idle(timeout=20)
        stats = rt.statistics("events")
    assert [a for a, _ in attempts[0]] == [1] * len(attempts[0])
    assert all(a == 2 for a, _ in attempts[1][: len(attempts[0])])
    assert stats["failed"] == len(attempts[0]) and stats["handled"] == 5


async def test_idempotency_keys_apply_per_item_and_poison_items_never_reach_the_list(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("events", shards=1)
    seen: list[int] = []
    keys: list[str | None] = []

    @app.handler(
        "events",
        batch=Batch(max_size=100, max_wait=timedelta(milliseconds=30)),
        idempotency_key=lambda e, ctx: f"e{e.seq}",
    )
    async def write(events: list[Event], ctx: BatchContext) -> None:
        seen.extend(e.seq for e in events)
        keys.extend(ctx.idempotency_keys)

    async with streamworks_runtime(app) as rt:
        await app.publish_many("events", _events(10, keys=2))
        await rt.wait_idle()
        await app.publish("events", {"not": "an event"}, key="k0")  # poison
        await app.publish_many("events", _events(12, keys=2))  # 0..9 again, then 10, 11
        await rt.wait_idle()
        stats = rt.statistics("events")
        letters = await rt.dead_letters("events")
    assert sorted(seen) == list(range(12))
    assert sorted(keys[:10]) == sorted(f"e{i}" for i in range(10))
    assert stats["duplicates"] == 10
    assert [d.reason for d in letters] == ["poison"]


async def test_a_crash_mid_batch_loses_nothing(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("events", shards=2)
    done: list[int] = []
    hang = anyio.Event()
    first = anyio.Event()

    @app.handler("events", batch=Batch(max_size=20, max_wait=timedelta(milliseconds=20)))
    async def write(events: list[Event]) -> None:
        if not first.is_set():
            first.set()
            await hang.wait()  # the member dies in here
        done.extend(e.seq for e in events)

    async with streamworks_runtime(app, workers=2) as rt:
        await app.publish_many("events", _events(100, keys=10))
        await first.wait()
        owner = next(i for i, w in enumerate(rt.workers) if w.handlers["events"].dispatcher.running)
        await rt.kill_worker(owner)
        await rt.advance(5)  # its lease runs out: the other member takes its shards
        await rt.wait_idle(timeout=30)
    assert sorted(set(done)) == list(range(100))  # nothing lost
    assert len(done) == 100  # the batch in the dead member never completed


async def test_shards_revoked_mid_batch_then_a_scale_lose_nothing_and_keep_key_order(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("events", shards=4)
    done: list[Event] = []
    cancelled: list[Event] = []
    started = anyio.Event()

    # One batch of everything (all four shards): a member joins while it runs, two of
    # its shards are revoked and, as it never ends, taken from it (the run cancelled).
    @app.handler("events", ordering="key", batch=Batch(max_size=200, max_wait=timedelta(seconds=1)))
    async def write(events: list[Event]) -> None:
        if not started.is_set():
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.extend(events)
        await anyio.sleep(0.005)  # batches keep running while the stream is scaled
        done.extend(events)

    async with streamworks_runtime(app, workers=1) as rt:
        await app.publish_many("events", _events(200, keys=20))
        await started.wait()
        first = rt.workers[0]
        await rt.add_worker(wait=False)  # a rebalance revokes two shards mid-batch
        await wait_for(lambda: bool(first.revoking_shards()), message="a revocation")
        await wait_for(lambda: bool(cancelled), timeout=30, message="the batch cancelled")
        await rt.wait_assigned(timeout=30)
        await app.publish_many("events", _events(400, keys=20)[200:])
        await rt.scale("events", 6, timeout=60)  # while those are handled
        await app.publish_many("events", [Record(Event(key="k0", seq=400), key="k0")])
        await rt.wait_idle(timeout=30)
        stats = rt.statistics("events")
    seqs = [e.seq for e in done]
    assert sorted(set(seqs)) == list(range(401))  # nothing lost (at least once)
    assert {e.seq for e in cancelled} == set(range(200))  # the first batch: everything
    assert stats["failed"] == 0  # an ownership loss is no failed attempt
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for e in done:
        per_key[e.key].append(e.seq)
    for key, got in per_key.items():
        firsts = list(dict.fromkeys(got))  # first completion of each, in order
        assert firsts == sorted(firsts), key


async def test_a_lease_lost_mid_batch_cancels_it_and_the_next_owner_runs_it(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("events", shards=2)
    done: list[int] = []
    cancelled: list[int] = []
    first = anyio.Event()

    @app.handler("events", batch=Batch(max_size=50, max_wait=timedelta(milliseconds=20)))
    async def write(events: list[Event]) -> None:
        if not first.is_set():
            first.set()
            try:
                await anyio.sleep_forever()  # until the lease's end cancels the run
            finally:
                cancelled.extend(e.seq for e in events)
        done.extend(e.seq for e in events)

    async with streamworks_runtime(app) as rt:
        await app.publish_many("events", _events(60, keys=6))
        await first.wait()
        await rt.advance(3)  # past the lease (1 s): the batch may not settle any more
        await wait_for(lambda: bool(cancelled), message="the batch to be cancelled")
        await rt.wait_idle(timeout=30)
        stats = rt.statistics("events")
    assert sorted(done) == list(range(60))  # the cancelled items ran again, once
    assert set(cancelled) <= set(done)
    assert stats["failed"] == 0  # ownership loss is no failed attempt


def test_batch_handlers_are_checked_at_declaration() -> None:
    app = App("g")
    app.stream("events", shards=1)

    async def one(event: Event) -> None: ...
    async def bad_ctx(events: list[Event], ctx: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="list"):
        app.handler("events", batch=Batch())(one)
    with pytest.raises(ConfigurationError, match="BatchContext"):
        app.handler("events", batch=Batch())(bad_ctx)
    with pytest.raises(ConfigurationError, match="max_size"):
        Batch(max_size=0)
    with pytest.raises(ConfigurationError, match="Batch"):
        app.handler("events", batch=500)(one)  # type: ignore[arg-type]
