"""Long admin operations keep their exclusion for as long as they run (issue 18,
finding 7): the stream mutex expires after ``mutex_ttl``, and an unsubscribe that
outlasted it let a scale-out on another replica create the group's consumer group on
new shards; the unsubscribe then removed the group from the registry, leaving an
orphan consumer group at ``0-0`` that blocks trimming and retirement for good.

Interleavings are held in place by a hook (an event-gated wrapper of the unsubscribe's
per-batch step) and the store's mutex-contention hook, as in ``test_subscriptions.py``.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from streamworks.coordinator import provision
from streamworks.coordinator.discipline import MutexLost
from streamworks.coordinator.service import CoordinatorService
from streamworks.coordinator.store import MutexTimeout
from streamworks.protocol.control import UnsubscribeRequest
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import SimMember, beat, open_service, settle
from tests.support import wait_for

STREAM = "orders"
TTL = 0.3  # the stream and group mutexes' TTL here (s)


def short_mutexes(settings: Settings) -> Settings:
    config = fast_settings(settings)
    coordinator = config.coordinator.model_copy(update={"mutex_ttl": TTL, "mutex_wait": 10.0})
    return config.model_copy(update={"coordinator": coordinator})


async def layout(service: CoordinatorService, keyspace: Keyspace) -> list[str]:
    _, meta = await service.store.load_stream(STREAM)
    assert meta is not None
    return [keyspace.stream(ShardId.parse(s)) for s in meta.shard_ids(meta.assignable())]


async def orphans(redis: Any, keys: list[str], group: str) -> list[str]:
    """The shard keys that still carry a consumer group (or a group-set entry) of
    ``group``."""
    found = []
    for key in keys:
        names = {g["name"].decode() for g in await redis.xinfo_groups(key)}
        listed = await redis.smembers(key.removesuffix(":stream") + ":groups")
        if group in names or group.encode() in listed:
            found.append(key)
    return found


async def subscribed_then_gone(service: CoordinatorService) -> None:
    await service.create_stream(STREAM, 4)
    await settle([SimMember("m1", [STREAM])], service, "g")
    await service.heartbeat("g", beat("m1", -1))  # left: the group may be unsubscribed


@pytest.fixture
def held_destroy(monkeypatch: pytest.MonkeyPatch) -> tuple[anyio.Event, anyio.Event]:
    """Hold the unsubscribe's first batch of shards until ``release``; ``reached`` is
    set when it got there (its mutexes taken, the layout read)."""
    reached, release = anyio.Event(), anyio.Event()
    real = provision.destroy_group

    async def held(*args: Any, **kwargs: Any) -> int:
        if not reached.is_set():
            reached.set()
            await release.wait()
        return await real(*args, **kwargs)

    monkeypatch.setattr(provision, "destroy_group", held)
    return reached, release


async def test_an_unsubscribe_outlasting_the_mutex_ttl_keeps_a_scale_out_out(
    settings: Settings,
    redis: Any,
    keyspace: Keyspace,
    held_destroy: tuple[anyio.Event, anyio.Event],
) -> None:
    """The unsubscribe is held three times as long as the mutex TTL, while another
    replica asks to scale the stream out: the renewed mutex keeps the scale-out waiting
    until the unsubscribe ended, so the new shards are created without the group."""
    reached, release = held_destroy
    config = short_mutexes(settings)
    async with open_service(config, replica="a") as a, open_service(config, replica="b") as b:
        await subscribed_then_gone(a)
        mutex = keyspace.stream_mutex(STREAM)
        contended: list[float] = []
        b.store.on_contended = lambda key: (
            contended.append(time.monotonic()) if key == mutex else None
        )
        scaled = anyio.Event()
        refused: list[BaseException] = []

        async def scale_out() -> None:
            try:
                await b.scale_stream(STREAM, 6)
            except MutexTimeout as e:
                refused.append(e)
            scaled.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(a.unsubscribe, UnsubscribeRequest(group="g", stream=STREAM, confirm=True))
            await reached.wait()
            held_since = time.monotonic()
            tg.start_soon(scale_out)
            # Until the scale-out ran (the bug: the mutex expired under the unsubscribe),
            # or it is still kept out three TTLs later.
            await wait_for(
                lambda: scaled.is_set() or any(t > held_since + 3 * TTL for t in contended),
                timeout=10,
                message="the scale-out to run, or to be kept out past three mutex TTLs",
            )
            kept_out = not scaled.is_set()
            release.set()
        if refused:  # it gave up waiting: scale now, after the unsubscribe
            await b.scale_stream(STREAM, 6)
        keys = await layout(b, keyspace)
        assert len(keys) == 6
        assert await orphans(redis, keys, "g") == [], "an orphan consumer group"
        assert "g" not in await b.store.subscribed_groups(STREAM)
        assert kept_out, "the scale-out ran inside the unsubscribe"


async def test_an_unsubscribe_that_lost_its_mutex_stops_and_can_be_retried(
    settings: Settings,
    redis: Any,
    keyspace: Keyspace,
    held_destroy: tuple[anyio.Event, anyio.Event],
) -> None:
    """The stream mutex expires under the unsubscribe anyway (a pause longer than the
    TTL: here its key is deleted, as expiry would), and another replica scales out
    meanwhile, creating the group on the new shards (it is still subscribed). The
    unsubscribe notices before its next step and stops with a retryable CONFLICT,
    the group still subscribed; retried, it removes the group everywhere."""
    reached, release = held_destroy
    config = short_mutexes(settings)
    async with open_service(config, replica="a") as a, open_service(config, replica="b") as b:
        await subscribed_then_gone(a)
        request = UnsubscribeRequest(group="g", stream=STREAM, confirm=True)
        failed: list[BaseException] = []

        async def unsubscribe() -> None:
            try:
                await a.unsubscribe(request)
            except MutexLost as e:
                failed.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(unsubscribe)
            await reached.wait()
            await redis.delete(keyspace.stream_mutex(STREAM))  # expired during a pause
            await b.scale_stream(STREAM, 6)  # takes the stream mutex, creates 2 shards
            release.set()
        keys = await layout(b, keyspace)
        assert len(keys) == 6
        assert [e.code for e in failed] == ["CONFLICT"], "the unsubscribe ran on"
        assert failed[0].retryable
        assert "g" in await b.store.subscribed_groups(STREAM)  # still subscribed: consistent
        await a.unsubscribe(request)  # the operator's retry
        assert await orphans(redis, keys, "g") == []
        assert "g" not in await b.store.subscribed_groups(STREAM)
