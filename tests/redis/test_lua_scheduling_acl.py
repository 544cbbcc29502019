"""The grants the new scripts need, per role (docs/design/scheduling.md §7), checked on a
real server: each role runs its scripts with the rules ``streamworks admin acl`` prints
(``redis/acl.py`` lists their paths), and without those paths gets NOPERM."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from redis.exceptions import NoPermissionError, ResponseError

from streamworks.protocol.envelope import encode_fields
from streamworks.protocol.shards import ShardId
from streamworks.ratelimit import RateLimit
from streamworks.redis.acl import PATHS, Role, compile_rules
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.settings import Settings
from streamworks.testing.embedded import EmbeddedRedis

from .streams import read_group, set_key

pytestmark = pytest.mark.no_cluster("users are created on one server of the test's own")

GROUP = "billing"


#: The scripts of issue 21, and the key family the coordinator's drain check gained.
NEW_SCRIPTS = {"delay_add", "delay_move", "schedule_tick", "rate_take"}


def rules(role: Role, prefix: str, *, new: bool) -> list[str]:
    """The role's rules (``new``), or the same without the paths of the new scripts and
    without the delayed keys in the drain check (what the role had before them)."""
    paths = list(PATHS[role])
    if not new:
        paths = [p for p in paths if not set(p.scripts) & NEW_SCRIPTS]
        paths = [
            replace(p, rest=tuple(f for f in p.rest if f != "delayed"))
            if "retire" in p.scripts
            else p
            for p in paths
        ]
    return compile_rules(paths, prefix)


@pytest.fixture(scope="module")
def server() -> Any:
    with EmbeddedRedis() as s:
        yield s


@pytest.fixture
async def world(server: Any) -> AsyncIterator[dict[str, Any]]:
    prefix = f"acl{uuid.uuid4().hex[:6]}"
    settings = Settings(redis_url=server.url, key_prefix=prefix)
    admin = create_redis(settings)
    clients: list[Any] = [admin]

    async def client(role: Role, *, extra: bool) -> Scripts:
        user, password = f"{role}-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
        setuser = ["ACL", "SETUSER", user, "reset", "on", f">{password}"]
        await admin.execute_command(*setuser, *rules(role, prefix, new=extra))
        url = server.url.replace("redis://", f"redis://{user}:{password}@")
        c = create_redis(settings.with_overrides(redis_url=url))
        clients.append(c)
        return Scripts(c)

    keys = Keyspace(prefix)
    sid, sched = ShardId("orders", 0, 1), keys.schedule_shard(1)
    admin_scripts = Scripts(admin)
    for shard in (sid, sched):
        stream = keys.stream(shard)
        assert await admin_scripts.shard_create(
            keys=[stream, set_key(stream)], args=["sealed", GROUP]
        )
        await admin_scripts.fence(keys=[keys.fence(shard, GROUP), stream], args=[1, "m"])
    try:
        yield {"client": client, "keys": keys, "sid": sid, "sched": sched, "admin": admin}
    finally:
        for c in clients:
            await c.aclose()


def delay_add_call(keys: Keyspace, sid: ShardId, delay_ms: int) -> dict[str, list[Any]]:
    return {
        "keys": [
            keys.stream(sid),
            keys.delayed(sid),
            keys.delayed_entries(sid),
            keys.delayed_counter(sid),
            keys.delayed_wake(sid),
            keys.dedup(sid, f"ev-{delay_ms}"),
        ],
        "args": ["in", delay_ms, 0, 60_000, *encode_fields(b"v", "k", None, None, 1)],
    }


async def producer_work(scripts: Scripts, w: dict[str, Any]) -> None:
    keys, sid = w["keys"], w["sid"]
    assert (await scripts.delay_add(**delay_add_call(keys, sid, 1_000)))[0] == 2
    assert (await scripts.delay_add(**delay_add_call(keys, sid, 0)))[0] == 1


async def worker_work(scripts: Scripts, w: dict[str, Any]) -> None:
    keys, sid, sched = w["keys"], w["sid"], w["sched"]
    assert (await scripts.delay_add(**delay_add_call(keys, sid, 500)))[0] == 2
    moved = await scripts.delay_move(
        keys=[
            keys.stream(sid),
            keys.fence(sid, GROUP),
            keys.delayed(sid),
            keys.delayed_entries(sid),
        ],
        args=["1:m", 5_000, 100],
    )
    assert moved[0] == 1 and moved[1] >= 1
    tick_keys = [
        keys.fence(sched, GROUP),
        keys.schedule_state(sched, GROUP, "hourly"),
        keys.schedules(sched, GROUP),
    ]
    opened = await scripts.schedule_tick(
        keys=tick_keys, args=["1:m", 0, "open", "hourly", "every 1h", "orders"]
    )
    tick = int(opened[2]) + 1
    claim = ["1:m", 10, "claim", "hourly", tick, str(sid), 0]
    assert (await scripts.schedule_tick(keys=tick_keys, args=claim))[0] == 1
    done = ["1:m", 10, "done", "hourly", tick, "1-0", "published", tick + 1]
    assert (await scripts.schedule_tick(keys=tick_keys, args=done))[0] == 1
    limit = RateLimit.parse("100/s")
    reply = await scripts.rate_take(
        keys=[keys.rate_bucket(GROUP, "orders"), keys.rate_key_bucket(GROUP, "orders", "k")],
        args=[*limit.script_args(timedelta(seconds=1), 0), 3, 3],
    )
    assert int(reply[1]) == 3


async def coordinator_work(scripts: Scripts, w: dict[str, Any]) -> None:
    keys, sid = w["keys"], w["sid"]
    await w["admin"].delete(keys.delayed(sid), keys.delayed_entries(sid))
    await Scripts(w["admin"]).delay_add(**delay_add_call(keys, sid, 3_600_000))
    retire_keys = [
        keys.stream(sid),
        keys.shard_groups(sid),
        keys.redelivery(sid, GROUP),
        keys.delayed(sid),
        keys.fence(sid, GROUP),
        keys.delayed_entries(sid),
        keys.delayed_counter(sid),
        keys.delayed_wake(sid),
    ]
    reply = await scripts.retire(keys=retire_keys, args=["check", 2, GROUP])
    assert reply[0] == 0 and b"delayed message(s)" in reply[1]


def refused() -> Any:
    """NOPERM from a command, or "ACL failure in script" from a command a script runs."""
    return pytest.raises(
        (NoPermissionError, ResponseError),
        # (Redis 7.0 words a key refused inside a script "can't access ... keys")
        match=r"(?i)noperm|no permissions|can.t run this command|can.t access",
    )


WORK = {"producer": producer_work, "worker": worker_work, "coordinator": coordinator_work}


@pytest.mark.parametrize("role", ["producer", "worker", "coordinator"])
async def test_the_new_scripts_run_with_the_proposed_grants(
    world: dict[str, Any], role: Role
) -> None:
    await WORK[role](await world["client"](role, extra=True), world)


@pytest.mark.parametrize("role", ["producer", "worker", "coordinator"])
async def test_todays_acl_refuses_them(world: dict[str, Any], role: Role) -> None:
    with refused():
        await WORK[role](await world["client"](role, extra=False), world)


async def test_the_coordinator_still_cannot_move_or_read_delayed_messages(
    world: dict[str, Any],
) -> None:
    keys, sid = world["keys"], world["sid"]
    scripts = await world["client"]("coordinator", extra=True)
    added = await Scripts(world["admin"]).delay_add(**delay_add_call(keys, sid, 1_000))
    assert added[0] == 2
    with refused():  # due (offset 5 s): the move would XADD it, which E24 forbids
        await scripts.delay_move(
            keys=[
                keys.stream(sid),
                keys.fence(sid, GROUP),
                keys.delayed(sid),
                keys.delayed_entries(sid),
            ],
            args=["1:m", 5_000, 100],
        )
    with refused():
        await read_group(scripts.client, keys.stream(sid), GROUP, "c", 1)


async def test_the_coordinator_cannot_read_a_delayed_payload(world: dict[str, Any]) -> None:
    keys, sid = world["keys"], world["sid"]
    scripts = await world["client"]("coordinator", extra=True)
    await Scripts(world["admin"]).delay_add(**delay_add_call(keys, sid, 3_600_000))
    with refused():
        await scripts.client.hgetall(keys.delayed_entries(sid))
