"""The write discipline (docs/protocol.md#write-discipline): a restarted replica
inherits only what Redis holds (E2), two replicas at once lose no update (E3), a
terminating replica refuses new work and finishes what passed the gate (E4)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from streamworks import App
from streamworks.coordinator.core import HeartbeatInput, heartbeat
from streamworks.coordinator.core.streams import topology_of
from streamworks.coordinator.service import CoordinatorService
from streamworks.exceptions import CoordinatorError, CoordinatorUnavailableError
from streamworks.protocol.control import HeartbeatStatus
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import load_script
from streamworks.runtime.message import Context
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import (
    SimMember,
    expect_error,
    open_service,
    recording_redis,
    serve_api,
    settle,
)
from tests.support import wait_for


def with_coordinator(settings: Settings, **changes: Any) -> Settings:
    base = fast_settings(settings)
    return base.model_copy(update={"coordinator": base.coordinator.model_copy(update=changes)})


def join_input(member_id: str, stream: str = "orders") -> HeartbeatInput:
    return HeartbeatInput(member_id, 0, 0, subscriptions=frozenset({stream}))


# -- E2: a restarted replica inherits only Redis ----------------------------------------


@pytest.mark.seed("E2")
async def test_a_new_replica_continues_the_group_from_redis_alone(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=4)
    handled: list[str] = []

    @app.handler("orders")
    async def handle(value: dict[str, int], ctx: Context) -> None:
        handled.append(ctx.member_id)

    async with streamworks_runtime(app, workers=2) as rt:
        old = rt.service
        before = await old.group_info("g")
        tokens = {w.member_id: {s: r.token for s, r in w.readers.items()} for w in rt.workers}

        # A rolling update: a fresh replica object (empty caches) takes over the
        # traffic, then the old one terminates.
        new = CoordinatorService(rt.redis, rt.settings, replica="new", clock=rt.clock)
        async with anyio.create_task_group() as tg:
            assert new.store.cached_group("g") is None
            tg.start_soon(new.run_loop)
            rt.coordinator.service = new
            rt.service = new
            await old.terminate()
            beats = {w.member_id: w.assignment.heartbeats for w in rt.workers}
            await wait_for(
                lambda: all(w.assignment.heartbeats >= beats[w.member_id] + 10 for w in rt.workers),
                message="workers to heartbeat to the new replica",
            )
            after = await new.group_info("g")
            assert after.group_epoch == before.group_epoch
            assert after.target_epoch == before.target_epoch
            assert after.metadata_version == before.metadata_version
            assert {m.member_id: (m.epoch, m.state, m.assigned) for m in after.members} == {
                m.member_id: (m.epoch, m.state, m.assigned) for m in before.members
            }
            # Nobody was told anything new: same readers under the same grants.
            assert {
                w.member_id: {s: r.token for s, r in w.readers.items()} for w in rt.workers
            } == tokens
            assert not await new.tick_group("g")  # and the loop has nothing to redo
            for n in range(20):
                await app.publish("orders", {"n": n}, key=f"k{n}")
            await rt.wait_idle()
            assert len(handled) == 20
            tg.cancel_scope.cancel()


class ReplicaKilled(BaseException):
    """The replica's process died at this point: nothing after it runs."""


@pytest.mark.seed("E2")
async def test_a_replica_killed_inside_a_critical_section_leaves_only_an_expiring_mutex(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    configured = with_coordinator(settings, mutex_ttl=1.0, mutex_wait=0.05)
    async with (
        open_service(configured, replica="a") as a,
        open_service(configured, replica="b") as b,
    ):
        await a.create_stream("orders", 4)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        await settle([m1], a)
        meta_key, lease_key = keyspace.group_meta("g"), keyspace.group_leases("g")
        meta_before = await redis.hgetall(meta_key)
        fences_before = {
            s: await redis.get(keyspace.fence(ShardId.parse(s), "g")) for s in m1.owned
        }

        # Replica a dies after taking the mutex and computing m2's join, before its
        # commit: no release, no commit, nothing after that point reaches Redis.
        async def die(*args: Any, **kwargs: Any) -> Any:
            raise ReplicaKilled

        async def send_nothing(*args: Any, **kwargs: Any) -> int:
            return 0

        a.store.commit_group = die  # type: ignore[method-assign]
        a.store.scripts.mutex_release = send_nothing  # type: ignore[assignment]
        with pytest.raises(ReplicaKilled):
            await m2.heartbeat(a, "g")

        mutex = keyspace.group_mutex("g")
        assert 0 < await redis.pttl(mutex) <= 1000  # at most a mutex, and it expires
        assert await redis.hgetall(meta_key) == meta_before  # nothing half-written
        assert await redis.zrange(lease_key, 0, -1) == [b"m1"]
        assert {
            s: await redis.get(keyspace.fence(ShardId.parse(s), "g")) for s in m1.owned
        } == fences_before
        # The other replica waits its bounded time and answers a retryable conflict...
        error = await expect_error(m2.heartbeat(b, "g"), "CONFLICT")
        assert error.retryable
        # ...and once the mutex expired it serves the same request from Redis.
        await wait_for(lambda: _gone(redis, mutex), message="the dead replica's mutex to expire")
        await settle([m1, m2], b)
        info = await b.group_info("g")
        assert sorted(m.member_id for m in info.members) == ["m1", "m2"]
        assert len(m1.owned) == len(m2.owned) == 2


@pytest.mark.seed("E2")
async def test_a_replica_killed_while_creating_a_stream_does_not_brick_it(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    configured = with_coordinator(settings, mutex_ttl=0.3, mutex_wait=2.0)
    async with (
        open_service(configured, replica="a") as a,
        open_service(configured, replica="b") as b,
    ):

        async def die(*args: Any, **kwargs: Any) -> Any:
            raise ReplicaKilled

        async def send_nothing(*args: Any, **kwargs: Any) -> int:
            return 0

        # Replica a provisions the shard keys and dies before committing the metadata.
        a.store.commit_stream = die  # type: ignore[method-assign]
        a.store.scripts.mutex_release = send_nothing  # type: ignore[assignment]
        with pytest.raises(ReplicaKilled):
            await a.create_stream("orders", 3)
        assert len(await b.store.existing_shard_keys("orders")) == 3
        assert not await redis.exists(keyspace.stream_meta("orders"))
        await expect_error(b.routing("orders"), "NOT_FOUND")  # it was never created
        # Another replica creates it (once the dead one's mutex expired): the leftovers
        # are exactly what that creation provisions, and never received an entry.
        info = await b.create_stream("orders", 3)
        assert info.created and info.shard_count == 3
        routing = await b.routing("orders")
        assert [s.shard for s in routing.shards] == ["orders/0@0", "orders/1@0", "orders/2@0"]

        # Leftovers that held data, or another layout, stay evidence of a lost stream.
        a.store.commit_stream = die  # type: ignore[method-assign]
        with pytest.raises(ReplicaKilled):
            await a.create_stream("audit", 2)
        await redis.xadd(keyspace.stream(ShardId("audit", 1)), {"v": "1"})
        await expect_error(b.create_stream("audit", 2), "METADATA_UNAVAILABLE")
        with pytest.raises(ReplicaKilled):
            await a.create_stream("audit2", 2)
        await expect_error(b.create_stream("audit2", 1), "METADATA_UNAVAILABLE")


async def _gone(redis: Any, key: str) -> bool:
    return not await redis.exists(key)


@pytest.mark.seed("E2")
async def test_a_crash_between_commit_and_fence_write_heals_within_heartbeats(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=2)
    handled: list[tuple[str, str]] = []

    @app.handler("orders", ordering="none")
    async def handle(value: dict[str, int], ctx: Context) -> None:
        handled.append((ctx.member_id, ctx.message.shard))

    async with streamworks_runtime(app, workers=1) as rt:
        w0 = rt.workers[0]
        store = rt.service.store
        real_write = store.write_fences
        crashed: list[str] = []

        async def crash_once(group_id: str, fences: Any, **kwargs: Any) -> Any:
            fences = list(fences)
            late = [f for f in fences if f.member_id != w0.member_id]
            if late and not crashed:
                crashed.extend(f.shard for f in late)
                # The replica committed the grant and died before writing its fence;
                # the member sees a lost connection.
                raise CoordinatorUnavailableError("replica died")
            return await real_write(group_id, fences, **kwargs)

        store.write_fences = crash_once  # type: ignore[method-assign]
        w1 = await rt.add_worker(wait=False)
        await wait_for(lambda: bool(crashed), message="the crash after a commit")
        store.write_fences = real_write  # type: ignore[method-assign]
        # Within a few heartbeats the shard is read by its new owner under a fence
        # the coordinator repaired.
        [shard] = crashed
        fence_key = rt.keyspace.fence(ShardId.parse(shard), "g")

        async def fenced_for_w1() -> bool:
            fence = await rt.redis.get(fence_key)
            return fence is not None and fence.decode().endswith(f":{w1.member_id}")

        await wait_for(fenced_for_w1, timeout=5, message="the new owner's fence")
        await rt.wait_assigned()
        for n in range(20):
            await app.publish("orders", {"n": n}, key=f"k{n}")
        await rt.wait_idle()
        assert len(handled) == 20
        assert {m for m, s in handled if s == shard} == {w1.member_id}


# -- E3: two replicas at once -------------------------------------------------------------


@pytest.mark.seed("E3")
async def test_two_replicas_serving_many_members_at_once_lose_no_update(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    configured = fast_settings(settings)
    shards = 30
    async with (
        open_service(configured, replica="a") as a,
        open_service(configured, replica="b") as b,
    ):
        await a.create_stream("orders", shards)
        members = [SimMember(f"m{i:02d}", ["orders"]) for i in range(20)]
        refusals: list[CoordinatorError] = []
        done = anyio.Event()

        async def drive(i: int, member: SimMember) -> None:
            n = i
            while not done.is_set():
                replica = (a, b)[n % 2]  # alternate replicas, heartbeat by heartbeat
                n += 1
                try:
                    await member.heartbeat(replica, "g")
                except CoordinatorError as e:
                    refusals.append(e)
                await anyio.sleep(0.005)  # pacing, not synchronisation

        async def stable() -> bool:
            if not all(m.responses for m in members):
                return False
            info = await b.group_info("g")
            if info.state != "STABLE" or len(info.members) != len(members):
                return False
            recorded = {m.member_id: m for m in info.members}
            return all(
                m.responses
                and m.last.status is HeartbeatStatus.OK
                and not m.last.pending
                and not m.last.revoke
                and recorded[m.member_id].epoch == m.epoch
                and set(recorded[m.member_id].assigned) == m.owned
                for m in members
            )

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i, member in enumerate(members):
                    tg.start_soon(drive, i, member)
                await wait_for(stable, timeout=25, message="20 members to settle")
                done.set()
        # Losing a compare-and-set or the mutex is allowed, and always retryable.
        assert all(e.code == "CONFLICT" and e.retryable for e in refusals), refusals[:3]

        # Read back by a third replica with empty caches: every member is there, with
        # the epoch it was last told, and the assignment is balanced and disjoint.
        async with open_service(configured, replica="c") as c:
            info = await c.group_info("g")
        assert sorted(m.member_id for m in info.members) == [m.member_id for m in members]
        assert all(m.state == "STABLE" and m.epoch == info.target_epoch for m in info.members)
        owned = [s for m in info.members for s in m.assigned]
        assert len(owned) == len(set(owned)) == shards
        sizes = {len(m.assigned) for m in info.members}
        assert sizes == {1, 2}
        for member in members:
            for grant in member.last.assigned:
                fence = await redis.get(keyspace.fence(ShardId.parse(grant.shard), "g"))
                assert fence == f"{grant.epoch}:{member.member_id}".encode()
        served = [
            r.get_sample_value(
                "streamworks_coordinator_heartbeats_total", {"path": "full", "status": "OK"}
            )
            for r in (a.metrics.registry, b.metrics.registry)
        ]
        assert all(n and n > 0 for n in served)  # both replicas committed


@pytest.mark.seed("E3")
async def test_a_commit_between_load_and_commit_makes_the_late_writer_reload(
    settings: Settings,
) -> None:
    configured = fast_settings(settings)
    async with (
        open_service(configured, replica="a") as a,
        open_service(configured, replica="b") as b,
    ):
        await a.create_stream("orders", 4)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        await settle([m1], a)
        real_load = a.store.load_group
        loads: list[int] = []

        async def load_then_b_commits(group_id: str) -> Any:
            loaded = await real_load(group_id)
            loads.append(loaded.rev)
            if len(loads) == 1:
                # Replica b commits between a's load and a's commit (as if a's mutex had
                # expired during a pause): the intruder joins through b's store.
                other = await b.store.load_group(group_id)
                streams = await b.store.load_streams(["orders"])
                topology = topology_of({n: m for n, (_, m) in streams.items() if m})
                step = heartbeat(
                    other.group, topology, join_input("intruder"), other.now_ms, b.config
                )
                rev = await b.store.commit_group(
                    other.rev,
                    step.group,
                    header_changed=step.header_changed,
                    changed=step.changed_members,
                    removed=step.removed_members,
                    now_ms=other.now_ms,
                    renew=["intruder"],
                    lease_ttl_ms=b.config.lease_ttl_ms,
                )
                assert rev is not None and rev > loaded.rev
            return loaded

        a.store.load_group = load_then_b_commits  # type: ignore[method-assign]
        response = await m2.heartbeat(a, "g")
        assert response.status is HeartbeatStatus.OK
        assert len(loads) == 2 and loads[1] > loads[0]  # a lost the CAS and reloaded
        conflicts = a.metrics.registry.get_sample_value(
            "streamworks_coordinator_cas_conflicts_total"
        )
        assert conflicts == 1
        a.store.load_group = real_load  # type: ignore[method-assign]
        info = await b.group_info("g")
        assert sorted(m.member_id for m in info.members) == ["intruder", "m1", "m2"]
        assert response.group_epoch == info.group_epoch  # m2's commit came after b's


@pytest.mark.seed("E3")
async def test_a_writer_that_keeps_losing_answers_a_retryable_conflict(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    import httpx

    configured = fast_settings(settings)
    async with (
        open_service(configured, replica="a") as a,
        open_service(configured, replica="b") as b,
    ):
        await a.create_stream("orders", 2)
        m1 = SimMember("m1", ["orders"])
        await settle([m1], a)
        real_load = a.store.load_group
        intruders = iter(range(100))

        async def load_then_b_commits(group_id: str) -> Any:
            loaded = await real_load(group_id)
            other = await b.store.load_group(group_id)
            step = heartbeat(
                other.group,
                topology_of({}),
                join_input(f"intruder{next(intruders)}", "other"),
                other.now_ms,
                b.config,
            )
            await b.store.commit_group(
                other.rev,
                step.group,
                header_changed=step.header_changed,
                changed=step.changed_members,
                removed=step.removed_members,
                now_ms=other.now_ms,
                lease_ttl_ms=b.config.lease_ttl_ms,
            )
            return loaded

        a.store.load_group = load_then_b_commits  # type: ignore[method-assign]
        m2 = SimMember("m2", ["orders"])
        error = await expect_error(m2.heartbeat(a, "g"), "CONFLICT")
        assert error.retryable and error.status == 409
        assert not await redis.exists(keyspace.group_mutex("g"))  # released
        # Over HTTP the same refusal is a 409 the client may retry.
        async with serve_api(a) as url, httpx.AsyncClient(base_url=url) as http:
            response = await http.post(
                "/v1/groups/g/heartbeat",
                content=m2.request().model_dump_json(by_alias=True),
                headers={"content-type": "application/json"},
            )
        assert response.status_code == 409, response.text
        assert response.json()["error"] == "CONFLICT" and response.json()["retryable"] is True
        a.store.load_group = real_load  # type: ignore[method-assign]
        response = await m2.heartbeat(a, "g")  # the retry succeeds
        assert response.status is HeartbeatStatus.OK and response.member_epoch > 0
        assert "m2" in {m.member_id for m in (await a.group_info("g")).members}


# -- E4: terminating ------------------------------------------------------------------------


@pytest.mark.seed("E4")
async def test_terminating_refuses_new_work_and_finishes_the_section_in_flight(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    configured = fast_settings(settings)
    async with open_service(configured) as service:
        await service.create_stream("orders", 2)
        m1, m2, m3 = (SimMember(f"m{i}", ["orders"]) for i in (1, 2, 3))
        await settle([m1], service)
        rev_before = int(await redis.hget(keyspace.group_meta("g"), "rev"))
        entered, release = anyio.Event(), anyio.Event()
        real_commit = service.store.commit_group

        async def held_commit(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            await release.wait()
            return await real_commit(*args, **kwargs)

        service.store.commit_group = held_commit  # type: ignore[method-assign]
        terminated = anyio.Event()
        loop_done = anyio.Event()
        caller = anyio.CancelScope()

        async def in_flight() -> None:
            with caller:  # the caller gives up; the section past the gate does not
                await m2.heartbeat(service, "g")

        async def terminate() -> None:
            await service.terminate()
            terminated.set()

        async def loop() -> None:
            await service.run_loop()
            loop_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(loop)
            tg.start_soon(in_flight)
            await entered.wait()
            tg.start_soon(terminate)
            await wait_for(lambda: service.terminating, message="terminating mode")
            # New critical sections are refused at the gate, retryably.
            for call in (
                m3.heartbeat(service, "g"),
                m1.heartbeat(service, "g"),
                service.create_stream("audit", 1),
            ):
                error = await expect_error(call, "COORDINATOR_TERMINATING")
                assert error.retryable and error.status == 503
            await loop_done.wait()  # the event loop stops taking work too
            assert not terminated.is_set()  # still waiting for the section in flight
            assert await redis.exists(keyspace.group_mutex("g"))
            caller.cancel()
            release.set()
            await terminated.wait()
        # The section completed its write and released the mutex.
        assert int(await redis.hget(keyspace.group_meta("g"), "rev")) > rev_before
        assert await redis.hexists(keyspace.group_meta("g"), "m:m2")
        assert not await redis.exists(keyspace.group_mutex("g"))
        assert not await redis.exists(keyspace.stream_meta("audit"))


async def test_a_no_change_heartbeat_costs_one_redis_round_trip(settings: Settings) -> None:
    """A stable member's heartbeat that changes nothing is answered from the replica's
    cached, revision-checked state with one Redis call: the lease renewal script
    (which also checks that the revisions the decision used are still current),
    followed in the same write by a ``WAIT`` where the node has replicas (the local
    cluster's masters do; the single server has none)."""
    real = create_redis(settings)
    recording = recording_redis(real)
    try:
        coordinator = CoordinatorService(recording, settings)
        await coordinator.create_stream("orders", 8)
        members = [SimMember(f"m{i}", ["orders"]) for i in range(3)]
        await settle(members, coordinator)
        for member in members:  # warm the replica's cache after the last change
            await member.heartbeat(coordinator, "g")
        recording.commands.clear()
        for _ in range(20):
            for member in members:
                response = await member.heartbeat(coordinator, "g")
                assert response.status is HeartbeatStatus.OK
                assert not response.revoke
        lease_renew = hashlib.sha1(load_script("lease_renew").encode()).hexdigest()
        renewals = [c for c in recording.commands if c[0] != "WAIT"]
        waits = len(recording.commands) - len(renewals)
        assert len(renewals) == 60, recording.commands[:10]
        assert all(c[:2] == ("EVALSHA", lease_renew) for c in renewals)
        assert waits in (0, 60)  # one WAIT per renewal, or none without replicas
    finally:
        await recording.aclose()
        await real.aclose()
