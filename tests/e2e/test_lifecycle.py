"""Startup and shutdown hooks in a real ``streamworks worker`` process: startup runs
before the member serves, shutdown after a SIGTERM once in-flight work has ended;
a failing startup hook is one error line and a non-zero exit, and no member joins."""

from __future__ import annotations

import signal
from typing import Any

from streamworks import App
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import GroupInfo
from tests.e2e.apps import lifecycle
from tests.e2e.harness import Cluster, live, wait_ready, wait_until
from tests.e2e.test_cli import assert_one_error_line

TARGET = "tests.e2e.apps.lifecycle:app"
GROUP = lifecycle.app.name


async def events(redis: Any, prefix: str) -> list[str]:
    return [e.decode() for e in await redis.lrange(lifecycle.log_key(prefix), 0, -1)]


async def group_info(cluster: Cluster) -> GroupInfo | None:
    async with cluster.client() as client:
        try:
            return await client.group(GROUP)
        except CoordinatorError:
            return None  # never joined: the group does not exist


async def test_worker_runs_startup_before_serving_and_shutdown_after_in_flight_work(
    cluster: Cluster, redis: Any
) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    worker = cluster.start_worker("worker", target=TARGET)

    async def serving() -> bool:
        group = await group_info(cluster)
        members = live(group) if group is not None else []
        return len(members) == 1 and len(members[0].assigned) == lifecycle.SHARDS

    await wait_until(serving, 30, "the worker to own every shard")
    assert await events(redis, cluster.prefix) == ["startup"]

    producer = App("e2e-producer", settings=cluster.settings())
    producer.stream(lifecycle.STREAM, shards=lifecycle.SHARDS)
    async with producer.connect():
        await producer.publish(lifecycle.STREAM, {"id": "m1", "sleep": 1.0})

    async def in_flight() -> bool:
        return "start m1" in await events(redis, cluster.prefix)

    await wait_until(in_flight, 20, "the handler to start")
    worker.send(signal.SIGTERM)  # while the handler sleeps
    assert await worker.wait_exit(20) == 0, worker.output()
    assert await events(redis, cluster.prefix) == ["startup", "start m1", "end m1", "shutdown"]
    group = await group_info(cluster)
    assert group is not None and live(group) == []  # it left the group


async def test_a_failing_startup_hook_is_one_error_line_and_no_member_joins(
    cluster: Cluster, redis: Any
) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    result = await cluster.cli("worker", TARGET, env={"LIFECYCLE_FAIL_STARTUP": "1"})
    assert_one_error_line(
        result, "startup hook", "ConnectionRefusedError: the payments database is down"
    )
    group = await group_info(cluster)
    assert group is None or group.members == []
    assert await events(redis, cluster.prefix) == []


async def test_dev_reports_a_failing_startup_hook_in_one_line(cluster: Cluster) -> None:
    """``streamworks dev`` runs the hooks too (through its TestRuntime). Its log (INFO
    by default, and a warning when the default port 7400 is taken) is left out: the
    failure itself is one line."""
    result = await cluster.cli(
        "dev", TARGET, "--workers", "1", "--log-level", "error",
        env={"LIFECYCLE_FAIL_STARTUP": "1"}, timeout=60,
    )  # fmt: skip
    assert_one_error_line(result, "startup hook", "the payments database is down")
