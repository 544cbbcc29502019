"""Publish throughput: streamworks ``app.publish`` / ``app.publish_many`` vs raw XADD.

Each contestant runs in its own process and writes ~100-byte JSON payloads, keyed
``c0..c4999``, to 8 existing shard keys:

* ``single`` — 20,000 messages, each awaited before the next: ``app.publish`` vs a
  raw ``XADD`` awaited one by one;
* ``batch-100`` / ``batch-1000`` — 200,000 messages: ``app.publish_many`` with 100
  (1000) records per call vs raw pipelined ``XADD``, 100 (1000) per pipeline.

Both sides do the per-message work a real producer does inside the timed loop:
build the record, JSON-encode the payload (orjson) and write the same fields
streamworks writes (``v``, ``t``, ``f``, ``k``). The raw loop picks the shard by
``i % 8``; streamworks routes by jump hash of the key (``XADD NOMKSTREAM``).

Run: ``python bench/publish.py`` (``--messages``, ``--single-messages``,
``--rounds``, ``--server``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common
from common import KEYS, PAYLOAD, PREFIX, SHARDS, Suite

#: (mode, batch size) per row of the table.
MODES = (("single", 1), ("batch-100", 100), ("batch-1000", 1000))
CONTESTANTS = ("raw", "streamworks")
STREAM = "pub"


def stream_keys() -> list[str]:
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace

    keyspace = Keyspace(PREFIX)
    return [keyspace.stream(ShardId(STREAM, i)) for i in range(SHARDS)]


# -- contestants (each runs in its own process) ------------------------------------------
async def raw_child(url: str, keys: list[str], total: int, batch: int) -> dict[str, Any]:
    """Raw redis-py: XADD awaited one by one (batch 1) or pipelined ``batch`` at a time."""
    import orjson

    redis = common.create_client(url)
    await redis.ping()
    dumps = orjson.dumps
    start = time.perf_counter()
    if batch == 1:
        for i in range(total):
            await redis.execute_command(
                "XADD", keys[i % SHARDS], "NOMKSTREAM", "*",
                "v", dumps(PAYLOAD), "t", str(int(time.time() * 1000)), "f", "1",
                "k", f"c{i % KEYS}",
            )  # fmt: skip
    else:
        for base in range(0, total, batch):
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(base, min(total, base + batch)):
                    pipe.execute_command(
                        "XADD", keys[i % SHARDS], "NOMKSTREAM", "*",
                        "v", dumps(PAYLOAD), "t", str(int(time.time() * 1000)), "f", "1",
                        "k", f"c{i % KEYS}",
                    )  # fmt: skip
                await pipe.execute()
    elapsed = time.perf_counter() - start
    await redis.aclose()
    return {"rate": total / elapsed, "elapsed": elapsed}


class _NoCoordinator:
    """Stands in for the coordinator transport: the benchmark's routing is static."""

    async def aclose(self) -> None:
        return None


async def sw_child(url: str, total: int, batch: int) -> dict[str, Any]:
    """streamworks: ``app.publish`` awaited one by one, or ``app.publish_many``.

    Routing is the app's declared layout (``StaticRoutingSource``: 8 shards, jump
    hash), so no coordinator is involved; the publish path is the production one.
    """
    from streamworks import App, Record, Settings
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
        start = time.perf_counter()
        if batch == 1:
            for i in range(total):
                await app.publish(STREAM, PAYLOAD, key=f"c{i % KEYS}")
        else:
            for base in range(0, total, batch):
                records = [
                    Record(PAYLOAD, key=f"c{i % KEYS}")
                    for i in range(base, min(total, base + batch))
                ]
                await app.publish_many(STREAM, records)
        elapsed = time.perf_counter() - start
    return {"rate": total / elapsed, "elapsed": elapsed}


# -- the suite ---------------------------------------------------------------------------
async def _clear(suite: Suite, keys: list[str]) -> None:
    for key in keys:
        await suite.redis.execute_command("XTRIM", key, "MAXLEN", 0)


async def run_suite(suite: Suite, args: argparse.Namespace) -> dict[str, Any]:
    from streamworks.coordinator.provision import create_shards
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    keys = stream_keys()
    shards = [ShardId(STREAM, i) for i in range(SHARDS)]
    await create_shards(Scripts(suite.redis), Keyspace(PREFIX), shards, ["seed"])
    counts = {"single": args.single_messages, "batch-100": args.messages}
    counts["batch-1000"] = args.messages
    print(
        f"# publish: {args.single_messages:,} messages one by one, {args.messages:,} in batches, "
        f"{len(common.payload_bytes())}-byte payloads, {SHARDS} shards"
    )
    rates: dict[str, dict[str, list[float]]] = {
        mode: {c: [] for c in CONTESTANTS} for mode, _ in MODES
    }
    for r in range(args.rounds):
        for mode, batch in MODES:
            for who in common.alternate(CONTESTANTS, r):
                await _clear(suite, keys)
                if who == "raw":
                    res = suite.child(
                        "publish:raw_child", url=suite.url, keys=keys, total=counts[mode],
                        batch=batch,
                    )  # fmt: skip
                else:
                    res = suite.child(
                        "publish:sw_child", url=suite.url, total=counts[mode], batch=batch
                    )
                rates[mode][who].append(res["rate"])
                print(f"publish round {r + 1} {mode:10s} {who:12s} {res['rate']:12,.0f} msg/s")
    await _clear(suite, keys)
    results = {
        "publish": {
            "messages": counts,
            "baseline": "raw",
            "unit": "msg/s",
            "results": {mode: common.summarize(rates[mode], "raw") for mode, _ in MODES},
        }
    }
    print_results(results)
    return results


def print_results(results: dict[str, Any]) -> None:
    pub = results["publish"]
    rows = []
    for mode, r in pub["results"].items():
        rows.append(
            (
                mode,
                pub["messages"][mode],
                r["raw"]["median"],
                r["streamworks"]["median"],
                r["streamworks"]["ratio"],
            )
        )
    common.print_table(
        "publish (medians of alternating rounds)",
        ["mode", "messages", "raw XADD msg/s", "streamworks msg/s", "× raw"],
        rows,
        caption="single: app.publish vs XADD, each awaited; batch-N: app.publish_many(N "
        "records) vs N XADDs per pipeline",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--messages", type=int, default=200_000, help="batched runs (default 200000)")
    p.add_argument(
        "--single-messages", type=int, default=20_000, help="one-by-one runs (default 20000)"
    )
    return p


def main() -> None:
    common.standalone(run_suite, parser().parse_args())


if __name__ == "__main__":
    sys.exit(main())
