"""What a removed shard must prove before it is retired, in-process (real coordinator
service, real workers, real Redis; ``TestRuntime`` with a 2 s routing lease).

* with no live member the migration still leaves FENCING when the routing fence
  passes and waits in DRAINING until a worker started later drains it (E9, E10, E14);
* with every member gone before the scale-in, drained shards are retired on Redis
  evidence alone, and a late entry on a removed shard keeps it DRAINING with its
  reason while nobody runs (E10);
* ``lag == nil`` is not proven drained (E12), and the two documented operator
  remedies (read to the end; ``XGROUP SETID … ENTRIESREAD``) let it complete;
* every consumer group on the shard must have drained it (E11).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from streamworks import App, Record
from streamworks.clock import Clock
from streamworks.exceptions import NoShardsError
from streamworks.protocol.shards import ShardId
from streamworks.redis.scripts import Scripts
from streamworks.runtime.connection import create_producer
from streamworks.runtime.leased_routing import LeasedRouting
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from tests.resharding.helpers import (
    blocked,
    draining,
    fence_of,
    keys_on,
    phase,
    probe_app,
    redis_now_ms,
    retired,
    wait_for,
)


async def publish_to(app: App, stream: str, index: int, count: int, ids: list[str]) -> list[str]:
    """Publish ``ids`` keyed onto shard ``index`` of ``count``; the shards they went to."""
    [key] = keys_on(index, count)
    return [(await app.publish(stream, {"id": i}, key=key)).shard for i in ids]


async def live_members(rt: TestRuntime) -> list[str]:
    assert rt.service is not None
    group = await rt.service.group_info(rt.app.name)
    return [m.member_id for m in group.members if m.state not in ("EXPIRED", "FENCED")]


@pytest.mark.seed("E9")
@pytest.mark.seed("E10")
@pytest.mark.seed("E14")
async def test_scale_in_whose_only_member_dies_waits_in_draining_until_a_worker_drains(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """10 -> 1 and 4 -> 0 while the group's only member holds every message in flight;
    it then crashes and expires, so nobody heartbeats. Both migrations still leave
    FENCING when the routing fence passes and wait in DRAINING with a reason per
    removed shard (its pending entries); routing of the 0-shard stream is empty at once
    and publishing to it raises NoShardsError. A worker started later takes the pending
    entries over where they are (nothing moved) and both migrations complete."""
    app, probe = probe_app("g", {"a": 10, "b": 4}, concurrency=64, ordering="none")
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        held = anyio.Event()
        for shard in [f"a/{i}@0" for i in range(10)] + [f"b/{i}@0" for i in range(4)]:
            probe.gates[shard] = held
        sent: dict[str, str] = {}
        for i in range(10):
            ids = [f"a{i}-{n}" for n in range(3)]
            sent.update(zip(ids, await publish_to(app, "a", i, 10, ids), strict=True))
        for i in range(4):
            ids = [f"b{i}-{n}" for n in range(3)]
            sent.update(zip(ids, await publish_to(app, "b", i, 4, ids), strict=True))
        assert set(sent.values()) == set(probe.gates)
        await wait_for(lambda: probe.started == len(sent), 10, "every message in a handler")

        a = await service.scale_stream("a", 1)
        b = await service.scale_stream("b", 0)
        assert len(await live_members(rt)) == 1
        assert (a.shard_count, b.shard_count) == (1, 0)
        assert phase(a) == phase(b) == "FENCING"
        removed = {"a": [f"a/{i}@0" for i in range(1, 10)], "b": [f"b/{i}@0" for i in range(4)]}
        assert draining(a) == sorted(removed["a"]) and draining(b) == sorted(removed["b"])
        routing = await service.routing("b")
        assert routing.model_dump(by_alias=True)["shardCount"] == 0  # E14, at once
        assert routing.shards == []
        assert (await service.routing("a")).shard_count == 1
        fence = max(fence_of(x) for x in (a, b))

        # The only member crashes with everything in flight and expires (E10).
        await rt.kill_worker(0)
        await wait_for(lambda: _none(live_members(rt)), 10, "the crashed member to expire")
        expired_at = await redis_now_ms(rt.redis)

        # Nobody heartbeats, yet each removed shard is checked once the fence passed.
        async def checked() -> Any:
            infos = [await service.stream_info(n) for n in ("a", "b")]
            if all(set(blocked(i)) == set(removed[i.name]) for i in infos):
                return infos
            return None

        infos = await wait_for(checked, 10, "every removed shard checked after the fence")
        assert await redis_now_ms(rt.redis) >= fence
        assert await live_members(rt) == []
        for info in infos:
            assert phase(info) == "DRAINING" and draining(info) == sorted(removed[info.name])
            assert set(blocked(info).values()) == {"group g has 3 pending"}, blocked(info)
        # The routing lease ran out before the fence: every producer sees 0 shards.
        with pytest.raises(NoShardsError):
            await app.publish("b", {"id": "late"}, key="k")
        assert await rt.redis.exists(*rt_keys(rt, [*removed["a"], *removed["b"]])) == 13

        held.set()
        await rt.add_worker(wait=False)

        async def complete() -> Any:
            infos = [await service.stream_info(n) for n in ("a", "b")]
            return infos if all(not draining(i) and phase(i) == "NONE" for i in infos) else None

        a, b = await wait_for(complete, 15, "both migrations to complete")
        assert [s.shard for s in a.shards] == ["a/0@0"] and b.shards == []
        assert await rt.redis.exists(*rt_keys(rt, [*removed["a"], *removed["b"]])) == 0
        assert (await service.routing("b")).shard_count == 0
        with pytest.raises(NoShardsError):
            await app.publish("b", {"id": "after"}, key="k")
    # Drained where they were: nothing moved between shards, nothing lost.
    assert probe.shard_of() == sent
    assert len(probe.handled) == len(sent)
    print(f"member expired {fence - expired_at} ms before the routing fence")


@pytest.mark.seed("E10")
async def test_with_every_member_gone_before_the_fence_evidence_alone_retires_shards(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """Every message of streams ``a`` (3 shards) and ``b`` (2) is handled and acked;
    the group's only worker then leaves, so nobody runs from before either scale-in
    (3 -> 1, 2 -> 1) to the end. A producer still holding the 2-shard routing of ``b``
    writes one late entry to removed shard b/1 before the routing fence. ``a``'s removed
    shards show pending 0 and lag 0: the migration completes on that evidence alone.
    ``b/1`` stays DRAINING with its reason ("group g lag 1") however often it is
    checked while nobody runs; a worker started later handles the late entry where it
    is, and ``b``'s migration completes."""
    app, probe = probe_app("g", {"a": 3, "b": 2})
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        sent: dict[str, str] = {}
        for stream, count in (("a", 3), ("b", 2)):
            for i in range(count):
                ids = [f"{stream}{i}-{n}" for n in range(3)]
                sent.update(zip(ids, await publish_to(app, stream, i, count, ids), strict=True))
        await wait_for(lambda: probe.ids() == set(sent), 10, "every message handled")
        stale = LeasedRouting(rt.coordinator, clock=Clock())
        assert (await stale.routing("b")).shard_count == 2
        late_producer = create_producer(app, rt.settings, rt.redis, Scripts(rt.redis), stale)
        await rt.stop_worker(0)
        assert await live_members(rt) == []
        removed = {"a": ["a/1@0", "a/2@0"], "b": ["b/1@0"]}
        keys = {n: rt_keys(rt, shards) for n, shards in removed.items()}

        async def acked_everywhere() -> bool:
            for key in [*keys["a"], *keys["b"]]:
                [group] = await rt.redis.xinfo_groups(key)
                if (group["pending"], group["lag"]) != (0, 0):
                    return False
            return True

        await wait_for(acked_everywhere, 10, "pending 0 and lag 0 on every removed shard")

        seen_live: list[list[str]] = []

        def nobody(check: Callable[[], Any]) -> Callable[[], Any]:
            """``check``, after recording any live member (there must never be one)."""

            async def probe_() -> Any:
                members = await live_members(rt)
                if members:
                    seen_live.append(members)
                return await check()

            return probe_

        a = await service.scale_stream("a", 1)
        b = await service.scale_stream("b", 1)
        assert phase(a) == phase(b) == "FENCING"
        [key] = keys_on(1, 2)
        late = await late_producer.publish("b", Record({"id": "late"}, key=key))
        assert late.shard == "b/1@0" and late.routing_version == 1
        assert await redis_now_ms(rt.redis) < fence_of(b)  # written before the fence

        async def a_complete() -> Any:
            info = await service.stream_info("a")
            return info if phase(info) == "NONE" and not draining(info) else None

        async def b_refused() -> Any:
            info = await service.stream_info("b")
            return info if blocked(info) else None

        info = await wait_for(nobody(a_complete), 15, "a's migration to complete")
        assert [s.shard for s in info.shards] == ["a/0@0"]
        assert retired(info) == removed["a"]
        assert await rt.redis.exists(*keys["a"]) == 0
        info = await wait_for(nobody(b_refused), 10, "the drain check of b/1")
        assert phase(info) == "DRAINING" and draining(info) == removed["b"]
        assert blocked(info) == {"b/1@0": "group g lag 1"}
        for _ in range(3):  # checked again and again while nobody runs: still refused
            await service.tick_streams()
        info = await nobody(lambda: service.stream_info("b"))()
        assert blocked(info) == {"b/1@0": "group g lag 1"} and phase(info) == "DRAINING"
        assert await rt.redis.exists(*keys["b"]) == 1
        assert "late" not in probe.ids()
        assert seen_live == [] and await live_members(rt) == []

        await rt.add_worker(wait=False)

        async def b_complete() -> Any:
            info = await service.stream_info("b")
            return info if phase(info) == "NONE" and not draining(info) else None

        info = await wait_for(b_complete, 15, "b's migration to complete")
        assert [s.shard for s in info.shards] == ["b/0@0"]
        assert await rt.redis.exists(*keys["b"]) == 0
    assert probe.shard_of() == {**sent, "late": "b/1@0"}
    assert len(probe.handled) == len(sent) + 1


@pytest.mark.seed("E12")
async def test_nil_lag_keeps_the_shard_draining_until_the_operator_remedy(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """An XDEL behind the runtime's back makes a removed shard's lag nil: the
    migration stays DRAINING ("lag unknown (nil)", status shows lag None) however often
    it is checked. The remedies of docs/resharding.md: a worker reading the shard to its
    end (possible when entries follow the deleted one) retires shard 1; on shard 2
    nothing follows the deleted entry, so reading cannot help and the shard stays
    DRAINING until ``XGROUP SETID <key> <group> $ ENTRIESREAD <entries-added>``."""
    app, probe = probe_app("g", {"s": 3})
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        one, two = (rt.keyspace.stream(ShardId("s", i, 0)) for i in (1, 2))
        await publish_to(app, "s", 2, 3, ["e0"])  # consumed by the group on shard 2
        await wait_for(lambda: probe.ids() == {"e0"}, 10, "e0 handled")
        await rt.stop_worker(0)
        await wait_for(lambda: _none(live_members(rt)), 10, "the member to leave")
        await publish_to(app, "s", 1, 3, ["a0", "a1", "a2"])
        await publish_to(app, "s", 2, 3, ["b1"])
        await service.scale_stream("s", 1)
        # The test, not the runtime, deletes undelivered entries ahead of the group.
        entries = {k: [e.decode() for e, _ in await rt.redis.xrange(k)] for k in (one, two)}
        await rt.redis.xdel(one, entries[one][1])
        await rt.redis.xdel(two, entries[two][1])
        for key in (one, two):
            [group] = await rt.redis.xinfo_groups(key)
            assert group["lag"] is None and group["pending"] == 0

        async def nil_reported() -> Any:
            info = await service.stream_info("s")
            reasons = blocked(info)
            return info if len(reasons) == 2 and phase(info) == "DRAINING" else None

        info = await wait_for(nil_reported, 10, "the drain check to refuse both shards")
        assert blocked(info) == {
            "s/1@0": "group g lag unknown (nil)",
            "s/2@0": "group g lag unknown (nil)",
        }
        for _ in range(3):  # checked again and again: never guessed drained
            await service.tick_streams()
        status = await service.status()
        [stream] = [s for s in status.streams if s.name == "s"]
        assert phase(stream) == "DRAINING"
        by_shard = {s.shard: s for s in stream.shards}
        for shard in ("s/1@0", "s/2@0"):
            assert by_shard[shard].state == "DRAINING"
            assert [(g.group, g.pending, g.lag) for g in by_shard[shard].groups] == [("g", 0, None)]
        assert await rt.redis.exists(one, two) == 2

        # Remedy 1: a worker reads shard 1 past the deleted entry; its lag is known again.
        await rt.add_worker(wait=False)

        async def one_retired() -> Any:
            info = await service.stream_info("s")
            return info if draining(info) == ["s/2@0"] else None

        await wait_for(one_retired, 10, "shard 1 retired after being read to its end")
        assert probe.ids() == {"e0", "a0", "a2"}
        assert not await rt.redis.exists(one)
        # Shard 2: the worker owns it and has read everything there is; lag stays nil.
        two_id = ShardId("s", 2, 0)
        await wait_for(lambda: any(two_id in w.readers for w in rt.workers), 5, "shard 2 read")
        for _ in range(3):
            await service.tick_streams()
        info = await service.stream_info("s")
        assert draining(info) == ["s/2@0"]
        assert blocked(info) == {"s/2@0": "group g lag unknown (nil)"}

        # Remedy 2: the operator, knowing the group consumed everything, resets it.
        added = (await rt.redis.xinfo_stream(two))["entries-added"]
        await rt.redis.xgroup_setid(two, "g", "$", entries_read=added)

        async def complete() -> Any:
            info = await service.stream_info("s")
            return info if not draining(info) and phase(info) == "NONE" else None

        info = await wait_for(complete, 10, "the migration to complete")
        assert [s.shard for s in info.shards] == ["s/0@0"]
        assert not await rt.redis.exists(two)
    assert sorted(probe.ids()) == ["a0", "a2", "e0"]  # a1 and b1 were deleted by the test


@pytest.mark.seed("E11")
async def test_retirement_waits_for_every_consumer_group(
    settings: Settings, redis: Any, streamworks_redis_url: str
) -> None:
    """Two groups on one stream: group ``ga`` drains removed shard 1 while group
    ``gb``'s only worker is stopped. The shard stays DRAINING ("group gb lag N") however
    often it is checked, although ``ga`` shows pending 0 and lag 0 on it; starting a
    ``gb`` worker drains it and the migration completes. Both groups handle every
    message exactly where it was published."""
    url = streamworks_redis_url
    app_a, probe_a = probe_app("ga", {"s": 2})
    app_b, probe_b = probe_app("gb", {"s": 2})
    async with (
        TestRuntime(app_a, workers=1, redis_url=url, key_prefix=settings.key_prefix) as rt_a,
        TestRuntime(app_b, workers=1, redis_url=url, key_prefix=settings.key_prefix) as rt_b,
    ):
        service_a, service_b = rt_a.service, rt_b.service
        assert service_a is not None and service_b is not None
        await rt_b.stop_worker(0)
        ids = [f"m{n}" for n in range(20)]
        shards = await publish_to(app_a, "s", 1, 2, ids[:15]) + await publish_to(
            app_a, "s", 0, 2, ids[15:]
        )
        await wait_for(lambda: probe_a.ids() == set(ids), 10, "group ga to handle everything")
        key = rt_a.keyspace.stream(ShardId("s", 1, 0))

        async def ga_done() -> bool:
            groups = {g["name"]: g for g in await redis.xinfo_groups(key)}
            return bool(groups[b"ga"]["pending"] == 0 and groups[b"ga"]["lag"] == 0)

        await wait_for(ga_done, 10, "group ga's acks on shard 1")
        await service_a.scale_stream("s", 1)

        async def refused() -> Any:
            info = await service_a.stream_info("s")
            return info if phase(info) == "DRAINING" and blocked(info) else None

        info = await wait_for(refused, 10, "the drain check of shard 1")
        assert blocked(info) == {"s/1@0": "group gb lag 15"}
        for _ in range(3):
            await service_a.tick_streams()
            await service_b.tick_streams()
        groups = {g["name"].decode(): g for g in await redis.xinfo_groups(key)}
        assert (groups["ga"]["pending"], groups["ga"]["lag"]) == (0, 0)
        assert (groups["gb"]["pending"], groups["gb"]["lag"]) == (0, 15)
        assert draining(await service_a.stream_info("s")) == ["s/1@0"]
        assert await redis.exists(key)

        await rt_b.add_worker(wait=False)

        async def complete() -> Any:
            info = await service_a.stream_info("s")
            return info if not draining(info) and phase(info) == "NONE" else None

        await wait_for(complete, 10, "the migration to complete")
        assert not await redis.exists(key)
    expected = dict(zip(ids, shards, strict=True))
    assert probe_a.shard_of() == probe_b.shard_of() == expected
    assert len(probe_a.handled) == len(probe_b.handled) == len(ids)


def rt_keys(rt: TestRuntime, shards: list[str]) -> list[str]:
    return [rt.keyspace.stream(ShardId.parse(s)) for s in shards]


async def _none(items: Any) -> bool:
    return not await items
