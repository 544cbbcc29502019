"""Publishing: entry format, pipelines, NOMKSTREAM re-routing (E16), shard-level dedup
(E18), sync publishing, and errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest

from streamworks import App, Published, Record
from streamworks.exceptions import NotConnectedError, ShardRetiredError
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.runtime.routing import RoutingTable, ShardRoute
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings


def orders_app(shards: int = 4, **stream: Any) -> App:
    app = App("g")
    app.stream("orders", shards=shards, **stream)
    return app


async def test_publish_writes_the_documented_entry_format(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = orders_app()
    async with streamworks_runtime(app, workers=0) as rt:
        p = await app.publish(
            "orders", {"a": 1}, key="cust-1", event_id="ev-1", headers={"trace": "t1"}
        )
        assert isinstance(p, Published)
        assert p.stream == "orders" and p.routing_version == 1 and not p.duplicate
        shard = ShardId.parse(p.shard)
        [(entry_id, fields)] = await rt.redis.xrange(rt.keyspace.stream(shard))
        assert entry_id.decode() == p.entry_id
        assert fields[b"v"] == b'{"a":1}'
        assert fields[b"k"] == b"cust-1" and fields[b"e"] == b"ev-1"
        assert fields[b"h"] == b'{"trace":"t1"}' and fields[b"f"] == b"1"
        assert int(fields[b"t"]) > 1_600_000_000_000


@pytest.mark.cluster
async def test_publish_many_keeps_order_and_routes_like_publish(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = orders_app(8)
    async with streamworks_runtime(app, workers=0):
        records = [Record({"n": i}, key=f"k{i % 13}") for i in range(300)]
        many = await app.publish_many("orders", records)
        single = [await app.publish("orders", r.value, key=r.key) for r in records[:13]]
        assert len(many) == 300
        assert [p.shard for p in many[:13]] == [p.shard for p in single]
        by_shard: dict[str, list[str]] = {}
        for p in many:
            by_shard.setdefault(p.shard, []).append(p.entry_id)
        assert all(
            ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
            for ids in by_shard.values()
        )


class SwitchingRouting:
    """Routing that first points at a retired shard, and at live ones after invalidate."""

    def __init__(self, keyspace: Keyspace, stale: Sequence[ShardId], fresh: Sequence[ShardId]):
        self.tables = [
            RoutingTable("orders", 1, [ShardRoute(s, keyspace.stream(s)) for s in stale]),
            RoutingTable("orders", 2, [ShardRoute(s, keyspace.stream(s)) for s in fresh]),
        ]
        self.invalidated: list[int] = []

    async def routing(self, stream: str) -> RoutingTable:
        return self.tables[min(len(self.invalidated), 1)]

    def invalidate(self, stream: str, version: int) -> None:
        self.invalidated.append(version)


@pytest.mark.seed("E16")
async def test_stale_routing_to_a_retired_shard_refreshes_and_republishes(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = orders_app(2)
    async with streamworks_runtime(app, workers=0) as rt:
        retired = ShardId("orders", 1)
        await rt.redis.delete(rt.keyspace.stream(retired))  # retired by a scale-in
        routing = SwitchingRouting(rt.keyspace, [retired], [ShardId("orders", 0)])
        rt.connection.producer.routing = routing  # type: ignore[union-attr]
        p = await app.publish("orders", {"n": 1}, key="x")
        assert routing.invalidated == [1]
        assert p.shard == "orders/0@0" and p.routing_version == 2
        assert not await rt.redis.exists(rt.keyspace.stream(retired))  # never re-created
        routing.invalidated.clear()
        many = await app.publish_many("orders", [Record({"n": i}) for i in range(10)])
        assert {m.shard for m in many} == {"orders/0@0"}
        assert not await rt.redis.exists(rt.keyspace.stream(retired))


@pytest.mark.seed("E16")
async def test_routing_that_keeps_pointing_at_retired_shards_fails_clearly(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = orders_app(1)
    async with streamworks_runtime(app, workers=0) as rt:
        await rt.redis.delete(rt.keyspace.stream(ShardId("orders", 0)))
        with pytest.raises(ShardRetiredError, match="retired shards"):
            await app.publish("orders", {"n": 1})
        assert not await rt.redis.exists(rt.keyspace.stream(ShardId("orders", 0)))


@pytest.mark.cluster
@pytest.mark.seed("E18")
async def test_shard_level_dedup_skips_a_repeated_event_id_even_after_retirement(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = orders_app(2, dedup_window=60)
    async with streamworks_runtime(app, workers=0) as rt:
        first = await app.publish("orders", {"n": 1}, key="k", event_id="ev-1")
        again = await app.publish("orders", {"n": 1}, key="k", event_id="ev-1")
        assert not first.duplicate and again.duplicate
        assert again.entry_id == first.entry_id and again.shard == first.shard
        shard = ShardId.parse(first.shard)
        assert await rt.redis.xlen(rt.keyspace.stream(shard)) == 1
        many = await app.publish_many("orders", [Record({"n": 1}, key="k", event_id="ev-1")] * 3)
        assert all(m.duplicate for m in many)
        # The shard is retired; a stale producer retrying the same event is answered
        # from the dedup record, and the key is not resurrected.
        await rt.redis.delete(rt.keyspace.stream(shard))
        late = await app.publish("orders", {"n": 1}, key="k", event_id="ev-1")
        assert late.duplicate and late.entry_id == first.entry_id
        assert not await rt.redis.exists(rt.keyspace.stream(shard))


@pytest.mark.seed("E18")
async def test_the_dedup_record_lives_for_the_window_or_the_operators_setting(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """A dedup record expires with the stream's ``dedup_window``; ``producer.dedup_ttl``
    overrides it for every stream with dedup on (and turns it on for none)."""
    for override, expected in ((None, 60_000), (5.0, 5_000)):
        app = orders_app(2, dedup_window=60)
        app.stream("plain", shards=1)
        settings = fast_settings()
        settings = settings.model_copy(
            update={"producer": settings.producer.model_copy(update={"dedup_ttl": override})}
        )
        async with streamworks_runtime(app, workers=0, settings=settings) as rt:
            first = await app.publish("orders", {"n": 1}, key="k", event_id="ev-1")
            record = rt.keyspace.dedup(ShardId.parse(first.shard), "ev-1")
            ttl = await rt.redis.pttl(record)
            assert expected - 2_000 < ttl <= expected, (override, ttl)
            plain = await app.publish("plain", {"n": 1}, event_id="ev-1")
            again = await app.publish("plain", {"n": 1}, event_id="ev-1")
            assert not plain.duplicate and not again.duplicate  # no dedup declared: none
            assert not await rt.redis.exists(rt.keyspace.dedup(ShardId.parse(plain.shard), "ev-1"))


@pytest.mark.seed("E18")
async def test_no_global_dedup_across_layouts(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """The documented limit: after resharding, the same event id may land on another
    shard and is written again (shard-level dedup only)."""
    app = orders_app(2, dedup_window=60)
    async with streamworks_runtime(app, workers=0) as rt:
        await app.publish("orders", {"n": 1}, key="k", event_id="ev-7")
        table = await rt.connection.routing.routing("orders")  # type: ignore[union-attr]
        old = table.route("k").shard
        other = ShardId("orders", 1 - old.index)
        rt.connection.producer.routing = SwitchingRouting(rt.keyspace, [other], [other])  # type: ignore[union-attr]
        p = await app.publish("orders", {"n": 1}, key="k", event_id="ev-7")
        assert not p.duplicate and p.shard == str(other)


async def test_publish_sync_from_synchronous_code(streamworks_redis_url: str) -> None:
    app = orders_app(2)
    async with TestRuntime(
        app, workers=0, redis_url=streamworks_redis_url, attach=False, http=True
    ) as rt:
        assert rt.http_url is not None
        # The app connects by itself, to the runtime's Redis and (real HTTP) coordinator.
        app._settings = rt.settings.with_overrides(coordinator_urls=[rt.http_url])

        def view() -> tuple[Published, list[Published]]:
            # A Django/Flask view: no event loop of its own.
            one = app.publish_sync("orders", {"n": 1}, key="a")
            with app.connect_sync() as conn:
                more = [conn.publish("orders", {"n": i}, key="b") for i in range(3)]
                assert app.publish_sync("orders", {"n": 9}).stream == "orders"
            return one, more

        one, more = await anyio.to_thread.run_sync(view)
        assert one.stream == "orders" and len(more) == 3
        total = sum([await rt.redis.xlen(k) for k in await rt.shard_keys("orders")])
        assert total == 5


async def test_publishing_without_a_connection_says_how_to_connect() -> None:
    app = orders_app()
    with pytest.raises(NotConnectedError, match=r"app\.connect"):
        await app.publish("orders", {"n": 1})


async def test_unencodable_values_are_refused_before_anything_is_written(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = orders_app(1)
    async with streamworks_runtime(app, workers=0) as rt:
        with pytest.raises(TypeError, match="JSON"):
            await app.publish("orders", object())
        assert await rt.redis.xlen(rt.keyspace.stream(ShardId("orders", 0))) == 0
