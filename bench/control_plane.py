"""Control-plane benchmarks: failover, join hand-off, heartbeat latency/throughput,
and target-assignment computation.

Everything runs against a Redis this script starts (embedded Valkey by default) and
a real coordinator subprocess (`streamworks coordinator`) reached over HTTP:

* **failover** — 2 worker processes of ``bench.apps.noop`` (default settings: 1 s
  heartbeats, 10 s lease); one is SIGKILLed; time until all its shards are assigned
  to the survivor. Target: ≤ lease TTL + 1 s.
* **join hand-off** — simulated members (honest protocol clients) form a stable
  group; a new member joins; time from its join heartbeat until it holds its whole
  target. Target: ≤ 2 heartbeat intervals.
* **heartbeat latency** — N simulated members heartbeating at the configured
  interval; p50/p99 round trip of no-change heartbeats.
* **heartbeat throughput** — the same members heartbeating back to back with 32
  in flight; heartbeats per second of one replica. Target: ≥ 2,000/s.
* **assignment** — ``assign_uniform`` for 1,000 and 10,000 members × 10,000 shards.
  Target: ≤ 1 s.

Run: ``python bench/control_plane.py`` (``--quick`` for a short run).

``--replicas N`` (with ``--interval S``): the member benchmarks with the simulated
members spread round-robin over N coordinator replicas (separate processes, one Redis),
all heartbeating every S seconds; prints the hand-off, p50/p99 and what each replica
served, paced and saturated. E.g. ``--replicas 3 --members 10000 --interval 10
--seconds 30``. Writes ``bench/results/control_plane_replicas_<N>.json``.

``--cluster``: the heartbeat benchmarks on a single node and on a local Redis Cluster
(3 masters + 3 replicas) in the same run, with the load each Redis node carries —
commands/s and CPU (``INFO stats``/``INFO cpu`` deltas) while every member heartbeats
once per interval (steady) and while heartbeats go back to back (saturated). Every
control key shares the slot ``{<prefix>}``, so one master carries all of it; the
others show what the cluster's own gossip costs. Writes
``bench/results/control_plane_cluster.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from streamworks.coordinator.core import Topology, assign_uniform
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import HeartbeatRequest, HeartbeatResponse
from streamworks.testing.cluster import LocalCluster
from streamworks.testing.embedded import EmbeddedRedis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lean_http import LeanConnection

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Processes:
    def __init__(self, redis_url: str, port: int | list[int], env: dict[str, str]) -> None:
        self.ports = port if isinstance(port, list) else [port]
        self.env = {
            **os.environ,
            "STREAMWORKS_REDIS_URL": redis_url,
            "STREAMWORKS_COORDINATOR_URLS": ",".join(f"http://127.0.0.1:{p}" for p in self.ports),
            "STREAMWORKS_COORDINATOR__PORT": str(self.ports[0]),
            "STREAMWORKS_WORKER__HTTP_PORT": "0",  # several workers: a free port each
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.port = self.ports[0]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, port: int | None = None) -> subprocess.Popen[bytes]:
        env = self.env if port is None else {**self.env, "STREAMWORKS_COORDINATOR__PORT": str(port)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamworks", *args, "--log-level", "WARNING"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(f"/tmp/bench-{args[0]}-{len(self.procs)}.log", "wb"),  # noqa: SIM115
        )
        self.procs.append(proc)
        return proc

    def start_coordinators(self) -> None:
        """One coordinator replica per port (same Redis, same key prefix)."""
        for port in self.ports:
            self.start("coordinator", port=port)

    async def ready(self) -> None:
        async with httpx.AsyncClient() as http:
            for port in self.ports:
                deadline = time.monotonic() + 20
                while True:
                    try:
                        if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"coordinator on port {port} not ready")
                    await asyncio.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


class SimulatedMember:
    """An honest protocol client: it reports exactly what it was granted and drops
    revoked shards at once (a worker with nothing in flight)."""

    def __init__(
        self, client: CoordinatorClient, group: str, streams: list[str], replica: int = 0
    ) -> None:
        # Its own keep-alive connection through the lean client (httpx would make the
        # load generator, not the coordinator, the bottleneck with 1,000 members), to
        # one replica (members spread over the replicas round-robin).
        host, _, port = client.urls[replica].removeprefix("http://").partition(":")
        self.replica = replica
        self.port = int(port)
        self.conn = LeanConnection(host, self.port)
        self.group = group
        self.streams = streams
        self.member_id = uuid.uuid4().hex
        self.epoch = 0
        self.owned: set[str] = set()
        self.last: HeartbeatResponse | None = None
        self.retries = 0

    async def heartbeat(self) -> HeartbeatResponse:
        request = HeartbeatRequest(
            member_id=self.member_id,
            member_epoch=self.epoch,
            metadata_version=self.last.metadata_version if self.last else 0,
            subscriptions=self.streams if self.epoch == 0 else None,
            owned_shards=sorted(self.owned) if self.epoch else [],
        )
        body = request.model_dump(mode="json", by_alias=True, exclude_none=True)
        for attempt in range(10):
            status, answer = await self.conn.post(f"/v1/groups/{self.group}/heartbeat", body)
            if status == 200:
                response = HeartbeatResponse.model_validate(answer)
                break
            if not answer.get("retryable") or attempt == 9:
                raise CoordinatorError(answer["error"], answer["message"], status=status)
            self.retries += 1
            await asyncio.sleep(0.05 * (attempt + 1))
        self.last = response
        if response.status in ("FENCED", "UNKNOWN_MEMBER"):
            self.epoch = 0
            self.owned = set()
        else:
            self.epoch = response.member_epoch
            self.owned = {g.shard for g in response.assigned}
        return response

    @property
    def settled(self) -> bool:
        return bool(self.last) and not self.last.pending and not self.last.revoke


#: Heartbeats the settling rounds keep in flight at once: a real fleet spreads its
#: heartbeats over the interval; 10,000 sent at the same instant would only measure how
#: long the replicas' Redis connection pools can queue them.
SETTLE_IN_FLIGHT = 500


async def settle(members: list[SimulatedMember], rounds: int = 200) -> None:
    slots = asyncio.Semaphore(SETTLE_IN_FLIGHT)

    async def beat(member: SimulatedMember) -> None:
        async with slots:
            await member.heartbeat()

    for _ in range(rounds):
        await asyncio.gather(*(beat(m) for m in members))
        if all(m.settled for m in members):
            return
    raise RuntimeError("simulated group did not settle")


async def bench_failover(redis_url: str, runs: int) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        port = free_port()
        procs = Processes(redis_url, port, {"STREAMWORKS_KEY_PREFIX": f"fo{uuid.uuid4().hex[:6]}"})
        try:
            procs.start("coordinator")
            await procs.ready()
            workers = [procs.start("worker", "bench.apps.noop:app") for _ in range(2)]
            async with CoordinatorClient([f"http://127.0.0.1:{port}"]) as client:
                victim_shards: list[str] = []
                while True:
                    try:
                        group = await client.group("bench")
                    except CoordinatorError:
                        await asyncio.sleep(0.05)
                        continue
                    live = [m for m in group.members if m.state == "STABLE"]
                    if group.state == "STABLE" and len(live) == 2 and all(m.assigned for m in live):
                        by_pid = {m.client.get("pid"): m for m in live}
                        victim_shards = sorted(by_pid[str(workers[0].pid)].assigned)
                        break
                    await asyncio.sleep(0.05)
                workers[0].send_signal(signal.SIGKILL)
                killed = time.monotonic()
                survivor = str(workers[1].pid)
                while True:
                    group = await client.group("bench")
                    owner = {s: m.client.get("pid") for m in group.members for s in m.assigned}
                    if all(owner.get(s) == survivor for s in victim_shards):
                        times.append(time.monotonic() - killed)
                        break
                    await asyncio.sleep(0.02)
        finally:
            procs.stop()
    return {"failover_s": times, "median_s": statistics.median(times), "lease_ttl_s": 10.0}


class NodeLoad:
    """Commands and CPU seconds of Redis nodes between two :meth:`mark` calls."""

    def __init__(self, ports: dict[int, str]) -> None:
        self.ports = ports  # port -> label
        self.phases: dict[str, dict[str, dict[str, float]]] = {}
        self._last: tuple[float, dict[int, tuple[int, float]]] | None = None

    def _sample(self) -> dict[int, tuple[int, float]]:
        import redis as sync_redis

        out = {}
        for port in self.ports:
            client = sync_redis.Redis(port=port)
            try:
                stats, cpu = client.info("stats"), client.info("cpu")
            finally:
                client.close()
            busy = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
            out[port] = (int(stats["total_commands_processed"]), busy)
        return out

    def mark(self, phase: str | None) -> None:
        """End the running phase (if any) and start ``phase`` (None: none)."""
        now, sample = time.monotonic(), self._sample()
        if self._last is not None and self._phase is not None:
            t0, before = self._last
            wall = now - t0
            self.phases[self._phase] = {
                self.ports[p]: {
                    "commands_per_s": (sample[p][0] - before[p][0]) / wall,
                    "cpu_percent": 100 * (sample[p][1] - before[p][1]) / wall,
                }
                for p in self.ports
            }
        self._last, self._phase = (now, sample), phase

    _phase: str | None = None


def cluster_nodes(cluster: LocalCluster, prefix: str) -> dict[int, str]:
    """Label of every master: which one owns the control slot ``{prefix}``."""
    control = cluster.master_for_key(f"{{{prefix}}}")
    return {
        n.port: f"{n.port} (control slot)" if n.port == control else f"{n.port}"
        for n in cluster.masters()
    }


async def bench_members(
    redis_url: str,
    members: int,
    seconds: float,
    load: Callable[[str], NodeLoad] | None = None,
    *,
    replicas: int = 1,
    interval: float = 1.0,
) -> dict[str, Any]:
    """Join hand-off, paced heartbeat latency and saturated throughput of ``members``
    simulated members spread round-robin over ``replicas`` coordinator replicas, all
    heartbeating every ``interval`` seconds (the coordinators' ``heartbeat_interval``;
    the lease is 10 s or 3 intervals)."""
    ports = [free_port() for _ in range(replicas)]
    prefix = f"hb{uuid.uuid4().hex[:6]}"
    env = {
        "STREAMWORKS_KEY_PREFIX": prefix,
        "STREAMWORKS_HEARTBEAT_INTERVAL": str(interval),
        "STREAMWORKS_LEASE_TTL": str(max(10.0, 3 * interval)),
    }
    procs = Processes(redis_url, ports, env)
    result: dict[str, Any] = {"members": members, "replicas": replicas}
    nodes = load(prefix) if load is not None else None
    try:
        procs.start_coordinators()
        await procs.ready()
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        async with CoordinatorClient(urls, timeout=60) as client:
            await client.create_stream("events", min(4096, max(256, 2 * members)))

            def member(i: int) -> SimulatedMember:
                return SimulatedMember(client, "sim", ["events"], replica=i % replicas)

            group = [member(i) for i in range(members)]
            t0 = time.monotonic()
            for i in range(0, members, 50):  # join in waves, as a deployment would
                await asyncio.gather(*(m.heartbeat() for m in group[i : i + 50]))
            await settle(group)
            result["form_s"] = time.monotonic() - t0
            # Join hand-off: every member heartbeats on the schedule the coordinator
            # gives it (fast while it has revocations or pending shards); a newcomer
            # joins; time from its join until it holds its whole target.
            stop = asyncio.Event()

            async def on_schedule(member: SimulatedMember, offset: float) -> None:
                await asyncio.sleep(offset)
                while not stop.is_set():
                    await member.heartbeat()
                    wait = member.last.heartbeat_interval_ms / 1000 if member.last else interval
                    try:
                        await asyncio.wait_for(stop.wait(), wait)
                    except TimeoutError:
                        pass

            background = [
                asyncio.create_task(on_schedule(m, interval * i / len(group)))
                for i, m in enumerate(group)
            ]
            await asyncio.sleep(interval)  # every member on its schedule
            newcomer = member(0)
            started = time.monotonic()
            await newcomer.heartbeat()
            beats = 1
            while not newcomer.settled:
                assert newcomer.last is not None
                await asyncio.sleep(newcomer.last.heartbeat_interval_ms / 1000)
                await newcomer.heartbeat()
                beats += 1
            result["join_handoff_s"] = time.monotonic() - started
            result["join_handoff_heartbeats"] = beats
            result["heartbeat_interval_s"] = interval
            stop.set()
            await asyncio.gather(*background)
            group.append(newcomer)
            await settle(group)
            # Latency of steady no-change heartbeats, each member once per interval.
            latencies: list[float] = []
            per_replica = [0] * replicas
            retried = [0]
            if nodes is not None:
                nodes.mark("steady")
            t0 = time.monotonic()
            deadline = t0 + seconds

            async def paced(member: SimulatedMember, offset: float) -> None:
                # Each member on its own keep-alive connection through the lean client,
                # so the numbers are the coordinator's, not the load generator's (the
                # member's own: 10,000 members must not hold 20,000 sockets).
                conn = member.conn
                body = {
                    "memberId": member.member_id,
                    "memberEpoch": member.epoch,
                    "metadataVersion": member.last.metadata_version if member.last else 0,
                    "ownedShards": sorted(member.owned),
                }
                await asyncio.sleep(offset)
                while time.monotonic() < deadline:
                    t = time.perf_counter()
                    for attempt in range(10):
                        status, answer = await conn.post("/v1/groups/sim/heartbeat", body)
                        if status == 200 or not answer.get("retryable") or attempt == 9:
                            break
                        retried[0] += 1  # as a client does: again, after a pause
                        await asyncio.sleep(0.05 * (attempt + 1))
                    latencies.append(time.perf_counter() - t)
                    per_replica[member.replica] += 1
                    if status != 200 or answer["status"] != "OK":
                        raise RuntimeError(f"heartbeat failed: {status} {answer}")
                    await asyncio.sleep(interval)
                await conn.close()

            await asyncio.gather(
                *(paced(m, interval * i / len(group)) for i, m in enumerate(group))
            )
            paced_s = time.monotonic() - t0
            if nodes is not None:
                nodes.mark(None)
            result["latency_p50_ms"] = percentile(latencies, 0.5) * 1000
            result["latency_p99_ms"] = percentile(latencies, 0.99) * 1000
            result["latency_samples"] = len(latencies)
            result["paced_per_replica_per_s"] = [n / paced_s for n in per_replica]
            result["paced_retries"] = retried[0]
            result["retries"] = sum(m.retries for m in group)
            # Throughput: no-change heartbeats back to back, 16 connections per replica,
            # through a lean HTTP client so the load generator is not the bottleneck.
            counts = [0] * replicas
            deadline = time.monotonic() + seconds
            bodies = [
                {
                    "memberId": m.member_id,
                    "memberEpoch": m.epoch,
                    "metadataVersion": m.last.metadata_version if m.last else 0,
                    "ownedShards": sorted(m.owned),
                }
                for m in group
            ]
            streams = 16 * replicas

            async def hammer(k: int) -> None:
                # Connection k sends the bodies of the members of replica k % replicas.
                replica = k % replicas
                conn = LeanConnection("127.0.0.1", ports[replica])
                i = k
                while time.monotonic() < deadline:
                    status, body = await conn.post(
                        "/v1/groups/sim/heartbeat", bodies[i % len(bodies)]
                    )
                    if status != 200 or body["status"] != "OK":
                        raise RuntimeError(f"heartbeat failed: {status} {body}")
                    counts[replica] += 1
                    i += streams
                await conn.close()

            if nodes is not None:
                nodes.mark("saturated")
            t0 = time.monotonic()
            await asyncio.gather(*(hammer(k) for k in range(streams)))
            elapsed = time.monotonic() - t0
            result["throughput_per_s"] = sum(counts) / elapsed
            result["throughput_per_replica_per_s"] = [n / elapsed for n in counts]
            if nodes is not None:
                nodes.mark(None)
                result["nodes"] = nodes.phases
            t0 = time.monotonic()
            result["sections"] = await critical_sections(ports)
            result["metrics_scrape_s"] = (time.monotonic() - t0) / replicas
    finally:
        procs.stop()
    return result


async def critical_sections(ports: list[int]) -> dict[str, float]:
    """Heartbeats that took the full road and the critical sections they took (group
    commit: several per section), over the whole run, summed over the replicas."""
    sections = served = 0.0
    # /metrics renders the status of every group first: seconds at 10,000 members.
    async with httpx.AsyncClient(timeout=120) as http:
        for port in ports:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name == "streamworks_coordinator_heartbeat_batch_size_count":
                    sections += float(value)
                elif name == "streamworks_coordinator_heartbeat_batch_size_sum":
                    served += float(value)
    return {"full_road_heartbeats": served, "critical_sections": sections}


def bench_assignment() -> dict[str, Any]:
    out = {}
    shards = tuple(f"s/{i}@0" for i in range(10_000))
    topology = Topology(shards={"s": shards}, versions={"s": 1})
    for members in (1_000, 10_000):
        subs = {f"m{i:05d}": frozenset({"s"}) for i in range(members)}
        times = []
        previous: dict[str, frozenset[str]] = {}
        for _ in range(3):
            t = time.perf_counter()
            previous = assign_uniform(subs, topology, previous)
            times.append(time.perf_counter() - t)
        out[f"{members}x10000_s"] = statistics.median(times)
    return out


async def run(args: argparse.Namespace) -> None:
    server = EmbeddedRedis().start()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}"
    }
    try:
        print(f"# {results['machine']}")
        results["assignment"] = bench_assignment()
        print(f"assignment: {results['assignment']}")
        for n in args.members:
            r = await bench_members(server.url, n, args.seconds)
            results[f"members_{n}"] = r
            print(
                f"{n:5d} members: join hand-off {r['join_handoff_s'] * 1000:.0f} ms = "
                f"{r['join_handoff_s'] / r['heartbeat_interval_s']:.1f} heartbeat intervals "
                f"(target <= 2; {r['join_handoff_heartbeats']} heartbeats), "
                f"heartbeat p50 {r['latency_p50_ms']:.2f} ms p99 {r['latency_p99_ms']:.2f} ms, "
                f"throughput {r['throughput_per_s']:,.0f}/s; "
                f"{r['sections']['full_road_heartbeats']:,.0f} full-road heartbeats in "
                f"{r['sections']['critical_sections']:,.0f} critical sections"
            )
        if not args.quick:
            results["failover"] = await bench_failover(server.url, args.failover_runs)
            print(f"failover after SIGKILL: {results['failover']}")
    finally:
        server.stop()
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "control_plane.json").write_text(json.dumps(results, indent=2))


async def run_replicas(args: argparse.Namespace) -> None:
    """The member benchmarks with the fleet spread over several coordinator replicas."""
    server = EmbeddedRedis().start()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}"
    }
    try:
        print(f"# {results['machine']}")
        for n in args.members:
            r = await bench_members(
                server.url, n, args.seconds, replicas=args.replicas, interval=args.interval
            )
            results[f"members_{n}_replicas_{args.replicas}"] = r
            paced = " / ".join(f"{x:,.0f}" for x in r["paced_per_replica_per_s"])
            saturated = " / ".join(f"{x:,.0f}" for x in r["throughput_per_replica_per_s"])
            print(
                f"{n:5d} members over {args.replicas} replicas, heartbeat every "
                f"{args.interval:g} s: formed in {r['form_s']:.0f} s; join hand-off "
                f"{r['join_handoff_s'] * 1000:.0f} ms = "
                f"{r['join_handoff_s'] / r['heartbeat_interval_s']:.1f} heartbeat intervals "
                f"({r['join_handoff_heartbeats']} heartbeats); heartbeat p50 "
                f"{r['latency_p50_ms']:.2f} ms p99 {r['latency_p99_ms']:.2f} ms "
                f"({r['latency_samples']} samples, {r['paced_retries']} retried; "
                f"{r['retries']} retries while forming); served per replica {paced} /s paced, "
                f"{saturated} /s saturated (total {r['throughput_per_s']:,.0f}/s); "
                f"{r['sections']['full_road_heartbeats']:,.0f} full-road heartbeats in "
                f"{r['sections']['critical_sections']:,.0f} critical sections; one /metrics "
                f"scrape {r['metrics_scrape_s']:.2f} s per replica"
            )
    finally:
        server.stop()
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / f"control_plane_replicas_{args.replicas}.json").write_text(json.dumps(results, indent=2))


async def run_cluster(args: argparse.Namespace) -> None:
    """The heartbeat benchmarks on one node and on a 3-master cluster, with node load."""
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}"
    }
    print(f"# {results['machine']}")
    server = EmbeddedRedis().start()
    cluster = LocalCluster().start()
    try:
        targets: list[tuple[str, str, Callable[[str], NodeLoad]]] = [
            ("single", server.url, lambda _p: NodeLoad({server.port: f"{server.port}"})),
            ("cluster", cluster.url, lambda p: NodeLoad(cluster_nodes(cluster, p))),
        ]
        for name, url, load in targets:
            for n in args.members:
                r = await bench_members(url, n, args.seconds, load)
                results[f"{name}_members_{n}"] = r
                print(
                    f"{name:7s} {n:5d} members: heartbeat p50 {r['latency_p50_ms']:.2f} ms "
                    f"p99 {r['latency_p99_ms']:.2f} ms, throughput {r['throughput_per_s']:,.0f}/s"
                )
                for phase, per_node in r["nodes"].items():
                    for node, v in per_node.items():
                        print(
                            f"    {phase:9s} node {node:22s} {v['commands_per_s']:9,.0f} cmd/s "
                            f"{v['cpu_percent']:5.1f}% CPU"
                        )
    finally:
        cluster.stop()
        server.stop()
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "control_plane_cluster.json").write_text(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--failover-runs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="skip the failover runs")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="heartbeat benchmarks on one node and on a local 3-master cluster, with the "
        "commands/s and CPU of every Redis node",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="spread the simulated members round-robin over this many coordinator "
        "replicas (e.g. --replicas 3 --members 10000 --interval 10); skips the "
        "assignment and failover benchmarks",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="heartbeat interval of the coordinators (and so of the simulated fleet), "
        "seconds; with --replicas only",
    )
    args = parser.parse_args()
    if args.cluster:
        asyncio.run(run_cluster(args))
    elif args.replicas > 1 or args.interval != 1.0:
        asyncio.run(run_replicas(args))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
