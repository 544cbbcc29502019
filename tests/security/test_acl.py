"""Least-privilege Redis ACLs (docs/security.md): every role runs every one of its code
paths with only what ``streamworks.redis.acl`` grants it, and is refused the rest.

The strongest check is the server's own: ``ACL LOG`` records every command a user was
refused, however the code that sent it handled the refusal (retried, fell back, logged
at DEBUG...). ``TestRuntime(acl=True)`` reads it for its users at exit and fails on any
entry; the tests here also fail on a permission error logged at WARNING or above.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from redis.exceptions import NoPermissionError

from streamworks import App, Record, RetryPolicy
from streamworks.coordinator import provision
from streamworks.dlq import DeadLetters, Selection
from streamworks.exceptions import PublishNotDurableError
from streamworks.protocol.control import UnsubscribeRequest
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import ReadStatus, Scripts
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from streamworks.testing.acl import open_role_users
from streamworks.testing.runtime import fast_settings
from tests.support import wait_for

pytestmark = pytest.mark.cluster  # also on a Redis Cluster: users on every node

_REFUSED = ("NOPERM", "no permissions", "ACL failure", "can't run this command", "can't access")


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and any(m in r.getMessage() for m in _REFUSED)
    ]


@pytest.mark.seed("E24")
async def test_every_path_of_every_role_runs_as_its_user(
    streamworks_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Publish (plain, idempotent, durable), consume with the fenced read, retry,
    dead-letter, replay a dead letter (read from the redelivery stream, acked and
    removed), idempotency, ack-delete trimming, lag gauges, status with dead-letter
    counts, scale out, scale in with drain and retirement, unsubscribe: the worker,
    producer and coordinator as their ACL users, and Redis refuses them nothing."""
    caplog.set_level(logging.WARNING)
    app = App("billing")
    app.stream("orders", shards=2, delete_on_ack=True, dedup_window=60)
    handled: list[int] = []
    poison = {7}
    flaky = {3}

    @app.handler(
        "orders",
        retry=RetryPolicy(max_attempts=2, backoff=0.01),
        idempotency_key=lambda v, c: f"{v['n']}-{len(handled)}",
    )
    async def handle(value: dict[str, int]) -> None:
        n = value["n"]
        if n in poison:
            raise RuntimeError("dead-letter me")
        if n in flaky:
            flaky.discard(n)
            raise RuntimeError("retry me")
        handled.append(n)

    async with TestRuntime(
        app, workers=1, redis_url=streamworks_redis_url, settings=fast_settings(), acl=True
    ) as rt:
        assert rt.service is not None and rt.connection is not None
        await app.publish_many(
            "orders", [Record({"n": i}, key=str(i), event_id=f"e{i}") for i in range(20)]
        )
        await app.publish("orders", {"n": 0}, key="0", event_id="e0")  # a duplicate: skipped
        await wait_for(lambda: len(handled) == 19, message="19 handled")

        async def dead_lettered() -> bool:
            return len(await rt.dead_letters("orders")) == 1

        await wait_for(dead_lettered, message="1 dead-lettered")
        [dead] = await rt.dead_letters("orders")
        assert dead.attempts == 2
        # Replay it (an operator's `dlq replay`, as the default user) to the group only:
        # the worker reads it from the redelivery stream, handles it, acks and removes it.
        poison.clear()
        operator = DeadLetters(rt.redis, rt.keyspace, routing=rt.service)
        done = await operator.replay("billing", "orders", Selection.of(ids=[dead.entry_id]))
        assert len(done.replayed) == 1, done
        await wait_for(lambda: handled.count(7) == 1, message="the replayed dead letter handled")
        try:  # durable publishing: WAIT (no replica on a single server: not durable)
            await app.publish("orders", {"n": 100}, key="100", min_replicas=1, replica_timeout=0.05)
        except PublishNotDurableError:
            pass
        await wait_for(lambda: 100 in handled, message="the durable publish handled")
        await rt.workers[0].metrics.exposition()  # lag and pending gauges (XINFO GROUPS)
        status = await rt.service.status()
        assert status.streams
        # (the replay took it off the dead-letter stream)
        assert await rt.service.store.dead_letter_lengths([("billing", "orders")]) == {
            ("billing", "orders"): 0
        }
        await rt.scale("orders", 3)  # scale-out: shards and consumer groups created
        await app.publish_many("orders", [Record({"n": i}, key=str(i)) for i in range(200, 230)])
        await rt.scale("orders", 1)  # scale-in: drained, checked and retired
        await wait_for(lambda: len([n for n in handled if n >= 200]) == 30, message="all handled")
        await rt.wait_idle()
        await rt.stop_worker(0)
        # Unsubscribing destroys the group's consumer groups on every shard.
        await rt.service.unsubscribe(
            UnsubscribeRequest(group="billing", stream="orders", confirm=True)
        )
        [remaining] = await rt.shard_keys("orders")
        assert await rt.redis.xinfo_groups(remaining) == []
    # TestRuntime(acl=True) has failed by now if ACL LOG holds a refusal of its users.
    assert _refusals(caplog) == []


@pytest.mark.no_cluster("the shard's keys and the worker user on the single server")
async def test_a_member_whose_grant_was_replaced_takes_nothing_as_the_worker_user(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    """The fenced read as the printed worker user: a stale member (its grant replaced)
    takes nothing, and the owner reads. Without +multi/+rename the stale member's
    XREADGROUP ran unchecked and took the entries."""
    shard = ShardId("orders", 0)
    stream, fence, hold = (
        keyspace.stream(shard),
        keyspace.fence(shard, "g"),
        keyspace.read_hold(shard),
    )
    await provision.create_shards(Scripts(redis), keyspace, [shard], ["g"])
    for i in range(3):
        await redis.xadd(stream, {"n": str(i)})
    await redis.set(fence, "8:new-owner")
    async with open_role_users(
        redis, settings.redis_url, keyspace.prefix, roles=("worker",)
    ) as users:
        worker = create_redis(settings.with_overrides(redis_url=users.url("worker")))
        try:
            scripts = Scripts(worker)
            stale = await scripts.fenced_read([stream, fence, hold], "g", "old", "7:old", 10)
            assert stale == (ReadStatus.FENCED, b"8:new-owner")
            assert (await redis.xpending(stream, "g"))["pending"] == 0
            status, entries = await scripts.fenced_read(
                [stream, fence, hold], "g", "new-owner", "8:new-owner", 10
            )
            assert status == ReadStatus.ENTRIES and len(entries) == 3
        finally:
            await worker.aclose()


async def test_each_role_is_refused_what_it_must_not_run(
    streamworks_redis_url: str, redis: Any, settings: Settings
) -> None:
    prefix = settings.key_prefix
    key = f"{{{prefix}:orders/0@0}}:stream"
    forbidden = {
        "coordinator": [
            ("XREADGROUP", "GROUP", "billing", "x", "COUNT", "1", "STREAMS", key, ">"),
            ("XACK", key, "billing", "0-1"),
            ("XDEL", key, "0-1"),
            ("XTRIM", key, "MAXLEN", "0"),
            ("XAUTOCLAIM", key, "billing", "x", "0", "0-0"),
            ("XREAD", "STREAMS", key, "0"),
            ("XRANGE", key, "-", "+"),
            ("HGETALL", f"{{{prefix}:orders/0@0}}:delayed:entries"),  # a delayed payload
        ],
        "producer": [
            ("XREADGROUP", "GROUP", "billing", "x", "STREAMS", key, ">"),
            ("XACK", key, "billing", "0-1"),
            ("DEL", key),
            ("SET", key, "x"),  # the dedup script's SET is on dedup records only
            ("HGETALL", f"{{{prefix}}}:group:billing"),
            ("XGROUP", "CREATE", f"{{{prefix}:new/0@0}}:stream", "g", "0", "MKSTREAM"),
        ],
        "worker": [
            ("XGROUP", "CREATE", f"{{{prefix}:new/0@0}}:stream", "g", "0", "MKSTREAM"),
            ("DEL", key),
            ("XDEL", key, "0-1"),
            ("RENAME", key, f"{{{prefix}:orders/0@0}}:other"),  # only to its hold key
            ("SET", f"{{{prefix}:orders/0@0}}:fence:billing", "1:me"),  # fences are read
            ("HGETALL", f"{{{prefix}}}:group:billing"),
            ("SET", f"{{{prefix}}}:group:billing:mutex", "x"),
            ("SET", f"{prefix}:dlq:{{billing:orders}}", "x"),  # the dead letters
            ("XADD", f"{prefix}:dlq-written:{{billing:orders}}", "*", "f", "v"),
        ],
    }
    # Refused on purpose: the block does not fail on its ACL LOG entries.
    async with open_role_users(redis, streamworks_redis_url, prefix, check_log=False) as users:
        allowed = []
        for role, commands in forbidden.items():
            client = create_redis(settings.with_overrides(redis_url=users.url(role)))
            try:
                for command in commands:
                    try:
                        await client.execute_command(*command)
                    except NoPermissionError:
                        continue
                    allowed.append((role, command[0]))
            finally:
                await client.aclose()
        assert allowed == [], f"roles allowed commands they must not run: {allowed}"
