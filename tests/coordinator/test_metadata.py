"""Redis is the only source of truth: lost writes are corrected from Redis (E19),
member reports never become metadata (E20), and lost or corrupt metadata fails closed
until an operator re-initialises it (E21)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from streamworks import App
from streamworks.clock import Clock
from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import HeartbeatStatus, ReinitializeRequest
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.runtime.message import Context
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import (
    SimMember,
    beat,
    expect_error,
    open_service,
    serve_api,
    settle,
)
from tests.support import wait_for


async def fences(redis: Any, keyspace: Keyspace, shards: list[str]) -> dict[str, str]:
    out = {}
    for shard in shards:
        value = await redis.get(keyspace.fence(ShardId.parse(shard), "g"))
        out[shard] = value.decode() if value else ""
    return out


SHARDS = [f"orders/{i}@0" for i in range(4)]


# -- E19 -------------------------------------------------------------------------------------


def issued_tokens(members: list[SimMember]) -> set[int]:
    """Every fence token the members were ever granted."""
    return {g.epoch for m in members for r in m.responses for g in r.assigned}


async def group_keys(redis: Any, keyspace: Keyspace) -> dict[str, Any]:
    """The group's control keys as Redis holds them (``DUMP``)."""
    keys = [
        keyspace.group_meta("g"),
        keyspace.group_leases("g"),
        keyspace.group_sequences("g"),
        keyspace.group_changes("g"),
    ]
    return {k: await redis.dump(k) for k in keys}


@pytest.mark.seed("E19")
async def test_a_member_ahead_of_redis_is_told_to_sync_and_new_tokens_exceed_old_ones(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    """Issue 18, finding 4b: SYNC_METADATA carries no grants and renews no lease; the
    member drops everything and rejoins, and gets its shards back only as fresh
    grants, under tokens above every token anyone saw before the loss."""
    clock = Clock()
    configured = fast_settings(settings)
    async with open_service(configured, clock=clock) as service:
        await service.create_stream("orders", 4)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        await settle([m1], service)
        recorded = m1.version
        snapshot = await redis.dump(keyspace.group_meta("g"))
        await settle([m1, m2], service)
        assert m1.version > recorded
        before_loss = issued_tokens([m1, m2])

        # Redis loses the writes since the snapshot (a failover to a stale replica).
        await redis.restore(keyspace.group_meta("g"), 0, snapshot, replace=True)
        untouched = await group_keys(redis, keyspace)
        response = await service.heartbeat("g", m1.request())
        assert response.status is HeartbeatStatus.SYNC_METADATA
        assert response.assigned == [] and response.member_epoch == 0
        assert response.metadata_version == recorded
        assert await group_keys(redis, keyspace) == untouched  # nothing written
        m1.apply(response)  # it drops everything and rejoins
        # m2 joined after the snapshot: Redis does not know it; it rejoins.
        assert (await m2.heartbeat(service, "g")).status is HeartbeatStatus.UNKNOWN_MEMBER
        settled_from = len(m1.responses), len(m2.responses)
        await m1.heartbeat(service, "g")
        await m2.heartbeat(service, "g")
        # The fences of m2's lost grants refuse the new grants: their shards stay out of
        # reach for a lease TTL (m2 may still have been running them).
        await tick(service, clock, configured.lease_ttl + 0.1)
        await settle([m1, m2], service)

        # Every grant after the loss is above every token issued before it.
        for member, start in zip((m1, m2), settled_from, strict=True):
            for r in member.responses[start:]:
                assert all(g.epoch > max(before_loss) for g in r.assigned)
        owners = {g.shard: f"{g.epoch}:{m.member_id}" for m in (m1, m2) for g in m.last.assigned}
        assert await fences(redis, keyspace, SHARDS) == owners


async def tick(service: CoordinatorService, clock: Clock, seconds: float) -> None:
    clock.advance(seconds)
    await service.tick_group("g")


@pytest.mark.seed("E19")
async def test_a_grant_refused_by_a_lost_grants_fence_fences_and_quarantines(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    """Issue 18, finding 4c: a grant refused by a fence the metadata never recorded
    fences the member with its shards quarantined (as at a revocation timeout), and
    the refused shards stay out of reach for a lease TTL, even after the member
    rejoins; then they are granted under tokens above the fences'."""
    clock = Clock()
    configured = fast_settings(settings)
    async with open_service(configured, clock=clock) as service:
        await service.create_stream("orders", 4)
        m1 = SimMember("m1", ["orders"])
        await settle([m1], service)
        snapshot = await redis.dump(keyspace.group_meta("g"))
        # Churn: members come and go, grants and fences reach higher tokens.
        churn = [SimMember(f"c{i}", ["orders"]) for i in range(3)]
        for member in churn:
            await settle([m1, member], service)
            await service.heartbeat("g", beat(member.member_id, -1))
        highest = max(
            int(v.split(":")[0]) for v in (await fences(redis, keyspace, SHARDS)).values()
        )

        # Redis loses all of it, and no member that saw it is left to report anything.
        await redis.restore(keyspace.group_meta("g"), 0, snapshot, replace=True)
        await tick(service, clock, configured.lease_ttl + 0.1)  # m1 is gone too
        newcomer = SimMember("n1", ["orders"])
        refused = await newcomer.heartbeat(service, "g")
        assert refused.status is HeartbeatStatus.FENCED
        info = await service.group_info("g")
        lost = [m for m in info.members if m.member_id.startswith("~lost:")]
        assert lost and all(m.state == "FENCED" for m in lost)
        # It rejoins at once (no runs): the shards whose fences name lost grants stay
        # pending for a lease TTL.
        await newcomer.heartbeat(service, "g")
        for _ in range(3):
            r = await newcomer.heartbeat(service, "g")
            assert r.status is HeartbeatStatus.OK and r.pending
        await tick(service, clock, configured.lease_ttl + 0.1)
        await settle([newcomer], service)
        assert all(g.epoch > highest for g in newcomer.last.assigned)
        assert {g.shard for g in newcomer.last.assigned} == set(SHARDS)
        assert await fences(redis, keyspace, SHARDS) == {
            g.shard: f"{g.epoch}:n1" for g in newcomer.last.assigned
        }


@pytest.mark.seed("E19")
async def test_a_replica_never_serves_from_a_cache_that_redis_rolled_back(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    configured = fast_settings(settings)
    async with (
        open_service(configured, replica="a") as a,
        open_service(configured, replica="b") as b,
    ):
        await a.create_stream("orders", 4)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        await settle([m1], a)
        snapshot = await redis.dump(keyspace.group_meta("g"))
        await settle([m1, m2], a)  # replica a caches the group as it is now
        cached = a.store.cached_group("g")
        assert cached is not None
        meta = keyspace.group_meta("g")
        await redis.restore(meta, 0, snapshot, replace=True)
        # Replica b writes on top of the restored metadata (newcomers join), as many
        # commits as it takes a revision counter to come back where replica a last saw
        # it (a revision that reappeared would make a's cache look current).
        newcomers = [SimMember("x0", ["orders"])]
        await newcomers[0].heartbeat(b, "g")
        while int(await redis.hget(meta, "rev")) < cached[0] and len(newcomers) < 50:
            newcomers.append(SimMember(f"x{len(newcomers)}", ["orders"]))
            await newcomers[-1].heartbeat(b, "g")
        # Redis knows m1 and the newcomers; m2 was lost with the rolled-back writes.
        # Replica a must answer from Redis, not from what it cached before the loss.
        response = await a.heartbeat("g", m2.request())
        assert response.status is HeartbeatStatus.UNKNOWN_MEMBER
        info = await a.group_info("g")
        assert sorted(m.member_id for m in info.members) == sorted(
            ["m1", *(m.member_id for m in newcomers)]
        )


# -- E20 -------------------------------------------------------------------------------------


@pytest.mark.seed("E20")
async def test_member_reports_never_recreate_deleted_group_metadata(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream("orders", 4)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        await settle([m1, m2], service)
        fenced = await fences(redis, keyspace, SHARDS)
        meta = keyspace.group_meta("g")

        await redis.delete(meta)
        for member in (m1, m2):
            await expect_error(member.heartbeat(service, "g"), "METADATA_UNAVAILABLE")
            await expect_error(
                service.heartbeat("g", beat(member.member_id, 0, subscriptions=["orders"])),
                "METADATA_UNAVAILABLE",
            )
        assert not await redis.exists(meta)

        # Even with the group gone from the registry too, reports create nothing: a
        # member with an epoch is unknown, and a rejoin finds the consumer groups it
        # left on the shards (the group existed) and fails closed.
        await redis.srem(keyspace.registry_groups(), "g")
        for member in (m1, m2):
            response = await service.heartbeat("g", member.request())
            assert response.status is HeartbeatStatus.UNKNOWN_MEMBER
            assert not await redis.exists(meta)
            member.apply(response)  # it rejoins with epoch 0
            await expect_error(member.heartbeat(service, "g"), "METADATA_UNAVAILABLE")
        assert not await redis.exists(meta)
        assert await fences(redis, keyspace, SHARDS) == fenced


async def raw_state(redis: Any, keyspace: Keyspace, shards: list[str]) -> dict[str, Any]:
    """What a report could corrupt, as Redis holds it: the group hash (field by field),
    and, serialised with ``DUMP``, every subscription registry, every shard's list of
    required groups and every owner fence of group ``g``; plus the consumer groups on
    each shard."""
    out: dict[str, Any] = {"group": await redis.hgetall(keyspace.group_meta("g"))}
    for stream in ("orders", "audit"):
        key = keyspace.registry_subscriptions(stream)
        out[key] = await redis.dump(key)
    for shard in map(ShardId.parse, shards):
        for key in (keyspace.shard_groups(shard), keyspace.fence(shard, "g")):
            out[key] = await redis.dump(key)
        groups = await redis.xinfo_groups(keyspace.stream(shard))
        out[f"groups of {shard}"] = sorted(g["name"] for g in groups)
    return out


@pytest.mark.seed("E20")
async def test_reports_contradicting_intact_metadata_change_nothing_over_http(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    """Two members hold ``orders`` (4 shards); stream ``audit`` exists and nobody
    subscribes to it. Over real HTTP, member m1 reports owning shards it was never
    granted (m2's, and one that does not exist), then also a metadata version above the
    recorded one with an extra subscription (``audit``), and m2 reports an epoch above
    the group's with the same claims. Each reply holds only what Redis records for the
    member (OK), or nothing (SYNC_METADATA, FENCED), and in Redis the member records,
    the group header, the subscription registries, the shards' group lists, the
    consumer groups and every owner fence are byte for byte what they were: no report
    writes anything (issue 18: a number in a request never moves the group epoch)."""
    shards = [*SHARDS, "audit/0@0"]
    async with open_service(fast_settings(settings, lease_ttl=60.0)) as service:
        await service.create_stream("orders", 4)
        await service.create_stream("audit", 1)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        await settle([m1, m2], service)
        info = await service.group_info("g")
        recorded = {m.member_id: m for m in info.members}
        grants = {
            m.member_id: sorted((g.shard, g.epoch) for g in m.last.assigned) for m in (m1, m2)
        }
        assert sorted(recorded["m1"].assigned) == [s for s, _ in grants["m1"]]
        never_granted = sorted({*SHARDS, "orders/9@9"} - m1.owned)
        before = await raw_state(redis, keyspace, shards)
        assert before["group"] and before[keyspace.fence(ShardId.parse(SHARDS[0]), "g")]

        async with serve_api(service) as url, CoordinatorClient([url]) as http:
            # 1. At its recorded epoch and version, m1 claims shards never granted to it.
            claim = [*m1.owned, *never_granted]
            r = await http.heartbeat("g", beat("m1", m1.epoch, owned=claim, version=m1.version))
            assert r.status is HeartbeatStatus.OK
            assert sorted((g.shard, g.epoch) for g in r.assigned) == grants["m1"]
            assert r.member_epoch == m1.epoch and not r.pending
            assert await raw_state(redis, keyspace, shards) == before

            # 2. The same claims, a metadata version above Redis's, an extra subscription.
            extra = ["audit", "orders"]
            r = await http.heartbeat(
                "g",
                beat("m1", m1.epoch, owned=claim, version=m1.version + 5, subscriptions=extra),
            )
            assert r.status is HeartbeatStatus.SYNC_METADATA
            assert r.assigned == [] and r.member_epoch == 0  # no grants: drop and rejoin
            assert r.metadata_version == m1.version
            assert await raw_state(redis, keyspace, shards) == before

            # 3. m2 reports an epoch above the group epoch, with the same claims.
            high = info.group_epoch + 10
            r = await http.heartbeat(
                "g",
                beat(
                    "m2",
                    high,
                    owned=[*SHARDS, "orders/9@9"],
                    subscriptions=extra,
                    version=m2.version,
                ),
            )
            assert r.status is HeartbeatStatus.FENCED and r.assigned == [] and not r.pending
            assert await raw_state(redis, keyspace, shards) == before

        info = await service.group_info("g")
        assert {m.member_id: sorted(m.assigned) for m in info.members} == {
            k: sorted(v.assigned) for k, v in recorded.items()
        }


# -- E21 -------------------------------------------------------------------------------------


async def rewrite(redis: Any, key: str, field: str, value: bytes | None) -> None:
    """A faulty writer replaces (or drops) one field, with a new revision as every
    writer does. (A change behind the revision's back is seen on the next revision.)"""
    # One script, not a MULTI pipeline: redis-py's asyncio cluster transactions run
    # their commands on a thread's own event loop, which breaks the client afterwards.
    if value is None:
        await redis.eval(_DROP_FIELD, 1, key, field)
    else:
        await redis.eval(_SET_FIELD, 1, key, field, value)


_BUMP = "redis.call('HINCRBY', KEYS[1], 'rev', 1)"
_SET_FIELD = "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]); " + _BUMP
_DROP_FIELD = "redis.call('HDEL', KEYS[1], ARGV[1]); " + _BUMP


CORRUPTIONS: list[tuple[str, Callable[[Any, Keyspace], Any]]] = [
    ("group hash deleted", lambda r, k: r.delete(k.group_meta("g"))),
    ("group header garbage", lambda r, k: rewrite(r, k.group_meta("g"), "header", b"{not")),
    ("group header wrong shape", lambda r, k: rewrite(r, k.group_meta("g"), "header", b"[1]")),
    ("group header missing", lambda r, k: rewrite(r, k.group_meta("g"), "header", None)),
    (
        "group member record garbage",
        lambda r, k: rewrite(r, k.group_meta("g"), "m:m1", b"\xff\x00"),
    ),
    (
        "group member record wrong types",
        lambda r, k: rewrite(r, k.group_meta("g"), "m:m1", b'{"epoch":"x"}'),
    ),
    ("stream hash deleted", lambda r, k: r.delete(k.stream_meta("orders"))),
    ("stream doc garbage", lambda r, k: rewrite(r, k.stream_meta("orders"), "doc", b"garbage")),
    (
        "stream doc wrong shape",
        lambda r, k: rewrite(r, k.stream_meta("orders"), "doc", b'{"shards":1}'),
    ),
]


@pytest.mark.seed("E21")
@pytest.mark.parametrize(("label", "corrupt"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
async def test_lost_or_corrupt_metadata_fails_closed_with_a_log_line(
    settings: Settings,
    redis: Any,
    keyspace: Keyspace,
    caplog: pytest.LogCaptureFixture,
    label: str,
    corrupt: Callable[[Any, Keyspace], Any],
) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream("orders", 4)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        await settle([m1, m2], service)
        await corrupt(redis, keyspace)
        dumped = {
            k: await redis.dump(k)
            for k in (keyspace.group_meta("g"), keyspace.stream_meta("orders"))
        }
        caplog.set_level(logging.INFO)
        caplog.clear()
        for member in (m1, m2):
            error = await expect_error(member.heartbeat(service, "g"), "METADATA_UNAVAILABLE")
            assert error.retryable is False and error.status == 503
        if "group" in label:
            await expect_error(service.group_info("g"), "METADATA_UNAVAILABLE")
        else:
            await expect_error(service.routing("orders"), "METADATA_UNAVAILABLE")
            await expect_error(service.stream_info("orders"), "METADATA_UNAVAILABLE")
        with pytest.raises(Exception) as ticked:
            await service.tick_group("g")
        assert getattr(ticked.value, "code", None) == "METADATA_UNAVAILABLE"
        # Said in the log, and nothing rebuilt: not from member reports, not by the
        # status projection.
        logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert any(
            "metadata" in text and ("'g'" in text or "'orders'" in text) for text in logged
        ), logged
        status = await service.status()
        assert ("stream" in label) == ("orders" not in [s.name for s in status.streams])
        assert ("group" in label) == ("g" not in [g.group for g in status.groups])
        assert {k: await redis.dump(k) for k in dumped} == dumped
        # Over HTTP: 503, not retryable.
        async with serve_api(service) as url, httpx.AsyncClient(base_url=url) as http:
            answer = await http.post(
                "/v1/groups/g/heartbeat",
                content=m1.request().model_dump_json(by_alias=True),
                headers={"content-type": "application/json"},
            )
        assert answer.status_code == 503
        assert answer.json() == {
            "error": "METADATA_UNAVAILABLE",
            "message": answer.json()["message"],
            "retryable": False,
        }


@pytest.mark.seed("E21")
async def test_an_operator_reinitialises_a_lost_group_and_its_workers_resume(
    streamworks_runtime: Callable[..., TestRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    app = App("g")
    app.stream("orders", shards=4)
    handled: list[int] = []

    @app.handler("orders", ordering="none")
    async def handle(value: dict[str, int]) -> None:
        handled.append(value["n"])

    async with streamworks_runtime(app, workers=2) as rt:
        assert rt.service is not None
        service = rt.service
        fenced = {
            s: (await rt.redis.get(rt.keyspace.fence(ShardId.parse(s), "g"))).decode()
            for s in SHARDS
        }
        highest = max(int(v.split(":")[0]) for v in fenced.values())
        await rewrite(rt.redis, rt.keyspace.group_meta("g"), "header", b"{corrupt")
        failures = {w.member_id: w.assignment.failures for w in rt.workers}
        await wait_for(
            lambda: all(w.assignment.failures >= failures[w.member_id] + 3 for w in rt.workers),
            message="workers to be refused",
        )
        assert all(w.assignment.failures for w in rt.workers)
        # The operator's action: a group whose metadata is present is never overwritten...
        request = ReinitializeRequest(kind="group", name="g", confirm=True)
        await expect_error(service.reinitialize(request), "ALREADY_EXISTS")
        # ...the corrupt key is deleted deliberately, then the group re-initialised.
        await rt.redis.delete(rt.keyspace.group_meta("g"))
        await service.reinitialize(request)
        info = await service.group_info("g")
        assert not info.members
        await rt.wait_assigned()  # the workers rejoined
        # Under fence tokens above every token of the old fences: accepted, and the
        # workers' ctx.fencing_token went up, not down.
        for s in SHARDS:
            fence = await rt.redis.get(rt.keyspace.fence(ShardId.parse(s), "g"))
            assert int(fence.split(b":")[0]) > highest
        for n in range(20):
            await app.publish("orders", {"n": n}, key=f"k{n}")
        await rt.wait_idle()
        assert sorted(handled) == list(range(20))


@pytest.mark.seed("E21")
async def test_an_operator_reinitialises_a_lost_stream_and_its_old_shards_drain(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=2)
    handled: list[tuple[int, str]] = []

    @app.handler("orders", ordering="none")
    async def handle(value: dict[str, int], ctx: Context) -> None:
        handled.append((value["n"], ctx.message.shard))

    async with streamworks_runtime(app, workers=1) as rt:
        assert rt.service is not None
        service = rt.service
        await rt.stop_worker(0)  # entries wait in the old shards, unconsumed
        for n in range(10):
            await app.publish("orders", {"n": n}, key=f"k{n}")
        await rt.redis.delete(rt.keyspace.stream_meta("orders"))
        await expect_error(service.routing("orders"), "METADATA_UNAVAILABLE")
        await expect_error(service.create_stream("orders", 2), "METADATA_UNAVAILABLE")

        status = await service.reinitialize(
            ReinitializeRequest(kind="stream", name="orders", shards=3, confirm=True)
        )
        [stream] = status.streams
        states = {s.shard: s.state for s in stream.shards}
        assert states == {
            "orders/0@0": "DRAINING",
            "orders/1@0": "DRAINING",
            "orders/0@1": "ACTIVE",
            "orders/1@1": "ACTIVE",
            "orders/2@1": "ACTIVE",
        }
        routing = await service.routing("orders")
        assert [s.shard for s in routing.shards] == ["orders/0@1", "orders/1@1", "orders/2@1"]
        await expect_error(
            service.reinitialize(
                ReinitializeRequest(kind="stream", name="orders", shards=3, confirm=True)
            ),
            "ALREADY_EXISTS",
        )
        # A worker reads the old shards to the end, and the new ones.
        await rt.add_worker()
        for n in range(10, 20):
            await app.publish("orders", {"n": n}, key=f"k{n}")
        await wait_for(lambda: len(handled) >= 20, message="every message to be handled")
        assert sorted(n for n, _ in handled) == list(range(20))
        assert {s for n, s in handled if n < 10} <= {"orders/0@0", "orders/1@0"}
