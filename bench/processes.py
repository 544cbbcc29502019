"""``streamworks worker --processes 1`` vs ``--processes 2``: messages per second and
messages per CPU-second, against one coordinator and one server.

Per round and process count P: a coordinator (``streamworks coordinator``) and a
supervisor (``streamworks worker bench.apps.noop8:app --processes P``: a no-op
handler, ``ordering="key"``, 8 shards, default settings) start
on a fresh key prefix; once the group is stable with P members, one Lua script call
(``latency_load.BURST``) appends ``--messages`` entries in the streamworks format,
round-robin over the 8 shards, inside the server: the server runs nothing else
meanwhile, so when the call returns the backlog is there exactly as if it had been
pre-published, and the workers are waiting on it. The clock starts then and runs
until every entry is acknowledged (``XINFO GROUPS``: entries read and nothing
pending, on every shard).

CPU is read from ``/proc`` (psutil) for the worker children, the coordinator and the
server, over exactly that window. ``msg per worker CPU-s`` is what the workers cost;
``msg per CPU-s (all)`` adds the server and the coordinator. On a 2-vCPU machine the
server and the workers share the cores, so 2 processes cannot double anything: the
figure to read is how much of the second core they turn into messages.

Run: ``python bench/processes.py`` (``--messages``, ``--rounds``, ``--processes 1,2``).
Default: 400,000 messages, 5 alternating rounds (each drain takes 1-3 s here, so one
round is easily hit by other work on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import common
import latency_load
from common import SHARDS, Suite

APP = "bench.apps.noop8:app"
GROUP = "bench-procs"
STREAM = "orders"


def _cpu(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


async def _acked(redis: Any, keys: list[str]) -> int:
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.execute_command("XINFO", "GROUPS", key)
        replies = await pipe.execute()
    done = 0
    for groups in replies:
        for g in groups:  # redis-py parses each group into a dict
            info = {(k.decode() if isinstance(k, bytes) else k): v for k, v in g.items()}
            if info["name"] in (GROUP, GROUP.encode()):
                done += int(info["entries-read"] or 0) - int(info["pending"])
    return done


async def one_round(suite: Suite, processes: int, messages: int) -> dict[str, Any]:
    """One supervisor of ``processes`` children draining ``messages``."""
    import psutil

    from streamworks.protocol.client import CoordinatorClient
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace

    prefix = f"pr{uuid.uuid4().hex[:6]}"
    port = common.free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STREAMWORKS_")},
        "PYTHONPATH": str(common.REPO_DIR),
        "STREAMWORKS_REDIS_URL": suite.url,
        "STREAMWORKS_KEY_PREFIX": prefix,
        "STREAMWORKS_COORDINATOR_URLS": url,
        "STREAMWORKS_COORDINATOR__PORT": str(port),
    }

    def start(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "streamworks", *args, "--log-level", "WARNING"],
            env=env,
            cwd=common.REPO_DIR,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )

    burst = suite.redis.register_script(latency_load.BURST)
    coordinator = start("coordinator")
    supervisor: subprocess.Popen[bytes] | None = None
    try:
        async with CoordinatorClient([url]) as client:
            await _wait(lambda: _ready(client), 30, "the coordinator")
            await client.create_stream(STREAM, SHARDS)
            supervisor = start("worker", APP, "--processes", str(processes))
            await _wait(lambda: _stable(client, processes), 60, f"{processes} members")
        children = [c.pid for c in psutil.Process(supervisor.pid).children()]
        assert len(children) == processes, children
        keyspace = Keyspace(prefix)
        keys = [keyspace.stream(ShardId(STREAM, i)) for i in range(SHARDS)]
        others = [coordinator.pid, suite.server.pid]
        # The baseline is taken before the burst: the workers are already
        # reading, and on a fast run they drain it before a later snapshot.
        cpu_workers, cpu_others = _cpu(children), _cpu(others)
        start_t = time.perf_counter()
        await burst(keys=keys, args=[messages, 0, latency_load.json_prefix(), 0])
        while await _acked(suite.redis, keys) < messages:
            if time.perf_counter() - start_t > 120:
                raise TimeoutError(f"--processes {processes}: not drained after 120 s")
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start_t
        workers_cpu = _cpu(children) - cpu_workers
        others_cpu = _cpu(others) - cpu_others
        for key in keys:
            await suite.redis.delete(key)
        return {
            "rate": messages / elapsed,
            "elapsed": elapsed,
            "worker_cpu_s": workers_cpu,
            "other_cpu_s": others_cpu,
            "per_worker_cpu_s": messages / workers_cpu if workers_cpu else float("nan"),
            "per_cpu_s_all": (
                messages / (workers_cpu + others_cpu) if workers_cpu + others_cpu else float("nan")
            ),
        }
    finally:
        for proc in (supervisor, coordinator):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


async def _ready(client: Any) -> bool:
    await client.status()
    return True


async def _stable(client: Any, members: int) -> bool:
    group = await client.group(GROUP)
    live = [m for m in group.members if m.state == "STABLE"]
    return (
        group.state == "STABLE"
        and len(live) == members
        and all(m.assigned and sorted(m.assigned) == sorted(m.target) for m in live)
        and sum(len(m.assigned) for m in live) == SHARDS
    )


async def _wait(probe: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await probe():
                return
        except Exception:  # not up yet (connection refused, unknown group)
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def run_suite(suite: Suite, args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(x) for x in str(args.processes).split(",")]
    print(
        f"# processes: --processes {' vs '.join(map(str, counts))}, {args.messages:,} "
        f"messages per round on {SHARDS} shards, one coordinator, one server"
    )
    runs: dict[str, list[dict[str, Any]]] = {f"--processes {p}": [] for p in counts}
    for r in range(args.rounds):
        for p in common.alternate(counts, r):
            res = await one_round(suite, p, args.messages)
            runs[f"--processes {p}"].append(res)
            print(
                f"processes round {r + 1} --processes {p}: {res['rate']:10,.0f} msg/s, "
                f"{res['per_worker_cpu_s']:10,.0f} msg per worker CPU-s, "
                f"{res['per_cpu_s_all']:10,.0f} msg per CPU-s (all); workers "
                f"{res['worker_cpu_s']:.2f} CPU-s, server+coordinator {res['other_cpu_s']:.2f}"
            )
    first = f"--processes {counts[0]}"
    summary: dict[str, Any] = {}
    for name, rs in runs.items():
        summary[name] = {
            k: round(common.median([x[k] for x in rs]), 3)
            for k in ("rate", "per_worker_cpu_s", "per_cpu_s_all", "worker_cpu_s", "other_cpu_s")
        }
        summary[name]["rounds"] = [round(x["rate"], 1) for x in rs]
    for r in summary.values():
        r["ratio"] = round(r["rate"] / summary[first]["rate"], 2)
    results = {
        "processes": {
            "messages": args.messages,
            "baseline": first,
            "unit": "msg/s",
            "results": summary,
        }
    }
    print_results(results)
    return results


def print_results(results: dict[str, Any]) -> None:
    pr = results["processes"]
    common.print_table(
        f"worker --processes: no-op consume of {pr['messages']:,} messages on 8 shards "
        "(medians of alternating rounds)",
        [
            "workers",
            "msg/s",
            f"× {pr['baseline']}",
            "msg / worker CPU-s",
            "msg / CPU-s (all)",
            "worker CPU-s",
            "server+coord CPU-s",
            "rounds (msg/s)",
        ],
        [
            (
                name,
                r["rate"],
                r["ratio"],
                r["per_worker_cpu_s"],
                r["per_cpu_s_all"],
                r["worker_cpu_s"],
                r["other_cpu_s"],
                " ".join(f"{x:,.0f}" for x in r["rounds"]),
            )
            for name, r in pr["results"].items()
        ],
        caption="CPU from /proc over the drain window; (all) adds the server and the coordinator",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.set_defaults(rounds=5)
    p.add_argument("--messages", type=int, default=400_000, help="per round (default 400000)")
    p.add_argument("--processes", default="1,2", help="process counts (default 1,2)")
    return p


def main() -> None:
    common.standalone(run_suite, parser().parse_args())


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
