"""Least-privilege Redis ACLs (docs/security.md): every role runs with only the
commands and keys ``streamworks.redis.acl`` grants it, and is refused the rest."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from redis.exceptions import NoPermissionError

from streamworks import App, Record, RetryPolicy
from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.control import UnsubscribeRequest
from streamworks.protocol.local import LocalTransport
from streamworks.protocol.shards import ShardId
from streamworks.redis.acl import setuser_command
from streamworks.redis.client import create_redis
from streamworks.runtime.connection import open_connection
from streamworks.runtime.membership import CoordinatorAssignment
from streamworks.runtime.worker import Worker
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import fast_settings
from tests.support import wait_for


@pytest.fixture(scope="module")
def acl_server() -> Any:
    # Its own server: users are server-wide, and the test must not depend on (or
    # change) the ACLs of a shared one.
    with EmbeddedRedis() as server:
        yield server


async def make_user(admin: Any, role: str, prefix: str) -> str:
    user, password = f"{role}-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await admin.execute_command(*setuser_command(role, user, password, prefix))  # type: ignore[arg-type]
    return f"redis://{user}:{password}@127.0.0.1:{{port}}/0"


@pytest.mark.seed("E24")
async def test_each_role_works_with_its_acl_and_only_with_it(acl_server: Any) -> None:
    prefix = f"a{uuid.uuid4().hex[:6]}"
    base = fast_settings(key_prefix=prefix, redis_url=acl_server.url)
    admin = create_redis(base)
    urls = {
        role: (await make_user(admin, role, prefix)).replace("{port}", str(acl_server.port))
        for role in ("worker", "producer", "coordinator")
    }
    clients = {role: create_redis(base.with_overrides(redis_url=url)) for role, url in urls.items()}
    app = App("billing")
    app.stream("orders", shards=2, delete_on_ack=True, dedup_window=60)
    handled: list[int] = []

    @app.handler(
        "orders",
        retry=RetryPolicy(max_attempts=2, backoff=0.01),
        idempotency_key=lambda v, c: str(v["n"]),
    )
    async def handle(value: dict[str, int]) -> None:
        if value["n"] == 7:
            raise RuntimeError("dead-letter me")
        handled.append(value["n"])

    service = CoordinatorService(clients["coordinator"], base)
    transport = LocalTransport(service)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.run_loop)
            async with (
                open_connection(
                    app, base, redis=clients["producer"], coordinator=transport
                ) as conn,
                app.attached(conn),
            ):
                worker = Worker(
                    app,
                    clients["worker"],
                    CoordinatorAssignment(transport, base),
                    settings=base,
                )
                await tg.start(worker.run)
                await app.publish_many(
                    "orders", [Record({"n": i}, key=str(i), event_id=f"e{i}") for i in range(20)]
                )
                await wait_for(lambda: len(handled) == 19, message="19 handled, 1 dead letter")
                await service.scale_stream("orders", 1)  # provisioning and retirement
                await wait_for(
                    lambda: _retired(service),
                    timeout=15,
                    message="the removed shard retired",
                )
                worker.request_stop()
                await worker.stopped.wait()
                # Unsubscribing (the group's consumer groups destroyed on every shard,
                # the registry entry removed) runs with the coordinator's ACL.
                await service.unsubscribe(
                    UnsubscribeRequest(group="billing", stream="orders", confirm=True)
                )
                [remaining] = (await service.stream_info("orders")).shards
                key = service.keyspace.stream(ShardId.parse(remaining.shard))
                assert await admin.xinfo_groups(key) == []
                assert await admin.smembers(f"{{{prefix}}}:registry:subscriptions:orders") == set()
            tg.cancel_scope.cancel()
        dead = await admin.xlen(base.key_prefix + ":dlq:{billing:orders}")
        assert dead == 1
        # The refusals that make each role least-privileged.
        shard = ShardId("orders", 0)
        key = f"{{{prefix}:{shard}}}:stream"
        forbidden = {
            "coordinator": [
                ("XREADGROUP", "GROUP", "billing", "x", "COUNT", "1", "STREAMS", key, ">"),
                ("XACK", key, "billing", "0-1"),
                ("XDEL", key, "0-1"),
                ("XTRIM", key, "MAXLEN", "0"),
                ("XAUTOCLAIM", key, "billing", "x", "0", "0-0"),
                ("XREAD", "STREAMS", key, "0"),
            ],
            "producer": [
                ("XREADGROUP", "GROUP", "billing", "x", "STREAMS", key, ">"),
                ("XACK", key, "billing", "0-1"),
                ("DEL", key),
                ("HGETALL", f"{{{prefix}}}:group:billing"),
                ("XGROUP", "CREATE", f"{{{prefix}:new/0@0}}:stream", "g", "0", "MKSTREAM"),
            ],
            "worker": [
                ("XGROUP", "CREATE", f"{{{prefix}:new/0@0}}:stream", "g", "0", "MKSTREAM"),
                ("DEL", key),
                ("XDEL", key, "0-1"),
                ("HGETALL", f"{{{prefix}}}:group:billing"),
                ("SET", f"{{{prefix}}}:group:billing:mutex", "x"),
                ("SET", f"{prefix}:dlq:{{billing:orders}}", "x"),  # the dead letters
                ("XADD", f"{prefix}:dlq-written:{{billing:orders}}:s:1-0", "*", "f", "v"),
            ],
        }
        allowed = []
        for role, commands in forbidden.items():
            for command in commands:
                try:
                    await clients[role].execute_command(*command)
                except NoPermissionError:
                    continue
                allowed.append((role, command[0]))
        assert allowed == [], f"roles allowed commands they must not run: {allowed}"
    finally:
        for client in clients.values():
            await client.aclose()
        await admin.aclose()


async def _retired(service: CoordinatorService) -> bool:
    info = await service.stream_info("orders")
    return not any(s.state == "DRAINING" for s in info.shards)
