"""Publish → handler latency **under load**: at a fraction (default 50 %) of the
maximum consume throughput measured in the same run, streamworks vs the raw loop.

The rate is ``--load-fraction`` × the streamworks no-op consume rate: taken from the
consume suite when ``run_all.py`` runs both, otherwise measured here first (the
consume benchmark's streamworks contestant on ``--max-rate-messages`` messages), or
given with ``--max-rate``. Both contestants get exactly that rate.

**The load is generated inside the server.** A publisher in Python cannot send
100k+ msg/s on this 2-core machine without taking a core from the consumer, so the
publisher process calls a Lua script every 2 ms (:data:`BURST`) that ``XADD``\\ s the
messages due since the previous call, in the streamworks entry format, round-robin
over the 8 shards, each payload carrying ``time.monotonic_ns()`` taken by the
publisher just before the call. The handler records ``monotonic_ns() - ts``: the time
from "published" to "handled", including up to one tick of batching on the publish
side (the same for both contestants). The first 0.5 s is warm-up.

* ``raw-per-shard`` — the consume benchmark's headline loop with a blocking read:
  one task per shard, ``XREADGROUP COUNT 100 BLOCK 1000``, ``orjson.loads`` per
  entry, one ``XACK`` per batch.
* ``streamworks`` — a ``Worker`` with default settings (``ordering="key"``), handler
  taking the decoded ``dict`` (the latency benchmark's consumer).

Run: ``python bench/latency_load.py`` (``--load-fraction``, ``--max-rate``,
``--duration``, ``--rounds``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import common
import latency
from common import PAYLOAD, PREFIX, SHARDS, Suite

CONTESTANTS = ("raw-per-shard", "streamworks")
#: Seconds between two bursts of the publisher.
TICK = 0.002

#: KEYS: the shard streams. ARGV: count, first message number, JSON prefix (ending
#: in '"ts":'), the timestamp. Appends ``count`` entries in the streamworks format.
BURST = """
local n = tonumber(ARGV[1])
local first = tonumber(ARGV[2])
local value = ARGV[3] .. ARGV[4] .. '}'
local shards = #KEYS
for i = first, first + n - 1 do
  redis.call('XADD', KEYS[(i % shards) + 1], '*', 'v', value, 't', '0', 'f', '1',
             'k', 'c' .. (i % 5000))
end
return n
"""


def raw_keys() -> list[str]:
    return [f"rawload/{i}" for i in range(SHARDS)]


def json_prefix() -> str:
    import orjson

    body = orjson.dumps(PAYLOAD).decode()
    return body[:-1] + ',"ts":'


async def burst_publisher(url: str, keys: list[str], rate: float, total: int) -> dict[str, Any]:
    """Every TICK, one script call appending the messages due since the last one."""
    redis = common.create_client(url)
    burst = redis.register_script(BURST)
    prefix = json_prefix()
    await redis.ping()
    sent = 0
    calls = 0
    start = time.monotonic()
    while sent < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        if due > sent:
            n = min(due - sent, 5000)
            await burst(keys=keys, args=[n, sent, prefix, time.monotonic_ns()])
            sent += n
            calls += 1
        await asyncio.sleep(TICK)
    elapsed = time.monotonic() - start
    await redis.aclose()
    return {"sent": sent, "rate": sent / elapsed, "late": 0, "calls": calls}


async def raw_tasks_consumer(
    url: str, keys: list[str], group: str, total: int, warmup: int, ready: Any
) -> dict[str, Any]:
    import orjson

    redis = common.create_client(url)
    await redis.ping()
    rec = latency.Recorder(total, warmup)

    async def drain(key: str) -> None:
        while True:
            reply = await redis.xreadgroup(group, "raw", {key: ">"}, count=100, block=1000)
            if not reply:
                continue
            entries = reply[0][1]
            for _entry_id, fields in entries:
                rec.record(orjson.loads(fields[b"v"])["ts"])
            await redis.xack(key, group, *[entry_id for entry_id, _ in entries])

    tasks = [asyncio.create_task(drain(key)) for key in keys]
    ready.set()
    res = await rec.wait(timeout=total / 1000 + 60)
    for task in tasks:
        task.cancel()
    return res


async def _one(suite: Suite, who: str, group: str, rate: float, total: int) -> dict[str, Any]:
    from streamworks.coordinator.provision import create_group
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    warmup = int(rate * latency.WARMUP)
    ready = common.new_event()
    if who == "raw-per-shard":
        keys = raw_keys()
        await common.create_groups(suite.redis, keys, group, "$")
        consumer = common.Child(
            "latency_load:raw_tasks_consumer", use_uvloop=suite.use_uvloop, url=suite.url,
            keys=keys, group=group, total=total, warmup=warmup, ready=ready,
        )  # fmt: skip
    else:
        keys = latency.sw_keys()
        shards = [ShardId(latency.STREAM, i) for i in range(SHARDS)]
        await create_group(Scripts(suite.redis), Keyspace(PREFIX), shards, group, "latest")
        consumer = common.Child(
            "latency:sw_consumer", use_uvloop=suite.use_uvloop, url=suite.url, group=group,
            total=total, warmup=warmup, ready=ready,
        )  # fmt: skip
    return await latency.drive(
        suite, consumer, ready, keys, group, "latency_load:burst_publisher", rate=rate,
        total=total, result_timeout=120, keys=keys,
    )  # fmt: skip


async def measure_max_rate(suite: Suite, messages: int) -> float:
    """The streamworks no-op consume rate (one round of the consume benchmark's
    contestant), when the consume suite did not run in this process."""
    import consume

    await consume.prepare_sw(suite.redis, "maxrate", messages)
    try:
        res = await consume._round(suite, "streamworks", "maxrate", messages, "maxrate", 0.0)
    finally:
        for key in consume.sw_keys("maxrate"):
            await suite.redis.delete(key)
    return float(res["rate"])


async def run_suite(
    suite: Suite, args: argparse.Namespace, max_rate: float | None = None
) -> dict[str, Any]:
    from streamworks.coordinator.provision import create_shards
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    source = "given (--max-rate)"
    if args.max_rate:
        max_rate = args.max_rate
    elif max_rate is not None:
        source = "the consume suite of this run (streamworks, no-op, median)"
    else:
        max_rate = await measure_max_rate(suite, args.max_rate_messages)
        source = f"measured here (streamworks no-op consume, {args.max_rate_messages:,} msgs)"
    rate = max_rate * args.load_fraction
    total = int(rate * args.duration)
    shards = [ShardId(latency.STREAM, i) for i in range(SHARDS)]
    await create_shards(Scripts(suite.redis), Keyspace(PREFIX), shards, ["seed"])
    for key in raw_keys():
        await suite.redis.execute_command("XGROUP", "CREATE", key, "seed", "$", "MKSTREAM")
    print(
        f"# latency under load: {args.load_fraction:.0%} of {max_rate:,.0f} msg/s ({source}) = "
        f"{rate:,.0f} msg/s for {args.duration:.0f}s ({total:,} msgs) per contestant and round"
    )
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTESTANTS}
    for r in range(args.rounds):
        for who in common.alternate(CONTESTANTS, r):
            res = await _one(suite, who, f"load-{who}-{r}", rate, total)
            runs[who].append(res)
            print(
                f"latency under load round {r + 1} {who:14s} p50 {res['p50']:7.2f} ms  p99 "
                f"{res['p99']:7.2f} ms  max {res['max']:7.2f} ms  received {res['received']:,} "
                f"(published at {res['publish_rate']:,.0f}/s)"
            )
    summary: dict[str, Any] = {}
    for who, rs in runs.items():
        summary[who] = {
            stat: round(common.median([x[stat] for x in rs]), 3)
            for stat in ("p50", "p99", "max", "publish_rate")
        }
        summary[who]["rounds"] = [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in x.items()} for x in rs
        ]
    base = summary[CONTESTANTS[0]]
    for r in summary.values():
        r["p50_ratio"] = round(r["p50"] / base["p50"], 2)
        r["p99_ratio"] = round(r["p99"] / base["p99"], 2)
    results = {
        "latency_load": {
            "max_rate": round(max_rate, 1),
            "max_rate_source": source,
            "fraction": args.load_fraction,
            "rate": round(rate, 1),
            "duration": args.duration,
            "messages": total,
            "warmup_s": latency.WARMUP,
            "unit": "ms",
            "baseline": CONTESTANTS[0],
            "results": summary,
        }
    }
    print_results(results)
    return results


def print_results(results: dict[str, Any]) -> None:
    lat = results["latency_load"]
    common.print_table(
        f"publish → handler latency under load: {lat['rate']:,.0f} msg/s "
        f"({lat['fraction']:.0%} of {lat['max_rate']:,.0f}) for {lat['duration']:.0f}s "
        "(ms; medians of rounds)",
        ["contestant", "published/s", "p50", "p99", "max", "p50 × raw", "p99 × raw"],
        [
            (who, r["publish_rate"], r["p50"], r["p99"], r["max"], r["p50_ratio"], r["p99_ratio"])
            for who, r in lat["results"].items()
        ],
        caption=f"raw: {CONTESTANTS[0]} (one task per shard, XREADGROUP COUNT 100 BLOCK 1000, "
        "one XACK per batch); load generated in the server by a Lua script every 2 ms",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--load-fraction", type=float, default=0.5, help="of the max (default 0.5)")
    p.add_argument("--max-rate", type=float, help="msg/s (default: measured in this run)")
    p.add_argument(
        "--max-rate-messages",
        type=int,
        default=100_000,
        help="messages of the max-rate measurement (default 100000)",
    )
    p.add_argument("--duration", type=float, default=5.0, help="seconds (default 5)")
    return p


def main() -> None:
    common.standalone(run_suite, parser().parse_args())


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
