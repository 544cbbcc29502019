"""`make demo`: the orders example end to end, as real processes.

An embedded Redis, one coordinator and three workers of ``examples.orders.app``
start as separate processes. 20,000 orders are published while they run; halfway
through one worker is killed with SIGKILL. Its lease expires, the coordinator moves
its shards to the two survivors, and they take over its unacknowledged messages.
At the end every order is accounted for: charged (once, or twice where the crash
hit between the side effect and the ack — at-least-once), or dead-lettered with
its reason.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from examples.orders.app import Order, app
from streamworks import Record
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.client import CoordinatorClient
from streamworks.settings import Settings
from streamworks.testing.embedded import EmbeddedRedis

ORDERS = 20_000
RATE = 2_000  # orders per second
WORKERS = 3
console = Console()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """The processes of the demo."""

    def __init__(self, redis_url: str, port: int, logs: Path) -> None:
        self.env = {
            **os.environ,
            "STREAMWORKS_REDIS_URL": redis_url,
            "STREAMWORKS_COORDINATOR_URLS": f"http://127.0.0.1:{port}",
            "STREAMWORKS_COORDINATOR__PORT": str(port),
            "PYTHONPATH": os.getcwd(),
        }
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamworks", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs[name] = proc
        return proc

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


async def wait_ready(port: int, timeout: float = 20) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while True:
            try:
                if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the coordinator did not become ready")
            await anyio.sleep(0.05)


async def wait_members(
    client: CoordinatorClient, count: int, timeout: float = 30
) -> dict[str, list[str]]:
    """Wait until the group is STABLE with ``count`` members; member -> its shards."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            group = await client.group(app.name)
            live = [m for m in group.members if m.state == "STABLE"]
            if group.state == "STABLE" and len(live) == count:
                return {m.client.get("pid", m.member_id): sorted(m.assigned) for m in live}
        except CoordinatorError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the group did not settle with {count} members")
        await anyio.sleep(0.1)


async def moved(
    client: CoordinatorClient, victim: subprocess.Popen[bytes], shards: list[str], since: float
) -> float | None:
    """If every shard of the killed worker has a new owner, print where they went and
    return the failover time."""
    group = await client.group(app.name)
    holders = {
        s: m.client.get("pid") for m in group.members if m.state != "EXPIRED" for s in m.assigned
    }
    if not all(holders.get(s) not in (None, str(victim.pid)) for s in shards):
        return None
    took = time.monotonic() - since
    where = ", ".join(f"shard {short([s])} -> pid {holders[s]}" for s in shards)
    console.print(f"[green]failover[/] after {took:.1f}s (lease TTL 10s): {where}")
    return took


def short(shards: list[str]) -> str:
    return ", ".join(s.split("/")[1].split("@")[0] for s in shards)


async def main() -> int:
    started = time.monotonic()
    console.rule("[bold]streamworks demo: a billing service consumes 20,000 orders")
    server = EmbeddedRedis().start()
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="streamworks-demo-"))
    cluster = Cluster(server.url, port, logs)
    settings = Settings(redis_url=server.url, coordinator_urls=[f"http://127.0.0.1:{port}"])
    app._settings = settings
    try:
        console.print(f"[dim]embedded Redis at {server.url}; process logs in {logs}[/]")
        cluster.start("coordinator", "coordinator")
        await wait_ready(port)
        metrics_ports = [free_port() for _ in range(WORKERS)]
        workers = [
            cluster.start(f"worker-{i}", "worker", "examples.orders.app:app", "--http-port", str(p))
            for i, p in enumerate(metrics_ports)
        ]
        async with CoordinatorClient(settings.coordinator_urls) as client:
            owners = await wait_members(client, WORKERS)
            console.print(f"coordinator + {WORKERS} workers up; the coordinator split 8 shards:")
            for pid, shards in owners.items():
                console.print(f"  worker pid {pid:>7} reads shards {short(shards)}")
            console.print("worker metrics (Prometheus; also /livez and /readyz):")
            for w, p in zip(workers, metrics_ports, strict=True):
                console.print(f"  worker pid {w.pid:>7} http://127.0.0.1:{p}/metrics")
            victim = workers[1]
            victim_shards = owners[str(victim.pid)]
            killed_at = 0.0
            failover = None
            rng = random.Random(7)
            dead_expected = 0
            async with app.connect():
                progress = Progress(
                    TextColumn("publishing"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=console,
                )
                with progress:
                    task = progress.add_task("orders", total=ORDERS)
                    t0 = time.monotonic()
                    for batch_start in range(0, ORDERS, 200):
                        records = []
                        for i in range(batch_start, batch_start + 200):
                            amount = rng.randint(1, 500)
                            if i % 2500 == 1234:
                                amount = -amount  # a payment that can never succeed
                                dead_expected += 1
                            order = Order(
                                id=f"o-{i:05d}", customer=f"c{rng.randint(1, 500)}", amount=amount
                            )
                            records.append(Record(order, key=order.customer, event_id=order.id))
                        await app.publish_many("orders", records)
                        progress.advance(task, len(records))
                        if batch_start + 200 == ORDERS // 2:
                            victim.send_signal(signal.SIGKILL)
                            killed_at = time.monotonic()
                            progress.console.print(
                                f"[red]SIGKILL[/] worker pid {victim.pid} "
                                f"(shards {short(victim_shards)}): no drain, no ack, no goodbye"
                            )
                        if killed_at and failover is None:
                            failover = await moved(client, victim, victim_shards, killed_at)
                        # Pace the producer so there is traffic before, during and after.
                        ahead = (batch_start + 200) / RATE - (time.monotonic() - t0)
                        if ahead > 0:
                            await anyio.sleep(ahead)
            with console.status(
                "waiting for the coordinator to move the killed worker's shards ..."
            ):
                while failover is None:
                    await anyio.sleep(0.1)
                    failover = await moved(client, victim, victim_shards, killed_at)
            with console.status("waiting for every order to be charged or dead-lettered ..."):
                from redis.asyncio import Redis

                r = Redis.from_url(server.url)
                deadline = time.monotonic() + 60
                while True:
                    charged = await r.scard(f"demo:charged:{app.name}")
                    dead = await r.xlen(f"sw:dlq:{{{app.name}:orders}}")
                    status = await client.status()
                    backlog = sum(
                        (g.lag or 0) + g.pending
                        for s in status.streams
                        for sh in s.shards
                        for g in sh.groups
                    )
                    if charged + dead >= ORDERS and backlog == 0:
                        break
                    if time.monotonic() > deadline:
                        console.print(
                            f"[red]timed out[/]: charged {charged}, dead {dead}, backlog {backlog}"
                        )
                        return 1
                    await anyio.sleep(0.2)
                duplicates = int(await r.get(f"demo:duplicates:{app.name}") or 0)
                by_member = await r.hgetall(f"demo:by-member:{app.name}")
                dlq = await r.xrange(f"sw:dlq:{{{app.name}:orders}}", count=3)
                await r.aclose()
            group = await client.group(app.name)
        pids = {m.member_id: m.client.get("pid", "?") for m in group.members}
        table = Table(title="Who charged what")
        table.add_column("worker")
        table.add_column("charged", justify="right")
        for member, count in sorted(by_member.items(), key=lambda kv: -int(kv[1])):
            mid = member.decode()
            note = " [red](killed)[/]" if pids.get(mid) == str(victim.pid) else ""
            table.add_row(f"pid {pids.get(mid, mid[:8])}{note}", str(int(count)))
        console.print(table)
        summary = Table(title="Every order accounted for")
        summary.add_column("")
        summary.add_column("", justify="right")
        summary.add_row("orders published", f"{ORDERS:,}")
        summary.add_row("charged (distinct orders)", f"{charged:,}")
        summary.add_row("charged twice (crash between side effect and ack)", str(duplicates))
        summary.add_row("dead-lettered (cannot be charged)", str(dead))
        summary.add_row("time to fail over after SIGKILL", f"{failover:.1f} s")
        summary.add_row("total time", f"{time.monotonic() - started:.1f} s")
        console.print(summary)
        for _, fields in dlq:
            console.print(
                f"  DLQ {fields[b'shard'].decode()} {fields[b'entry_id'].decode()}: "
                f"{fields[b'reason'].decode()}: {fields[b'error'].decode()[:60]}"
            )
        ok = charged + dead == ORDERS and dead == dead_expected
        console.print("[bold green]OK[/]: nothing lost" if ok else "[bold red]MISMATCH[/]")
        return 0 if ok else 1
    finally:
        cluster.stop_all()
        server.stop()


if __name__ == "__main__":
    raise SystemExit(anyio.run(main))
