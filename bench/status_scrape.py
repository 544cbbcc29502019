"""What a ``/metrics`` scrape and a status read cost a coordinator replica at N members.

One Redis (embedded Valkey), one group of ``--members`` members on one stream of
``min(4096, max(256, 2 N))`` shards (the layout of ``control_plane.py``'s member
benchmarks). The members join through a ``CoordinatorService`` in this process (the
real heartbeat code path, 10,000 joins in seconds) with a one-hour lease, so nobody
has to keep them alive while the replica under test is measured. Then a real
``streamworks coordinator`` process on the same key prefix (it loads the group from
Redis) serves, over real HTTP:

* ``GET /metrics`` — each scrape after the replica's observation has expired (it is
  reused for a second), so every scrape takes a fresh one;
* ``GET /v1/status`` and ``GET /v1/groups/<g>`` — the status API.

Each is measured ``--scrapes`` times with nothing changing in between, then again with
one commit between scrapes (a member leaves and joins again: the group's revision
moves). Reported: wall time per request and the coordinator process's CPU seconds per
request (``psutil``; robust to other work on the machine), medians.

``--base PATH`` runs the same measurements first with the coordinator imported from
the checkout at PATH (a before/after comparison on the same data, in one run).

Run: ``python bench/status_scrape.py --members 10000`` (``--quick``: 500 members).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
GROUP, STREAM = "sim", "events"
#: The replica's observation is reused for this long (``Observer.max_age``).
OBSERVATION_AGE = 1.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def form_group(url: str, prefix: str, members: int) -> list[str]:
    """``members`` members joined (in waves of 500, group-committed) with long leases."""
    from streamworks.coordinator.service import CoordinatorService
    from streamworks.redis.client import create_redis

    settings = _settings(url, prefix)
    redis = create_redis(settings)
    try:
        service = CoordinatorService(redis, settings, replica="former")
        await service.create_stream(STREAM, min(4096, max(256, 2 * members)))
        ids = [uuid.uuid4().hex for _ in range(members)]
        for i in range(0, members, 500):
            await asyncio.gather(
                *(service.heartbeat(GROUP, _join(member)) for member in ids[i : i + 500])
            )
        return ids
    finally:
        await redis.aclose()


def _settings(url: str, prefix: str) -> Any:
    from streamworks.settings import Settings

    return Settings(redis_url=url, key_prefix=prefix, lease_ttl=3600, heartbeat_interval=60)


def _join(member: str) -> Any:
    from streamworks.protocol.control import HeartbeatRequest

    return HeartbeatRequest(
        member_id=member,
        member_epoch=0,
        metadata_version=0,
        subscriptions=[STREAM],
        owned_shards=[],
    )


async def commit_once(url: str, prefix: str, member: str) -> None:
    """One commit on the group: ``member`` leaves (epoch -1) and joins again."""
    from streamworks.coordinator.service import CoordinatorService
    from streamworks.protocol.control import HeartbeatRequest
    from streamworks.redis.client import create_redis

    settings = _settings(url, prefix)
    redis = create_redis(settings)
    try:
        service = CoordinatorService(redis, settings, replica="committer")
        leave = HeartbeatRequest(member_id=member, member_epoch=-1, metadata_version=0)
        await service.heartbeat(GROUP, leave)
        await service.heartbeat(GROUP, _join(member))
    finally:
        await redis.aclose()


def start_coordinator(url: str, prefix: str, port: int, src: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "STREAMWORKS_REDIS_URL": url,
        "STREAMWORKS_KEY_PREFIX": prefix,
        "STREAMWORKS_COORDINATOR__PORT": str(port),
        "STREAMWORKS_LEASE_TTL": "3600",
        "STREAMWORKS_HEARTBEAT_INTERVAL": "60",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "streamworks", "coordinator", "--log-level", "WARNING"],
        env=env,
        cwd=str(src),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_ready(http: httpx.AsyncClient, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"coordinator exited with {proc.returncode}")
        try:
            if (await http.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError("coordinator not ready after 60 s")


async def measure(
    http: httpx.AsyncClient,
    proc: psutil.Process,
    path: str,
    scrapes: int,
    between: Any = None,
) -> dict[str, Any]:
    """Wall and coordinator CPU seconds of ``scrapes`` GETs of ``path`` (medians); each
    after the observation expired and, with ``between``, after one commit."""
    walls, cpus, size = [], [], 0
    for _ in range(scrapes):
        if between is not None:
            await between()
        await asyncio.sleep(OBSERVATION_AGE + 0.05)
        times = proc.cpu_times()
        cpu = times.user + times.system
        t = time.perf_counter()
        response = await http.get(path)
        walls.append(time.perf_counter() - t)
        times = proc.cpu_times()
        cpus.append(times.user + times.system - cpu)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:200]}")
        size = len(response.content)
    return {
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "bytes": size,
        "walls": [round(w, 4) for w in walls],
    }


async def run_tree(
    label: str, url: str, prefix: str, src: Path, scrapes: int, member: str
) -> dict[str, Any]:
    port = free_port()
    coordinator = start_coordinator(url, prefix, port, src)
    out: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            await wait_ready(http, coordinator)
            proc = psutil.Process(coordinator.pid)
            await http.get("/metrics")  # warm: the first load of the group is not steady
            await http.get("/v1/status")

            async def commit() -> None:
                await commit_once(url, prefix, member)

            for name, path in (
                ("metrics", "/metrics"),
                ("status", "/v1/status"),
                ("group", f"/v1/groups/{GROUP}"),
            ):
                for mode, between in (("unchanged", None), ("after a commit", commit)):
                    r = await measure(http, proc, path, scrapes, between)
                    out[f"{name} ({mode})"] = r
                    print(
                        f"{label:6s} {name:8s} {mode:15s} wall {r['wall_s'] * 1000:8.1f} ms  "
                        f"coordinator CPU {r['cpu_s'] * 1000:8.1f} ms  {r['bytes']:>10,} bytes",
                        flush=True,
                    )
    finally:
        coordinator.terminate()
        coordinator.wait(15)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from streamworks.testing.embedded import EmbeddedRedis

    server = EmbeddedRedis(binary=args.server) if args.server else EmbeddedRedis()
    server.start()
    try:
        prefix = f"scrape{uuid.uuid4().hex[:6]}"
        t = time.monotonic()
        ids = await form_group(server.url, prefix, args.members)
        shards = min(4096, max(256, 2 * args.members))
        print(
            f"# {args.members:,} members on {shards:,} shards formed in "
            f"{time.monotonic() - t:.1f}s; load average {_load()}",
            flush=True,
        )
        trees = ([("base", Path(args.base))] if args.base else []) + [("this", ROOT)]
        results: dict[str, Any] = {"members": args.members, "shards": shards}
        for label, src in trees:
            results[label] = await run_tree(label, server.url, prefix, src, args.scrapes, ids[0])
        if args.base:
            print("\n# this tree × base (coordinator CPU per request; lower is better)")
            for key, r in results["this"].items():
                base = results["base"][key]["cpu_s"]
                ratio = r["cpu_s"] / base if base else float("nan")
                print(f"{key:28s} {ratio:6.2f}×")
        results["loadavg_end"] = list(os.getloadavg())
        print(f"# load average at the end {_load()}")
        return results
    finally:
        server.stop()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, default=10_000)
    p.add_argument("--scrapes", type=int, default=5, help="requests per measurement")
    p.add_argument("--quick", action="store_true", help="500 members, 2 scrapes")
    p.add_argument("--base", help="also measure the coordinator of this checkout first")
    p.add_argument("--server", help="redis-server/valkey-server binary (default: embedded)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    if args.quick:
        args.members, args.scrapes = 500, 2
    results = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
