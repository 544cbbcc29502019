"""Exclusive processing with real processes and slow handlers (issue 10).

See docs/guarantees.md#exclusive-processing.

Two workers of ``tests/e2e/apps/slow.py`` (2 shards, ``ordering="key"``) run jobs of
seconds, async or sync, and record every run's start *and* end (a Redis sequence
number and CLOCK_MONOTONIC). For every shard, no run of one member may overlap a run
of another: either it ended before the other started, or its process had exited
(fail-stop) before the other started. Each test drives one path by which ownership
ends while a run is going: the coordinator cut off while Redis stays reachable (lost
heartbeats, then UNKNOWN_MEMBER on return), FENCED at the revocation timeout, a
graceful leave (SIGTERM) while a sync handler runs, and the fail-stop of a sync
handler that outlives its lease.

Timers: heartbeats every 0.2 s, a 2 s lease, ``lease_grace`` 0.5 s: a member starts
runs until 1.28 s after its last successful heartbeat was sent, cancels async ones at
1.78 s and fail-stops at 1.88 s; the coordinator expires it no earlier than 2 s after.
"""

from __future__ import annotations

import re
import signal
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from streamworks import App
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import GroupInfo
from streamworks.runtime.ownership import FAIL_STOP_EXIT_CODE
from tests.chaos.proxy import ProxyHub
from tests.e2e.apps import slow
from tests.e2e.harness import Cluster, Proc, live, member_of, wait_ready, wait_until

TARGET = "tests.e2e.apps.slow:app"
TIMERS = {
    "STREAMWORKS_HEARTBEAT_INTERVAL": "0.2",
    "STREAMWORKS_LEASE_TTL": "2",
    "STREAMWORKS_WORKER__LEASE_GRACE": "0.5",
    "STREAMWORKS_WORKER__SHUTDOWN_TIMEOUT": "0.5",
}
_FAIL_STOP = re.compile(r"fail-stop: .*\(monotonic ([0-9.]+)")

pytestmark = pytest.mark.timeout(90)


@dataclass
class Run:
    """One handler run as the slow app recorded it."""

    member: str
    pid: int
    shard: str
    id: str
    token: int
    start_seq: int
    start_mono: float
    end_seq: int | None = None
    end_mono: float | None = None
    ok: bool = False

    def __str__(self) -> str:
        end = "-" if self.end_seq is None else f"{self.end_seq} ({'ok' if self.ok else 'cut'})"
        return (
            f"{self.id} on {self.shard} by {self.member[:8]}/{self.pid} token {self.token}: "
            f"seq {self.start_seq}..{end}"
        )


async def read_runs(redis: Any, prefix: str) -> list[Run]:
    runs: dict[tuple[int, str, str], list[Run]] = defaultdict(list)
    out: list[Run] = []
    for raw in await redis.lrange(slow.runs_key(prefix), 0, -1):
        body, _, seq = raw.decode().rpartition("|")
        doc = orjson.loads(body)
        key = (doc["pid"], doc["shard"], doc["entry"])
        if doc["ev"] == "start":
            run = Run(
                doc["member"], doc["pid"], doc["shard"], doc["id"], doc["token"], int(seq),
                doc["mono"],
            )  # fmt: skip
            runs[key].append(run)
            out.append(run)
        else:
            run = next(r for r in runs[key] if r.end_seq is None)
            run.end_seq, run.end_mono, run.ok = int(seq), doc["mono"], doc["ok"]
    return out


def assert_exclusive(runs: Iterable[Run], exited: Mapping[int, float] | None = None) -> None:
    """No two members' runs on a shard overlap. A run without an end counts as ended
    when its process exited (``exited``: pid -> the monotonic time of its fail-stop);
    a run that neither ended nor had its process exit fails the check if anyone else
    ran on its shard after it started."""
    exited = exited or {}
    by_shard: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_shard[run.shard].append(run)
    for shard, shard_runs in by_shard.items():
        for a in shard_runs:
            for b in shard_runs:
                if a.member == b.member or b.start_seq < a.start_seq:
                    continue
                # b started after a: a must have ended (or died) before b started.
                if a.end_seq is not None:
                    assert a.end_seq < b.start_seq, f"overlap on {shard}: {a} and {b}"
                else:
                    assert a.pid in exited, f"{a} never ended, yet {b} ran"
                    assert exited[a.pid] < b.start_mono, f"{b} started before {a}'s exit"
                # A later owner's grant is strictly newer: a fencing token only grows.
                assert a.token < b.token, f"fencing token did not grow: {a} then {b}"


def fail_stop_time(proc: Proc) -> float:
    match = _FAIL_STOP.search(proc.output())
    assert match, f"{proc.name} logged no fail-stop:\n{proc.output()[-3000:]}"
    return float(match.group(1))


class Jobs:
    """Publishes jobs from the test process and waits on the app's records."""

    def __init__(self, cluster: Cluster, redis: Any) -> None:
        self.cluster = cluster
        self.redis = redis
        self.app = App("ex-producer", settings=cluster.settings())
        self.app.stream(slow.STREAM, shards=slow.SHARDS)
        self.shard_of: dict[str, str] = {}

    async def publish(
        self, n: int, *, prefix: str, sleep: float, on: str | None = None
    ) -> list[str]:
        """Publish jobs (one key each) until ``n`` landed on shard ``on`` (any shard
        when None); returns the ids of those."""
        ids: list[str] = []
        i = 0
        async with self.app.connect():
            while len(ids) < n:
                job_id = f"{prefix}-{i}"
                i += 1
                published = await self.app.publish(
                    slow.STREAM, {"id": job_id, "sleep": sleep, "sleep_once": True}, key=job_id
                )
                self.shard_of[job_id] = published.shard
                if on is None or published.shard == on:
                    ids.append(job_id)
        return ids

    async def runs(self) -> list[Run]:
        return await read_runs(self.redis, self.cluster.prefix)

    async def wait_started(self, member_pid: int, shard: str | None = None) -> Run:
        async def started() -> Run | None:
            for run in await self.runs():
                if run.pid == member_pid and (shard is None or run.shard == shard):
                    return run
            return None

        return await wait_until(started, 30, f"a run by pid {member_pid}", 0.02)

    async def wait_done(self, timeout: float = 40) -> list[Run]:
        """Until every published job has a run that ended ok."""

        async def done() -> list[Run] | None:
            runs = await self.runs()
            finished = {r.id for r in runs if r.ok}
            return runs if finished >= set(self.shard_of) else None

        return await wait_until(done, timeout, "every job handled", 0.1)


async def group(client: CoordinatorClient) -> GroupInfo:
    return await client.group(slow.GROUP)


async def wait_members(client: CoordinatorClient, *procs: Proc) -> GroupInfo:
    """Until exactly ``procs`` are live, STABLE and own both shards between them."""

    async def settled() -> GroupInfo | None:
        info = await group(client)
        members = [member_of(info, p) for p in procs]
        if len(live(info)) != len(procs) or any(m is None for m in members):
            return None
        held = sorted(s for m in members if m for s in m.assigned)
        if len(held) != slow.SHARDS or info.state != "STABLE":
            return None
        for m in members:
            assert m is not None
            if m.state != "STABLE" or sorted(m.assigned) != sorted(m.target) or not m.assigned:
                return None
        return info

    return await wait_until(settled, 40, f"{len(procs)} members owning every shard", 0.05)


async def start_coordinator(cluster: Cluster, **env: str) -> Proc:
    coordinator = cluster.start_coordinator(**{**TIMERS, **env})
    await wait_ready(coordinator)
    async with cluster.client() as client:
        await client.create_stream(slow.STREAM, slow.SHARDS)
    return coordinator


def start_worker(cluster: Cluster, name: str, *, via: str | None = None, **env: str) -> Proc:
    extra = {**TIMERS, "E2E_SHARDS": str(slow.SHARDS), **env}
    if via is not None:
        extra["STREAMWORKS_COORDINATOR_URLS"] = via
        return cluster.start(name, "worker", TARGET, env=extra)
    return cluster.start_worker(name, target=TARGET, **extra)


@pytest.fixture
def hub() -> Any:
    proxies = ProxyHub()
    try:
        yield proxies
    finally:
        proxies.close()


def owned_by(info: GroupInfo, proc: Proc) -> list[str]:
    member = member_of(info, proc)
    assert member is not None
    return sorted(member.assigned)


@pytest.mark.seed("E1")
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_cut_off_from_the_coordinator_runs_end_before_the_lease(
    cluster: Cluster, redis: Any, hub: ProxyHub, sync: bool
) -> None:
    """A worker that loses its coordinator but still reaches Redis: its async runs are
    cancelled, a sync run makes it fail-stop, before its lease ends; the shard's next
    owner re-runs the job only after that. (Async: back in touch, it is UNKNOWN_MEMBER
    and rejoins.)"""
    coordinator = await start_coordinator(cluster)
    port = int(coordinator.url.rsplit(":", 1)[1])
    proxy = await hub.add("a.coordinator", port)
    env = {"E2E_SYNC": "1"} if sync else {}
    a = start_worker(cluster, "worker-a", via=f"http://127.0.0.1:{proxy.port}", **env)
    b = start_worker(cluster, "worker-b", **env)
    jobs = Jobs(cluster, redis)
    async with cluster.client() as client:
        info = await wait_members(client, a, b)
        (shard,) = owned_by(info, a)
        await jobs.publish(2, prefix="cut", sleep=6.0, on=shard)
        await jobs.wait_started(a.pid, shard)
        await hub.cut("a.coordinator", 60)  # heartbeats fail; Redis is still reachable
        exited: dict[int, float] = {}
        if sync:
            assert await a.wait_exit(20) == FAIL_STOP_EXIT_CODE
            exited[a.pid] = fail_stop_time(a)
        runs = await jobs.wait_done()
        assert any(r.shard == shard and r.pid == b.pid and r.ok for r in runs)
        assert_exclusive(runs, exited)
        if not sync:
            cut = [r for r in runs if r.pid == a.pid and r.shard == shard]
            assert cut and all(r.end_seq is not None and not r.ok for r in cut), cut
            assert a.alive()
            await hub.heal("a.coordinator")
            await wait_until(
                lambda: _logged(a, "UNKNOWN_MEMBER"), 20, "worker-a told UNKNOWN_MEMBER"
            )
            await wait_members(client, a, b)
            await jobs.publish(4, prefix="back", sleep=0.2)
            assert_exclusive(await jobs.wait_done())


@pytest.mark.seed("E6")
@pytest.mark.seed("E8")
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_fenced_at_the_revocation_timeout_runs_end_before_the_shard_moves(
    cluster: Cluster, redis: Any, sync: bool
) -> None:
    """A member that does not finish revoking in time is FENCED while its lease is
    still valid: the coordinator keeps the shard from the new owner until that lease
    would have expired, and the member cancels its async runs (and rejoins once they
    ended) or fail-stops with a sync run still going."""
    await start_coordinator(cluster)
    env = {"E2E_SYNC": "1"} if sync else {}
    a = start_worker(cluster, "worker-a", STREAMWORKS_REBALANCE_TIMEOUT="1", **env)
    jobs = Jobs(cluster, redis)
    async with cluster.client() as client:
        await wait_members(client, a)
        await jobs.publish(4, prefix="slow", sleep=8.0)
        for shard in {jobs.shard_of[j] for j in jobs.shard_of}:
            await jobs.wait_started(a.pid, shard)
        b = start_worker(cluster, "worker-b", **env)  # a must revoke a shard it is busy on
        exited: dict[int, float] = {}
        if sync:
            assert await a.wait_exit(20) == FAIL_STOP_EXIT_CODE
            exited[a.pid] = fail_stop_time(a)
        else:
            await wait_until(lambda: _logged(a, "FENCED"), 20, "worker-a fenced")
        runs = await jobs.wait_done()
        assert_exclusive(runs, exited)
        assert any(r.pid == b.pid and r.ok for r in runs)
        assert "FENCED" in a.output()
        if not sync:
            assert a.alive()
            await wait_members(client, a, b)  # it rejoined after its runs ended


async def test_graceful_leave_waits_for_a_running_sync_handler(
    cluster: Cluster, redis: Any
) -> None:
    """SIGTERM with a short shutdown timeout while a sync handler runs: the worker does
    not leave (which would free the shard at once) until the run has ended, then
    leaves and exits 0; the next owner runs on the shard only after that."""
    timers = {"STREAMWORKS_LEASE_TTL": "6"}  # the 3 s run ends inside the last lease
    await start_coordinator(cluster, **timers)
    a = start_worker(cluster, "worker-a", E2E_SYNC="1", **timers)
    b = start_worker(cluster, "worker-b", E2E_SYNC="1", **timers)
    jobs = Jobs(cluster, redis)
    async with cluster.client() as client:
        info = await wait_members(client, a, b)
        (shard,) = owned_by(info, a)
        await jobs.publish(1, prefix="leave", sleep=3.0, on=shard)
        started = await jobs.wait_started(a.pid, shard)
        a.send(signal.SIGTERM)
        assert await a.wait_exit(20) == 0
        runs = await jobs.runs()
        mine = next(r for r in runs if r.start_seq == started.start_seq)
        assert mine.ok, mine  # it ran to its end...
        assert "waiting for 1 handler runs to end" in a.output()
        assert "left group" in a.output()  # ...and only then did the worker leave
        await jobs.publish(2, prefix="after", sleep=0.1, on=shard)
        runs = await jobs.wait_done()
        assert any(r.pid == b.pid and r.shard == shard for r in runs)
        assert_exclusive(runs)


async def test_a_worker_whose_grace_does_not_fit_its_lease_refuses_to_start(
    cluster: Cluster,
) -> None:
    result = await cluster.cli(
        "worker", TARGET, env={"STREAMWORKS_LEASE_TTL": "2", "STREAMWORKS_WORKER__LEASE_GRACE": "2"}
    )
    err = result.stderr.decode(errors="replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert result.returncode == 1, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "lease_grace" in lines[0] and "lease_ttl" in lines[0], lines[0]


def _logged(proc: Proc, text: str) -> Any:
    async def probe() -> bool:
        return text in proc.output()

    return probe()
