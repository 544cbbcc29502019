"""Scale-in after a Redis restart (docs/protocol.md#migrations, lag repair): a server of
our own with an AOF is restarted between the reads and the drain check.

Redis before 7.4 replays a group's reads from the AOF as ``XCLAIM … LASTID``, which
does not count them: after the reload the group sits at the last entry with
``entries-read`` back at its creation value, and ``lag`` stays above 0 for good. The
drain check repairs it (the group has delivered everything: pending 0 and
last-delivered-id equal to last-generated-id) and a later check retires the shard.
Servers that keep the counter (Valkey 8.1) retire at the first check.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from streamworks.coordinator import provision
from streamworks.coordinator.core.streams import new_stream
from streamworks.coordinator.lag_repair import ActiveLagRepair
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.provision import DrainStatus
from streamworks.coordinator.store import Store
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.settings import Settings
from streamworks.testing.embedded import EmbeddedRedis, find_server_binary

from .streams import add_entries, groups, read_group, shard

GROUPS = ("billing", "shipping")


def _binaries() -> list[Any]:
    out = [pytest.param(find_server_binary(), id="default")]
    redis_server = shutil.which("redis-server")
    if redis_server:
        out.append(pytest.param(redis_server, id="redis-server"))
    else:
        out.append(pytest.param("", id="redis-server", marks=pytest.mark.skip("not on PATH")))
    return out


@pytest.fixture(params=_binaries())
async def server(request: pytest.FixtureRequest) -> AsyncIterator[EmbeddedRedis]:
    embedded = EmbeddedRedis(binary=request.param, appendonly=True)
    await anyio.to_thread.run_sync(embedded.start)
    try:
        yield embedded
    finally:
        await anyio.to_thread.run_sync(embedded.stop)


def _lags_counter_on_reload(info: dict[str, Any]) -> bool:
    """Whether this server keeps `entries-read` across an AOF reload (Redis >= 7.4, or
    any Valkey)."""
    if info.get("valkey_version"):
        return True
    major, minor = (int(p) for p in str(info["redis_version"]).split(".")[:2])
    return (major, minor) >= (7, 4)


@pytest.mark.seed("E11")
async def test_a_drained_shard_is_retired_after_a_restart_that_lost_entries_read(
    server: EmbeddedRedis,
) -> None:
    settings = Settings(redis_url=server.url, key_prefix="restart")
    keyspace = Keyspace(settings.key_prefix)
    sid = shard("orders", 1)
    stream = keyspace.stream(sid)
    redis = create_redis(settings)
    try:
        scripts = Scripts(redis)
        keeps_counter = _lags_counter_on_reload(await redis.info("server"))
        await provision.create_shards(scripts, keyspace, [sid], list(GROUPS))
        await add_entries(redis, stream, 8)
        for g in GROUPS:
            ids = await read_group(redis, stream, g, "c", 100)
            await redis.xack(stream, g, *ids)
        trimmed = await scripts.trim(keys=[stream, keyspace.shard_groups(sid)], args=[""])
        assert trimmed == 8
        before = await groups(redis, stream)
        assert all(g["lag"] == 0 and g["entries-read"] == 8 for g in before.values())
        assert (
            await provision.drain_check(scripts, keyspace, sid, GROUPS, mode="check")
        ).status is (DrainStatus.DRAINED)

        await redis.aclose()
        await anyio.to_thread.run_sync(server.restart)
        redis = create_redis(settings)
        scripts = Scripts(redis)

        after = await groups(redis, stream)
        assert all(g["last-delivered-id"] == "8-0" and g["pending"] == 0 for g in after.values())
        if keeps_counter:
            assert all(g["lag"] == 0 for g in after.values()), after
            first = await provision.drain_check(scripts, keyspace, sid, GROUPS)
            assert first.status is DrainStatus.DRAINED, first
        else:
            # The reproduction: fully read, nothing pending, and yet lag is not 0.
            assert all(g["lag"] != 0 for g in after.values()), after
            first = await provision.drain_check(scripts, keyspace, sid, GROUPS)
            assert first.status is DrainStatus.REPAIRED, first
            assert all(f"group {g} lag" in first.reason for g in GROUPS), first.reason
            assert await redis.exists(stream) == 1  # not retired in the same call
            repaired = await groups(redis, stream)
            assert all(g["lag"] == 0 and g["entries-read"] == 8 for g in repaired.values())
            second = await provision.drain_check(scripts, keyspace, sid, GROUPS)
            assert second.status is DrainStatus.DRAINED, second
        assert await redis.exists(stream, keyspace.shard_groups(sid)) == 0
    finally:
        await redis.aclose()


async def test_repair_mode_fixes_the_lag_of_a_shard_that_stays(server: EmbeddedRedis) -> None:
    """An ACTIVE shard that lived through the restart: 'repair' makes its lag exact
    (for status and monitoring) and never deletes it."""
    settings = Settings(redis_url=server.url, key_prefix="restart")
    keyspace = Keyspace(settings.key_prefix)
    sid = shard("orders", 0)
    stream = keyspace.stream(sid)
    redis = create_redis(settings)
    try:
        scripts = Scripts(redis)
        keeps_counter = _lags_counter_on_reload(await redis.info("server"))
        await provision.create_shards(scripts, keyspace, [sid], list(GROUPS))
        await add_entries(redis, stream, 6)
        for g in GROUPS:
            ids = await read_group(redis, stream, g, "c", 100)
            await redis.xack(stream, g, *ids)
        await redis.aclose()
        await anyio.to_thread.run_sync(server.restart)
        redis = create_redis(settings)
        scripts = Scripts(redis)

        first = await provision.drain_check(scripts, keyspace, sid, GROUPS, mode="repair")
        expected = DrainStatus.DRAINED if keeps_counter else DrainStatus.REPAIRED
        assert first.status is expected, first
        assert all(g["lag"] == 0 for g in (await groups(redis, stream)).values())
        again = await provision.drain_check(scripts, keyspace, sid, GROUPS, mode="repair")
        assert again.status is DrainStatus.DRAINED, again
        assert await redis.exists(stream, keyspace.shard_groups(sid)) == 2
        await add_entries(redis, stream, 2, start=7)  # still a live shard: lag counts on
        assert all(g["lag"] == 2 for g in (await groups(redis, stream)).values())
    finally:
        await redis.aclose()


async def test_the_coordinators_pass_repairs_active_shards_read_to_the_end_only(
    server: EmbeddedRedis,
) -> None:
    """The coordinator's rate-limited pass over ACTIVE shards (``lag_repair.py``) after
    a real restart: the shard every group read to the end gets lag 0 (counted); the
    shard with an entry a group has not read keeps its lag (no proof: nothing
    written); a pass that is not due checks nothing."""
    settings = Settings(redis_url=server.url, key_prefix="restart")
    keyspace = Keyspace(settings.key_prefix)
    meta = new_stream("orders", 2, 1)
    read_all, unread = (ShardId.parse(s) for s in meta.shard_ids(meta.routable()))
    redis = create_redis(settings)
    try:
        keeps_counter = _lags_counter_on_reload(await redis.info("server"))
        store = Store(redis, keyspace)
        for g in GROUPS:
            await store.record_subscription("orders", g)
        await provision.create_shards(store.scripts, keyspace, [read_all, unread], list(GROUPS))
        for sid in (read_all, unread):
            await add_entries(redis, keyspace.stream(sid), 4)
        for g in GROUPS:
            ids = await read_group(redis, keyspace.stream(read_all), g, "c", 100)
            await redis.xack(keyspace.stream(read_all), g, *ids)
            # On the other shard every group reads 3 of the 4 entries.
            ids = await read_group(redis, keyspace.stream(unread), g, "c", 3)
            await redis.xack(keyspace.stream(unread), g, *ids)
        await redis.aclose()
        await anyio.to_thread.run_sync(server.restart)
        redis = create_redis(settings)
        store = Store(redis, keyspace)
        metrics = CoordinatorMetrics()
        lags = {
            sid: {g["name"]: g["lag"] for g in (await groups(redis, keyspace.stream(sid))).values()}
            for sid in (read_all, unread)
        }
        if not keeps_counter:  # the reproduction on Redis < 7.4
            assert all(lag != 0 for lag in lags[read_all].values()), lags

        repair = ActiveLagRepair(store, keyspace, metrics, interval=60)
        repaired = await repair.maybe_repair("orders", meta)

        assert repaired == (0 if keeps_counter else 1)
        # Where the counter survives a reload the pass does not even read the shards.
        assert repair.passes == (0 if keeps_counter else 1)
        after = {
            sid: {g["name"]: g["lag"] for g in (await groups(redis, keyspace.stream(sid))).values()}
            for sid in (read_all, unread)
        }
        assert all(lag == 0 for lag in after[read_all].values()), after
        assert after[unread] == lags[unread], "no proof on the unread shard: nothing written"
        if keeps_counter:
            assert all(lag == 1 for lag in after[unread].values()), after
        value = metrics.registry.get_sample_value(
            "streamworks_drain_repairs_total", {"stream": "orders"}
        )
        assert (value or 0.0) == repaired
        # Rate-limited: the next pass within the interval checks nothing, even when a
        # lag is wrong again; nor does another replica's while the first one's turn
        # lasts (one pass per stream per interval, however many replicas).
        await redis.execute_command(
            "XGROUP", "SETID", keyspace.stream(read_all), GROUPS[0], "4-0", "ENTRIESREAD", 0
        )
        assert await repair.maybe_repair("orders", meta) == 0
        other = ActiveLagRepair(store, keyspace, metrics, needed=True)
        assert await other.maybe_repair("orders", meta) == (1 if keeps_counter else 0)
        if not keeps_counter:
            assert (await groups(redis, keyspace.stream(read_all)))[GROUPS[0]]["lag"] == 4
            await redis.delete(keyspace.lag_repair_turn("orders"))  # the turn ran out
            third = ActiveLagRepair(store, keyspace, metrics)
            assert await third.maybe_repair("orders", meta) == 1
        assert (await groups(redis, keyspace.stream(read_all)))[GROUPS[0]]["lag"] == 0
    finally:
        await redis.aclose()


async def _commands(redis: Any) -> dict[str, int]:
    """``INFO commandstats``: calls per command (``cmdstat_xinfo|groups`` as
    ``xinfo|groups``), on the test's own server."""
    stats = await redis.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def test_a_repair_pass_costs_nothing_where_the_counter_survives_and_one_read_elsewhere(
    server: EmbeddedRedis,
) -> None:
    """The cost of the ACTIVE lag repair, counted by the server (``INFO commandstats``)
    over 20 passes on 16 shards of 2 groups read to the end: on a server that keeps
    ``entries-read`` (Valkey 8.x, Redis >= 7.4) one ``HELLO``, nothing else; on one
    that loses it, one turn (``SET NX``) and one pipelined read of the shards' groups
    per pass, and the repair script only on a shard whose lag is wrong (here: one)."""
    settings = Settings(redis_url=server.url, key_prefix="cost")
    keyspace = Keyspace(settings.key_prefix)
    meta = new_stream("orders", 16, 1)
    shards = [ShardId.parse(s) for s in meta.shard_ids(meta.routable())]
    redis = create_redis(settings)
    try:
        keeps_counter = _lags_counter_on_reload(await redis.info("server"))
        store = Store(redis, keyspace)
        for g in GROUPS:
            await store.record_subscription("orders", g)
        await provision.create_shards(store.scripts, keyspace, shards, list(GROUPS))
        for sid in shards:
            await add_entries(redis, keyspace.stream(sid), 3)
            for g in GROUPS:
                ids = await read_group(redis, keyspace.stream(sid), g, "c", 100)
                await redis.xack(keyspace.stream(sid), g, *ids)
        broken = keyspace.stream(shards[5])
        await redis.execute_command("XGROUP", "SETID", broken, GROUPS[0], "3-0", "ENTRIESREAD", 0)
        repair = ActiveLagRepair(store, keyspace, CoordinatorMetrics(), interval=0)
        before = await _commands(redis)
        repaired = 0
        for _ in range(20):
            await redis.delete(keyspace.lag_repair_turn("orders"))  # as if 5 s passed
            repaired += await repair.maybe_repair("orders", meta)
        after = await _commands(redis)
        spent = {c: n - before.get(c, 0) for c, n in after.items() if n != before.get(c, 0)}
        spent.pop("info", None)  # this test's own INFO
        deletes = spent.pop("del")
        assert deletes == 20
        if keeps_counter:
            assert spent == {"hello": 1}, spent
            assert repaired == 0
        else:
            assert repaired == 1  # the broken shard, in the first pass; then exact
            # (a first EVALSHA may be refused NOSCRIPT on this fresh server: reloaded)
            assert spent["evalsha"] - spent.get("script|load", 0) == 1, spent
            assert spent["xgroup|setid"] == 1, spent
            assert spent["set"] == 20 and spent["hello"] == 1, spent
            # XLEN: one per shard and pass, and in the repair script the two groups'
            # redelivery streams and the shard's delayed set (retire.lua: must be empty).
            assert spent["xinfo|groups"] == 20 * 16 + 1 and spent["xlen"] == 20 * 16 + 3, spent
    finally:
        await redis.aclose()
