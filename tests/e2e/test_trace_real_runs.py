"""The trace check on real runs, and a rule broken on purpose that it must catch.

A coordinator and two workers of ``tests/e2e/apps/broken.py`` (the slow app: stream
``jobs``, 2 shards) record their protocol steps (``STREAMWORKS_HISTORY_FILE``, one file
per process). Jobs are handled; worker A is paused with SIGSTOP past its lease, the
coordinator expires it and moves its shard to B; A is resumed (SIGCONT) and answered
``UNKNOWN_MEMBER``; more jobs are handled. Then ``tests/chaos/trace_check.py`` replays
the merged history:

* with the rules as the runtime follows them, A drops its shards on that answer and
  rejoins: the history passes;
* with ``E2E_BROKEN_RULE=renew-revoked-lease`` on A, A keeps its shard and renews its
  lease on the answer (a revoked lease renewed): the check fails, at A's step, on
  "one valid holder" (B holds that shard under a valid lease then).

The two runs differ in that one variable only, which only the test app honours.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamworks import App
from streamworks.protocol.client import CoordinatorClient
from tests.chaos.trace_check import check_directory, record_history
from tests.e2e.apps import slow
from tests.e2e.harness import Cluster, Proc, live, member_of, wait_ready, wait_until

TARGET = "tests.e2e.apps.broken:app"
TIMERS = {
    "STREAMWORKS_HEARTBEAT_INTERVAL": "0.2",
    "STREAMWORKS_LEASE_TTL": "2",
    "STREAMWORKS_WORKER__LEASE_GRACE": "0.5",
    "STREAMWORKS_WORKER__SHUTDOWN_TIMEOUT": "0.5",
}

pytestmark = pytest.mark.timeout(120)


async def owners(client: CoordinatorClient, *procs: Proc) -> dict[str, list[str]] | None:
    """Member id -> shards of each of ``procs``, once they alone are live, STABLE and own
    every shard between them (None before)."""
    info = await client.group(slow.GROUP)
    members = [member_of(info, p) for p in procs]
    if len(live(info)) != len(procs) or info.state != "STABLE":
        return None
    out: dict[str, list[str]] = {}
    for m in members:
        if m is None or m.state != "STABLE" or sorted(m.assigned) != sorted(m.target):
            return None
        out[m.member_id] = sorted(m.assigned)
    return out if sum(len(s) for s in out.values()) == slow.SHARDS else None


async def handle(cluster: Cluster, redis: Any, prefix: str, n: int) -> None:
    """Publish ``n`` quick jobs and wait until each was handled."""
    app = App("trace-producer", settings=cluster.settings())
    app.stream(slow.STREAM, shards=slow.SHARDS)
    ids = [f"{prefix}-{i}" for i in range(n)]
    async with app.connect():
        for job in ids:
            await app.publish(slow.STREAM, {"id": job, "sleep": 0.01}, key=job)

    async def done() -> bool:
        ended = set()
        for raw in await redis.lrange(slow.runs_key(cluster.prefix), 0, -1):
            doc = orjson.loads(raw.decode().rpartition("|")[0])
            if doc["ev"] == "end" and doc["ok"]:
                ended.add(doc["id"])
        return ended >= set(ids)

    await wait_until(done, 40, f"{n} jobs handled", 0.1)


def heartbeats_after(history: Path, pid: int, since: float) -> list[dict[str, Any]]:
    path = history / f"{pid}.jsonl"
    if not path.exists():
        return []
    steps = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    return [s for s in steps if s["kind"] == "heartbeat" and s["t"] > since]


@pytest.mark.parametrize("broken", [False, True], ids=["rules-kept", "renews-revoked-lease"])
async def test_a_resumed_member_passes_the_trace_check_unless_it_renews_a_revoked_lease(
    cluster: Cluster, redis: Any, tmp_path: Path, broken: bool
) -> None:
    history = record_history(cluster.base_env, tmp_path / "history")
    await wait_ready(cluster.start_coordinator(**TIMERS))
    async with cluster.client() as client:
        await client.create_stream(slow.STREAM, slow.SHARDS)
    rule = {"E2E_BROKEN_RULE": "renew-revoked-lease"} if broken else {}
    a = cluster.start_worker("worker-a", target=TARGET, **TIMERS, **rule)
    b = cluster.start_worker("worker-b", target=TARGET, **TIMERS)
    async with cluster.client() as client:
        before = await wait_until(lambda: owners(client, a, b), 40, "a and b own a shard each")
        await handle(cluster, redis, "before", 6)
        a.send(signal.SIGSTOP)
        try:
            after = await wait_until(lambda: owners(client, b), 40, "b owns every shard")
        finally:
            resumed = time.clock_gettime(time.CLOCK_BOOTTIME)
            a.send(signal.SIGCONT)
        (a_id,) = set(before) - set(after)
        # A applies an answer after its resume: UNKNOWN_MEMBER (dropped), or, broken,
        # that answer taken as OK with its old shard.
        await wait_until(
            lambda: _true(heartbeats_after(history, a.pid, resumed)), 20, "a heartbeat of a"
        )
        if not broken:
            await wait_until(lambda: owners(client, a, b), 40, "a rejoined")
        await handle(cluster, redis, "after", 6)
    ok, report = check_directory(history)
    print(report)
    if broken:
        assert not ok, report
        assert "one valid holder" in report.splitlines()[0], report
        assert f'"member":"{a_id}"' in report, report  # A's renewal is the offending step
    else:
        assert ok, report
        assert "read" in report and "ack" in report and "fence" in report, report


async def _true(value: list[Any]) -> bool:
    return bool(value)
