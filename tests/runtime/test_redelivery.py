"""Replaying a dead letter reaches only the group whose DLQ it is (issue 12 item 4):
it goes to that group's redelivery stream of the key's shard, the shard's owner
handles it with the same handler, and no other group on the stream sees it again.
The replay is the library's (``streamworks.dlq``, what the CLI and the dashboard
call), routed by the in-process coordinator."""

from __future__ import annotations

from typing import Any

import pytest

from streamworks import App, Message, RetryPolicy
from streamworks.dlq import DeadLetters, Replayed, Selection
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from tests.support import wait_for


def two_groups(broken: set[int]) -> tuple[App, App, list[tuple[int, str, int]], list[int]]:
    """Group ``ga`` fails (once, no retry) on the values in ``broken``; ``gb`` never."""
    app_a, app_b = App("ga"), App("gb")
    for app in (app_a, app_b):
        app.stream("orders", shards=2)
    seen_a: list[tuple[int, str, int]] = []
    seen_b: list[int] = []

    @app_a.handler("orders", retry=RetryPolicy(max_attempts=1))
    async def handle_a(value: dict[str, int], msg: Message) -> None:
        if value["n"] in broken:
            raise RuntimeError(f"cannot handle {value['n']}")
        seen_a.append((value["n"], msg.shard, msg.attempt))

    @app_b.handler("orders")
    async def handle_b(value: dict[str, int]) -> None:
        seen_b.append(value["n"])

    return app_a, app_b, seen_a, seen_b


@pytest.mark.cluster
async def test_replay_reaches_only_the_dead_letters_group(
    settings: Settings, redis: Any, streamworks_redis_url: str
) -> None:
    broken = {1}
    app_a, app_b, seen_a, seen_b = two_groups(broken)
    url, prefix = streamworks_redis_url, settings.key_prefix
    keyspace = Keyspace(prefix)
    async with (
        TestRuntime(app_a, workers=1, redis_url=url, key_prefix=prefix) as rt_a,
        TestRuntime(app_b, workers=1, redis_url=url, key_prefix=prefix, attach=False) as rt_b,
    ):
        published = [await app_a.publish("orders", {"n": n}, key=f"k{n}") for n in range(3)]
        await wait_for(lambda: sorted(seen_b) == [0, 1, 2], 10, "group gb to handle all")
        dlq_key = keyspace.dead_letters("ga", "orders")
        await wait_for(lambda: _xlen(redis, dlq_key, 1), 10, "ga's dead letter")
        [(dlq_id, _)] = await redis.xrange(dlq_key)

        broken.clear()  # the bug is fixed; replay it
        result = await replay(rt_a, redis, keyspace, dlq_id)
        assert result.shard == published[1].shard  # the key's shard: per-key order holds
        await wait_for(lambda: (1, published[1].shard, 1) in seen_a, 10, "ga to handle it")

        # gb reads past anything published since: had the replay gone to the stream,
        # gb would have handled 1 again by the time it handles 3.
        await app_a.publish("orders", {"n": 3}, key="k1")
        await wait_for(lambda: 3 in seen_b, 10, "gb to handle the next message")
        assert sorted(seen_b) == [0, 1, 2, 3]
        # The two groups read independently: ga may handle 3 a little later than gb.
        await wait_for(lambda: any(n == 3 for n, _, _ in seen_a), 10, "ga to handle 3")
        assert sorted(n for n, _, _ in seen_a) == [0, 1, 2, 3]
        # Acked redelivered entries are deleted from the group's private stream, and the
        # stream, empty, is removed: nobody reads it any more.
        shard = ShardId.parse(result.shard)
        redelivery = keyspace.redelivery(shard, "ga")
        await wait_for(lambda: _gone(redis, redelivery), 10, "the redelivery stream removed")
        assert rt_a.workers[0].redelivery.readers == {}
        assert not await redis.exists(keyspace.redelivery(shard, "gb"))
        assert rt_b.statistics("orders")["handled"] == 4
        # A later replay to the same shard creates it again, and is handled.
        broken.add(4)
        await app_a.publish("orders", {"n": 4}, key="k1")
        await wait_for(lambda: _xlen(redis, dlq_key, 1), 10, "another dead letter")
        [(dlq_id, _)] = await redis.xrange(dlq_key)
        broken.clear()
        again = await replay(rt_a, redis, keyspace, dlq_id)
        assert again.shard == result.shard
        await wait_for(lambda: any(n == 4 for n, _, _ in seen_a), 10, "the second replay")
        await wait_for(lambda: _gone(redis, redelivery), 10, "removed again")


async def test_a_replayed_message_that_fails_again_is_dead_lettered_again(
    settings: Settings, redis: Any, streamworks_redis_url: str
) -> None:
    app_a, _, seen_a, _ = two_groups({7})
    keyspace = Keyspace(settings.key_prefix)
    async with TestRuntime(
        app_a, workers=2, redis_url=streamworks_redis_url, key_prefix=settings.key_prefix
    ) as rt:
        await app_a.publish("orders", {"n": 7}, key="seven")
        dlq_key = keyspace.dead_letters("ga", "orders")
        await wait_for(lambda: _xlen(redis, dlq_key, 1), 10, "the dead letter")
        [(first_id, fields)] = await redis.xrange(dlq_key)
        result = await replay(rt, redis, keyspace, first_id)  # removed from the DLQ
        await wait_for(lambda: _xlen(redis, dlq_key, 1), 10, "the second dead letter")
        [(_, again)] = await redis.xrange(dlq_key)
        assert again[b"o.v"] == fields[b"o.v"] and again[b"o.k"] == b"seven"
        assert again[b"shard"] == result.shard.encode()
        assert again[b"reason"] == b"max_attempts"
        assert seen_a == []
        shard = ShardId.parse(result.shard)
        # Of the two members, the one that handled it owns the shard (fenced read).
        fence = (await redis.get(keyspace.fence(shard, "ga"))).decode()
        assert fence.split(":", 1)[1] == again[b"member"].decode()
        await wait_for(lambda: _gone(redis, keyspace.redelivery(shard, "ga")), 10, "removed")


async def replay(rt: TestRuntime, redis: Any, keyspace: Keyspace, dlq_id: bytes) -> Replayed:
    """Replay one dead letter of group ``ga`` for ``orders`` as the CLI does."""
    assert rt.service is not None
    dead_letters = DeadLetters(redis, keyspace, routing=rt.service)
    done = await dead_letters.replay("ga", "orders", Selection.of(ids=[dlq_id.decode()]))
    assert not done.kept
    [replayed] = done.replayed
    return replayed


async def _xlen(redis: Any, key: str, n: int) -> bool:
    return bool(await redis.xlen(key) == n)


async def _gone(redis: Any, key: str) -> bool:
    return not await redis.exists(key)


async def test_replay_of_a_message_from_a_retired_shard_follows_its_key(
    settings: Settings, redis: Any, streamworks_redis_url: str
) -> None:
    """The origin shard was scaled in: the dead letter goes, by its key and the current
    routing, to the live shard that key now routes to (never a raw add to the stream)."""
    broken = {5}
    app_a, _, seen_a, _ = two_groups(broken)
    keyspace = Keyspace(settings.key_prefix)
    async with TestRuntime(
        app_a, workers=1, redis_url=streamworks_redis_url, key_prefix=settings.key_prefix
    ) as rt:
        dlq_id = await _dead_letter_on_shard_1(rt, app_a, redis, keyspace)
        await rt.scale("orders", 1)
        assert not await redis.exists(keyspace.stream(ShardId("orders", 1, 0)))
        broken.clear()
        result = await replay(rt, redis, keyspace, dlq_id)
        assert result.shard == "orders/0@0"
        # Handled by shard 0's owner, as a message of shard 0 (its lane, its retries).
        await wait_for(lambda: (5, "orders/0@0", 1) in seen_a, 10, "ga to handle it")
        assert not await redis.exists(keyspace.redelivery(ShardId("orders", 1, 0), "ga"))


async def _dead_letter_on_shard_1(
    rt: TestRuntime, app: App, redis: Any, keyspace: Keyspace
) -> bytes:
    """Publish the broken value 5 under a key that routes to shard 1 of 2 (and so to
    shard 0 once there is one shard); return its dead letter's id."""
    key = next(k for k in (f"key{i}" for i in range(100)) if _shard_of(rt, k) == 1)
    await app.publish("orders", {"n": 5}, key=key)
    dlq_key = keyspace.dead_letters("ga", "orders")
    await wait_for(lambda: _xlen(redis, dlq_key, 1), 10, "the dead letter")
    [(dlq_id, fields)] = await redis.xrange(dlq_key)
    assert fields[b"shard"] == b"orders/1@0"
    return bytes(dlq_id)


def _shard_of(rt: TestRuntime, key: str) -> int:
    from streamworks.protocol.routing import jump_hash, key_hash

    return jump_hash(key_hash(key), 2)


async def test_a_replayed_dead_letter_on_a_draining_shard_keeps_it_until_handled(
    settings: Settings, redis: Any, streamworks_redis_url: str
) -> None:
    """A replay lands on a shard that a scale-in then removes while no member of the
    group runs: the shard is drained of its own entries, but the replayed dead letter
    waits in its redelivery stream, so the shard is not retired (that would delete it
    unhandled) until a member comes back, owns the draining shard and handles it."""
    broken = {5}
    app_a, _, seen_a, _ = two_groups(broken)
    keyspace = Keyspace(settings.key_prefix)
    removed = ShardId("orders", 1, 0)
    async with TestRuntime(
        app_a, workers=1, redis_url=streamworks_redis_url, key_prefix=settings.key_prefix
    ) as rt:
        dlq_id = await _dead_letter_on_shard_1(rt, app_a, redis, keyspace)
        await rt.stop_worker(0)  # nobody of group ga runs from here on
        broken.clear()
        result = await replay(rt, redis, keyspace, dlq_id)
        assert result.shard == str(removed)

        await rt.scale("orders", 1, wait=False)
        assert rt.service is not None
        service = rt.service

        async def blocked_by_the_replay() -> bool:
            await rt.advance(1.0)  # towards the routing fence (a routing lease later)
            info = await service.stream_info("orders")
            blocked = str((info.migration or {}).get("blocked", ""))
            return "replayed dead letter" in blocked

        await wait_for(blocked_by_the_replay, 20, "the replay to block the shard's retirement")
        assert await redis.exists(keyspace.stream(removed))
        assert seen_a == []

        await rt.add_worker(wait=False)
        await wait_for(lambda: (5, str(removed), 1) in seen_a, 20, "ga to handle the replay")

        async def retired() -> bool:
            info = await service.stream_info("orders")
            return not any(s.state == "DRAINING" for s in info.shards)

        await wait_for(retired, 20, "the drained shard to retire")
        assert not await redis.exists(keyspace.stream(removed), keyspace.redelivery(removed, "ga"))
