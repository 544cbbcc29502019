"""Membership with real workers: expiry of a silent group (E5), revoke before assign
(E6), a draining member cut off from the coordinator (E7), and a member dying or stuck
while draining (E8)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from streamworks import App
from streamworks.clock import Clock
from streamworks.protocol.control import HeartbeatStatus
from streamworks.protocol.shards import ShardId
from streamworks.runtime.message import Context
from streamworks.runtime.worker import Worker
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import (
    CutTransport,
    SimMember,
    beat,
    keys_per_shard,
    open_service,
    settle,
)
from tests.support import wait_for


class BlockingApp:
    """An app on a 2-shard stream whose handler holds messages marked ``block`` until
    ``release`` is set, and records who handled what."""

    def __init__(self) -> None:
        self.app = App("g")
        self.app.stream("orders", shards=2)
        self.release = anyio.Event()
        self.started: dict[int, tuple[str, str]] = {}  # n -> (shard, member)
        self.handled: list[tuple[int, str, str]] = []  # (n, shard, member)
        self.runs: list[tuple[int, str, str, int]] = []  # (n, shard, member, token) at start

        @self.app.handler("orders", ordering="none", concurrency=8)
        async def handle(value: dict[str, Any], ctx: Context) -> None:
            self.started[value["n"]] = (ctx.message.shard, ctx.member_id)
            self.runs.append((value["n"], ctx.message.shard, ctx.member_id, ctx.fencing_token))
            if value.get("block"):
                await self.release.wait()
            self.handled.append((value["n"], ctx.message.shard, ctx.member_id))

    def handled_by(self, member_id: str, shard: str) -> list[int]:
        return [n for n, s, m in self.handled if m == member_id and s == shard]


async def hold_one_message_per_shard(rt: TestRuntime, blocking: BlockingApp) -> dict[str, str]:
    """Publish one blocking message to each shard and wait until both are in flight.
    Returns the shard -> partition key map used."""
    keys = await keys_per_shard(rt, "orders")
    for n, key in enumerate(keys.values()):
        await blocking.app.publish("orders", {"n": n, "block": True}, key=key)
    await wait_for(lambda: len(blocking.started) == 2, message="both messages in flight")
    return keys


async def revoked_shard(rt: TestRuntime, member_id: str) -> str:
    """Wait until the coordinator tells ``member_id`` to revoke a shard; return it."""
    assert rt.service is not None
    revoking: list[str] = []

    async def told() -> bool:
        assert rt.service is not None
        info = await rt.service.group_info("g")
        member = next(m for m in info.members if m.member_id == member_id)
        revoking[:] = member.pending_revocation
        return bool(revoking)

    await wait_for(told, message=f"{member_id[:8]} to be told to revoke")
    [shard] = revoking
    return shard


async def fence_of(rt: TestRuntime, shard: str) -> str:
    value = await rt.redis.get(rt.keyspace.fence(ShardId.parse(shard), "g"))
    return value.decode() if value else ""


async def shard_group(rt: TestRuntime, shard: str) -> dict[str, Any]:
    [info] = await rt.redis.xinfo_groups(rt.keyspace.stream(ShardId.parse(shard)))
    return dict(info)


async def heartbeats_pass(worker: Worker, n: int) -> None:
    start = worker.assignment.heartbeats
    await wait_for(lambda: worker.assignment.heartbeats >= start + n, message=f"{n} heartbeats")


# -- E5 ------------------------------------------------------------------------------------


@pytest.mark.seed("E5")
async def test_a_group_whose_members_all_stop_heartbeating_expires_then_forgets_them(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=4)

    @app.handler("orders")
    async def handle(value: Any) -> None:
        return None

    # A lease long against the real time the test takes (a loaded machine): only the
    # advanced clock may expire the members, so "nothing changes before" is exact.
    settings = fast_settings(lease_ttl=10.0)
    async with streamworks_runtime(app, workers=2, settings=settings) as rt:
        assert rt.service is not None
        service = rt.service
        before = await service.group_info("g")
        epochs = {m.member_id: m.epoch for m in before.members}
        owned = {m.member_id: m.assigned for m in before.members}
        await rt.kill_worker(0)
        await rt.kill_worker(1)
        # Nothing changes before the lease runs out...
        await rt.advance(rt.settings.lease_ttl / 2)
        assert (await service.group_info("g")).group_epoch == before.group_epoch
        # ...then the loop expires every member.
        await rt.advance(rt.settings.lease_ttl / 2 + 0.1)
        info = await service.group_info("g")
        assert info.state == "EMPTY"
        assert {m.member_id: m.state for m in info.members} == dict.fromkeys(epochs, "EXPIRED")
        assert info.group_epoch > before.group_epoch
        assert info.metadata_version > before.metadata_version
        assert info.target_epoch == info.group_epoch  # no target pending: cleared
        assert all(not (m.assigned or m.target or m.pending_revocation) for m in info.members)
        assert await rt.redis.zcard(rt.keyspace.group_leases("g")) == 0

        # The records stay: a late heartbeat is told it is unknown, and changes nothing.
        rev = await rt.redis.hget(rt.keyspace.group_meta("g"), "rev")
        for member_id, epoch in epochs.items():
            late = beat(member_id, epoch, owned=owned[member_id], version=before.metadata_version)
            response = await service.heartbeat("g", late)
            assert response.status is HeartbeatStatus.UNKNOWN_MEMBER
            assert not response.assigned
        assert await rt.redis.hget(rt.keyspace.group_meta("g"), "rev") == rev
        retention = rt.settings.stale_member_retention
        await rt.advance(retention - 1)
        assert len((await service.group_info("g")).members) == 2
        # After the retention, stale-member cleanup removes them.
        await rt.advance(1.1)
        info = await service.group_info("g")
        assert info.members == [] and info.state == "EMPTY"
        fields = await rt.redis.hkeys(rt.keyspace.group_meta("g"))
        assert not [f for f in fields if f.startswith(b"m:")]
        for member_id, epoch in epochs.items():
            response = await service.heartbeat("g", beat(member_id, epoch, owned=[]))
            assert response.status is HeartbeatStatus.UNKNOWN_MEMBER


# -- E6 ------------------------------------------------------------------------------------


@pytest.mark.seed("E6")
async def test_a_shard_is_only_pending_for_its_new_owner_until_the_old_one_revoked_it(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    blocking = BlockingApp()
    settings = fast_settings(rebalance_timeout=60.0)  # the drain may take its time
    async with streamworks_runtime(blocking.app, workers=1, settings=settings) as rt:
        assert rt.service is not None
        w0 = rt.workers[0]
        keys = await hold_one_message_per_shard(rt, blocking)
        w1 = await rt.add_worker(wait=False)
        moving = await revoked_shard(rt, w0.member_id)
        old_fence = await fence_of(rt, moving)
        assert old_fence.endswith(f":{w0.member_id}")
        # While w0 drains (its handler is busy), w1 heartbeats again and again and is
        # only ever told the shard is pending.
        await heartbeats_pass(w1, 10)
        response = w1.assignment.last_response
        assert response is not None
        assert moving in response.pending
        assert moving not in {g.shard for g in response.assigned}
        info = await rt.service.group_info("g")
        members = {m.member_id: m for m in info.members}
        assert members[w0.member_id].pending_revocation == [moving]
        assert members[w1.member_id].state == "UNRELEASED"
        assert moving in members[w1.member_id].target
        assert moving not in members[w1.member_id].assigned
        assert await fence_of(rt, moving) == old_fence
        shard = ShardId.parse(moving)
        assert shard not in w1.readers
        assert not w0.readers[shard].accepting  # w0 stopped reading; its work runs on
        # A message published meanwhile waits: nobody reads the shard.
        await blocking.app.publish("orders", {"n": 10}, key=keys[moving])
        await heartbeats_pass(w1, 3)
        assert (await shard_group(rt, moving))["lag"] == 1
        assert 10 not in blocking.started

        blocking.release.set()  # w0 finishes its in-flight work, acks, reports revoked
        await wait_for(lambda: 10 in blocking.started, message="the new owner to read")
        assert blocking.started[10] == (moving, w1.member_id)
        await rt.wait_idle()
        new_fence = await fence_of(rt, moving)
        assert new_fence.endswith(f":{w1.member_id}")
        assert int(new_fence.split(":")[0]) > int(old_fence.split(":")[0])
        # Exactly once each: the in-flight message finished on w0, none was redone.
        assert sorted(n for n, _, _ in blocking.handled) == [0, 1, 10]


# -- E7 ------------------------------------------------------------------------------------


@pytest.mark.seed("E7")
async def test_a_draining_member_cut_off_from_the_coordinator_never_resumes_the_shard(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    blocking = BlockingApp()
    settings = fast_settings(lease_ttl=10.0, rebalance_timeout=60.0)
    async with streamworks_runtime(blocking.app, workers=0, settings=settings) as rt:
        local = rt.coordinator
        link = CutTransport(local)
        rt.coordinator = link  # w0 reaches the coordinator through a link we can cut
        w0 = await rt.add_worker()
        rt.coordinator = local
        keys = await hold_one_message_per_shard(rt, blocking)
        w1 = await rt.add_worker(wait=False)
        moving = await revoked_shard(rt, w0.member_id)
        shard = ShardId.parse(moving)
        await wait_for(lambda: shard in w0.revoking, message="w0 to start draining")
        kept = next(s for s in w0.readers if s != shard)

        link.cut = True  # the coordinator is gone for w0
        await blocking.app.publish("orders", {"n": 10}, key=keys[moving])
        await blocking.app.publish("orders", {"n": 11}, key=keys[str(kept)])
        await wait_for(lambda: len(link.sent_while_cut()) >= 10, message="w0 to keep retrying")
        # It keeps reporting the shard as revoking, never reads it, and keeps reading
        # the shard it was not told to give up (its lease is still valid).
        assert all(moving in r.revoking_shards for r in link.sent_while_cut())
        assert not w0.readers[shard].accepting
        await wait_for(lambda: 11 in blocking.started, message="the kept shard to be read")
        assert 10 not in blocking.started
        group = await shard_group(rt, moving)
        assert group["lag"] == 1 and group["pending"] == 1  # only the in-flight message
        assert ShardId.parse(moving) not in w1.readers  # still pending for w1

        link.cut = False  # back: w0 still drains, and says so
        restored = len(link.heartbeats)
        await wait_for(lambda: len(link.heartbeats) >= restored + 5, message="heartbeats")
        assert all(moving in r.revoking_shards and not cut for cut, r in link.heartbeats[restored:])
        assert 10 not in blocking.started
        blocking.release.set()
        await wait_for(lambda: 10 in blocking.started, message="the new owner to read")
        await rt.wait_idle()
        assert blocking.started[10] == (moving, w1.member_id)
        # After the DRAIN, w0 handled nothing more of that shard: only what was in flight.
        [in_flight] = [n for n, (s, _) in blocking.started.items() if s == moving and n < 10]
        assert blocking.handled_by(w0.member_id, moving) == [in_flight]
        assert shard not in w0.readers


@pytest.mark.seed("E7")
async def test_a_drain_finished_while_cut_off_never_reads_the_shard_again_until_regranted(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """w0 drains a shard it was told to give up and is cut off from the coordinator
    (Redis still reachable). Its in-flight run finishes and is acked *while* it is cut
    off, within its lease; it keeps reporting the shard as revoking and reads nothing
    more from it — not after the drain, not past its lease. The coordinator expires it
    and the shard's next owner (a newer fence) reads the waiting message. Back in
    touch, w0 rejoins; it reads the shard again only when a fence newer than all of
    those names it, and its runs there carry that fence's epoch."""
    blocking = BlockingApp()
    settings = fast_settings(lease_ttl=3.0, rebalance_timeout=60.0)
    async with streamworks_runtime(blocking.app, workers=0, settings=settings) as rt:
        local = rt.coordinator
        link = CutTransport(local)
        rt.coordinator = link  # w0 reaches the coordinator through a link we can cut
        w0 = await rt.add_worker()
        rt.coordinator = local
        keys = await hold_one_message_per_shard(rt, blocking)
        w1 = await rt.add_worker(wait=False)
        moving = await revoked_shard(rt, w0.member_id)
        shard = ShardId.parse(moving)
        await wait_for(lambda: shard in w0.revoking, message="w0 to start draining")
        [(in_flight, old_token)] = [
            (n, t) for n, s, m, t in blocking.runs if s == moving and m == w0.member_id
        ]

        link.cut = True  # the coordinator is gone for w0; Redis is not
        w0_epoch = w0.assignment.epoch
        await blocking.app.publish("orders", {"n": 10}, key=keys[moving])
        await wait_for(lambda: len(link.sent_while_cut()) >= 3, message="w0 to keep retrying")
        assert all(moving in r.revoking_shards for r in link.sent_while_cut())
        blocking.release.set()  # the in-flight runs end now, while w0 is cut off

        async def drained() -> bool:
            group = await shard_group(rt, moving)
            return bool(blocking.handled_by(w0.member_id, moving) and group["pending"] == 0)

        await wait_for(drained, message="w0's in-flight run to end and be acked")
        assert link.cut and w0.lease.held()  # finished under its lease, still cut off
        after_drain = len(link.heartbeats)
        group = await shard_group(rt, moving)
        assert group["lag"] == 1  # message 10 waits, unread
        assert not w0.readers.get(shard) or not w0.readers[shard].accepting

        # Past its lease, still cut off: the coordinator expires w0, w1 takes the shard.
        await wait_for(lambda: not w0.lease.held(), timeout=10, message="w0's lease to end")
        await wait_for(lambda: 10 in blocking.started, timeout=10, message="message 10 read")
        assert link.cut
        # Drained, it reports the shard as given up (neither owned nor revoking).
        reports = [r for _, r in link.heartbeats[after_drain:]]
        assert reports and all(r.member_epoch == w0_epoch for r in reports)
        assert not any(moving in (r.owned_shards or []) + r.revoking_shards for r in reports)
        assert blocking.started[10] == (moving, w1.member_id)
        w1_fence = await fence_of(rt, moving)
        assert w1_fence.endswith(f":{w1.member_id}")
        assert [n for n, s, m, _ in blocking.runs if m == w0.member_id and s == moving] == [
            in_flight
        ]

        link.cut = False  # back: w0 is unknown, rejoins; w1 leaves, w0 gets everything
        await wait_for(
            lambda: w0.assignment.heartbeats > 0 and w0.lease.valid(), message="w0 rejoined"
        )
        await rt.stop_worker(1)
        await wait_for(lambda: shard in w0.readers, timeout=10, message="w0 granted the shard")
        new_fence = await fence_of(rt, moving)
        assert new_fence.endswith(f":{w0.member_id}")
        new_epoch = int(new_fence.split(":")[0])
        assert new_epoch > int(w1_fence.split(":")[0]) > old_token
        await blocking.app.publish("orders", {"n": 12}, key=keys[moving])
        await wait_for(lambda: 12 in blocking.started, timeout=10, message="message 12 read")
        await rt.wait_idle()
        runs_on_moving = [(n, m, t) for n, s, m, t in blocking.runs if s == moving]
        assert [(n, m) for n, m, _ in runs_on_moving if m == w0.member_id] == [
            (in_flight, w0.member_id),
            (12, w0.member_id),
        ]
        assert [t for n, _, t in runs_on_moving if n == 12] == [new_epoch]


# -- E8 ------------------------------------------------------------------------------------


@pytest.mark.seed("E8")
async def test_a_member_dying_while_draining_frees_the_shard_at_lease_expiry(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    blocking = BlockingApp()
    settings = fast_settings(rebalance_timeout=60.0)
    async with streamworks_runtime(blocking.app, workers=1, settings=settings) as rt:
        assert rt.service is not None
        w0 = rt.workers[0]
        keys = await hold_one_message_per_shard(rt, blocking)
        w1 = await rt.add_worker(wait=False)
        moving = await revoked_shard(rt, w0.member_id)
        await rt.kill_worker(0)  # dies mid-drain: nothing acked, no leave
        for n, key in enumerate(keys.values(), start=10):
            await blocking.app.publish("orders", {"n": n}, key=key)
        await heartbeats_pass(w1, 5)
        assert ShardId.parse(moving) not in w1.readers  # blocked until w0 is known gone
        blocking.release.set()

        async def expired() -> bool:
            assert rt.service is not None
            info = await rt.service.group_info("g")
            return any(m.member_id == w0.member_id and m.state == "EXPIRED" for m in info.members)

        await wait_for(expired, timeout=5, message="w0's lease to expire")  # w1 renews
        await rt.wait_assigned()
        info = await rt.service.group_info("g")
        states = {m.member_id: m.state for m in info.members}
        assert states == {w0.member_id: "EXPIRED", w1.member_id: "STABLE"}
        assert set(next(m for m in info.members if m.member_id == w1.member_id).assigned) == set(
            keys
        )
        await rt.wait_idle()
        # Nothing lost; what w0 had in flight was handled again by w1 (at least once).
        assert {n for n, _, _ in blocking.handled} == {0, 1, 10, 11}
        assert {n for n, _, m in blocking.handled if m == w1.member_id} >= {0, 1, 10, 11}


@pytest.mark.seed("E8")
async def test_a_member_stuck_draining_is_fenced_at_the_revocation_deadline(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    blocking = BlockingApp()
    # Leases far longer than the revocation timeout: only the deadline can free it.
    settings = fast_settings(lease_ttl=30.0, rebalance_timeout=1.0)
    async with streamworks_runtime(blocking.app, workers=0, settings=settings) as rt:
        assert rt.service is not None
        local = rt.coordinator
        link = CutTransport(local)
        link.cut_on = {HeartbeatStatus.FENCED}  # once fenced, w0 loses the coordinator
        rt.coordinator = link
        w0 = await rt.add_worker()
        rt.coordinator = local
        keys = await hold_one_message_per_shard(rt, blocking)
        w1 = await rt.add_worker(wait=False)
        moving = await revoked_shard(rt, w0.member_id)
        await heartbeats_pass(w1, 3)
        assert ShardId.parse(moving) not in w1.readers
        await rt.advance(1.1)  # past the revocation deadline; w0 still heartbeats
        await wait_for(
            lambda: any(r.status is HeartbeatStatus.FENCED for r in link.responses),
            message="w0 to be fenced",
        )
        assert await rt.service.store.expired_members("g", await rt.service.store.now_ms()) == []

        async def moved() -> bool:
            return (await fence_of(rt, moving)).endswith(f":{w1.member_id}")

        # w0 was fenced while its lease was valid: its handler may still run until that
        # lease would have expired, so the shard is quarantined until then.
        await heartbeats_pass(w1, 3)
        assert not await moved()
        assert ShardId.parse(moving) not in w1.readers
        for _ in range(7):  # past w0's lease (30 s), w1 heartbeating all the while
            await rt.advance(5.0)
            await heartbeats_pass(w1, 1)
        await wait_for(moved, message="the shard to reach its target owner")
        await blocking.app.publish("orders", {"n": 10}, key=keys[moving])
        await wait_for(lambda: 10 in blocking.started, message="the new owner to read")
        assert blocking.started[10] == (moving, w1.member_id)
        info = await rt.service.group_info("g")
        states = {m.member_id: m.state for m in info.members}
        # w0 is a tombstone, or already forgotten (stale retention passed meanwhile).
        assert states.pop(w0.member_id, "FENCED") == "FENCED"
        assert states == {w1.member_id: "STABLE"}
        blocking.release.set()  # w0's stuck handler finally returns
        link.cut = False  # and w0 rejoins
        await rt.wait_assigned()
        await rt.wait_idle()
        assert {n for n, _, _ in blocking.handled} == {0, 1, 10}


@pytest.mark.seed("E5")
async def test_a_survivor_is_told_to_come_back_just_after_a_silent_peers_lease_ends(
    settings: Settings,
) -> None:
    """Failover takes the lease TTL, not TTL + a heartbeat interval: the replica's loop
    wakes at the next lease deadline, and a member whose next heartbeat would come
    well after a silent peer's lease ends is told to come back just after it."""
    clock = Clock()
    async with open_service(settings, clock=clock) as service:
        await service.create_stream("orders", 4)
        alive, silent = SimMember("alive", ["orders"]), SimMember("silent", ["orders"])
        await settle([alive, silent], service)
        interval_ms = int(settings.heartbeat_interval * 1000)
        assert alive.last.heartbeat_interval_ms == interval_ms

        clock.advance(settings.lease_ttl - 0.4)  # "silent" stopped heartbeating
        await alive.heartbeat(service, "g")
        await service.tick_group("g")  # what the loop does: it sees the next deadline
        assert 0 < service._loop_sleep(0.5) <= 0.41
        told = (await alive.heartbeat(service, "g")).heartbeat_interval_ms
        assert 350 <= told <= 550, told  # 0.4 s to the deadline + 0.1 s, minus time spent

        clock.advance(told / 1000)
        await service.tick_group("g")  # the deadline passed: "silent" expires
        for _ in range(3):
            await alive.heartbeat(service, "g")
            if len(alive.owned) == 4:
                break
        assert alive.owned == {f"orders/{i}@0" for i in range(4)}
        # Nothing about to expire any more: the normal interval again.
        assert alive.last.heartbeat_interval_ms == interval_ms
