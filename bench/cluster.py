"""streamworks on a 3-master Redis Cluster against a single node, in the same run.

Starts a single node (``EmbeddedRedis``) and a local cluster (``LocalCluster``: 3
masters, ``--replicas`` replicas each) from the same server binary on 127.0.0.1, then
measures on both, alternating rounds (the tables show medians and the cluster's ratio
to the single node):

* **publish** — ``app.publish_many`` of ``--messages`` ~100-byte records, 1,000 per
  call, on ``--shards`` shards (one pipelined write per node per call on the cluster);
  with ``--replicas`` >= 1 also with ``min_replicas=1`` (``WAIT`` in the same write);
* **consume** — a ``Worker`` owning every shard handles ``--messages`` pre-published
  entries with a no-op handler, until every ack is confirmed;
* **connections** — connections a worker owning 64 idle shards holds on each node
  (``CLIENT LIST``, against the count before it started), and its wait connections;
* **spread** — how shard tags fall on the masters for 8, 64 and 1,024 shards (the
  slot map of the cluster; shards per master, max/min).

Run: ``python bench/cluster.py`` (``--messages``, ``--shards``, ``--rounds``,
``--replicas``, ``--json FILE``). Every contestant runs in this process, one after
the other, so the numbers compare the two deployments, not absolute capacity; on a
small machine the cluster's six processes share its cores with the client.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.crc import key_slot

from streamworks import App, Record, Settings
from streamworks.coordinator.provision import (
    create_group,
    create_shards,
    grant_token,
    write_fence,
)
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.runtime.assignment import StaticAssignment
from streamworks.runtime.connection import open_connection
from streamworks.runtime.routing import StaticRoutingSource
from streamworks.runtime.worker import Worker
from streamworks.testing.cluster import LocalCluster
from streamworks.testing.embedded import EmbeddedRedis

PAYLOAD = {"order": "o-0000000", "customer": "customer-00000", "amount": 12345, "note": "x" * 30}
KEYS = 5000
STREAM = "bench"
GROUP = "bench-group"


class _NoCoordinator:
    async def aclose(self) -> None:
        return None


def _app(prefix: str, url: str, shards: int, min_replicas: int = 0) -> tuple[App, Settings]:
    settings = Settings(redis_url=url, key_prefix=prefix)
    app = App(GROUP, settings=settings)
    app.stream(STREAM, shards=shards, min_replicas=min_replicas, replica_timeout=5.0)
    return app, settings


async def _provision(redis: Any, prefix: str, shards: int) -> list[ShardId]:
    ids = [ShardId(STREAM, i) for i in range(shards)]
    scripts, keyspace = Scripts(redis), Keyspace(prefix)
    await create_shards(scripts, keyspace, ids, [GROUP])
    await create_group(scripts, keyspace, ids, GROUP, "earliest")
    return ids


async def publish(url: str, shards: int, total: int, min_replicas: int = 0) -> float:
    """Messages/s of ``app.publish_many``, 1,000 records per call."""
    prefix = f"p{uuid.uuid4().hex[:8]}"
    app, settings = _app(prefix, url, shards, min_replicas)
    redis = create_redis(settings)
    try:
        await _provision(redis, prefix, shards)
        routing = StaticRoutingSource(Keyspace(prefix), {STREAM: shards})
        async with (
            open_connection(
                app, settings, redis=redis, routing=routing, coordinator=_NoCoordinator(),
                ensure_streams=False,
            ) as conn,
            app.attached(conn),
        ):  # fmt: skip
            start = time.perf_counter()
            for base in range(0, total, 1000):
                records = [
                    Record(PAYLOAD, key=f"c{i % KEYS}")
                    for i in range(base, min(total, base + 1000))
                ]
                await app.publish_many(STREAM, records)
            return total / (time.perf_counter() - start)
    finally:
        await _delete(redis, prefix)
        await redis.aclose()


async def consume(url: str, shards: int, total: int) -> float:
    """Messages/s of one worker handling pre-published entries (no-op handler)."""
    prefix = f"c{uuid.uuid4().hex[:8]}"
    app, settings = _app(prefix, url, shards)

    @app.handler(STREAM, ordering="key")
    async def handle(payload: bytes) -> None:
        return None

    redis = create_redis(settings)
    try:
        ids = await _provision(redis, prefix, shards)
        routing = StaticRoutingSource(Keyspace(prefix), {STREAM: shards})
        async with (
            open_connection(
                app, settings, redis=redis, routing=routing, coordinator=_NoCoordinator(),
                ensure_streams=False,
            ) as conn,
            app.attached(conn),
        ):  # fmt: skip
            for base in range(0, total, 1000):
                records = [
                    Record(PAYLOAD, key=f"c{i % KEYS}")
                    for i in range(base, min(total, base + 1000))
                ]
                await app.publish_many(STREAM, records)
        member = uuid.uuid4().hex
        worker = Worker(
            app, redis, StaticAssignment({s: grant_token(1, member) for s in ids}),
            settings=settings, member_id=member,
        )  # fmt: skip
        for shard in ids:
            await write_fence(worker.scripts, worker.keyspace, shard, GROUP, 1, member)
        import anyio

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            while worker.acker.acked < total:  # noqa: ASYNC110 - polling a counter
                await asyncio.sleep(0.002)
            elapsed = time.perf_counter() - start
            worker.request_stop()
        return total / elapsed
    finally:
        await _delete(redis, prefix)
        await redis.aclose()


async def connections(url: str, shards: int = 64) -> dict[str, Any]:
    """Connections per node held by one worker owning ``shards`` idle shards."""
    import anyio

    prefix = f"w{uuid.uuid4().hex[:8]}"
    app, settings = _app(prefix, url, shards)

    @app.handler(STREAM)
    async def handle(payload: bytes) -> None:
        return None

    probe = create_redis(settings)
    redis = create_redis(settings)
    try:
        ids = await _provision(probe, prefix, shards)
        before = await _clients(probe)
        member = uuid.uuid4().hex
        worker = Worker(
            app, redis, StaticAssignment({s: grant_token(1, member) for s in ids}),
            settings=settings, member_id=member,
        )  # fmt: skip
        for shard in ids:
            await write_fence(worker.scripts, worker.keyspace, shard, GROUP, 1, member)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            deadline = time.monotonic() + 30
            while worker.waiter.statistics()["waiting"] < shards - settings.worker.own_waits:
                if time.monotonic() > deadline:
                    raise RuntimeError("the worker's shards did not all go idle")
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # idle for a while: what it holds at rest
            after = await _clients(probe)
            stats = worker.waiter.statistics()
            waits = f"{stats['nodes']} shared + {stats['own']} own"
            worker.request_stop()
        per_node = {node: after[node] - before.get(node, 0) for node in after}
        return {"per_node": per_node, "total": sum(per_node.values()), "wait": waits}
    finally:
        await _delete(probe, prefix)
        await probe.aclose()
        await redis.aclose()


async def _clients(redis: Any) -> dict[str, int]:
    if hasattr(redis, "get_primaries"):
        nodes = redis.get_primaries()
        replies = await redis.client_list(target_nodes=nodes)
        if not isinstance(replies, dict):
            replies = {nodes[0].name: replies}
        return {name: len(clients) for name, clients in replies.items()}
    return {"single": len(await redis.client_list())}


async def _delete(redis: Any, prefix: str) -> None:
    for pattern in Keyspace(prefix).namespace_patterns():
        keys = [k async for k in redis.scan_iter(match=pattern, count=1000)]
        for i in range(0, len(keys), 500):
            for key in keys[i : i + 500]:
                await redis.delete(key)


def spread(cluster: LocalCluster, counts: tuple[int, ...] = (8, 64, 1024)) -> dict[str, Any]:
    """Shards per master for each shard count (by the cluster's slot map)."""
    keyspace = Keyspace("sw")
    owner: dict[int, int] = {}
    for master in cluster.masters():
        for lo, hi in master.slots:
            for slot in range(lo, hi + 1):
                owner[slot] = master.port
    result: dict[str, Any] = {}
    for n in counts:
        per = Counter(
            owner[key_slot(keyspace.stream(ShardId("orders", i)).encode())] for i in range(n)
        )
        values = [per.get(m.port, 0) for m in cluster.masters()]
        result[str(n)] = {
            "per_master": values,
            "max_over_min": (max(values) / min(values)) if min(values) else None,
        }
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    single = EmbeddedRedis().start()
    cluster = LocalCluster(replicas=args.replicas).start()
    targets = {"single": single.url, "cluster": cluster.url}
    rows: dict[str, dict[str, list[float]]] = {}

    def add(row: str, target: str, value: float) -> None:
        rows.setdefault(row, {}).setdefault(target, []).append(value)

    try:
        for round_no in range(args.rounds):
            order = list(targets) if round_no % 2 == 0 else list(reversed(targets))
            for target in order:
                url = targets[target]
                add("publish_many", target, await publish(url, args.shards, args.messages))
                if args.replicas and target == "cluster":
                    add(
                        "publish_many min_replicas=1",
                        target,
                        await publish(url, args.shards, args.messages, min_replicas=1),
                    )
                add("consume", target, await consume(url, args.shards, args.messages))
        conns = {t: await connections(u) for t, u in targets.items()}
        return {
            "messages": args.messages,
            "shards": args.shards,
            "replicas": args.replicas,
            "rounds": rows,
            "connections_64_idle_shards": conns,
            "spread": spread(cluster),
        }
    finally:
        cluster.stop()
        single.stop()


def report(results: dict[str, Any]) -> None:
    rounds = len(next(iter(results["rounds"].values()))["cluster"])
    print(
        f"# {results['messages']:,} messages, {results['shards']} shards, cluster of 3 masters "
        f"x {results['replicas']} replica(s); medians of {rounds} rounds"
    )
    print(f"{'':32} {'single msg/s':>14} {'cluster msg/s':>14} {'ratio':>7}")
    for row, by in results["rounds"].items():
        s = statistics.median(by["single"]) if "single" in by else None
        c = statistics.median(by["cluster"])
        ratio = f"{c / s:.2f}" if s else "-"
        print(f"{row:32} {(f'{s:,.0f}' if s else '-'):>14} {c:>14,.0f} {ratio:>7}")
    print("\n# connections held by one worker owning 64 idle shards (CLIENT LIST delta)")
    for target, c in results["connections_64_idle_shards"].items():
        print(
            f"{target:8} total {c['total']:3}  per node {c['per_node']}  "
            f"wait connections {c['wait']}"
        )
    print("\n# shard tags per master (3 masters)")
    for n, s in results["spread"].items():
        ratio = f"{s['max_over_min']:.2f}" if s["max_over_min"] else "inf"
        print(f"{n:>5} shards: per master {s['per_master']}  max/min {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    report(results)
    if args.json:
        import json

        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
