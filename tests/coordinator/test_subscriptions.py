"""Subscriptions through the real coordinator service (issue 10, parts 2 and 3): a group
that joins before its stream exists is created with the stream; an unsubscribe is seen
by every replica and is serialized with a scale-out of the stream. Interleavings are
held in place by hooks (an event-gated wrapper, the store's mutex-contention hook),
never by sleeps."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streamworks import App, Record
from streamworks.coordinator import provision
from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.control import HeartbeatStatus, UnsubscribeRequest
from streamworks.protocol.local import LocalTransport
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.runtime.connection import open_connection
from streamworks.runtime.membership import CoordinatorAssignment
from streamworks.runtime.worker import Worker
from streamworks.settings import Settings
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import SimMember, beat, open_service, settle
from tests.support import wait_for

STREAM = "orders"


async def shard_keys(service: CoordinatorService, keyspace: Keyspace) -> list[str]:
    _, meta = await service.store.load_stream(STREAM)
    assert meta is not None
    return [keyspace.stream(ShardId.parse(s)) for s in meta.shard_ids(meta.assignable())]


async def groups_on(redis: Any, key: str) -> set[str]:
    return {g["name"].decode() for g in await redis.xinfo_groups(key)}


async def consume_all(redis: Any, key: str, group: str) -> list[bytes]:
    """Read and ack everything (as a worker of ``group`` would)."""
    got: list[bytes] = []
    while reply := await redis.xreadgroup(group, "c", {key: ">"}, count=100):
        ids = [i for i, _ in reply[0][1]]
        await redis.xack(key, group, *ids)
        got += ids
    return got


async def test_a_group_that_joins_before_its_stream_exists_is_created_with_it(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    async with open_service(fast_settings(settings)) as service:
        late = SimMember("l1", [STREAM])
        response = await late.heartbeat(service, "late")
        assert response.status is HeartbeatStatus.OK and response.assigned == []
        assert await service.store.subscribed_groups(STREAM) == {"late"}  # the intent

        await service.create_stream(STREAM, 2)
        keys = await shard_keys(service, keyspace)
        for key in keys:
            assert await groups_on(redis, key) == {"late"}, "created with the stream"

        # Another group consumes everything and trims: nothing the late group has not
        # read is trimmed, because its consumer group exists from the first entry on.
        await settle([SimMember("e1", [STREAM])], service, "early")
        published = {key: [await redis.xadd(key, {"n": str(n)}) for n in range(20)] for key in keys}
        for key in keys:
            assert await consume_all(redis, key, "early") == published[key]
            shard = keyspace.shard_of(key)
            trim_keys = [key, keyspace.shard_groups(shard)]
            await service.store.scripts.trim(keys=trim_keys, args=[""])
            assert await redis.xlen(key) == 20

        await settle([late], service, "late")
        assert sorted(late.owned) == sorted(str(keyspace.shard_of(k)) for k in keys)
        for key in keys:
            assert await consume_all(redis, key, "late") == published[key]


async def test_a_worker_deployed_before_its_stream_exists_handles_every_entry(
    settings: Settings, redis: Any
) -> None:
    """A rolling deploy that adds a handler before ``streams create``: the worker joins
    naming a stream that does not exist; the stream is created later (here by a
    producer's declaration) and everything published to it at once is handled, even
    with ``start="latest"``: the group joined before any of it."""
    config = fast_settings(settings)
    consumer = App("late")
    consumer.stream(STREAM, shards=2, start="latest")
    handled: list[int] = []

    @consumer.handler(STREAM)
    async def handle(value: dict[str, int]) -> None:
        handled.append(value["n"])

    producer = App("producer")
    producer.stream(STREAM, shards=2)
    async with open_service(config) as service, anyio.create_task_group() as tg:
        transport = LocalTransport(service)
        tg.start_soon(service.run_loop)
        worker = Worker(consumer, redis, CoordinatorAssignment(transport, config), settings=config)
        await tg.start(worker.run)

        async def registered() -> bool:
            return "late" in await service.store.subscribed_groups(STREAM)

        await wait_for(registered, message="the subscription to be recorded")
        assert await service.store.load_stream(STREAM) == (0, None)
        async with (
            open_connection(producer, config, redis=redis, coordinator=transport) as conn,
            producer.attached(conn),
        ):
            await producer.publish_many(STREAM, [Record({"n": i}, key=str(i)) for i in range(50)])
            await wait_for(lambda: sorted(handled) == list(range(50)), message="all handled")
        worker.request_stop()
        await worker.stopped.wait()
        tg.cancel_scope.cancel()


async def test_a_resubscribe_through_another_replica_recreates_the_group(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    config = fast_settings(settings)
    async with (
        open_service(config, replica="a") as a,
        open_service(config, replica="b") as b,
    ):
        await a.create_stream(STREAM, 2)
        first = SimMember("m1", [STREAM])
        await settle([first], b, "g")  # b checked the group's consumer groups
        await b.heartbeat("g", beat("m1", -1))  # the member leaves
        await a.unsubscribe(UnsubscribeRequest(group="g", stream=STREAM, confirm=True))
        keys = await shard_keys(a, keyspace)
        for key in keys:
            assert await groups_on(redis, key) == set()

        # The handler is deployed again; its member joins through replica b.
        again = SimMember("m2", [STREAM])
        await settle([again], b, "g")
        assert await b.store.subscribed_groups(STREAM) == {"g"}
        for key in keys:
            assert await groups_on(redis, key) == {"g"}
            ids = [await redis.xadd(key, {"n": str(n)}) for n in range(5)]
            assert await consume_all(redis, key, "g") == ids


async def test_an_unsubscribe_is_serialized_with_a_scale_out(
    settings: Settings, redis: Any, keyspace: Keyspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = fast_settings(settings)
    async with (
        open_service(config, replica="a") as a,
        open_service(config, replica="b") as b,
    ):
        await a.create_stream(STREAM, 1)
        await settle([SimMember("m1", [STREAM])], a, "g")
        await a.heartbeat("g", beat("m1", -1))

        # Hold the unsubscribe after it read the layout, before it removes anything.
        reached, release = anyio.Event(), anyio.Event()
        real_destroy = provision.destroy_group

        async def held_destroy(*args: Any, **kwargs: Any) -> bool:
            reached.set()
            await release.wait()
            return await real_destroy(*args, **kwargs)

        monkeypatch.setattr(provision, "destroy_group", held_destroy)
        # The scale-out, on the other replica, either finds the stream's mutex taken or
        # (without serialization) runs to its end: whichever comes first ends the hold.
        contended, ended = anyio.Event(), anyio.Event()
        mutex = keyspace.stream_mutex(STREAM)

        def on_contended(key: str) -> None:
            if key == mutex:
                contended.set()
                ended.set()

        b.store.on_contended = on_contended

        async def scale_out() -> None:
            await b.scale_stream(STREAM, 3)
            ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(a.unsubscribe, UnsubscribeRequest(group="g", stream=STREAM, confirm=True))
            await reached.wait()
            tg.start_soon(scale_out)
            await ended.wait()
            release.set()

        keys = await shard_keys(b, keyspace)
        assert len(keys) == 3
        orphans = {key: await groups_on(redis, key) for key in keys}
        assert orphans == {key: set() for key in keys}, "an orphan consumer group"
        assert contended.is_set(), "the scale-out ran inside the unsubscribe"
        assert "g" not in await b.store.subscribed_groups(STREAM)


async def test_shards_left_provisional_by_a_crash_are_confirmed_by_the_event_loop(
    settings: Settings, redis: Any, keyspace: Keyspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that dies between a creation's commit and its confirmation of the
    shards' group sets leaves trimming refused; any replica's event loop confirms them."""
    async with open_service(fast_settings(settings)) as service:

        async def dies(*args: Any, **kwargs: Any) -> list[ShardId]:
            raise ConnectionError("the replica died here")

        monkeypatch.setattr(provision, "record_shard_groups", dies)
        await settle([SimMember("l1", [STREAM])], service, "late")  # joins first
        with pytest.raises(ConnectionError):
            await service.create_stream(STREAM, 1)
        monkeypatch.undo()
        [key] = await shard_keys(service, keyspace)
        shard = keyspace.shard_of(key)
        trim_keys = [key, keyspace.shard_groups(shard)]
        await redis.xadd(key, {"n": "1"})
        assert await service.store.scripts.trim(keys=trim_keys, args=[""]) == -4  # unsealed

        await service.tick_streams()
        assert await redis.smembers(keyspace.shard_groups(shard)) == {b"late"}
        assert await consume_all(redis, key, "late")
        assert await service.store.scripts.trim(keys=trim_keys, args=[""]) == 1
