"""`make demo`: the orders example end to end on an embedded Redis.

Three workers share the 8 shards of ``orders``; 5,000 orders are published (a few
with a flaky gateway that needs a retry, a few that can never be charged, and one
corrupt entry); halfway through, one worker crashes and its shards move to the
others. At the end every order is accounted for: charged once, or dead-lettered
with its reason.
"""

from __future__ import annotations

import logging
import random
import time

import anyio
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from examples.orders.app import Order, app
from streamworks.protocol.shards import ShardId
from streamworks.testing import TestRuntime

ORDERS = 5_000
console = Console()


async def main() -> int:
    logging.basicConfig(level=logging.ERROR)
    console.rule("[bold]streamworks demo: billing consumes orders")
    console.print("Starting an embedded Redis and 3 in-process workers of app [b]billing[/b] ...")
    async with TestRuntime(app, workers=3) as rt:
        redis = rt.redis
        for worker in rt.workers:
            shards = ", ".join(str(s.index) for s in sorted(worker.owned_shards()))
            console.print(f"  worker [cyan]{worker.member_id[:8]}[/] reads shards {shards}")
        rng = random.Random(7)
        expected_dead = 0
        started = time.monotonic()
        victim = rt.workers[1]
        with Progress(console=console, transient=False) as progress:
            task = progress.add_task("publishing orders", total=ORDERS)
            for i in range(ORDERS):
                amount = rng.randint(1, 500)
                if i % 1000 == 999:
                    amount = -amount  # can never be charged: dead-lettered
                    expected_dead += 1
                order = Order(id=f"o-{i:05d}", customer=f"c{rng.randint(1, 300)}", amount=amount)
                await app.publish("orders", order, key=order.customer, event_id=order.id)
                progress.advance(task)
                if i == ORDERS // 2:
                    lost = sorted(s.index for s in victim.owned_shards())
                    await rt.kill_worker(1)
                    progress.console.print(
                        f"[red]worker {victim.member_id[:8]} crashed[/] holding shards {lost}; "
                        "its shards move to the survivors"
                    )
        # One corrupt entry written behind the framework's back: a poison message.
        await redis.execute_command(
            "XADD", rt.keyspace.stream(ShardId("orders", 0)), "*", "v", b"{oops", "f", "1"
        )
        expected_dead += 1
        with console.status("waiting until every shard is drained ..."):
            await rt.wait_idle(timeout=60)
        elapsed = time.monotonic() - started
        charged = await redis.scard(f"demo:charged:{app.name}")
        duplicates = int(await redis.get(f"demo:duplicates:{app.name}") or 0)
        by_member = await redis.hgetall(f"demo:by-member:{app.name}")
        dead = await rt.dead_letters("orders")
        stats = rt.statistics("orders")

    table = Table(title="Who charged what")
    table.add_column("member")
    table.add_column("charged", justify="right")
    for member, count in sorted(by_member.items()):
        table.add_row(member.decode()[:8], str(int(count)))
    console.print(table)
    summary = Table(title="Every order accounted for")
    summary.add_column("what")
    summary.add_column("count", justify="right")
    summary.add_row("orders published", str(ORDERS))
    summary.add_row("charged (distinct orders)", str(charged))
    summary.add_row("charged twice (at-least-once duplicates)", str(duplicates))
    summary.add_row("retried attempts", str(stats["retried"]))
    summary.add_row("dead-lettered", str(len(dead)))
    summary.add_row("  of which poison (undecodable)", str(sum(d.reason == "poison" for d in dead)))
    summary.add_row("seconds", f"{elapsed:.1f}")
    console.print(summary)
    for d in dead[:3]:
        console.print(f"  DLQ {d.shard} {d.origin_id}: [yellow]{d.reason}[/] {d.error[:70]}")
    ok = charged + len(dead) - 1 == ORDERS and len(dead) == expected_dead
    console.print("[bold green]OK[/]: nothing lost" if ok else "[bold red]MISMATCH[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(anyio.run(main))
