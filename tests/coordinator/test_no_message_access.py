"""The coordinator never reads, acks or deletes stream messages (E24): a whole scenario
runs with the coordinator's Redis client recording every command it sends."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest

from streamworks import App
from streamworks.coordinator.service import CoordinatorService
from streamworks.redis.client import create_redis
from streamworks.redis.scripts import SCRIPT_NAMES, load_script
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from tests.coordinator.harness import recording_redis
from tests.support import wait_for

#: Commands that read, acknowledge, delete or write stream entries.
MESSAGE_COMMANDS = {
    "XADD",
    "XREAD",
    "XREADGROUP",
    "XACK",
    "XACKDEL",
    "XDEL",
    "XDELEX",
    "XTRIM",
    "XAUTOCLAIM",
    "XCLAIM",
    "XRANGE",
    "XREVRANGE",
    "XSETID",
}


def commands_in_script(name: str) -> set[str]:
    """Redis commands a shipped Lua script can issue (``redis.call('X…')``)."""
    source = load_script(name)
    return {m.upper() for m in re.findall(r"redis\.p?call\(\s*'([A-Za-z]+)'", source)}


@pytest.mark.seed("E24")
async def test_the_coordinator_never_touches_stream_messages(
    streamworks_runtime: Callable[..., TestRuntime], streamworks_redis_url: str
) -> None:
    app = App("g")
    app.stream("orders", shards=2)
    handled: list[int] = []

    @app.handler("orders", ordering="none")
    async def handle(value: dict[str, int]) -> None:
        handled.append(value["n"])

    # A schedule too: its ticks are published by a member, never by the coordinator.
    app.stream("reports", shards=1)

    @app.schedule("beat", stream="reports", every=timedelta(seconds=1))
    def beat() -> None: ...

    # The coordinator's own connections (closed after the runtime, which uses them
    # until its workers and producers have stopped).
    real = create_redis(Settings(redis_url=streamworks_redis_url))
    recording = recording_redis(real)
    try:
        async with streamworks_runtime(app, workers=0) as rt:
            assert rt.service is not None
            async with anyio.create_task_group() as tg:
                # The runtime's coordinator is replaced by one whose client records.
                coordinator = CoordinatorService(recording, rt.settings, clock=rt.clock)
                tg.start_soon(coordinator.run_loop)
                old, rt.service = rt.service, coordinator
                rt.coordinator.service = coordinator
                await old.terminate()

                # Provisioning, joining, consuming, a failover, status and routing.
                await coordinator.create_stream("audit", 2)
                w0 = await rt.add_worker()
                await rt.add_worker()
                for n in range(30):
                    await app.publish("orders", {"n": n}, key=f"k{n}")
                await rt.wait_idle()
                await rt.kill_worker(0)

                async def expired() -> bool:
                    info = await coordinator.group_info("g")
                    return any(
                        m.member_id == w0.member_id and m.state == "EXPIRED" for m in info.members
                    )

                await wait_for(expired, timeout=5, message="the failover")
                await rt.wait_assigned()
                for n in range(30, 40):
                    await app.publish("orders", {"n": n}, key=f"k{n}")
                await rt.wait_idle()

                async def ticked() -> bool:
                    info = await coordinator.group_info("g")
                    return any(s.published >= 2 for s in info.schedules)

                await wait_for(ticked, timeout=10, message="two ticks of the schedule")
                status = await coordinator.status()
                await coordinator.routing("orders")
                await coordinator.stream_info("orders")
                tg.cancel_scope.cancel()
    finally:
        await recording.aclose()
        await real.aclose()

    assert sorted(handled) == list(range(40))
    assert {s.name for s in status.streams} == {"audit", "orders", "reports", "sw-schedules"}
    [group] = status.groups
    assert [s.name for s in group.schedules] == ["beat"]
    names = {c[0] for c in recording.commands}
    # The recorder saw the coordinator's work, status reads included...
    assert {"EVALSHA", "HMGET", "XLEN", "XINFO GROUPS"} <= names, names
    # ...and no command on stream entries.
    assert not names & MESSAGE_COMMANDS, names & MESSAGE_COMMANDS
    # Scripts it ran: none can touch entries either (only XGROUP/XINFO on shards).
    by_sha = {hashlib.sha1(load_script(n).encode()).hexdigest(): n for n in SCRIPT_NAMES}
    scripts = {by_sha[c[1]] for c in recording.commands if c[0] == "EVALSHA"}
    assert {"group_commit", "fence", "group_create", "shard_create"} <= scripts, scripts
    for script in scripts:
        assert not commands_in_script(script) & MESSAGE_COMMANDS, script
    # (A check of the check: the data plane's scripts do use them.)
    assert commands_in_script("read") & MESSAGE_COMMANDS
    assert commands_in_script("claim") & MESSAGE_COMMANDS
