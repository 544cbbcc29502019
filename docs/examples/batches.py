"""Batch handlers: one call, one transaction, for up to 100 events."""

from __future__ import annotations

from datetime import timedelta

import anyio
from pydantic import BaseModel

from streamworks import App, Batch, BatchContext, Record, RetryPolicy
from streamworks.testing import TestRuntime

app = App("warehouse")
app.stream("clicks", shards=2)


class Click(BaseModel):
    user: str
    page: str
    n: int


table: dict[int, Click] = {}  # stands in for a database table
batch_sizes: list[int] = []


@app.handler(
    "clicks",
    batch=Batch(max_size=100, max_wait=timedelta(milliseconds=50)),
    retry=RetryPolicy(max_attempts=2, backoff=0.01),
    idempotency_key=lambda click, ctx: f"click:{click.n}",  # per item, as usual
)
async def store(clicks: list[Click], ctx: BatchContext) -> None:
    batch_sizes.append(len(clicks))
    failed_users: set[str] = set()
    for i, click in enumerate(clicks):
        if click.user in failed_users:
            continue  # after its key's failed item: it runs again after that one
        if click.page == "":
            ctx.fail(i, ValueError("no page"))  # this item only: retried, then DLQ
            failed_users.add(click.user)
            continue
        table[click.n] = click
    # Returning acks every item not failed; raising would fail (retry) them all.


async def main() -> None:
    table.clear()
    batch_sizes.clear()
    async with TestRuntime(app) as rt:
        clicks = [Click(user=f"u{n % 10}", page="" if n == 42 else "/", n=n) for n in range(500)]
        await app.publish_many("clicks", [Record(c, key=c.user) for c in clicks])
        await rt.wait_idle(timeout=30)
        letters = await rt.dead_letters("clicks")
    assert sorted(table) == [n for n in range(500) if n != 42]
    assert [d.reason for d in letters] == ["max_attempts"]
    assert max(batch_sizes) <= 100 and len(batch_sizes) < 50
    print(f"{len(table)} clicks stored in {len(batch_sizes)} batches")


if __name__ == "__main__":
    anyio.run(main)
