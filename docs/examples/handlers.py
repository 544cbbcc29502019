"""Handlers: parameter injection, ordering, retries, dead letters, idempotency."""

from __future__ import annotations

import anyio
from pydantic import BaseModel

from streamworks import App, Context, Message, Retry, RetryPolicy, Skip
from streamworks.testing import TestRuntime

app = App("shipping")
app.stream("orders", shards=2)
app.stream("audit", shards=1, delete_on_ack=True)  # trim entries every group acked


class Order(BaseModel):
    id: str
    customer: str
    amount: int


shipped: list[str] = []


@app.handler(
    "orders",
    ordering="key",  # in order per partition key; "shard" or "none" also exist
    concurrency=32,  # messages in flight at once in this worker
    retry=RetryPolicy(max_attempts=3, backoff=0.01, max_backoff=1.0),
    idempotency_key=lambda order, ctx: f"ship:{order.id}",
    timeout=10.0,  # an attempt running longer counts as failed
)
async def ship(order: Order, msg: Message, ctx: Context) -> None:
    if order.amount == 0:
        raise Skip  # ack, nothing to do
    if order.amount < 0:
        raise ValueError("cannot ship a negative order")  # retried, then dead-lettered
    if msg.attempt == 1 and order.id == "o-2":
        raise Retry(delay=0.01, reason="warehouse busy")  # counts as an attempt
    assert ctx.idempotency_key == f"ship:{order.id}"
    shipped.append(order.id)


audited: list[dict[str, str]] = []


@app.handler("audit", ordering="none")
def audit(entry: dict[str, str]) -> None:  # a plain `def` runs in a worker thread
    audited.append(entry)


async def main() -> None:
    async with TestRuntime(app) as rt:
        for order in [
            Order(id="o-1", customer="a", amount=5),
            Order(id="o-2", customer="a", amount=7),
            Order(id="o-3", customer="b", amount=0),
            Order(id="o-4", customer="b", amount=-1),
            Order(id="o-1", customer="a", amount=5),  # a duplicate of o-1
        ]:
            await app.publish("orders", order, key=order.customer)
        await app.publish("audit", {"who": "alice", "what": "login"})
        await rt.wait_idle()
        assert shipped == ["o-1", "o-2"]
        [dead] = await rt.dead_letters("orders")
        assert dead.reason == "max_attempts" and dead.attempts == 3
        assert "negative" in dead.error
        assert rt.statistics("orders")["duplicates"] == 1
        assert audited == [{"who": "alice", "what": "login"}]


if __name__ == "__main__":
    anyio.run(main)
