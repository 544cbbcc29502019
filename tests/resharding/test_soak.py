"""8 -> 3 -> 12 under continuous load with random worker restarts (E13, E17).

A coordinator and three workers of the instrumented app (``ordering="key"``) run as
processes; two producers publish continuously, each sequentially, so "published
before" is well defined per producer. While the stream is scaled in (8 -> 3, waiting
for the removed shards to be retired) and out (3 -> 12), a random worker is restarted
(SIGTERM or SIGKILL, then a new process) every few hundred messages. The random seed is
printed; ``RESHARDING_SEED=<seed>`` replays the same choices.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from typing import Any

import anyio
import pytest

from tests.chaos.trace_check import check_directory, record_history
from tests.e2e.harness import (
    STREAM,
    Cluster,
    Proc,
    Publisher,
    duplicates,
    producer_app,
    wait_handled,
    wait_ready,
    wait_stable,
    wait_until,
)
from tests.resharding.helpers import draining, phase

# Every handling takes 10 ms, and a backlog is published just before the scale-in, so
# the removed shards are being drained while workers restart.
WORKER_ENV: dict[str, Any] = {"E2E_SHARDS": "8", "E2E_ORDERING": "key", "E2E_SLEEP": "0.01"}
BACKLOG = 1000


class Restarter:
    """Restarts a random worker each time the producers published ``gap`` more
    messages (``gap`` drawn from the seeded generator)."""

    def __init__(self, cluster: Cluster, workers: list[Proc], rng: random.Random) -> None:
        self.cluster = cluster
        self.workers = workers
        self.rng = rng
        self.done: list[str] = []
        self._stop = anyio.Event()
        self._lock = anyio.Lock()

    async def run(self, published: Any) -> None:
        while not self._stop.is_set():
            target = published() + self.rng.randint(400, 900)

            async def due(target: int = target) -> bool:
                return published() >= target or self._stop.is_set()

            await wait_until(due, 60, "more messages published")
            if self._stop.is_set():
                return
            await self.restart()

    async def restart(self) -> None:
        async with self._lock:
            i = self.rng.randrange(len(self.workers))
            victim = self.workers[i]
            sig = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
            victim.send(sig)
            await victim.wait_exit(20)
            name = f"worker-{len(self.cluster.procs)}"
            self.workers[i] = self.cluster.start_worker(name, **WORKER_ENV)
            self.done.append(f"{victim.name} {sig.name} -> {name}")

    def stop(self) -> None:
        self._stop.set()


#: Why this test runs on a single node only (``--redis-target=cluster`` skips it).
_ATOMIC_OBSERVER = (
    "its instruments read shard state and handler records in one atomic script, which "
    "a cluster cannot run across slots"
)


@pytest.mark.no_cluster(_ATOMIC_OBSERVER)
@pytest.mark.seed("E13")
@pytest.mark.seed("E17")
async def test_eight_to_three_to_twelve_under_load_with_worker_restarts(
    cluster: Cluster, redis: Any
) -> None:
    """Nothing is lost (every published id handled), duplicates are counted and printed,
    and per-key order holds within each layout: for each producer and key, the messages
    it published under one routing version were first started in publish order."""
    seed = int(os.environ.get("RESHARDING_SEED") or time.time_ns() % 2**31)
    print(f"\nrandom seed {seed} (RESHARDING_SEED={seed} replays it)")
    rng = random.Random(seed)
    # Every process records its protocol steps; the history is checked at the end.
    history = record_history(cluster.base_env, cluster.workdir / "history")
    coordinator = cluster.start_coordinator(STREAMWORKS_ROUTING_LEASE="2")
    await wait_ready(coordinator)
    async with cluster.client() as client:
        await client.create_stream(STREAM, 8)
        workers = [cluster.start_worker(f"worker-{i}", **WORKER_ENV) for i in range(3)]
        await wait_stable(client, 3)
        apps = [producer_app(cluster), producer_app(cluster)]
        publishers = [Publisher(app, f"p{i}") for i, app in enumerate(apps)]
        backlog = Publisher(apps[1], "backlog")
        restarter = Restarter(cluster, workers, rng)

        def published() -> int:
            return sum(len(p.published) for p in publishers)

        async def settled(count: int) -> Any:
            info = await client.stream(STREAM)
            done = info.shard_count == count and not draining(info) and phase(info) == "NONE"
            return info if done else None

        async with apps[0].connect(), apps[1].connect(), anyio.create_task_group() as tg:
            for publisher in publishers:
                tg.start_soon(publisher.run)
            await publishers[0].wait_count(150)
            tg.start_soon(restarter.run, published)

            await backlog.burst(BACKLOG)  # its own producer: sequential on its own
            started = time.monotonic()
            await client.scale_stream(STREAM, 3)
            await restarter.restart()  # at least one while the removed shards drain
            info = await wait_until(lambda: settled(3), 60, "8 -> 3 to complete")
            scale_in = time.monotonic() - started
            assert [s.shard for s in info.shards] == [f"{STREAM}/{i}@0" for i in range(3)]

            mark = published()
            await wait_until(_at_least(published, mark + 300), 30, "traffic on 3 shards")
            info = await client.scale_stream(STREAM, 12)
            assert info.shard_count == 12
            # Both producers pick the 12-shard routing up within their routing lease.
            for publisher in publishers:
                await wait_until(
                    _at_least(lambda p=publisher: _on_version(p, info.routing_version), 300),
                    30,
                    f"{publisher.prefix}: traffic on 12 shards",
                )
            if not restarter.done:
                await restarter.restart()
            restarter.stop()
            ids = [i for p in publishers for i in await p.stop()] + backlog.published
        records = await wait_handled(redis, cluster.prefix, ids, timeout=60)
        info = await wait_until(lambda: settled(12), 5, "12 shards")
        assert [s.shard for s in info.shards] == [f"{STREAM}/{i}@0" for i in range(3)] + [
            f"{STREAM}/{i}@1" for i in range(3, 12)
        ]

    handled = {p.id for p in records if p.end is not None}
    lost = set(ids) - handled
    dups = duplicates(records)
    versions = sorted({r.routing_version for p in publishers for r in p.results})
    print(
        f"published {len(ids)}, handled {len(handled)}, lost {len(lost)}, "
        f"processings {len(records)}, ids processed more than once {len(dups)} "
        f"({sum(len(v) - 1 for v in dups.values())} extra processings), routing versions "
        f"{versions}, 8 -> 3 took {scale_in:.1f}s, restarts: {restarter.done}"
    )
    assert not lost
    assert len(versions) == 3  # messages were published under all three layouts

    # Per-key order within each layout, for each sequential producer: its messages of a
    # key under one routing version were written in publish order (entry ids) and first
    # started in that order.
    first_start: dict[str, int] = {}
    for p in records:
        first_start[p.id] = min(p.start, first_start.get(p.id, p.start))
    runs: dict[tuple[str, str, int], list[tuple[str, str]]] = defaultdict(list)
    for publisher in [*publishers, backlog]:
        for event_id, result in zip(publisher.published, publisher.results, strict=True):
            run = (publisher.prefix, f"k{event_id[-2:]}", result.routing_version)
            runs[run].append((event_id, result.entry_id))
    disorder = []
    for run, entries in runs.items():
        written = [tuple(map(int, e.split("-"))) for _, e in entries]
        starts = [first_start[i] for i, _ in entries]
        for j in range(1, len(entries)):
            if written[j] <= written[j - 1] or starts[j] < starts[j - 1]:
                disorder.append((run, entries[j - 1], entries[j]))
                break
    assert not disorder, f"{len(disorder)} key runs out of order, e.g. {disorder[:3]}"

    # The recorded history satisfies the model's invariants (tests/chaos/trace_check.py),
    # and it saw the migrations' phases.
    ok, report = check_directory(history)
    print(report)
    assert ok, report
    assert "migration" in report, report


def _on_version(publisher: Publisher, version: int) -> int:
    return sum(1 for r in publisher.results if r.routing_version == version)


def _at_least(count: Any, target: int) -> Any:
    async def probe() -> bool:
        return bool(count() >= target)

    return probe
