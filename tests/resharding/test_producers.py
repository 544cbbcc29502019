"""Producers across a resharding: stale routing after a scale-in (E16), routing
determinism across processes (E17), and one event id across a scale-out (E18)."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable

import anyio
import orjson
import pytest

from streamworks import App, Record
from streamworks.clock import Clock
from streamworks.protocol.shards import ShardId
from streamworks.redis.scripts import Scripts
from streamworks.runtime.connection import create_producer
from streamworks.runtime.leased_routing import LeasedRouting
from streamworks.runtime.producer import Producer
from streamworks.runtime.routing import jump_hash, key_hash
from streamworks.testing import TestRuntime
from tests.e2e.harness import REPO
from tests.resharding.helpers import Probe, draining, keys_on, phase, probe_app, wait_for


@pytest.mark.seed("E16")
async def test_stale_producer_is_refused_by_the_retired_key_and_reroutes(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """Producers that fetched the 3-shard routing before a 3 -> 1 scale-in and whose
    clock then stalled (so the cached table still looks valid after the removed shards
    were retired) publish to a retired shard: ``XADD NOMKSTREAM`` (plain, pipelined,
    and through the idempotent-publish script) is refused, the producer refreshes and
    the message lands on the live shard. The retired keys stay absent and no dedup
    record is written for them."""
    app, probe = probe_app("g", {"s": 3})
    app.stream("d", shards=3, dedup_window=60)
    app.handler("d")(probe.handle)
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        stalled = Clock()
        producers: list[Producer] = []
        for stream in ("s", "s", "d"):
            routing = LeasedRouting(rt.coordinator, clock=stalled)
            assert (await routing.routing(stream)).shard_count == 3
            producers.append(
                create_producer(app, rt.settings, rt.redis, Scripts(rt.redis), routing)
            )
        single, many, dedup = producers

        for stream in ("s", "d"):
            await service.scale_stream(stream, 1)

        async def retired() -> bool:
            infos = [await service.stream_info(n) for n in ("s", "d")]
            return all(not draining(i) and phase(i) == "NONE" for i in infos)

        await wait_for(retired, 15, "shards 1 and 2 of both streams retired")
        gone = {
            name: [rt.keyspace.stream(ShardId(name, i, 0)) for i in (1, 2)] for name in ("s", "d")
        }
        assert await rt.redis.exists(*gone["s"], *gone["d"]) == 0
        # The stalled clock: these producers still hold the old routing, valid to them.
        stalled.offset = -3600.0
        for producer in producers:
            table = await producer.routing.routing("d" if producer is dedup else "s")
            assert table.shard_count == 3 and table.version == 1

        k1, k2 = keys_on(1, 3)[0], keys_on(2, 3)[0]
        p = await single.publish("s", Record({"id": "late-single"}, key=k2))
        results = await many.publish_many(
            "s", [Record({"id": "late-many-1"}, key=k1), Record({"id": "late-many-2"}, key=k2)]
        )
        q = await dedup.publish("d", Record({"id": "late-dedup"}, key=k1, event_id="ev-1"))
        for result in (p, *results, q):
            assert result.shard in ("s/0@0", "d/0@0") and result.routing_version == 2
            assert not result.duplicate
        assert [pr.statistics.reroutes for pr in producers] == [1, 1, 1]
        # Nothing written to a retired key, none re-created, no dedup record for one.
        assert await rt.redis.exists(*gone["s"], *gone["d"]) == 0
        assert not await rt.redis.exists(rt.keyspace.dedup(ShardId("d", 1, 0), "ev-1"))
        assert await rt.redis.exists(rt.keyspace.dedup(ShardId("d", 0, 0), "ev-1"))
        late = {"late-single", "late-many-1", "late-many-2", "late-dedup"}
        live = rt.keyspace.stream(ShardId("s", 0, 0))
        on_live = {orjson.loads(f[b"v"])["id"] for _, f in await rt.redis.xrange(live)}
        assert {"late-single", "late-many-1", "late-many-2"} <= on_live
        await wait_for(lambda: late <= probe.ids(), 10, "the late messages handled")
        assert {i: s for i, s in probe.shard_of().items() if i in late} == {
            "late-single": "s/0@0",
            "late-many-1": "s/0@0",
            "late-many-2": "s/0@0",
            "late-dedup": "d/0@0",
        }
        assert await rt.redis.exists(*gone["s"], *gone["d"]) == 0


CHILD = textwrap.dedent(
    """
    import anyio, orjson, sys
    from streamworks import App

    async def main() -> None:
        app = App("det-child")
        app.stream("det", shards=6)
        count, keys = int(sys.argv[1]), sys.argv[2].split(",")
        async with app.connect():
            value = {"by": "child", "count": count}
            out = [(await app.publish("det", value, key=k)).shard for k in keys]
        sys.stdout.write(orjson.dumps(out).decode())

    anyio.run(main)
    """
)


async def child_shards(rt: TestRuntime, count: int, keys: list[str]) -> list[str]:
    """The shards a producer in a new process (hash seed = count) puts ``keys`` on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMWORKS_")}
    env.update(
        PYTHONPATH=str(REPO),
        PYTHONHASHSEED=str(count),
        STREAMWORKS_REDIS_URL=rt.settings.redis_url,
        STREAMWORKS_KEY_PREFIX=rt.settings.key_prefix,
        STREAMWORKS_COORDINATOR_URLS=str(rt.http_url),
    )
    args = [sys.executable, "-c", CHILD, str(count), ",".join(keys)]
    with anyio.fail_after(30):
        done = await anyio.run_process(args, env=env, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return list(orjson.loads(done.stdout))


@pytest.mark.seed("E17")
async def test_same_key_and_shard_count_give_the_same_shard_in_two_processes(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """A producer in another process (another hash seed) and one in the test process put
    every key on the same shard for the same shard count: the one jump-xxh64-v1 names.
    After a 6 -> 8 scale-out they agree again, and a key either keeps its shard or
    moves to one of the two new shards (jump hashing moves ~1/4 of the keys here).
    Read back from Redis, both producers' entries of a key sit on one shard per layout."""
    app, _ = probe_app("det-parent", {"det": 6})
    keys = [f"customer-{i}" for i in range(300)]
    async with streamworks_runtime(app, workers=0, http=True) as rt:
        assert rt.service is not None
        layouts: dict[int, list[str]] = {}
        for count in (6, 8):
            if count == 8:
                await rt.service.scale_stream("det", count)
            routing = LeasedRouting(rt.coordinator)
            producer = create_producer(app, rt.settings, rt.redis, Scripts(rt.redis), routing)
            value = {"by": "parent", "count": count}
            mine = [(await producer.publish("det", Record(value, key=k))).shard for k in keys]
            theirs = await child_shards(rt, count, keys)
            expected = []
            for k in keys:
                index = jump_hash(key_hash(k), count)
                expected.append(f"det/{index}@{0 if index < 6 else 1}")
            assert mine == theirs == expected
            layouts[count] = mine
        moved = [(b, a) for b, a in zip(layouts[6], layouts[8], strict=True) if b != a]
        assert all(a in ("det/6@1", "det/7@1") for _, a in moved)
        assert 0.1 < len(moved) / len(keys) < 0.4, len(moved)

        where: dict[tuple[str, int], set[str]] = {}
        by: dict[tuple[str, int], set[str]] = {}
        info = await rt.service.stream_info("det")
        for shard in info.shards:
            for _, fields in await rt.redis.xrange(rt.keyspace.stream(ShardId.parse(shard.shard))):
                value = orjson.loads(fields[b"v"])
                at = (fields[b"k"].decode(), value["count"])
                where.setdefault(at, set()).add(shard.shard)
                by.setdefault(at, set()).add(value["by"])
        assert len(where) == 2 * len(keys)
        assert all(len(shards) == 1 for shards in where.values())
        assert all(names == {"parent", "child"} for names in by.values())
        assert [next(iter(where[(k, 8)])) for k in keys] == layouts[8]


@pytest.mark.seed("E18")
async def test_one_event_id_across_a_scale_out_lands_on_two_shards_then_dedups_on_the_new(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """A real 2 -> 3 scale-out moves a key to the new shard 2. The same event id,
    published under the old layout (a producer whose routing is still the 2-shard one)
    and then under the new one, is written twice, once per shard: deduplication is per
    shard, not global. Repeats are then deduplicated where each producer routes them:
    on the new shard under the new layout (answered with the new entry), on the old
    shard under the old one. The worker handles the event once per shard."""
    app, probe = App("g"), Probe()
    app.stream("d", shards=2, dedup_window=60)
    app.handler("d")(probe.handle)
    [key] = keys_on(2, 3)  # moves: shard 2 of 3, some shard below 2 of 2
    before = jump_hash(key_hash(key), 2)
    async with streamworks_runtime(app, workers=1) as rt:
        stalled = Clock()
        old_routing = LeasedRouting(rt.coordinator, clock=stalled)
        assert (await old_routing.routing("d")).shard_count == 2
        old = create_producer(app, rt.settings, rt.redis, Scripts(rt.redis), old_routing)
        event = Record({"id": "ev-1"}, key=key, event_id="ev-1")

        first = await old.publish("d", event)
        assert first.shard == f"d/{before}@0" and not first.duplicate

        await rt.scale("d", 3)
        stalled.offset = -3600.0  # the old producer's routing still looks valid to it
        assert (await old.routing.routing("d")).shard_count == 2
        second = await app.publish("d", event.value, key=key, event_id="ev-1")
        assert second.shard == "d/2@1" and second.routing_version == 2
        assert not second.duplicate and second.entry_id  # not deduplicated across shards

        again = await app.publish("d", event.value, key=key, event_id="ev-1")
        assert again.duplicate and (again.shard, again.entry_id) == ("d/2@1", second.entry_id)
        stale = await old.publish("d", event)
        assert stale.duplicate and (stale.shard, stale.entry_id) == (first.shard, first.entry_id)

        for shard in (first.shard, second.shard):
            assert await rt.redis.xlen(rt.keyspace.stream(ShardId.parse(shard))) == 1
        await wait_for(lambda: len(probe.handled) == 2, 10, "both entries handled")
        await rt.wait_idle()
    assert sorted(probe.handled) == sorted(
        [("ev-1", first.shard, first.entry_id), ("ev-1", second.shard, second.entry_id)]
    )
