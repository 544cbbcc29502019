"""Group commit (``coordinator/batching.py``): the heartbeats of a group that queue up
behind its critical section are decided together — one load, the core's step for each
request in turn, one commit, one fence pipeline — and each is answered as if it had
had the section to itself.

Every test queues its requests deterministically: it holds the group's local lock
(what a critical section in progress holds), starts the heartbeats, waits until all of
them are queued, and lets go. Commits are counted in Redis (the group's changelog gets
one entry per commit) and critical sections by the batch-size histogram.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

from streamworks.coordinator.core import HeartbeatInput, heartbeat
from streamworks.coordinator.core.streams import topology_of
from streamworks.coordinator.service import CoordinatorService
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import HeartbeatResponse, HeartbeatStatus
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import SimMember, beat, open_service, settle
from tests.support import wait_for

Outcome = HeartbeatResponse | CoordinatorError


@contextlib.asynccontextmanager
async def queued_behind_a_section(
    service: CoordinatorService, group: str = "g"
) -> AsyncIterator[Callable[[list[Callable[[], Awaitable[HeartbeatResponse]]]], Any]]:
    """Yields ``run(calls)``: starts every call while the group's section is held, waits
    until all of them are queued, lets the section go and returns their outcomes."""
    lock = service.discipline.lock(service.keyspace.group_mutex(group))

    async def run(calls: list[Callable[[], Awaitable[HeartbeatResponse]]]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(calls)

        async def one(i: int) -> None:
            try:
                outcomes[i] = await calls[i]()
            except CoordinatorError as e:
                outcomes[i] = e

        async with anyio.create_task_group() as tg, lock:  # a critical section in progress
            for i in range(len(calls)):
                tg.start_soon(one, i)
            await wait_for(
                lambda: service.heartbeats.batches.queued(group) == len(calls),
                message=f"{len(calls)} heartbeats queued",
            )
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None]

    yield run


def sections(service: CoordinatorService) -> tuple[float, float]:
    """(critical sections heartbeats took, heartbeats they served) so far."""
    registry = service.metrics.registry
    name = "streamworks_coordinator_heartbeat_batch_size"
    count = registry.get_sample_value(f"{name}_count") or 0.0
    total = registry.get_sample_value(f"{name}_sum") or 0.0
    return count, total


async def commits(redis: Any, keyspace: Keyspace, group: str = "g") -> int:
    return int(await redis.llen(keyspace.group_changes(group)))


def responses(outcomes: list[Outcome]) -> list[HeartbeatResponse]:
    assert all(isinstance(o, HeartbeatResponse) for o in outcomes), outcomes
    return [o for o in outcomes if isinstance(o, HeartbeatResponse)]


async def assert_consistent(
    service: CoordinatorService, redis: Any, keyspace: Keyspace, members: list[SimMember]
) -> None:
    """What every member was told is what Redis records, and every grant is fenced."""
    info = await service.group_info("g")
    recorded = {m.member_id: m for m in info.members}
    for member in members:
        answer = member.last
        assert answer.status is HeartbeatStatus.OK
        assert recorded[member.member_id].epoch == answer.member_epoch
        assert {g.shard for g in answer.assigned} == set(recorded[member.member_id].assigned)
        for grant in answer.assigned:
            fence = await redis.get(keyspace.fence(ShardId.parse(grant.shard), "g"))
            assert fence == f"{grant.epoch}:{member.member_id}".encode()
    owned = [s for m in info.members for s in m.assigned]
    assert len(owned) == len(set(owned))


async def test_concurrent_changing_heartbeats_commit_once_and_are_each_answered(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream("orders", 16)
        old = [SimMember(f"m{i}", ["orders"]) for i in range(4)]
        await settle(old, service)
        new = [SimMember(f"n{i}", ["orders"]) for i in range(12)]
        commits_before, (sections_before, served_before) = (
            await commits(redis, keyspace),
            sections(service),
        )
        async with queued_behind_a_section(service) as run:
            outcomes = await run([lambda m=m: m.heartbeat(service, "g") for m in new])
        answers = responses(outcomes)
        # Twelve joins, one critical section, one commit.
        assert await commits(redis, keyspace) == commits_before + 1
        assert sections(service) == (sections_before + 1, served_before + 12)
        # Each join is answered on its own step: a member of the group at the epoch
        # the steps reached, the later joins seeing the earlier ones.
        assert all(a.status is HeartbeatStatus.OK and a.member_epoch > 0 for a in answers)
        assert [a.group_epoch for a in answers] == sorted(a.group_epoch for a in answers)
        info = await service.group_info("g")
        assert sorted(m.member_id for m in info.members) == sorted(m.member_id for m in old + new)
        assert {m.member_id: m.epoch for m in info.members if m.member_id.startswith("n")} == {
            m.member_id: m.epoch for m in new
        }
        assert await redis.zcard(keyspace.group_leases("g")) == 16  # every lease set
        # The group then settles as ever: what members hold is what Redis records.
        await settle(old + new, service)
        await assert_consistent(service, redis, keyspace, old + new)
        assert {len(m.owned) for m in old + new} == {1}


async def test_one_invalid_request_fails_only_itself(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream("orders", 8)
        old = SimMember("m0", ["orders"])
        await settle([old], service)
        new = [SimMember(f"n{i}", ["orders"]) for i in range(4)]
        invalid = beat("bad", 0, subscriptions=["orders"], owned=["orders/0@0"])  # a join owning
        calls: list[Callable[[], Awaitable[HeartbeatResponse]]] = [
            lambda m=m: m.heartbeat(service, "g") for m in new
        ]
        calls.insert(2, lambda: service.heartbeat("g", invalid))
        before = await commits(redis, keyspace)
        async with queued_behind_a_section(service) as run:
            outcomes = await run(calls)
        refused = outcomes.pop(2)
        assert isinstance(refused, CoordinatorError) and refused.code == "INVALID_REQUEST"
        assert all(a.status is HeartbeatStatus.OK for a in responses(outcomes))
        assert await commits(redis, keyspace) == before + 1
        info = await service.group_info("g")
        assert sorted(m.member_id for m in info.members) == ["m0", "n0", "n1", "n2", "n3"]


@pytest.mark.seed("E3")
async def test_a_lost_compare_and_set_retries_the_whole_batch(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    configured = fast_settings(settings)
    async with (
        open_service(configured, replica="a") as a,
        open_service(configured, replica="b") as b,
    ):
        await a.create_stream("orders", 8)
        old = SimMember("m0", ["orders"])
        await settle([old], a)
        real_load = a.store.load_group
        loads: list[int] = []

        async def load_then_b_commits(group_id: str) -> Any:
            loaded = await real_load(group_id)
            loads.append(loaded.rev)
            if len(loads) == 1:
                # Replica b commits between a's load and a's commit of the batch.
                other = await b.store.load_group(group_id)
                streams = await b.store.load_streams(["orders"])
                topology = topology_of({n: m for n, (_, m) in streams.items() if m})
                step = heartbeat(
                    other.group,
                    topology,
                    HeartbeatInput("intruder", 0, 0, subscriptions=frozenset({"orders"})),
                    other.now_ms,
                    b.config,
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
                assert rev is not None
            return loaded

        a.store.load_group = load_then_b_commits  # type: ignore[method-assign]
        new = [SimMember(f"n{i}", ["orders"]) for i in range(5)]
        async with queued_behind_a_section(a) as run:
            outcomes = await run([lambda m=m: m.heartbeat(a, "g") for m in new])
        a.store.load_group = real_load  # type: ignore[method-assign]
        answers = responses(outcomes)
        assert len(loads) == 2 and loads[1] > loads[0]  # lost once, reloaded once
        assert (
            a.metrics.registry.get_sample_value("streamworks_coordinator_cas_conflicts_total") == 1
        )
        assert sections(a)[0] == 1 + 1  # m0's join, then the one batch (retried inside)
        # Everyone's answer comes from the retry, on top of the intruder's join.
        info = await b.group_info("g")
        assert sorted(m.member_id for m in info.members) == [
            "intruder",
            "m0",
            "n0",
            "n1",
            "n2",
            "n3",
            "n4",
        ]
        recorded = {m.member_id: m for m in info.members}
        for member, answer in zip(new, answers, strict=True):
            assert answer.status is HeartbeatStatus.OK
            assert recorded[member.member_id].epoch == answer.member_epoch
        assert answers[-1].group_epoch == info.group_epoch
        # The intruder's member (it joined through b) heartbeats from here on too.
        intruder = SimMember("intruder", ["orders"])
        intruder.epoch, intruder.version = recorded["intruder"].epoch, info.metadata_version
        intruder.owned = set(recorded["intruder"].assigned)
        await settle([old, intruder, *new], a)
        await assert_consistent(a, redis, keyspace, [old, intruder, *new])


@pytest.mark.seed("E4")
async def test_a_terminating_replica_refuses_the_queued_heartbeats(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream("orders", 4)
        old = SimMember("m0", ["orders"])
        await settle([old], service)
        meta_before = await redis.hgetall(keyspace.group_meta("g"))
        new = [SimMember(f"n{i}", ["orders"]) for i in range(3)]
        calls: list[Callable[[], Awaitable[HeartbeatResponse]]] = [
            lambda m=m: m.heartbeat(service, "g") for m in new
        ]
        lock = service.discipline.lock(service.keyspace.group_mutex("g"))
        outcomes: list[Outcome] = []

        async def one(call: Callable[[], Awaitable[HeartbeatResponse]]) -> None:
            try:
                outcomes.append(await call())
            except CoordinatorError as e:
                outcomes.append(e)

        async with anyio.create_task_group() as tg, lock:
            for call in calls:
                tg.start_soon(one, call)
            await wait_for(lambda: service.heartbeats.batches.queued("g") == 3, message="3 queued")
            await service.terminate()  # nothing in flight: the queued never started
        assert len(outcomes) == 3
        for outcome in outcomes:
            assert isinstance(outcome, CoordinatorError), outcome
            assert outcome.code == "COORDINATOR_TERMINATING" and outcome.retryable
        assert await redis.hgetall(keyspace.group_meta("g")) == meta_before
        assert not await redis.exists(keyspace.group_mutex("g"))


async def test_a_batch_is_bounded_and_the_rest_is_served_by_the_next_holder(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        service.heartbeats.batches.max_batch = 2
        await service.create_stream("orders", 8)
        new = [SimMember(f"n{i}", ["orders"]) for i in range(5)]
        async with queued_behind_a_section(service) as run:
            outcomes = await run([lambda m=m: m.heartbeat(service, "g") for m in new])
        assert all(a.status is HeartbeatStatus.OK for a in responses(outcomes))
        assert sections(service) == (3, 5)  # 2 + 2 + 1
        assert await commits(redis, keyspace) == 3
        await settle(new, service)
        await assert_consistent(service, redis, keyspace, new)


async def test_a_caller_that_gives_up_while_queued_leaves_the_queue_unstarted(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream("orders", 4)
        lock = service.discipline.lock(service.keyspace.group_mutex("g"))
        quitter, stayer = SimMember("quitter", ["orders"]), SimMember("stayer", ["orders"])
        answers: list[HeartbeatResponse] = []
        gave_up = anyio.CancelScope()

        async def quit_() -> None:
            with gave_up:
                await quitter.heartbeat(service, "g")

        async def stay() -> None:
            answers.append(await stayer.heartbeat(service, "g"))

        async with anyio.create_task_group() as tg, lock:
            tg.start_soon(quit_)
            await wait_for(lambda: service.heartbeats.batches.queued("g") == 1)
            tg.start_soon(stay)
            await wait_for(lambda: service.heartbeats.batches.queued("g") == 2)
            gave_up.cancel()
            await wait_for(lambda: service.heartbeats.batches.queued("g") == 1)
        assert [a.status for a in answers] == [HeartbeatStatus.OK]
        info = await service.group_info("g")
        assert [m.member_id for m in info.members] == ["stayer"]
        assert sections(service) == (1, 1)
