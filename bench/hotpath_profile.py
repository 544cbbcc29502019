"""Consume hot path: streamworks vs the one-task-per-shard raw loop, wall and CPU time.

A quick, same-process comparison used to find and check hot-path work (issue 14):
each contestant runs in its own spawned process on the same pre-published entries
(``--messages`` no-op messages on 8 shards, each contestant in a consumer group of its
own), alternating for ``--rounds``; it reports msg/s and the *CPU time per message* of
the consumer process (``time.process_time()``), which a loaded machine disturbs less
than wall-clock throughput.

* ``raw-shard`` — one task per shard: ``XREADGROUP COUNT 100`` + one ``XACK`` per
  batch, a no-op per entry, all 8 tasks in one process on one client;
* ``raw-lean`` — the same with the replies left undecoded and hand-packed commands on
  a connection per task (``raw_lean.py``, ``consume.py``'s ``raw-lean``);
* ``raw-gate`` — the same with streamworks' fenced read (``Scripts.fenced_read``: the
  gate script, ``XREADGROUP`` and the ungate in one transaction, COUNT 200) and a
  hand-packed ``XACK`` per batch: what the fence costs without the framework;
* ``raw-lua`` — the same with the older fenced read, ``read.lua`` (COUNT 200), which
  passes the entries through Lua;
* ``raw-100`` — one coroutine visiting the 8 shards in turn (``consume.py``'s);
* ``streamworks`` — a default ``Worker`` (``consume.py``'s ``sw_child``);
* ``streamworks-cli`` — the same, with the heap frozen once up, as the
  ``streamworks worker`` command runs it (``freeze_startup_heap``).

The server's CPU time per message (from ``/proc``) is shown too: on a 2-core machine
the server competes with the consumer for the same cores.

``--py-spy FILE`` runs the streamworks contestant under ``py-spy record`` instead
(collapsed stacks in FILE). Run: ``python bench/hotpath_profile.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import common
import consume
from common import SHARDS

CONTESTANTS = (
    "raw-shard",
    "raw-lean",
    "raw-lua",
    "raw-gate",
    "raw-100",
    "streamworks",
    "streamworks-cli",
)


async def raw_shard_child(url: str, keys: list[str], group: str, total: int) -> dict[str, Any]:
    """One task per shard: XREADGROUP COUNT 100, no-op, one XACK per batch."""
    _preload()
    redis = common.create_client(url)
    await redis.ping()
    done = 0
    finished = asyncio.Event()

    async def one(key: str) -> None:
        nonlocal done
        while not finished.is_set():
            reply = await redis.xreadgroup(group, "raw", {key: ">"}, count=100, block=100)
            if not reply:
                continue
            ids = [entry_id for entry_id, _fields in reply[0][1]]
            await redis.xack(key, group, *ids)
            done += len(ids)
            if done >= total:
                finished.set()

    cpu, start = time.process_time(), time.perf_counter()
    tasks = [asyncio.create_task(one(key)) for key in keys]
    await finished.wait()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    await asyncio.gather(*tasks)
    await redis.aclose()
    return {"rate": done / elapsed, "cpu_us": cpu / done * 1e6}


async def raw_lua_child(
    url: str, keys: list[str], group: str, total: int, gate: bool = False
) -> dict[str, Any]:
    """``raw-shard`` with a fenced read: one task per shard, ``read.lua`` (COUNT 200,
    hand-packed EVALSHA) or, with ``gate``, streamworks' transaction
    (``Scripts.fenced_read``), + one hand-packed XACK per batch. What the fence costs
    without the framework around it."""
    _preload()
    from streamworks.coordinator.provision import grant_token, write_fence
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts
    from streamworks.redis.wire import call

    redis = common.create_client(url)
    scripts, keyspace = Scripts(redis), Keyspace(common.PREFIX)
    member = "raw-gate" if gate else "raw-lua"
    shards = [ShardId("orders", i) for i in range(SHARDS)]
    for shard in shards:
        await write_fence(scripts, keyspace, shard, group, 1, member)
    token = grant_token(1, member)
    done = 0
    finished = asyncio.Event()

    async def one(shard: Any) -> None:
        nonlocal done
        fkeys = [keyspace.stream(shard), keyspace.fence(shard, group)]
        args = [group, member, token, 200]
        gkeys = [*fkeys, keyspace.read_hold(shard)]
        while not finished.is_set():
            if gate:
                reply = await scripts.fenced_read(gkeys, group, member, token, 200)
            else:
                reply = await scripts.call("read", fkeys, args)  # type: ignore[arg-type]
            if reply[0] != 1:
                await asyncio.sleep(0.01)
                continue
            ids = [entry_id for entry_id, _fields in reply[1]]
            await call(redis, ["XACK", fkeys[0], group, *ids])
            done += len(ids)
            if done >= total:
                finished.set()

    cpu, start = time.process_time(), time.perf_counter()
    tasks = [asyncio.create_task(one(shard)) for shard in shards]
    await finished.wait()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    await asyncio.gather(*tasks)
    await redis.aclose()
    return {"rate": done / elapsed, "cpu_us": cpu / done * 1e6}


def _preload() -> None:
    """Import what the contestants use before the clock starts (the first import of
    streamworks, redis-py and pydantic costs more CPU than 100,000 messages)."""
    import streamworks.app
    import streamworks.coordinator.provision
    import streamworks.runtime.worker  # noqa: F401


async def raw_100_child(url: str, keys: list[str], group: str, total: int) -> dict[str, Any]:
    _preload()
    cpu = time.process_time()
    res = await consume.raw_child(url, keys, group, total, 100)
    res["cpu_us"] = (time.process_time() - cpu) / total * 1e6
    return res


async def sw_child(
    url: str, group: str, stream: str, total: int, freeze: bool = False, src: str = ""
) -> dict[str, Any]:
    """``consume.sw_child``, with the CPU time taken over the same span as the rate;
    ``freeze``: as ``streamworks worker`` runs it (``freeze_startup_heap`` once up);
    ``src``: import streamworks from that checkout (a before/after comparison)."""
    if src:
        sys.path.insert(0, src)
        assert "streamworks" not in sys.modules, "streamworks was imported already"
    import anyio

    _preload()
    if freeze:
        from streamworks.runtime.process import freeze_startup_heap

        freeze_startup_heap()  # as the command does once up
    worker, redis, shards = consume._sw_worker(url, group, stream, 0.0)
    await consume._sw_write_fences(worker, shards)
    cpu, start = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        while worker.acker.acked < total:  # noqa: ASYNC110 - polling a counter, cheaply
            await asyncio.sleep(0.002)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        worker.request_stop()
    await redis.aclose()
    return {"rate": total / elapsed, "elapsed": elapsed, "cpu_us": cpu / total * 1e6}


def _server_cpu(pid: int | None) -> float:
    """CPU seconds the server process used so far (Linux /proc)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _target(name: str) -> str:
    return f"hotpath_profile:{name}"


async def run(suite: common.Suite, args: argparse.Namespace) -> dict[str, Any]:
    from streamworks.coordinator.provision import create_group
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    n = args.messages
    keys = await consume.prepare_sw(suite.redis, "orders", n)
    shards = [ShardId("orders", i) for i in range(SHARDS)]
    only = args.only.split(",") if args.only else list(CONTESTANTS)
    if args.base:
        only += ["streamworks@base", "streamworks-cli@base"]
    rates: dict[str, list[float]] = {c: [] for c in only}
    cpus: dict[str, list[float]] = {c: [] for c in only}
    servers: dict[str, list[float]] = {c: [] for c in only}
    for r in range(args.rounds):
        for name in common.alternate(only, r):
            group = f"{name.replace('@', '.')}-{r}"
            await create_group(
                Scripts(suite.redis), Keyspace(common.PREFIX), shards, group, "earliest"
            )
            server_cpu = _server_cpu(suite.server.pid)
            try:
                if name == "raw-shard":
                    res = suite.child(_target("raw_shard_child"), url=suite.url, keys=keys,
                                      group=group, total=n)  # fmt: skip
                elif name == "raw-lean":
                    res = suite.child("raw_lean:lean_child", url=suite.url, keys=keys,
                                      group=group, total=n)  # fmt: skip
                elif name in ("raw-lua", "raw-gate"):
                    res = suite.child(_target("raw_lua_child"), url=suite.url, keys=keys,
                                      group=group, total=n, gate=name == "raw-gate")  # fmt: skip
                elif name == "raw-100":
                    res = suite.child(_target("raw_100_child"), url=suite.url, keys=keys,
                                      group=group, total=n)  # fmt: skip
                else:
                    res = suite.child(_target("sw_child"), url=suite.url, group=group,
                                      stream="orders", total=n,
                                      freeze=name.startswith("streamworks-cli"),
                                      src=args.base if name.endswith("@base") else "")  # fmt: skip
            finally:
                await common.destroy_groups(suite.redis, keys, group)
            server_us = (_server_cpu(suite.server.pid) - server_cpu) / n * 1e6
            rates[name].append(res["rate"])
            cpus[name].append(res["cpu_us"])
            servers[name].append(server_us)
            print(
                f"round {r + 1} {name:12s} {res['rate']:10,.0f} msg/s  "
                f"{res['cpu_us']:6.2f} µs CPU/msg (server {server_us:5.2f})"
            )
    base = statistics.median(rates["raw-shard"]) if "raw-shard" in rates else None
    base_cpu = statistics.median(cpus["raw-shard"]) if "raw-shard" in cpus else None
    print(
        f"\n{'contestant':12s} {'msg/s':>10s} {'× raw-shard':>12s} {'µs CPU/msg':>11s} "
        f"{'× CPU':>7s} {'server µs/msg':>14s}"
    )
    for name in only:
        rate, cpu = statistics.median(rates[name]), statistics.median(cpus[name])
        ratio = f"{rate / base:.2f}" if base else "-"
        cratio = f"{cpu / base_cpu:.2f}" if base_cpu else "-"
        srv = statistics.median(servers[name])
        print(f"{name:12s} {rate:10,.0f} {ratio:>12s} {cpu:11.2f} {cratio:>7s} {srv:14.2f}")
    return {"rates": rates, "cpu_us": cpus, "server_cpu_us": servers}


async def _spy(url: str, n: int, out: str, rate: int) -> None:
    """Run sw_child in a subprocess under py-spy."""
    from streamworks.coordinator.provision import create_group
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    redis = common.create_client(url)
    await consume.prepare_sw(redis, "orders", n)
    shards = [ShardId("orders", i) for i in range(SHARDS)]
    await create_group(Scripts(redis), Keyspace(common.PREFIX), shards, "spy", "earliest")
    await redis.aclose()
    code = (
        "import sys; sys.path.insert(0, 'bench'); import common, hotpath_profile as h; "
        f"print(common.run_async(h.sw_child({url!r}, 'spy', 'orders', {n})))"
    )
    cmd = [
        "py-spy",
        "record",
        "-r",
        str(rate),
        "-f",
        "raw",
        "-o",
        out,
        "--",
        sys.executable,
        "-c",
        code,
    ]
    await asyncio.to_thread(subprocess.run, cmd, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--only", help=f"comma-separated of {CONTESTANTS}")
    p.add_argument(
        "--base",
        help="also run the streamworks rows with streamworks imported from this checkout "
        "(rows '...@base': a before/after comparison in one run)",
    )
    p.add_argument("--py-spy", help="write a py-spy (collapsed stacks) profile of streamworks here")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    args = p.parse_args()
    if args.py_spy:
        server = common.start_server(args.server)
        try:
            common.run_async(_spy(server.url, args.messages, args.py_spy, args.rate), args.uvloop)
        finally:
            server.stop()
        return
    common.standalone(run, args)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
