"""Ordering modes under concurrency: order holds where promised, parallelism happens."""

from __future__ import annotations

import collections
import random
from collections.abc import Callable

import anyio

from streamworks import App, Message, Record
from streamworks.testing import TestRuntime


class Probe:
    """Records processing order and the largest number of concurrent handlers."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, int]] = []  # (shard, key, seq)
        self.active: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.now = 0
        self.max_now = 0

    async def handle(self, value: dict[str, int], msg: Message) -> None:
        self.now += 1
        self.max_now = max(self.max_now, self.now)
        self.active[msg.shard] += 1
        self.peak[msg.shard] = max(self.peak[msg.shard], self.active[msg.shard])
        await anyio.sleep(random.random() * 0.002)  # simulated I/O of varying length
        self.active[msg.shard] -= 1
        self.now -= 1
        self.log.append((msg.shard, msg.key or "", value["seq"]))


def make_app(ordering: str, concurrency: int) -> tuple[App, Probe]:
    app = App("g")
    app.stream("events", shards=4)
    probe = Probe()
    app.handler("events", ordering=ordering, concurrency=concurrency)(probe.handle)  # type: ignore[arg-type]
    return app, probe


async def publish(app: App, n: int, keys: int, key_of: Callable[[int], str | None]) -> None:
    records = [Record({"seq": i}, key=key_of(i)) for i in range(n)]
    for i in range(0, n, 100):
        await app.publish_many("events", records[i : i + 100])


async def test_key_ordering_keeps_per_key_order_and_runs_keys_in_parallel(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, probe = make_app("key", concurrency=16)
    async with streamworks_runtime(app, workers=2) as rt:
        await publish(app, 600, 20, lambda i: f"k{i % 20}")
        await rt.wait_idle(timeout=20)
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for _, key, seq in probe.log:
        per_key[key].append(seq)
    assert len(probe.log) == 600
    assert all(seqs == sorted(seqs) for seqs in per_key.values())
    assert probe.max_now > 4  # different keys really ran at the same time


async def test_shard_ordering_is_one_at_a_time_per_shard(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, probe = make_app("shard", concurrency=16)
    async with streamworks_runtime(app, workers=1) as rt:
        await publish(app, 400, 0, lambda i: f"k{i % 50}")
        await rt.wait_idle(timeout=20)
    assert len(probe.log) == 400
    assert max(probe.peak.values()) == 1  # never two at once on a shard
    assert probe.max_now > 1  # but shards ran in parallel
    per_shard: dict[str, list[int]] = collections.defaultdict(list)
    for shard, _, seq in probe.log:
        per_shard[shard].append(seq)
    assert all(seqs == sorted(seqs) for seqs in per_shard.values())


async def test_no_ordering_runs_up_to_the_concurrency_limit(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, probe = make_app("none", concurrency=8)
    async with streamworks_runtime(app, workers=1) as rt:
        await publish(app, 400, 0, lambda i: "same-key")
        await rt.wait_idle(timeout=20)
    assert len(probe.log) == 400
    assert probe.max_now == 8  # one key, still fully parallel, capped at concurrency
    assert max(probe.peak.values()) > 1


async def test_unkeyed_messages_run_independently_in_key_mode(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, probe = make_app("key", concurrency=8)
    async with streamworks_runtime(app, workers=1) as rt:
        await publish(app, 200, 0, lambda i: None)
        await rt.wait_idle(timeout=20)
    assert len(probe.log) == 200
    assert probe.max_now > 1


async def test_readers_forget_every_settled_message(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """A reader tracks the ids it has in flight (a takeover round must skip them); once
    settled they are forgotten, or memory would grow with every message."""
    app, probe = make_app("key", concurrency=8)
    async with streamworks_runtime(app, workers=1) as rt:
        await publish(app, 500, 0, lambda i: f"k{i % 7}")
        await rt.wait_idle(timeout=20)
        readers = list(rt.workers[0].readers.values())
        assert readers
        assert all(not r.held and r.outstanding == 0 for r in readers)
    assert len(probe.log) == 500
