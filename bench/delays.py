"""Delayed-message precision: due → handled at 1,000 delayed messages per second.

A publisher process sends 1,000 msg/s for 10 s (8 shards, keyed) with
``delay=1 s`` (``delayed``), or without a delay (``immediate``, the baseline); a
consumer process (a ``Worker`` with default settings on all 8 shards, started first)
records in its handler how late it runs:

* ``delayed`` — ``time.time_ns()`` at the handler minus the message's due time
  (``Message.due_at``: Redis ``TIME`` + delay at the publish, same host so the same
  wall clock). This is the whole path: the shard's mover wakes at the due time, moves
  the message into the stream (``delay_move.lua``), the reader reads it, the
  dispatcher runs it.
* ``immediate`` — ``time.time_ns()`` at the handler minus the wall time in the
  payload, taken just before the publish: publish → handled, what the delayed path is
  compared with.

The first 0.5 s of messages are warm-up and not counted. ``due → handled`` can never
be negative (the move compares with Redis ``TIME``); a negative sample would be an
early delivery and is reported as ``early``.

Run: ``python bench/delays.py`` (``--rate``, ``--duration``, ``--delay``, ``--rounds``;
``--rounds 1 --duration 1`` is the quick smoke run of tests/e2e/test_bench_scripts.py).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import common
from common import KEYS, PAYLOAD, PREFIX, SHARDS, Suite
from latency import _NoCoordinator, _paced, drive, percentiles, sw_keys

from streamworks import Message  # the handler's annotation is resolved at module level

CONTESTANTS = ("immediate", "delayed")
STREAM = "lat"  # latency.sw_keys() builds this stream's keys
WARMUP = 0.5


class Lateness:
    """Collects how late each message ran until ``total`` arrived."""

    def __init__(self, total: int, warmup: int) -> None:
        self.total, self.warmup = total, warmup
        self.seen = 0
        self.early = 0
        self.samples: list[int] = []
        self.done = asyncio.Event()

    def record(self, late_ns: int) -> None:
        self.seen += 1
        if late_ns < 0:
            self.early += 1
        if self.seen > self.warmup:
            self.samples.append(late_ns)
        if self.seen >= self.total:
            self.done.set()

    async def wait(self, timeout: float) -> dict[str, Any]:
        try:
            await asyncio.wait_for(self.done.wait(), timeout)
        except TimeoutError:
            pass
        return {"received": self.seen, "early": self.early, **percentiles(self.samples)}


async def publisher(url: str, rate: float, total: int, delay: float) -> dict[str, Any]:
    """``app.publish`` at ``rate``; with ``delay`` > 0 every message is delayed by it."""
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
            value = {**PAYLOAD, "ts": time.time_ns()}
            await app.publish(STREAM, value, key=f"c{i % KEYS}", delay=delay or None)

        return await _paced(rate, total, send)


async def consumer(
    url: str, group: str, total: int, warmup: int, ready: Any, delayed: bool, timeout: float
) -> dict[str, Any]:
    import anyio

    from streamworks import App, Settings
    from streamworks.coordinator.provision import grant_token, write_fence
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.client import create_redis
    from streamworks.runtime.assignment import StaticAssignment
    from streamworks.runtime.worker import Worker

    settings = Settings(redis_url=url, key_prefix=PREFIX)
    redis = create_redis(settings)
    app = App(group, settings=settings)
    app.stream(STREAM, shards=SHARDS)
    rec = Lateness(total, warmup)

    @app.handler(STREAM, ordering="key")
    async def handle(value: dict[str, Any], msg: Message) -> None:
        now = time.time_ns()
        if delayed:
            due = msg.due_at
            assert due is not None, "a delayed message without its due time"
            rec.record(now - due * 1_000_000)
        else:
            rec.record(now - value["ts"])

    member = uuid.uuid4().hex
    shards = [ShardId(STREAM, i) for i in range(SHARDS)]
    worker = Worker(
        app,
        redis,
        StaticAssignment({s: grant_token(1, member) for s in shards}),
        settings=settings,
        member_id=member,
    )
    for shard in shards:
        await write_fence(worker.scripts, worker.keyspace, shard, group, 1, member)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await asyncio.sleep(0.3)  # readers and movers past their first pass
        ready.set()
        res = await rec.wait(timeout=timeout)
        res["moved"] = sum(worker.delays.moved_total.values())
        worker.request_stop()
    await redis.aclose()
    return res


async def _one(suite: Suite, who: str, group: str, args: argparse.Namespace) -> dict[str, Any]:
    from streamworks.coordinator.provision import create_group
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    total = int(args.rate * args.duration)
    delay = args.delay if who == "delayed" else 0.0
    shards = [ShardId(STREAM, i) for i in range(SHARDS)]
    await create_group(Scripts(suite.redis), Keyspace(PREFIX), shards, group, "latest")
    ready = common.new_event()
    wait = total / 500 + 30 + delay
    child = common.Child(
        "delays:consumer", use_uvloop=suite.use_uvloop, url=suite.url, group=group, total=total,
        warmup=int(args.rate * WARMUP), ready=ready, delayed=delay > 0, timeout=wait,
    )  # fmt: skip
    return await drive(
        suite, child, ready, sw_keys(), group, "delays:publisher", rate=args.rate, total=total,
        result_timeout=wait + 30, delay=delay,
    )  # fmt: skip


async def run_suite(suite: Suite, args: argparse.Namespace) -> dict[str, Any]:
    from streamworks.coordinator.provision import create_shards
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    shards = [ShardId(STREAM, i) for i in range(SHARDS)]
    await create_shards(Scripts(suite.redis), Keyspace(PREFIX), shards, ["seed"])
    print(
        f"# delays: {args.rate:,.0f} msg/s for {args.duration:.0f}s per contestant and round, "
        f"delay {args.delay}s; first {WARMUP}s excluded"
    )
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTESTANTS}
    for r in range(args.rounds):
        for who in common.alternate(CONTESTANTS, r):
            res = await _one(suite, who, f"delays-{who}-{r}", args)
            runs[who].append(res)
            print(
                f"delays round {r + 1} {who:10s} p50 {res['p50']:7.2f} ms  p99 {res['p99']:7.2f} "
                f"ms  max {res['max']:7.2f} ms  received {res['received']:,}  early "
                f"{res['early']}  (published at {res['publish_rate']:,.0f}/s)"
            )
    summary: dict[str, Any] = {}
    for who, rs in runs.items():
        summary[who] = {
            stat: round(common.median([x[stat] for x in rs]), 3) for stat in ("p50", "p99", "max")
        }
        summary[who]["early"] = sum(x["early"] for x in rs)
        summary[who]["rounds"] = [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in x.items()} for x in rs
        ]
    base = summary["immediate"]
    for who in summary:
        for stat in ("p50", "p99"):
            summary[who][f"{stat}_ratio"] = round(summary[who][stat] / base[stat], 2)
    results = {
        "delays": {
            "rate": args.rate,
            "duration": args.duration,
            "delay_s": args.delay,
            "warmup_s": WARMUP,
            "unit": "ms",
            "measured": "delayed: handler start - due time; immediate: handler start - publish",
            "baseline": "immediate",
            "results": summary,
        }
    }
    common.print_table(
        f"due → handled at {args.rate:,.0f} delayed msg/s (ms; medians of rounds)",
        ["contestant", "p50", "p99", "max", "early", "p50 × immediate", "p99 × immediate"],
        [
            [who, s["p50"], s["p99"], s["max"], s["early"], s["p50_ratio"], s["p99_ratio"]]
            for who, s in summary.items()
        ],
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of publishing")
    parser.add_argument("--delay", type=float, default=1.0, help="delay of each message (s)")
    args = parser.parse_args()
    common.standalone(run_suite, args)


if __name__ == "__main__":
    main()
