"""Publish → handler latency at a steady rate: streamworks vs a raw loop vs FastStream.

A publisher process sends 1,000 msg/s for 10 s (8 shards, keyed), each payload
carrying ``time.monotonic_ns()`` taken just before the publish call; a consumer
process (started first, in a fresh consumer group) records, in its handler,
``monotonic_ns() - ts``. ``CLOCK_MONOTONIC`` is system-wide on Linux, so the two
processes share the clock. The first 0.5 s of messages are warm-up and not counted.

* ``raw`` — XADD awaited one by one; the consumer is one coroutine doing a blocking
  ``XREADGROUP COUNT 100 BLOCK 1000`` over all 8 shards, JSON-decoding each entry,
  then one pipelined ``XACK`` per read.
* ``streamworks`` — ``app.publish``; a ``Worker`` with default settings
  (``ordering="key"``) and a handler taking the decoded ``dict``.
* ``faststream`` — ``broker.publish(..., stream=shard)``; one batch
  ``StreamSub`` subscriber per shard (``max_records=100``, the consume benchmark's
  configuration; ``polling_interval`` default 100 ms is the XREADGROUP BLOCK time).

Run: ``python bench/latency.py`` (``--rate``, ``--duration``, ``--rounds``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import common
from common import KEYS, PAYLOAD, PREFIX, SHARDS, Suite

CONTESTANTS = ("raw", "streamworks", "faststream")
STREAM = "lat"
#: Seconds of warm-up excluded from the percentiles.
WARMUP = 0.5


def sw_keys() -> list[str]:
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace

    keyspace = Keyspace(PREFIX)
    return [keyspace.stream(ShardId(STREAM, i)) for i in range(SHARDS)]


def raw_keys() -> list[str]:
    return [f"rawlat/{i}" for i in range(SHARDS)]


def fs_keys() -> list[str]:
    return [f"fslat/{i}" for i in range(SHARDS)]


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50/p90/p99/max in milliseconds."""
    if not samples_ns:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "max": float("nan")}
    xs = sorted(samples_ns)
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return {
        "p50": q[49] / 1e6,
        "p90": q[89] / 1e6,
        "p99": q[98] / 1e6,
        "max": xs[-1] / 1e6,
    }


class Recorder:
    """Collects latencies until ``total`` messages arrived."""

    def __init__(self, total: int, warmup: int) -> None:
        self.total = total
        self.warmup = warmup
        self.seen = 0
        self.samples: list[int] = []
        self.done = asyncio.Event()

    def record(self, ts: int) -> None:
        lat = time.monotonic_ns() - ts
        self.seen += 1
        if self.seen > self.warmup:
            self.samples.append(lat)
        if self.seen >= self.total:
            self.done.set()

    async def wait(self, timeout: float) -> dict[str, Any]:
        try:
            await asyncio.wait_for(self.done.wait(), timeout)
        except TimeoutError:
            pass
        return {"received": self.seen, **percentiles(self.samples)}


# -- publishers (own process) ---------------------------------------------------------------
async def _paced(rate: float, total: int, send: Any) -> dict[str, Any]:
    """Call ``send(i)`` ``total`` times at ``rate`` per second (no catch-up bursts)."""
    interval = 1.0 / rate
    start = time.monotonic()
    late = 0
    for i in range(total):
        due = start + i * interval
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -interval:
            late += 1
        await send(i)
    elapsed = time.monotonic() - start
    return {"sent": total, "rate": total / elapsed, "late": late}


def _value(i: int) -> dict[str, Any]:
    return {**PAYLOAD, "ts": time.monotonic_ns()}


async def raw_publisher(url: str, keys: list[str], rate: float, total: int) -> dict[str, Any]:
    import orjson

    redis = common.create_client(url)
    await redis.ping()

    async def send(i: int) -> None:
        await redis.execute_command(
            "XADD", keys[i % SHARDS], "*", "v", orjson.dumps(_value(i)),
            "t", str(int(time.time() * 1000)), "f", "1", "k", f"c{i % KEYS}",
        )  # fmt: skip

    res = await _paced(rate, total, send)
    await redis.aclose()
    return res


class _NoCoordinator:
    async def aclose(self) -> None:
        return None


async def sw_publisher(url: str, rate: float, total: int) -> dict[str, Any]:
    from streamworks import App, Settings
    from streamworks.redis.keyspace import Keyspace
    from streamworks.runtime.connection import open_connection
    from streamworks.runtime.routing import StaticRoutingSource

    settings = Settings(redis_url=url, key_prefix=PREFIX)
    app = App("bench-producer", settings=settings)
    app.stream(STREAM, shards=SHARDS)
    routing = StaticRoutingSource(Keyspace(PREFIX), {STREAM: SHARDS})
    async with (
        open_connection(
            app, settings, routing=routing, coordinator=_NoCoordinator(), ensure_streams=False
        ) as conn,
        app.attached(conn),
    ):
        await conn.redis.ping()

        async def send(i: int) -> None:
            await app.publish(STREAM, _value(i), key=f"c{i % KEYS}")

        return await _paced(rate, total, send)


async def fs_publisher(url: str, keys: list[str], rate: float, total: int) -> dict[str, Any]:
    from faststream.redis import RedisBroker

    broker = RedisBroker(url, logger=None)
    await broker.connect()

    async def send(i: int) -> None:
        await broker.publish(_value(i), stream=keys[i % SHARDS])

    res = await _paced(rate, total, send)
    await broker.stop()
    return res


# -- consumers (own process) ----------------------------------------------------------------
async def raw_consumer(
    url: str, keys: list[str], group: str, total: int, warmup: int, ready: Any
) -> dict[str, Any]:
    import orjson

    redis = common.create_client(url)
    await redis.ping()
    rec = Recorder(total, warmup)
    streams = dict.fromkeys(keys, ">")

    async def loop() -> None:
        while True:
            reply = await redis.xreadgroup(group, "raw", streams, count=100, block=1000)
            if not reply:
                continue
            # A context manager: the loop is cancelled at the end, maybe mid-execute,
            # and the pipeline must give its connection back then.
            async with redis.pipeline(transaction=False) as pipe:
                for key, entries in reply:
                    ids = []
                    for entry_id, fields in entries:
                        rec.record(orjson.loads(fields[b"v"])["ts"])
                        ids.append(entry_id)
                    pipe.xack(key, group, *ids)
                await pipe.execute()

    task = asyncio.create_task(loop())
    ready.set()
    res = await rec.wait(timeout=total / 500 + 30)
    task.cancel()
    return res


async def sw_consumer(url: str, group: str, total: int, warmup: int, ready: Any) -> dict[str, Any]:
    import anyio

    from streamworks import App, Settings
    from streamworks.redis.client import create_redis

    settings = Settings(redis_url=url, key_prefix=PREFIX)
    redis = create_redis(settings)
    app = App(group, settings=settings)
    app.stream(STREAM, shards=SHARDS)
    rec = Recorder(total, warmup)

    @app.handler(STREAM, ordering="key")
    async def handle(value: dict[str, Any]) -> None:
        rec.record(value["ts"])

    worker = await common.owning_worker(app, redis, settings, STREAM)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await asyncio.sleep(0.3)  # readers past their takeover pass, waiting for entries
        ready.set()
        res = await rec.wait(timeout=total / 500 + 30)
        worker.request_stop()
    await redis.aclose()
    return res


async def fs_consumer(
    url: str, keys: list[str], group: str, total: int, warmup: int, ready: Any
) -> dict[str, Any]:
    from faststream import AckPolicy
    from faststream.redis import RedisBroker, StreamSub

    broker = RedisBroker(url, logger=None)
    rec = Recorder(total, warmup)
    for key in keys:

        @broker.subscriber(
            stream=StreamSub(key, group=group, consumer="bench", batch=True, max_records=100),
            ack_policy=AckPolicy.REJECT_ON_ERROR,
        )
        async def handle(body: list[dict[str, Any]]) -> None:
            for value in body:
                rec.record(value["ts"])

    await broker.start()
    await asyncio.sleep(0.3)
    ready.set()
    res = await rec.wait(timeout=total / 500 + 30)
    await broker.stop()
    return res


# -- the suite ---------------------------------------------------------------------------
async def _one(suite: Suite, who: str, group: str, rate: float, total: int) -> dict[str, Any]:
    from streamworks.coordinator.provision import create_group

    warmup = int(rate * WARMUP)
    ready = common.new_event()
    if who == "raw":
        keys = raw_keys()
        await common.create_groups(suite.redis, keys, group, "$")
        consumer = common.Child(
            "latency:raw_consumer", use_uvloop=suite.use_uvloop, url=suite.url, keys=keys,
            group=group, total=total, warmup=warmup, ready=ready,
        )  # fmt: skip
        pub_target, pub_kwargs = "latency:raw_publisher", {"keys": keys}
    elif who == "streamworks":
        from streamworks.protocol.shards import ShardId
        from streamworks.redis.keyspace import Keyspace
        from streamworks.redis.scripts import Scripts

        keys = sw_keys()
        shards = [ShardId(STREAM, i) for i in range(SHARDS)]
        await create_group(Scripts(suite.redis), Keyspace(PREFIX), shards, group, "latest")
        consumer = common.Child(
            "latency:sw_consumer", use_uvloop=suite.use_uvloop, url=suite.url, group=group,
            total=total, warmup=warmup, ready=ready,
        )  # fmt: skip
        pub_target, pub_kwargs = "latency:sw_publisher", {}
    else:
        keys = fs_keys()
        await common.create_groups(suite.redis, keys, group, "$")
        consumer = common.Child(
            "latency:fs_consumer", use_uvloop=suite.use_uvloop, url=suite.url, keys=keys,
            group=group, total=total, warmup=warmup, ready=ready,
        )  # fmt: skip
        pub_target, pub_kwargs = "latency:fs_publisher", {"keys": keys}
    return await drive(
        suite, consumer, ready, keys, group, pub_target, rate=rate, total=total,
        result_timeout=60, **pub_kwargs,
    )  # fmt: skip


async def drive(
    suite: Suite,
    consumer: common.Child,
    ready: Any,
    streams: list[str],
    group: str,
    pub_target: str,
    *,
    rate: float,
    total: int,
    result_timeout: float,
    **pub_kwargs: Any,
) -> dict[str, Any]:
    """Wait for the consumer child to be ready, run the publisher child at ``rate``,
    collect the consumer's result (with the publisher's rate and lateness); then stop
    the consumer and leave ``streams`` empty, its group destroyed (latency_load too)."""
    try:
        deadline = time.monotonic() + 60
        while not ready.is_set():
            if not consumer.process.is_alive() or time.monotonic() > deadline:
                return consumer.result(1)  # raises with the child's error
            await asyncio.sleep(0.05)
        pub = common.run_child(
            pub_target,
            timeout=total / rate + 60,
            use_uvloop=suite.use_uvloop,
            url=suite.url,
            rate=rate,
            total=total,
            **pub_kwargs,
        )
        res = consumer.result(timeout=result_timeout)
        res["publish_rate"] = pub["rate"]
        if "late" in pub:
            res["publish_late"] = pub["late"]
        return res
    finally:
        consumer.stop()
        await common.destroy_groups(suite.redis, streams, group)
        for key in streams:
            await suite.redis.execute_command("XTRIM", key, "MAXLEN", 0)


async def run_suite(suite: Suite, args: argparse.Namespace) -> dict[str, Any]:
    from streamworks.coordinator.provision import create_shards
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    shards = [ShardId(STREAM, i) for i in range(SHARDS)]
    await create_shards(Scripts(suite.redis), Keyspace(PREFIX), shards, ["seed"])
    for key in raw_keys() + fs_keys():
        await suite.redis.execute_command("XGROUP", "CREATE", key, "seed", "$", "MKSTREAM")
    total = int(args.rate * args.duration)
    print(
        f"# latency: {args.rate:,.0f} msg/s for {args.duration:.0f}s ({total:,} msgs) per "
        f"contestant and round, first {WARMUP}s excluded"
    )
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTESTANTS}
    for r in range(args.rounds):
        for who in common.alternate(CONTESTANTS, r):
            res = await _one(suite, who, f"lat-{who}-{r}", args.rate, total)
            runs[who].append(res)
            print(
                f"latency round {r + 1} {who:12s} p50 {res['p50']:7.2f} ms  p99 "
                f"{res['p99']:7.2f} ms  max {res['max']:7.2f} ms  received {res['received']:,} "
                f"(published at {res['publish_rate']:,.0f}/s)"
            )
    summary: dict[str, Any] = {}
    for who, rs in runs.items():
        summary[who] = {
            stat: round(common.median([x[stat] for x in rs]), 3) for stat in ("p50", "p99", "max")
        }
        summary[who]["rounds"] = [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in x.items()} for x in rs
        ]
    for who in summary:
        base = summary.get("raw")
        summary[who]["p50_ratio"] = round(summary[who]["p50"] / base["p50"], 2) if base else None
        summary[who]["p99_ratio"] = round(summary[who]["p99"] / base["p99"], 2) if base else None
    results = {
        "latency": {
            "rate": args.rate,
            "duration": args.duration,
            "messages": total,
            "warmup_s": WARMUP,
            "unit": "ms",
            "baseline": "raw",
            "results": summary,
        }
    }
    print_results(results)
    return results


def print_results(results: dict[str, Any]) -> None:
    lat = results["latency"]
    common.print_table(
        f"publish → handler latency at {lat['rate']:,.0f} msg/s for {lat['duration']:.0f}s "
        "(ms; medians of rounds)",
        ["contestant", "p50", "p99", "max", "p50 × raw", "p99 × raw"],
        [
            (who, r["p50"], r["p99"], r["max"], r["p50_ratio"], r["p99_ratio"])
            for who, r in lat["results"].items()
        ],
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--rate", type=float, default=1000.0, help="msg/s (default 1000)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    return p


def main() -> None:
    common.standalone(run_suite, parser().parse_args())


if __name__ == "__main__":
    sys.exit(main())
