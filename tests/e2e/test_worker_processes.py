"""``streamworks worker --processes N``: a supervisor and its children, real signals.

One coordinator and one supervisor of the instrumented app (6 shards). Each child is
a member of its own; the tests find them through the pid each member reported when
joining, and check the parent of that pid is the supervisor.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import GroupInfo
from tests.e2e.harness import (
    GROUP,
    STREAM,
    Cluster,
    Proc,
    Publisher,
    create_stream,
    duplicates,
    free_port,
    live,
    processings,
    producer_app,
    wait_handled,
    wait_ready,
    wait_stable,
    wait_until,
)
from tests.e2e.test_cli import assert_one_error_line

#: A fast restart policy for the tests (seconds).
FAST_RESTARTS = {
    "STREAMWORKS_SUPERVISOR__RESTART_DELAY": "0.1",
    "STREAMWORKS_SUPERVISOR__RESTART_DELAY_MAX": "0.5",
}


def parent_of(pid: int) -> int | None:
    """The parent pid of a live (non-zombie) process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    # "pid (comm) state ppid ...": comm may contain spaces, so split after its ')'.
    state, ppid = stat.rpartition(")")[2].split()[:2]
    return None if state in ("Z", "X") else int(ppid)


def child_pids(group: GroupInfo) -> set[int]:
    return {int(m.client["pid"]) for m in live(group)}


async def start_supervisor(cluster: Cluster, processes: int = 2, **env: str) -> Proc:
    coordinator = cluster.start_coordinator(**env)
    await wait_ready(coordinator)
    await create_stream(cluster)
    return cluster.start_worker(
        "supervisor", args=["--processes", str(processes)], **{**FAST_RESTARTS, **env}
    )


async def wait_children(
    client: CoordinatorClient, supervisor: Proc, count: int, timeout: float = 40
) -> set[int]:
    """Wait until the group is stable with ``count`` members, all children of
    ``supervisor``; their pids."""

    async def settled() -> set[int] | None:
        if not supervisor.alive():
            raise AssertionError(f"the supervisor exited:\n{supervisor.output()[-3000:]}")
        group = await wait_stable(client, count, timeout=timeout)
        pids = child_pids(group)
        return pids if all(parent_of(p) == supervisor.pid for p in pids) else None

    return await wait_until(settled, timeout, f"{count} members, children of the supervisor")


async def test_two_processes_are_two_members_of_the_group(cluster: Cluster) -> None:
    """--processes 2: two children of the supervisor, each a member with its own id,
    sharing the shards; the supervisor logs each child's start with its pid."""
    supervisor = await start_supervisor(cluster)
    async with cluster.client() as client:
        pids = await wait_children(client, supervisor, 2)
        group = await client.group(GROUP)
    members = live(group)
    assert len({m.member_id for m in members}) == 2
    assert all(m.assigned for m in members)
    assert supervisor.pid not in pids
    for pid in pids:
        assert f"started (pid {pid})" in supervisor.output()


async def test_a_killed_child_is_restarted_and_rejoins(cluster: Cluster) -> None:
    """SIGKILL one child: the supervisor logs its exit (pid, signal), starts a new
    process in its place, and the new one joins; the other child is untouched."""
    supervisor = await start_supervisor(cluster)
    async with cluster.client() as client:
        before = await wait_children(client, supervisor, 2)
        victim, survivor = sorted(before)
        os.kill(victim, signal.SIGKILL)

        async def replaced() -> set[int] | None:
            pids = await wait_children(client, supervisor, 2)
            return pids if victim not in pids else None

        # The killed member's lease (2 s) expires; its replacement joins.
        after = await wait_until(replaced, 40, "the killed child to be replaced")
    assert survivor in after
    (new,) = after - {survivor}
    out = supervisor.output()
    assert f"(pid {victim}) exited unexpectedly: killed by SIGKILL" in out, out[-3000:]
    assert f"started (pid {new})" in out
    assert supervisor.alive()


async def test_sigterm_stops_the_children_gracefully_and_exits_0(
    cluster: Cluster, redis: Any
) -> None:
    """SIGTERM to the supervisor under traffic: it forwards SIGTERM, each child
    finishes its work, acks and leaves (the members are gone long before their 10 s
    lease), the supervisor exits 0 after its children; nothing is lost or doubled."""
    supervisor = await start_supervisor(cluster, STREAMWORKS_LEASE_TTL="10")
    app = producer_app(cluster)
    async with cluster.client() as client, app.connect():
        pids = await wait_children(client, supervisor, 2)
        publisher = Publisher(app, "sup")
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await publisher.wait_count(200)
            published = await publisher.stop()
        records = await wait_handled(redis, cluster.prefix, published, timeout=30)
        supervisor.send(signal.SIGTERM)
        termed = time.monotonic()
        code = await supervisor.wait_exit(30)

        async def left() -> bool:
            return not live(await client.group(GROUP))

        await wait_until(left, 5, "both members to leave")
        took = time.monotonic() - termed
    out = supervisor.output()
    assert code == 0, out[-3000:]
    assert took < 8, f"members left {took:.1f}s after SIGTERM (the lease is 10 s)"
    for pid in pids:
        assert f"(pid {pid}) exited: exit code 0" in out, out[-3000:]
        assert parent_of(pid) is None
    assert duplicates(records) == {}


async def test_second_signal_kills_the_children_at_once(cluster: Cluster, redis: Any) -> None:
    """A second SIGTERM while a child's handler is stuck: the children are SIGKILLed
    and the supervisor exits 2 at once."""
    supervisor = await start_supervisor(cluster)
    app = producer_app(cluster)
    async with cluster.client() as client, app.connect():
        pids = await wait_children(client, supervisor, 2)
        await app.publish(STREAM, {"id": "stuck", "sleep": 60}, key="stuck")

        async def stuck_started() -> bool:
            return any(p.id == "stuck" for p in await processings(redis, cluster.prefix))

        await wait_until(stuck_started, 10, "the stuck event to start")
        supervisor.send(signal.SIGTERM)

        async def stopping() -> bool:
            return "stopping 2 worker processes gracefully" in supervisor.output()

        await wait_until(stopping, 5, "the supervisor to forward SIGTERM")
        supervisor.send(signal.SIGTERM)
        second = time.monotonic()
        code = await supervisor.wait_exit(5)
    assert time.monotonic() - second < 3
    assert code == 2, supervisor.output()[-3000:]
    assert "killed by SIGKILL" in supervisor.output()
    assert all(parent_of(pid) is None for pid in pids)


async def test_children_that_keep_crashing_make_the_supervisor_give_up(cluster: Cluster) -> None:
    """Every child fails at start (nothing listens at its Redis URL): after more than
    max_crashes crashes within the window the supervisor exits 1 with one error line."""
    supervisor = cluster.start(
        "supervisor",
        "worker",
        "tests.e2e.apps.instrumented:app",
        "--processes",
        "2",
        "--redis",
        f"redis://127.0.0.1:{free_port()}",
        env={**FAST_RESTARTS, "STREAMWORKS_SUPERVISOR__MAX_CRASHES": "3"},
    )
    code = await supervisor.wait_exit(60)
    out = supervisor.output()
    assert code == 1, out[-3000:]
    errors = [line for line in out.splitlines() if "giving up" in line]
    assert len(errors) == 1, out[-3000:]
    assert errors[0].startswith("error: worker processes crashed 4 times within 60s")
    assert out.count("exited unexpectedly: exit code 1") == 3


async def test_bad_processes_and_a_missing_app_are_one_line_before_any_child(
    cluster: Cluster,
) -> None:
    """--processes 0 is a usage error; a missing app fails once in the supervisor,
    not once per child and restart."""
    zero = await cluster.cli("worker", "tests.e2e.apps.instrumented:app", "--processes", "0")
    assert zero.returncode == 2
    assert_one_error_line(zero, "--processes", "0")
    missing = await cluster.cli("worker", "tests.e2e.apps.no_such_app:app", "--processes", "2")
    assert_one_error_line(missing, "cannot import module 'tests.e2e.apps.no_such_app'")
    assert b"worker process" not in missing.stderr


def free_port_pair() -> int:
    """A port P such that P and P + 1 were both free a moment ago."""
    for _ in range(50):
        base = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise AssertionError("no two consecutive free ports")


async def test_each_child_serves_http_on_its_own_port(cluster: Cluster) -> None:
    """--http-port P --processes 2: child 0 serves /livez on P, child 1 on P + 1 (two
    processes cannot share a port)."""
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    base = free_port_pair()  # after the coordinator took its port
    supervisor = cluster.start_worker(
        "supervisor", args=["--processes", "2", "--http-port", str(base)], **FAST_RESTARTS
    )
    async with cluster.client() as client:
        await wait_children(client, supervisor, 2)

    async def both_live() -> bool | None:
        async with httpx.AsyncClient(timeout=1) as http:
            ports = (base, base + 1)
            codes = [(await http.get(f"http://127.0.0.1:{p}/livez")).status_code for p in ports]
        return codes == [200, 200] or None

    await wait_until(both_live, 10, f"/livez on ports {base} and {base + 1}")
    assert "exited unexpectedly" not in supervisor.output()
